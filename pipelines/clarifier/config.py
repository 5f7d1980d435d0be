"""The τ-bench Clarifier's settings, read by its stages with :func:`pipelines.config.from_params`:
params.yaml ``clarifier.data`` (the training tables) and ``clarifier.eval`` (the evaluation)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.config import MAX_LLM_FAILURE_RATE


@dataclass(frozen=True)
class ClarifierDataParams:
    """params.yaml ``clarifier.data``: ``splits`` (label -> retail split; None: train and
    dev), the ``teacher`` and ``judge`` backend sections (None: rules), ``candidates``
    (``{noise, temperature}``: the two DPO candidates' rules noise / openai temperature)."""

    output: str
    metrics: str
    taubench: str | None = None
    splits: Any = None
    seed: int = 0
    budget: int = 3
    patience: int = 2
    teacher: Any = None
    candidates: Any = None
    judge: Any = None
    cache_dir: str | None = None
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE


@dataclass(frozen=True)
class ClarifierEvalParams:
    """params.yaml ``clarifier.eval``: ``domains`` (domain -> split; None: retail and airline
    test), ``seeds`` (None: ``[seed]``), ``max_tasks`` (the first N tasks of each split; None:
    all), the ``agent`` / ``user`` / ``clarifiers`` sections (read by :mod:`catalog.clarifier`'s
    ``make_agent``, ``make_user``, ``make_clarifier``), the outputs."""

    output: str
    metrics: str
    markdown: str
    taubench: str | None = None
    domains: Any = None
    seed: int = 0
    seeds: tuple[int, ...] | None = None
    budget: int = 3
    max_tasks: int | None = None
    agent: Any = None
    user: Any = None
    clarifiers: Any = None
    cache_dir: str | None = None
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE
