"""Learn-to-Ask's settings, read by its stages with :func:`pipelines.config.from_params`:
params.yaml ``calibrate`` (Auto-Prompt), ``hindsight`` (the hindsight targets) and ``l2a.eval``
(the evaluation of the trained policies)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.config import MAX_LLM_FAILURE_RATE, OutputSpec, positive_int
from pipelines.errors import ConfigError
from pipelines.rewards.learn_to_ask import BETA


@dataclass(frozen=True)
class CalibratePolicyParams:
    """``calibrate.policy``: the model whose sampler prompt ROLLOUT calibrates, ``samples`` per
    context, its ``batch_size`` and ``sampling`` (:class:`pipelines.llm.SamplingParams`' keys)."""

    model_path: str
    samples: int = 2
    batch_size: int = 8
    sampling: Any = field(default_factory=lambda: {"temperature": 0.7, "max_tokens": 48})


@dataclass(frozen=True)
class CalibrateParams:
    """params.yaml ``calibrate``: the sessions (``source``, ``format``, ``db_dir``), the
    ``tracks`` to calibrate, the ``extractor`` / ``grader`` under calibration (backend
    sections, :meth:`BackendConfig.from_dict`), the rollout track's ``policy``, curated
    ``anchors`` (extract / grader -> file or null), the search's sizes and seed, the outputs
    (``output: {runs, prompts}``, ``metrics``)."""

    source: str
    output: OutputSpec
    metrics: str
    format: str = "multiwoz"
    db_dir: str | None = None
    tracks: tuple[str, ...] = ("extract",)
    extractor: Any = None
    grader: Any = None
    policy: CalibratePolicyParams | None = None
    anchors: Any = None
    n_anchors: int = 8
    n_pool: int = 3
    iterations: int = 2
    k: int = 2
    seed: int = 0


@dataclass(frozen=True)
class HindsightParams:
    """params.yaml ``hindsight``: the sessions (``source``, ``format``, ``db_dir``,
    ``max_sessions``: the first N by id, None for all), the stop rule, the calibrated
    ``prompts`` file (None: the seed prompts), the LLM failure budget, the outputs."""

    source: str
    output: str
    metrics: str
    format: str = "multiwoz"
    db_dir: str | None = None
    max_sessions: int | None = None
    stop_when: str = "no_info"
    prompts: str | None = None
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE


#: What each reader of :class:`L2aEvalParams` does not take: a GPU profile's ``l2a_eval``
#: answers with the job's own models, each compared with the one before it, writes the job's
#: reports and has no model grader (the node holds no second model).
NOT_IN_GPU_SECTION: tuple[str, ...] = ("models", "output", "model_grader", "compare")


@dataclass(frozen=True)
class L2aEvalParams:
    """Learn-to-Ask's evaluation settings: params.yaml ``l2a.eval`` and a GPU profile's
    ``l2a_eval`` section (read without :data:`NOT_IN_GPU_SECTION`). ``models`` (name -> model
    directory, or a list of them: one per training seed), ``generation`` (``{max_new_tokens,
    batch_size}``), ``stats`` (``{resamples, alpha, seed}``), ``compare`` ([model, baseline]
    pairs), ``model_grader`` (null or ``{samples, backend, ...}``), ``output``
    (``{generations, metrics, markdown}``); what both readers take is checked by
    :meth:`settings`, the rest by stage ``l2a_eval``."""

    samples: str
    models: Any = None
    output: OutputSpec | None = None
    split: str = "test"
    max_samples: int | None = None
    max_prompt_tokens: int = 512
    generation: Any = None
    beta: float = BETA
    stats: Any = None
    compare: Any = None
    model_grader: Any = None

    def settings(self, where: str) -> dict[str, Any]:
        """What both readers take, checked: ``samples`` (a path), ``split``, ``max_samples``,
        ``max_prompt_tokens``, ``max_new_tokens`` and ``batch_size`` (from ``generation``),
        ``beta``, ``stats`` (defaults filled in).

        >>> L2aEvalParams(samples="s.parquet", generation={"batch_size": 4}).settings("w")["batch_size"]
        4
        >>> L2aEvalParams(samples="s.parquet", generation={"top_k": 4}).settings("w")
        Traceback (most recent call last):
        ...
        pipelines.errors.ConfigError: w.generation: unknown key(s) ['top_k']
        """
        generation = dict(self.generation or {})
        unknown = sorted(set(generation) - {"max_new_tokens", "batch_size"})
        if unknown:
            raise ConfigError(f"{where}.generation: unknown key(s) {unknown}")
        stats = {"resamples": 1000, "alpha": 0.05, "seed": 0, **(self.stats or {})}
        if sorted(stats) != ["alpha", "resamples", "seed"]:
            raise ConfigError(f"{where}.stats: expected {{resamples, alpha, seed}}")
        return {
            "samples": Path(self.samples),
            "split": self.split,
            "max_samples": positive_int(self.max_samples, f"{where}.max_samples", optional=True),
            "max_prompt_tokens": positive_int(self.max_prompt_tokens, f"{where}.max_prompt_tokens"),
            "max_new_tokens": positive_int(generation.get("max_new_tokens", 48), f"{where}.generation.max_new_tokens"),
            "batch_size": positive_int(generation.get("batch_size", 16), f"{where}.generation.batch_size"),
            "beta": self.beta,
            "stats": stats,
        }
