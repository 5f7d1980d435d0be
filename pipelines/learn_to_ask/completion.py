"""The completion function an LLM extractor (stage ``hindsight``) or a calibrated prompt's
scorer (stage ``calibrate``) calls: a local ``hf`` model or an ``openai`` backend behind the
response cache."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Mapping

from pipelines.errors import ConfigError
from pipelines.learn_to_ask.hindsight import EXTRACTION_SCHEMA
from pipelines.llm import Accounting, BackendConfig, CompletionRequest, LLMClient, ResponseCache


def completer(backend: BackendConfig, llm: Mapping[str, Any] | None, accounting: Accounting,
              schema: Mapping[str, Any] | None = EXTRACTION_SCHEMA) -> Callable[[list[list[dict[str, str]]]], list[Any]]:
    """What an LLM extractor (or grader) calls: conversations in, a reply (or a (reason,
    detail) failure) each out; ``schema``: the JSON schema an openai reply must follow."""
    if backend.kind == "hf":
        from pipelines.llm.hf import HFBackend

        assert backend.hf is not None
        if not Path(backend.hf.model_path).exists():
            raise ConfigError(f"{backend.role} model_path: {backend.hf.model_path} does not exist "
                              "(models/smollm2: python -m stages.smollm2)")
        model = HFBackend.from_config(backend.hf)

        def complete(conversations: list[list[dict[str, str]]]) -> list[Any]:
            return model.generate(conversations, backend.sampling)
        return complete
    if backend.kind != "openai" or backend.client is None:
        raise ConfigError(f"{backend.role}: an LLM backend (hf or openai) is needed here, got {backend.kind!r}")
    cache = ResponseCache((llm or {}).get("cache_dir") or "data/cache/llm")
    client = LLMClient(backend.client, cache=cache, accounting=accounting)

    def complete(conversations: list[list[dict[str, str]]]) -> list[Any]:
        requests = [CompletionRequest(c, backend.role, backend.sampling, seed=0, response_schema=schema) for c in conversations]
        return [r.text if r.ok else (r.reason, r.last_error) for r in client.complete_many_sync(requests)]
    return complete
