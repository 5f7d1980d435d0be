"""PIR augmentation (section 3.1.1) from traces to rows and metrics: score every step with the
teacher, select the top k %, insert the pairs (at every selected step: the inserter never
sees the ground truth); and, where the assumption steps are known, the fidelity check (the
only reader of the ground truth): precision and recall of the picks against the assumption
steps, next to a random selection of the same size, with bootstrap intervals, for both scopes
at k 10/20/30 %, and the configured setting as the headline."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import mean
from typing import Any, Sequence

import numpy as np

from pipelines.config import MAX_LLM_FAILURE_RATE
from pipelines.errors import ConfigError
from pipelines.stats import LEVEL, interval, resample_indices, resampled_ratios
from pipelines.pir.entropy import SCOPES, Scope, Scorer, StepScores, fidelity, score_steps, select_top_k
from pipelines.pir.insertion import Inserter, Insertion, Skipped
from pipelines.pir.tables import pir_rows
from pipelines.pir.traces import Trace


SWEEP_K: tuple[float, ...] = (10, 20, 30)


@dataclass(frozen=True)
class PirConfig:
    """params.yaml ``pir`` (stage ``pir_augment``): the traces (a ``traces`` file, or built from
    the MultiWOZ directory ``source``; the first ``max_traces``), the ``teacher`` and
    ``inserter`` backend sections, the selection (``top_k_percent`` of the steps, per trace or
    over the corpus: ``scope``), the outputs. ``threads``: None takes the top-level
    params.yaml ``threads``."""

    output: str
    metrics: str
    source: str | None = None
    db_dir: str | None = None
    traces: str | None = None
    max_traces: int | None = None
    seed: int = 0
    teacher: Any = None
    threads: int | None = None
    top_k_percent: float = 20.0
    scope: str = "trace"
    inserter: Any = None
    cache_dir: str | None = None
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE

    def __post_init__(self) -> None:
        if not 0 < self.top_k_percent <= 100:
            raise ConfigError(f"top_k_percent must be in (0, 100], got {self.top_k_percent!r}")
        if self.scope not in SCOPES:
            raise ConfigError(f"scope must be one of {list(SCOPES)}, got {self.scope!r}")

    @property
    def k_percent(self) -> float:
        return self.top_k_percent


@dataclass
class PirResult:
    rows: list[dict[str, Any]]
    metrics: dict[str, Any]


def run_pir(traces: Sequence[Trace], scorer: Scorer, inserter: Inserter, config: PirConfig, teacher: str) -> PirResult:
    scores = score_steps(scorer, traces)
    entropies = [s.entropies for s in scores]
    selected = select_top_k(entropies, config.k_percent, config.scope)
    pairs = inserter.insertions(traces, selected)
    rows = pir_rows(traces, scores, selected, pairs, teacher=teacher, inserter=inserter.name, k_percent=config.k_percent, scope=config.scope)
    return PirResult(rows, pir_metrics(traces, scores, selected, pairs, config, teacher, inserter.name))


def pir_metrics(
    traces: Sequence[Trace], scores: Sequence[StepScores], selected: Sequence[Sequence[int]],
    pairs: Sequence[Sequence[Insertion | Skipped]], config: PirConfig, teacher: str, inserter: str,
) -> dict[str, Any]:
    n_steps = [len(s.entropies) for s in scores]
    made = [p for row in pairs for p in row]
    metrics: dict[str, Any] = {
        "teacher": teacher, "inserter": inserter, "k_percent": config.k_percent, "scope": config.scope,
        "traces": len(traces), "steps": sum(n_steps), "selected_steps": sum(len(s) for s in selected),
        "insertions": sum(isinstance(p, Insertion) for p in made),
        "skipped": dict(sorted(Counter(p.reason for p in made if isinstance(p, Skipped)).items())),
        "traces_with_insertions": sum(any(isinstance(p, Insertion) for p in row) for row in pairs),
        "tokens": {"reasoning": sum(s.scored_tokens for s in scores), "context": sum(s.context_tokens for s in scores)},
    }
    known = [i for i, t in enumerate(traces) if t.assumption_steps is not None]
    if known:
        truth = [traces[i].assumption_steps for i in known]
        steps_known = [n_steps[i] for i in known]
        entropies = [scores[i].entropies for i in known]
        every = [s.entropies for s in scores]
        # Misplaced questions stay in the data: how many pairs sit at an assumption step.
        placed = [p.step for i in known for p in pairs[i] if isinstance(p, Insertion) and p.step in traces[i].assumption_steps]
        metrics["insertions_at_assumption_steps"] = len(placed)
        metrics["insertions_elsewhere"] = sum(isinstance(p, Insertion) for i in known for p in pairs[i]) - len(placed)
        sweep = {}
        for k in SWEEP_K:
            sweep[f"{k:g}"] = {}
            for scope in SCOPES:
                chosen = select_top_k(every, k, scope)
                sweep[f"{k:g}"][scope] = fidelity_with_intervals([chosen[i] for i in known], truth, steps_known, scope)
        headline = fidelity_with_intervals([selected[i] for i in known], truth, steps_known, config.scope)
        assumed = [e[j] for e, t in zip(entropies, truth) for j in t if e[j] is not None]
        others = [v for e, t in zip(entropies, truth) for j, v in enumerate(e) if j not in t and v is not None]
        metrics["fidelity"] = {
            "traces": len(known),
            "bootstrap": {"unit": "trace", "resamples": RESAMPLES, "seed": BOOTSTRAP_SEED, "level": LEVEL,
                          "note": "percentile intervals over traces, the selection held fixed; random = the expected "
                                  "value of a uniform pick of the same size (per trace, or over the corpus)"},
            # The setting the data was built with (params.yaml pir: top_k_percent, scope, fixed before measuring).
            "headline": {"k_percent": config.k_percent, "scope": config.scope, **headline},
            # Every scope at k 10/20/30 %, the same entropies: how much does the picture depend on the setting?
            "sweep": sweep,
            # Diagnostic: is the teacher more uncertain on the assumption steps at all?
            "mean_entropy": {"assumption_steps": _round(mean(assumed)) if assumed else None,
                             "other_steps": _round(mean(others)) if others else None},
            "assumption_step_rank": _mean_rank(entropies, truth),
            # Where the selected steps sit relative to the nearest assumption step: entropy may
            # peak where the assumption's consequences appear (+1) rather than at it (0).
            "selected_offset_from_assumption": _offsets([selected[i] for i in known], truth),
        }
    return metrics


RESAMPLES = 2000
BOOTSTRAP_SEED = 0


def fidelity_with_intervals(
    selected: Sequence[Sequence[int]], truth: Sequence[Sequence[int]], n_steps: Sequence[int], scope: Scope,
    resamples: int = RESAMPLES, seed: int = BOOTSTRAP_SEED,
) -> dict[str, Any]:
    """:func:`~pipelines.pir.entropy.fidelity`'s precision and recall of the picks and of a
    random pick of the same size, each with a 95 % percentile bootstrap interval over traces
    (the project's helper, :func:`pipelines.stats.resample_indices`), and the
    intervals of the differences entropy - random (paired: the same resampled traces).

    >>> out = fidelity_with_intervals([(1,), (0,), (2,)], [(1,), (2,), (2,)], [3, 4, 3], "trace", resamples=200)
    >>> out["precision"]["value"], out["random_precision"]["value"], out["hits"]
    (0.6667, 0.3056, 2)
    >>> 0.0 <= out["precision"]["ci95_low"] <= 0.6667 <= out["precision"]["ci95_high"] <= 1.0
    True
    """
    check = fidelity(selected, truth, n_steps, scope)
    picked = np.array([len(s) for s in selected], dtype=float)
    positives = np.array([len(t) for t in truth], dtype=float)
    hits = np.array([len(set(s) & set(t)) for s, t in zip(selected, truth)], dtype=float)
    steps = np.array(n_steps, dtype=float)
    if scope == "trace":
        random_hits = np.divide(picked * positives, steps, out=np.zeros_like(steps), where=steps > 0)
        random_picked = picked
    else:  # a corpus-wide uniform pick at the same rate: expected picks and hits per trace
        rate = picked.sum() / steps.sum() if steps.sum() else 0.0
        random_hits, random_picked = rate * positives, rate * steps
    indices = resample_indices(len(selected), resamples, seed)
    draws = {
        "precision": resampled_ratios(hits, picked, indices),
        "recall": resampled_ratios(hits, positives, indices),
        "random_precision": resampled_ratios(random_hits, random_picked, indices),
        "random_recall": resampled_ratios(random_hits, positives, indices),
    }
    draws["precision_minus_random"] = draws["precision"] - draws["random_precision"]
    draws["recall_minus_random"] = draws["recall"] - draws["random_recall"]
    values = {"precision": check["entropy"]["precision"], "recall": check["entropy"]["recall"],
              "random_precision": check["random"]["precision"], "random_recall": check["random"]["recall"]}
    values["precision_minus_random"] = _difference(values["precision"], values["random_precision"])
    values["recall_minus_random"] = _difference(values["recall"], values["random_recall"])
    out: dict[str, Any] = {key: check[key] for key in ("selected", "positives", "steps", "hits")}
    for key, value in values.items():
        low, high = interval(draws[key]) or (None, None)
        out[key] = {"value": value, "ci95_low": None if low is None else round(low, 4), "ci95_high": None if high is None else round(high, 4)}
    return out


def _difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else round(a - b, 4)


def _mean_rank(entropies: Sequence[Sequence[float | None]], truth: Sequence[Sequence[int]]) -> dict[str, float | None]:
    """Mean normalised rank of the assumption steps within their trace (1 = always the most
    uncertain step, 0 = always the least; 0.5 is what chance gives)."""
    ranks = []
    for values, steps in zip(entropies, truth):
        scored = [v for v in values if v is not None]
        if len(scored) < 2:
            continue
        for j in steps:
            if values[j] is not None:
                below = sum(v < values[j] for v in scored)
                ranks.append(below / (len(scored) - 1))
    return {"mean": _round(mean(ranks)) if ranks else None, "n": len(ranks)}


def _offsets(selected: Sequence[Sequence[int]], truth: Sequence[Sequence[int]]) -> dict[str, int]:
    """Selected steps counted by their signed distance to the nearest assumption step of
    their trace (ties to the earlier one), e.g. {"-1": 3, "0": 21, "+1": 65}."""
    counts: Counter = Counter()
    for chosen, steps in zip(selected, truth):
        for i in chosen:
            if steps:
                nearest = min(steps, key=lambda j: (abs(i - j), j))
                counts[i - nearest] += 1
    return {f"{k:+d}" if k else "0": v for k, v in sorted(counts.items())}


def _round(value: float) -> float:
    return round(float(value), 4)
