"""PIR augmentation (section 3.1.1) from traces to rows and metrics: score every step with the
teacher, select the top k %, insert the pairs; and, where the assumption steps are known,
the fidelity check against a random selection of the same size in both scopes."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from statistics import mean
from typing import Any, Sequence

from pipelines.pir.entropy import SCOPES, Scope, Scorer, StepScores, fidelity, score_steps, select_top_k
from pipelines.pir.insertion import Inserter, Insertion, Skipped
from pipelines.pir.tables import pir_rows
from pipelines.pir.traces import Trace


SWEEP_K: tuple[float, ...] = (10, 20, 30, 50)


@dataclass(frozen=True)
class PirConfig:
    k_percent: float = 20.0
    scope: Scope = "trace"

    def __post_init__(self) -> None:
        if not 0 < self.k_percent <= 100:
            raise ValueError(f"top_k_percent must be in (0, 100], got {self.k_percent!r}")
        if self.scope not in SCOPES:
            raise ValueError(f"scope must be one of {list(SCOPES)}, got {self.scope!r}")


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
        checks = {}
        for scope in SCOPES:
            chosen = selected if scope == config.scope else select_top_k([s.entropies for s in scores], config.k_percent, scope)
            checks[scope] = fidelity([chosen[i] for i in known], truth, steps_known, scope)
        assumed = [e[j] for e, t in zip(entropies, truth) for j in t if e[j] is not None]
        others = [v for e, t in zip(entropies, truth) for j, v in enumerate(e) if j not in t and v is not None]
        every = [s.entropies for s in scores]
        sweep = {}
        for k in SWEEP_K:
            row = {}
            for scope in SCOPES:
                chosen = select_top_k(every, k, scope)
                check = fidelity([chosen[i] for i in known], truth, steps_known, scope)
                row[scope] = {"precision": check["entropy"]["precision"], "recall": check["entropy"]["recall"],
                              "random_precision": check["random"]["precision"], "random_recall": check["random"]["recall"]}
            sweep[f"{k:g}"] = row
        metrics["fidelity"] = {
            "traces": len(known),
            "by_scope": checks,
            # The same entropies at other k: does the picture depend on the setting?
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
