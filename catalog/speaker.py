"""params.yaml ``speaker`` read into the library's objects: the :class:`SpeakerConfig` and
the synthesizer of ``speaker.synthesizer`` (with its LLM client and response cache). The stage
and the fan-out flow's workers (:mod:`flows.speaker`) build them the same way; params parsing
lives here, above the library."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

from catalog.io import from_params
from pipelines.config import FanOutSpec
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, BackendConfig, LLMClient, ResponseCache
from pipelines.speaker.pipeline import SpeakerConfig
from pipelines.speaker.synthesis import LLMSynthesizer, RulesSynthesizer, Synthesizer


_DEFAULTS = SpeakerConfig()


@dataclass(frozen=True)
class SpeakerParams:
    """params.yaml ``speaker``: the corpus (``source``, ``db_dir``), the ``synthesizer``
    (a backend section, :meth:`BackendConfig.from_dict`; None: rules) and its ``cache_dir``,
    :class:`SpeakerConfig`'s settings (``dedup: {threshold, ngram}``), the outputs, the LLM
    failure and yield bounds, the ``fan_out``."""

    source: str
    output: str
    metrics: str
    db_dir: str | None = None
    synthesizer: Any = None
    cache_dir: str | None = None
    seed: int = _DEFAULTS.seed
    max_clarifications: int = _DEFAULTS.max_clarifications
    dedup: Any = None
    act_points: int = _DEFAULTS.act_points
    contrast_points: int = _DEFAULTS.contrast_points
    # numbers in [0, 1], checked by the stage (the message gives the range)
    max_llm_failure_rate: Any = 0.05
    min_yield: Any = 0.5
    fan_out: FanOutSpec = field(default_factory=FanOutSpec)


def speaker_params(params: Mapping[str, Any]) -> SpeakerParams:
    """params.yaml ``speaker`` (the stage's, or the copy a fan-out worker gets), checked."""
    return from_params(SpeakerParams, params, "params.yaml speaker")


def speaker_config(params: Mapping[str, Any] | SpeakerParams) -> SpeakerConfig:
    if not isinstance(params, SpeakerParams):
        params = speaker_params(params)
    dedup = params.dedup or {}
    if not isinstance(dedup, Mapping) or set(dedup) - {"threshold", "ngram"}:
        raise ConfigError(f"params.yaml speaker.dedup: expected a mapping with threshold and ngram, got {dedup!r}")
    try:
        return SpeakerConfig(
            seed=params.seed,
            max_clarifications=params.max_clarifications,
            dedup_threshold=float(dedup.get("threshold", _DEFAULTS.dedup_threshold)),
            dedup_ngram=dedup.get("ngram", _DEFAULTS.dedup_ngram),
            act_points=params.act_points,
            contrast_points=params.contrast_points,
        )
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"params.yaml speaker: {exc}") from None


def make_synthesizer(params: Mapping[str, Any] | SpeakerParams, database: Database, seed: int, accounting: Accounting) -> Synthesizer:
    if not isinstance(params, SpeakerParams):
        params = speaker_params(params)
    backend = BackendConfig.from_dict("synthesizer", params.synthesizer or {"backend": "rules"}, "speaker.synthesizer")
    if backend.kind == "rules":
        return RulesSynthesizer(database, seed)
    if backend.kind == "openai":
        cache = ResponseCache(params.cache_dir or "data/cache/llm")
        client = LLMClient(backend.client, cache=cache, accounting=accounting)
        return LLMSynthesizer(client, backend.sampling, database, seed, cache)
    raise ConfigError("params.yaml speaker.synthesizer.backend: 'hf' is not supported for synthesis; use rules or openai")
