"""Learn-to-Ask's held-out proxy metrics (paper section 4.1, Table 1; definitions: appendix F.6).

Each policy output (a_t, s_t) on a held-out sample with target (I*_t, s*_t) is scored with
the reward's own pieces (:mod:`pipelines.rewards.learn_to_ask`, eq. 3-5, appendix F.3)::

    R_s    1 when the decision matches s*_t, else 0                          (eq. 4)
    R_a    the grader's content score in {0, 0.5, 1}, only on right CONTINUEs (eq. 3)
    P      Omega: a right CONTINUE's question count (1 / 0.5 / 0), a right STOP's exact
           stop token (1 / 0); 0 on a wrong decision                     (appendix F.3)
    R      R_s * (1 + beta * R_a) + P, with R_a = 1 on a right STOP          (eq. 5)

and the metrics are means over subsets of the samples (appendix F.6):

======  ========================================================================
WA      mean R_a over samples with s* = CONTINUE that the policy also continued
WA-GH   share of those with R_a = 1 (a "good hit")
WC      mean R_s over samples with s* = CONTINUE
WS      mean R_s over samples with s* = STOP
AA      mean R_s over all samples
FC      mean P over all samples
TR      mean R over all samples
======  ========================================================================

R_a grades "the question(s)" of the output (appendix G's grading policy): :class:`QuestionGrader`
(:mod:`pipelines.rewards.learn_to_ask`, with the ``l2a_questions`` reward built on it)
hands the grader only the output's questions, and an output with none (a statement, a tool
call) scores 0 ("no_question"). The rules grader alone reads the whole text, so a tool call
whose arguments name a slot of I*_t would count as a precise question.

A right CONTINUE the grader could not score (R_a None: an empty or malformed reference, an
LLM grader's unreadable reply) is counted in ``unscored`` and left out of WA, WA-GH and TR
rather than scored 0. Percentile bootstrap intervals resample the samples (:func:`bootstrap`).
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from statistics import fmean
from typing import Any, Callable, Sequence

from pipelines.rewards.learn_to_ask import (  # noqa: F401 (NO_QUESTION, QuestionGrader, questions: the metrics' names too)
    BETA, CATCH_ALL_QUESTION, CONTINUE, NO_QUESTION, STOP, STOP_TOKEN, Grade, Grader, QuestionGrader, RulesGrader, _items, _Malformed,
    decision, format_score, questions,
)

METRICS: tuple[str, ...] = ("WA", "WA-GH", "WC", "WS", "AA", "FC", "TR")


@dataclass(frozen=True)
class Scored:
    """One output's pieces (module docstring); ``content`` is None unless a right CONTINUE
    was graded, ``reward`` None when that grade failed (``reason`` says why)."""

    truth: str
    decision: str
    correct: float
    content: float | None
    fmt: float
    reward: float | None
    reason: str


def score_output(text: str, truth: str, info: Any, grader: Grader, context: Any = None, beta: float = BETA) -> Scored:
    """The pieces of one output against (I*_t = ``info``, s*_t = ``truth``).

    >>> from pipelines.rewards.learn_to_ask import RulesGrader
    >>> area = [{"field": "hotel-area", "value": "north"}]
    >>> s = score_output("Which area would you like?", "continue", area, RulesGrader())
    >>> (s.correct, s.content, s.fmt, s.reward)
    (1.0, 1.0, 1.0, 4.0)
    >>> s = score_output("Which area? <stop />", "stop", [], RulesGrader())
    >>> (s.correct, s.content, s.fmt, s.reward)
    (1.0, None, 0.0, 3.0)
    """
    if truth not in (CONTINUE, STOP):
        raise ValueError(f"decision_truth: expected 'continue' or 'stop', got {truth!r}")
    chosen = decision(text)
    if chosen != truth:
        return Scored(truth, chosen, 0.0, None, 0.0, 0.0, "wrong_decision")
    if truth == STOP:
        fmt = 1.0 if text.strip() == STOP_TOKEN else 0.0
        return Scored(truth, chosen, 1.0, None, fmt, 1.0 + beta + fmt, "stop")
    fmt = format_score(text)
    try:
        grade = grader.grade(text, _items(info), context)
        score, reason = grade.score, grade.reason
    except _Malformed:
        score, reason = None, "malformed_reference"
    reward = None if score is None else 1.0 + beta * score + fmt
    return Scored(truth, chosen, 1.0, score, fmt, reward, reason)


#: The reference rows every model row is read against (``l2a_eval`` scores them on the same samples).
REFERENCES: dict[str, str] = {
    "expert": "the logged expert turn a_t, `<stop />` where s*_t is STOP (the SFT target): its decisions are s*_t itself, "
              "so its WC, WS and AA are an oracle's; its WA and WA-GH grade the expert's own questions",
    "catch_all": "one fixed question listing every slot, asked on every sample (never stops): what a grader that rewards "
                 "coverage alone scores as a precise question",
}


def reference_outputs(samples: Sequence[dict[str, Any]]) -> dict[str, list[str]]:
    """The outputs of the reference rows (:data:`REFERENCES`) on ``samples`` (rows with
    ``expert_reply`` and ``decision_truth``).

    >>> refs = reference_outputs([{"expert_reply": "Which area?", "decision_truth": "continue"},
    ...                           {"expert_reply": "Bye!", "decision_truth": "stop"}])
    >>> refs["expert"], refs["catch_all"][0] == CATCH_ALL_QUESTION
    (['Which area?', '<stop />'], True)
    """
    return {
        "expert": [STOP_TOKEN if s["decision_truth"] == STOP else s["expert_reply"] for s in samples],
        "catch_all": [CATCH_ALL_QUESTION for _ in samples],
    }


def _mean(values: Sequence[float]) -> float | None:
    return fmean(values) if values else None


def metrics_of(scored: Sequence[Scored]) -> dict[str, float | None]:
    """WA, WA-GH, WC, WS, AA, FC, TR (module docstring); None where a subset is empty.

    >>> right_ask = Scored("continue", "continue", 1.0, 1.0, 1.0, 4.0, "targets_item")
    >>> vague_ask = Scored("continue", "continue", 1.0, 0.5, 0.0, 2.0, "relevant_not_precise")
    >>> missed_stop = Scored("stop", "continue", 0.0, None, 0.0, 0.0, "wrong_decision")
    >>> m = metrics_of([right_ask, vague_ask, missed_stop])
    >>> m["WA"], m["WA-GH"], m["WC"], m["WS"], m["AA"], m["FC"], m["TR"]
    (0.75, 0.5, 1.0, 0.0, 0.6666666666666666, 0.3333333333333333, 2.0)
    """
    continues = [s for s in scored if s.truth == CONTINUE]
    graded = [s.content for s in continues if s.correct and s.content is not None]
    return {
        "WA": _mean(graded),
        "WA-GH": _mean([float(c == 1.0) for c in graded]),
        "WC": _mean([s.correct for s in continues]),
        "WS": _mean([s.correct for s in scored if s.truth == STOP]),
        "AA": _mean([s.correct for s in scored]),
        "FC": _mean([s.fmt for s in scored]),
        "TR": _mean([s.reward for s in scored if s.reward is not None]),
    }


def counts_of(scored: Sequence[Scored]) -> dict[str, int]:
    """How many samples each metric averages over, and how many right CONTINUEs went ungraded."""
    continues = [s for s in scored if s.truth == CONTINUE]
    right = [s for s in continues if s.correct]
    return {
        "samples": len(scored),
        "continue": len(continues),
        "stop": len(scored) - len(continues),
        "right_continue_graded": sum(s.content is not None for s in right),
        "unscored": sum(s.reward is None for s in scored),
    }


def _percentile_intervals(draws: dict[str, list[float]], alpha: float) -> dict[str, tuple[float, float] | None]:
    intervals: dict[str, tuple[float, float] | None] = {}
    for name, values in draws.items():
        values = sorted(values)
        if not values:
            intervals[name] = None
            continue
        low = values[int((alpha / 2) * (len(values) - 1))]
        high = values[int(round((1 - alpha / 2) * (len(values) - 1)))]
        intervals[name] = (low, high)
    return intervals


def _resampled(n: int, resamples: int, seed: int, statistic: Callable[[list[int]], dict[str, float | None]]) -> dict[str, list[float]]:
    rng = random.Random(seed)
    draws: dict[str, list[float]] = {name: [] for name in METRICS}
    for _ in range(resamples):
        values = statistic([rng.randrange(n) for _ in range(n)])
        for name in METRICS:
            if values[name] is not None:
                draws[name].append(values[name])
    return draws


def bootstrap(scored: Sequence[Scored], resamples: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, tuple[float, float] | None]:
    """Percentile bootstrap intervals (level 1 - ``alpha``) of every metric, resampling the
    samples with replacement ``resamples`` times (seeded); None for a metric no resample
    defines.

    >>> hit = Scored("continue", "continue", 1.0, 1.0, 1.0, 4.0, "targets_item")
    >>> bootstrap([hit] * 5, resamples=50)["WA"], bootstrap([hit] * 5, resamples=50)["WS"]
    ((1.0, 1.0), None)
    """
    if not scored:
        return {name: None for name in METRICS}
    draws = _resampled(len(scored), resamples, seed, lambda idx: metrics_of([scored[i] for i in idx]))
    return _percentile_intervals(draws, alpha)


def bootstrap_difference(
    scored: Sequence[Scored], baseline: Sequence[Scored], resamples: int = 1000, alpha: float = 0.05, seed: int = 0
) -> dict[str, tuple[float, float] | None]:
    """Paired percentile intervals of ``metric(scored) - metric(baseline)``: two policies'
    outputs on the same samples (same order), resampled together.

    >>> hit = Scored("continue", "continue", 1.0, 1.0, 1.0, 4.0, "targets_item")
    >>> miss = Scored("continue", "continue", 1.0, 0.0, 1.0, 2.0, "irrelevant")
    >>> bootstrap_difference([hit] * 4, [miss] * 4, resamples=20)["WA-GH"]
    (1.0, 1.0)
    """
    if len(scored) != len(baseline):
        raise ValueError(f"paired samples differ in number: {len(scored)} and {len(baseline)}")
    if not scored:
        return {name: None for name in METRICS}

    def difference(idx: list[int]) -> dict[str, float | None]:
        a, b = metrics_of([scored[i] for i in idx]), metrics_of([baseline[i] for i in idx])
        return {m: None if a[m] is None or b[m] is None else a[m] - b[m] for m in METRICS}

    return _percentile_intervals(_resampled(len(scored), resamples, seed, difference), alpha)


def _pooled(per_seed: Sequence[Sequence[Scored]], seeds: Sequence[int], idx: Sequence[int]) -> list[Scored]:
    return [per_seed[k][i] for k in seeds for i in idx]


def bootstrap_seeds(per_seed: Sequence[Sequence[Scored]], resamples: int = 1000, alpha: float = 0.05,
                    seed: int = 0) -> dict[str, tuple[float, float] | None]:
    """Percentile intervals of every metric of a policy trained under several seeds
    (``per_seed[k]``: seed k's outputs on the same samples, same order), resampling both what
    varies: the training seeds (with replacement) and then the samples (issue 28: intervals
    over samples alone miss what a re-training moves). The metric is computed over the chosen
    seeds' outputs pooled. One seed: :func:`bootstrap`.

    >>> hit = Scored("continue", "continue", 1.0, 1.0, 1.0, 4.0, "targets_item")
    >>> miss = Scored("continue", "continue", 1.0, 0.0, 1.0, 2.0, "irrelevant")
    >>> low, high = bootstrap_seeds([[hit] * 4, [miss] * 4], resamples=200)["WA-GH"]
    >>> low, high
    (0.0, 1.0)
    """
    if len(per_seed) == 1:
        return bootstrap(per_seed[0], resamples, alpha, seed)
    return _percentile_intervals(_resampled_seeds(per_seed, resamples, seed, lambda seeds, idx: metrics_of(_pooled(per_seed, seeds, idx))), alpha)


def bootstrap_seeds_difference(per_seed: Sequence[Sequence[Scored]], baseline: Sequence[Sequence[Scored]],
                               resamples: int = 1000, alpha: float = 0.05, seed: int = 0) -> dict[str, tuple[float, float] | None]:
    """Paired intervals of ``metric(per_seed) - metric(baseline)`` resampling seeds and samples:
    seed k of one is paired with seed k of the other (e.g. GRPO from SFT seed k); a baseline
    with one seed (an untrained model) is paired with every seed. Both with one seed:
    :func:`bootstrap_difference`.

    >>> hit = Scored("continue", "continue", 1.0, 1.0, 1.0, 4.0, "targets_item")
    >>> miss = Scored("continue", "continue", 1.0, 0.0, 1.0, 2.0, "irrelevant")
    >>> bootstrap_seeds_difference([[hit] * 3, [miss] * 3], [[miss] * 3], resamples=200)["WA-GH"]
    (0.0, 1.0)
    """
    if len(per_seed) == 1 and len(baseline) == 1:
        return bootstrap_difference(per_seed[0], baseline[0], resamples, alpha, seed)
    if len(baseline) == 1:
        baseline = [baseline[0]] * len(per_seed)
    elif len(per_seed) == 1:
        per_seed = [per_seed[0]] * len(baseline)
    if len(per_seed) != len(baseline) or len({len(s) for s in [*per_seed, *baseline]}) != 1:
        raise ValueError(f"paired seeds and samples differ in number: {[len(s) for s in per_seed]} and {[len(s) for s in baseline]}")

    def difference(seeds: list[int], idx: list[int]) -> dict[str, float | None]:
        a, b = metrics_of(_pooled(per_seed, seeds, idx)), metrics_of(_pooled(baseline, seeds, idx))
        return {m: None if a[m] is None or b[m] is None else a[m] - b[m] for m in METRICS}

    return _percentile_intervals(_resampled_seeds(per_seed, resamples, seed, difference), alpha)


def _resampled_seeds(per_seed: Sequence[Sequence[Scored]], resamples: int, seed: int,
                     statistic: Callable[[list[int], list[int]], dict[str, float | None]]) -> dict[str, list[float]]:
    rng = random.Random(seed)
    k, n = len(per_seed), len(per_seed[0])
    draws: dict[str, list[float]] = {name: [] for name in METRICS}
    if n == 0:
        return draws
    for _ in range(resamples):
        values = statistic([rng.randrange(k) for _ in range(k)], [rng.randrange(n) for _ in range(n)])
        for name in METRICS:
            if values[name] is not None:
                draws[name].append(values[name])
    return draws


def markdown_table(results: dict[str, dict[str, Any]], digits: int = 2) -> str:
    """Table 1's layout: one row per model, the metrics with their interval when known.

    >>> print(markdown_table({"base": {"metrics": {m: 0.5 for m in METRICS}, "ci": {m: (0.25, 0.75) for m in METRICS}, "counts": {"samples": 4}}}))
    | Model | n | WA | WA-GH | WC | WS | AA | FC | TR |
    |---|---|---|---|---|---|---|---|---|
    | base | 4 | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] | 0.50 [0.25, 0.75] |
    """

    def cell(value: float | None, interval: Any) -> str:
        if value is None:
            return "-"
        text = f"{value:.{digits}f}"
        if interval:
            text += f" [{interval[0]:.{digits}f}, {interval[1]:.{digits}f}]"
        return text

    lines = ["| Model | n | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 2)]
    for model, result in results.items():
        ci = result.get("ci") or {}
        cells = [cell(result["metrics"].get(m), ci.get(m)) for m in METRICS]
        lines.append(f"| {model} | {result['counts']['samples']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)
