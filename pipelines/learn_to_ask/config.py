"""Learn-to-Ask's settings, read by its stages with :func:`pipelines.config.from_params`:
params.yaml ``calibrate`` (Auto-Prompt), ``hindsight`` (the hindsight targets) and ``l2a.eval``
(the evaluation of the trained policies)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from pipelines.config import MAX_LLM_FAILURE_RATE, OutputSpec
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


@dataclass(frozen=True)
class L2aEvalParams:
    """params.yaml ``l2a.eval``: ``models`` (name -> model directory, or a list of them: one
    per training seed), ``generation`` (``{max_new_tokens, batch_size}``), ``stats``
    (``{resamples, alpha, seed}``), ``compare`` ([model, baseline] pairs), ``model_grader``
    (null or ``{samples, backend, ...}``), ``output`` (``{generations, metrics, markdown}``);
    checked further by :func:`check_params`."""

    samples: str
    models: Any
    output: OutputSpec
    split: str = "test"
    max_samples: int | None = None
    max_prompt_tokens: int = 512
    generation: Any = None
    beta: float = BETA
    stats: Any = None
    compare: Any = None
    model_grader: Any = None
