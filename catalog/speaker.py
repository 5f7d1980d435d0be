"""params.yaml ``speaker`` read into the library's objects: the :class:`SpeakerConfig` and
the synthesizer of ``speaker.synthesizer`` (with its LLM client and response cache). The stage
and the fan-out flow's workers (:mod:`flows.speaker`) build them the same way; params parsing
lives here, above the library."""

from __future__ import annotations

from typing import Any, Mapping

from pipelines.config import from_params
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, BackendConfig, LLMClient, ResponseCache
from pipelines.speaker.pipeline import SpeakerConfig
from pipelines.speaker.synthesis import LLMSynthesizer, RulesSynthesizer, Synthesizer


def speaker_config(params: Mapping[str, Any] | SpeakerConfig) -> SpeakerConfig:
    """params.yaml ``speaker`` (the stage's, or the copy a fan-out worker gets), checked."""
    if isinstance(params, SpeakerConfig):
        return params
    return from_params(SpeakerConfig, params, "params.yaml speaker")


def make_synthesizer(params: Mapping[str, Any] | SpeakerConfig, database: Database, seed: int, accounting: Accounting) -> Synthesizer:
    params = speaker_config(params)
    backend = BackendConfig.from_dict("synthesizer", params.synthesizer or {"backend": "rules"}, "speaker.synthesizer")
    if backend.kind == "rules":
        return RulesSynthesizer(database, seed)
    if backend.kind == "openai":
        cache = ResponseCache(params.cache_dir or "data/cache/llm")
        client = LLMClient(backend.client, cache=cache, accounting=accounting)
        return LLMSynthesizer(client, backend.sampling, database, seed, cache)
    raise ConfigError("params.yaml speaker.synthesizer.backend: 'hf' is not supported for synthesis; use rules or openai")
