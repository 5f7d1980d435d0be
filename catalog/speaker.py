"""params.yaml ``speaker`` read into the library's objects: the :class:`SpeakerConfig` and
the synthesizer of ``speaker.synthesizer`` (with its LLM client and response cache). The stage
and the fan-out flow's workers (:mod:`flows.speaker`) build them the same way; params parsing
lives here, above the library."""

from __future__ import annotations

from typing import Any, Mapping

from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, BackendConfig, LLMClient, ResponseCache
from pipelines.speaker.pipeline import SpeakerConfig
from pipelines.speaker.synthesis import LLMSynthesizer, RulesSynthesizer, Synthesizer


def speaker_config(params: Mapping[str, Any]) -> SpeakerConfig:
    dedup = params.get("dedup") or {}
    if not isinstance(dedup, Mapping) or set(dedup) - {"threshold", "ngram"}:
        raise ConfigError(f"params.yaml speaker.dedup: expected a mapping with threshold and ngram, got {dedup!r}")
    defaults = SpeakerConfig()
    try:
        return SpeakerConfig(
            seed=params.get("seed", defaults.seed),
            max_clarifications=params.get("max_clarifications", defaults.max_clarifications),
            dedup_threshold=float(dedup.get("threshold", defaults.dedup_threshold)),
            dedup_ngram=dedup.get("ngram", defaults.dedup_ngram),
            act_points=params.get("act_points", defaults.act_points),
            contrast_points=params.get("contrast_points", defaults.contrast_points),
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params.yaml speaker: {exc}") from None


def make_synthesizer(params: Mapping[str, Any], database: Database, seed: int, accounting: Accounting) -> Synthesizer:
    backend = BackendConfig.from_dict("synthesizer", params.get("synthesizer") or {"backend": "rules"}, "speaker.synthesizer")
    if backend.kind == "rules":
        return RulesSynthesizer(database, seed)
    if backend.kind == "openai":
        cache = ResponseCache(params.get("cache_dir") or "data/cache/llm")
        client = LLMClient(backend.client, cache=cache, accounting=accounting)
        return LLMSynthesizer(client, backend.sampling, database, seed, cache)
    raise ConfigError("params.yaml speaker.synthesizer.backend: 'hf' is not supported for synthesis; use rules or openai")
