"""Scores of played episodes: per episode, then Avg@k over seeded runs (SpeakRL section 4).

Success is the goal checker's (every domain's offered entity fits the goal's final
constraints, every booking made with the goal's values and a reference the environment
issued, every requested attribute given). Turns are utterances, user and agent, as
MultiWOZ counts them. Avg@k: each seeded run (one episode per held-out goal) gives a
rate; the score is the mean and the sample standard deviation of the k rates.

Clarification quality uses the verifiable judge (:mod:`pipelines.rewards.verifiable`) with
the decision point read off the episode: when the agent asks, the *known* slots are the
goal constraints whose values the user has already said (whole words, normalised), and
the *discriminating* ones are the goal constraints the user has not said yet: what a
question could usefully ask for. A question scores 1 when it asks about one of those and
about nothing already said. It is lexical, like the judge: a user who said "two people"
where the goal says 2 leaves ``people`` unknown.

Both are read per domain: a question belongs to the domain of the agent's latest tool call
(``query_hotel`` -> hotel), and only that domain's constraints count, said in the user turns
since the one before the domain's first tool call (the turn that asked for it). Read over the
whole goal, a hotel's area was "known" as soon as the user had named the same area for an
attraction (13 % of SpeakER's training questions, issue 26). Before the agent's first tool
call every domain counts, over everything said. A domain the agent books without searching
(a taxi: no query tool) opens at the first user turn that names it ("I also need a taxi to the
museum"): the agent's question for its missing pickup or time comes before any tool call of
that domain, and read against the previous domain it would count as over-asking. (A user who
names a taxi while still on another domain moves the reading to the taxi early; the agenda
simulator takes the domains one at a time.)

Over-asking: a question is *needless* when, at the moment it is asked, either it asks about
a goal constraint the user has already stated (the judge's ``asks_known_slot``), or the user
has already stated every constraint of the goal (nothing was left to ask; "don't care"
values are not constraints). Both read the same dialogue state as above. Being lexical, a
constraint said in other words stays open, so the count is a lower bound; a question about
something the goal does not constrain at all is not counted here (it is "not
discriminating"). An always-ask policy shows up here, not in the clarify rate alone.

Confidence intervals (:func:`bootstrap_summary`): the goals are the sampling unit. Every
metric is a ratio of integer sums over episodes (successes / episodes, questions /
episodes, hits / applicable domains ...); the goals are resampled with replacement
(``resamples`` times, a seeded generator, the same resamples for every model and metric)
and the 2.5th and 97.5th percentiles of the resampled ratios are the 95 % interval. The
sums are integers, so the figures are the same on every machine. Differences between two
models (:func:`paired_comparisons`) use the same resamples (a paired bootstrap over goals):
the difference's interval, a two-sided p-value (twice the smaller share of resampled
differences on either side of zero), Holm-adjusted over the model pairs of each metric;
significant when the adjusted p is below ``alpha``.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from pipelines.env.replay import DomainFocus
from pipelines.episodes.records import AGENT_NO_OUTPUT, Episode
from pipelines.multiwoz.ontology import is_dont_care
from pipelines.records import Goal
from pipelines.rewards.verifiable import ASKS_KNOWN, VerifiableJudge, words
from pipelines.stats import LEVEL, resample_indices, seed_draws
from pipelines.stats import bounds as _bounds, holm as _holm, interval as _interval, resampled_ratios as _resampled_ratios

_JUDGE = VerifiableJudge()


@dataclass(frozen=True)
class EpisodeScore:
    """One episode's numbers. Rates over domains are ``(hits, total)`` pairs so that runs
    pool them; a domain whose check does not apply (no booking asked) is not counted."""

    episode_id: str
    dialogue_id: str
    seed: int
    success: bool
    n_turns: int
    ended_by: str
    domains: Mapping[str, bool]
    inform: tuple[int, int]
    book: tuple[int, int]
    request: tuple[int, int]
    n_clarifications: int
    n_discriminating: int
    n_malformed: int
    n_agent_fallbacks: int
    n_over_asking: int = 0
    # The standard MultiWOZ evaluator's grade of the same episode (pipelines.env.standard);
    # None where the world has none (τ-bench). ``success`` / ``inform`` are the strict grade.
    standard_success: bool | None = None
    standard_inform: bool | None = None


def goal_slot_values(goal: Goal, domain: str | None = None) -> dict[str, list[str]]:
    """Every constraint the goal can make the user say: slot -> values (``info``,
    ``fail_info``, ``book``, ``fail_book`` of every domain, or of ``domain`` only; "don't
    care" left out)."""
    values: dict[str, list[str]] = defaultdict(list)
    for part_of in (d for d in goal.domains if domain is None or d.domain == domain):
        for part in (part_of.info, part_of.fail_info, part_of.book, part_of.fail_book):
            for slot, value in part.items():
                if not is_dont_care(value) and str(value) not in values[slot]:
                    values[slot].append(str(value))
    return dict(values)


def _said(value: str, said: str) -> bool:
    needle = words(value)
    return bool(needle) and f" {needle} " in said


@dataclass(frozen=True)
class QuestionCheck:
    """One clarification question read against the dialogue state when it was asked."""

    score: float  # the verifiable judge's: 1 = asks about an open goal constraint only
    needless: bool  # over-asking (module docstring)
    reason: str  # the judge's reason, or "nothing_open" when every constraint was stated


NOTHING_OPEN = "nothing_open"

def clarification_checks(episode: Episode, goal: Goal) -> list[QuestionCheck]:
    """Every clarification question of the episode, in order, scored and checked for
    over-asking from what the user had said before it (module docstring)."""
    focus = DomainFocus(d.domain for d in goal.domains)
    checks = []
    for event in episode.events:
        if event.kind == "user" and event.text:
            focus.user(words(event.text))
        elif event.kind == "tool_call" and event.tool_name:
            focus.tool_call(event.tool_name)
        elif event.kind == "clarify":
            slots = goal_slot_values(goal, focus.current)
            said = focus.said
            known = sorted(s for s, values in slots.items() if any(_said(v, said) for v in values))
            open_slots = sorted(s for s in slots if s not in known)
            verdict = _JUDGE.verdict(event.text or "", {"discriminating_slots": open_slots, "known_slots": known})
            if not open_slots:
                checks.append(QuestionCheck(verdict.score, True, NOTHING_OPEN))
            else:
                checks.append(QuestionCheck(verdict.score, verdict.reason == ASKS_KNOWN, verdict.reason))
    return checks


def clarification_verdicts(episode: Episode, goal: Goal) -> list[float]:
    """The verifiable judge's score of each clarification question, in order (docstring)."""
    return [check.score for check in clarification_checks(episode, goal)]


def _rate(flags: Iterable[bool | None]) -> tuple[int, int]:
    applicable = [f for f in flags if f is not None]
    return sum(applicable), len(applicable)


def score_episode(episode: Episode, goal: Goal) -> EpisodeScore:
    domains = episode.result.domains
    checks = clarification_checks(episode, goal)
    return EpisodeScore(
        episode_id=episode.episode_id,
        dialogue_id=episode.dialogue_id,
        seed=episode.seed,
        success=episode.success,
        n_turns=episode.n_turns,
        ended_by=episode.ended_by,
        domains={d.domain: d.success for d in domains},
        inform=_rate(d.inform for d in domains),
        book=_rate(d.book for d in domains),
        request=_rate(d.request for d in domains),
        n_clarifications=episode.n_clarifications,
        n_discriminating=int(sum(c.score for c in checks)),
        n_malformed=episode.n_malformed,
        n_agent_fallbacks=episode.n_agent_fallbacks,
        n_over_asking=sum(c.needless for c in checks),
        standard_success=episode.standard_success,
        standard_inform=episode.standard_inform,
    )


def conversation_columns(episode: Episode, goal: Goal) -> dict[str, float | int]:
    """What the multi-turn GRPO rewards (:mod:`pipelines.rewards.dialogue`) read of a played
    conversation, graded against its goal by :func:`score_episode`: ``progress``, the share
    of the goal's inform, book and request checks met (its success where it has none);
    ``useless_questions``, questions about nothing the goal constrains that the user had
    not said (the verifiable judge's 0); ``malformed``, turns the format could not parse."""
    score = score_episode(episode, goal)
    met = score.inform[0] + score.book[0] + score.request[0]
    checks = score.inform[1] + score.book[1] + score.request[1]
    return {"progress": met / checks if checks else float(score.success),
            "useless_questions": score.n_clarifications - score.n_discriminating, "malformed": score.n_malformed}


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std"}``: the sample standard deviation (0 for a single run)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no runs to average")
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


#: Every rate of :func:`run_rates` as (numerator, denominator) integers of one episode.
RATE_PARTS: Mapping[str, Any] = {
    "success": lambda s: (int(s.success), 1),
    "turns": lambda s: (s.n_turns, 1),
    "inform_rate": lambda s: s.inform,
    "book_rate": lambda s: s.book,
    "request_rate": lambda s: s.request,
    "clarifications_per_dialogue": lambda s: (s.n_clarifications, 1),
    "discriminating_share": lambda s: (s.n_discriminating, s.n_clarifications),
    "over_asking_per_dialogue": lambda s: (s.n_over_asking, 1),
    "over_asking_share": lambda s: (s.n_over_asking, s.n_clarifications),
    "malformed_per_dialogue": lambda s: (s.n_malformed, 1),
    "fallbacks_per_dialogue": lambda s: (s.n_agent_fallbacks, 1),
    # The standard evaluator's Success and Inform (the field's papers' numbers), per dialogue.
    "standard_success": lambda s: (0, 0) if s.standard_success is None else (int(s.standard_success), 1),
    "standard_inform_rate": lambda s: (0, 0) if s.standard_inform is None else (int(s.standard_inform), 1),
}

def _pooled(pairs: Iterable[tuple[int, int]]) -> float | None:
    hits = total = 0
    for h, t in pairs:
        hits, total = hits + h, total + t
    return hits / total if total else None


def run_rates(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """One seeded run's rates (one episode per goal): every :data:`RATE_PARTS` ratio pooled
    over the episodes (None where its denominator is 0), and success per goal domain."""
    if not scores:
        raise ValueError("a run without episodes")
    domain_flags: dict[str, list[bool]] = defaultdict(list)
    for score in scores:
        for domain, ok in score.domains.items():
            domain_flags[domain].append(ok)
    rates: dict[str, Any] = {key: _pooled(parts(s) for s in scores) for key, parts in RATE_PARTS.items()}
    rates["domain_success"] = {d: sum(f) / len(f) for d, f in sorted(domain_flags.items())}
    return rates


def avg_at_k(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """Avg@k over the seeded runs in ``scores`` (grouped by seed): every rate's mean and
    std across runs; a rate that applies to no episode of a run is left out of that run
    (``None`` when it applies in none). ``runs``: the seeds, ``episodes``: the total."""
    return avg_over_training_seeds([scores])


def avg_over_training_seeds(per_seed: Sequence[Sequence[EpisodeScore]]) -> dict[str, Any]:
    """:func:`avg_at_k` of one policy trained under several seeds (``per_seed[k]``: training
    seed k's episodes): a run is one (training seed, evaluation seed) pair, so the std is
    across re-trainings too; ``training_seeds``: how many (only when more than one).

    >>> def score(seed, ok):
    ...     return EpisodeScore("e", "g", seed, ok, 4, "done", {}, (0, 0), (0, 0), (0, 0), 0, 0, 0, 0)
    >>> summary = avg_over_training_seeds([[score(0, True)], [score(0, False)]])
    >>> summary["runs"], summary["training_seeds"], summary["success"]
    (2, 2, {'mean': 0.5, 'std': 0.7071067811865476})
    """
    runs = []
    seeds: set[int] = set()
    for scores in per_seed:
        by_seed: dict[int, list[EpisodeScore]] = defaultdict(list)
        for score in scores:
            by_seed[score.seed].append(score)
        runs += [run_rates(by_seed[seed]) for seed in sorted(by_seed)]
        seeds |= set(by_seed)
    if not runs:
        raise ValueError("no runs to average")
    summary: dict[str, Any] = {"runs": len(runs), "episodes": sum(len(s) for s in per_seed), "seeds": sorted(seeds)}
    if len(per_seed) > 1:
        summary["training_seeds"] = len(per_seed)
    for key in runs[0]:
        if key == "domain_success":
            continue
        values = [r[key] for r in runs if r[key] is not None]
        summary[key] = mean_std(values) if values else None
    domains = sorted({d for r in runs for d in r["domain_success"]})
    summary["domain_success"] = {
        d: mean_std([r["domain_success"][d] for r in runs if d in r["domain_success"]]) for d in domains
    }
    return summary



def fault_counts(episodes: Iterable[Episode]) -> dict[str, dict[str, Any]]:
    """Hidden faults of the played episodes, per role, so that a score never rests silently
    on fallbacks.

    ``user_simulator``: ``faults`` (failed attempts at a user turn: retries plus fallbacks),
    ``fallbacks`` (turns that are the recorded fallback), ``llm_failures`` (faults of turns
    whose last fault was an LLM call that failed; a turn's faults are counted under its last
    reason, the only one recorded), ``faults_by_reason`` and ``turns``.
    ``agent``: ``llm_failures`` (outputs the backend failed to produce), ``malformed`` (all
    rejected outputs, those included), ``fallbacks`` (turns that ended in the apology) and
    ``turns``."""
    user = {"turns": 0, "faults": 0, "fallbacks": 0, "llm_failures": 0}
    user_reasons: dict[str, int] = defaultdict(int)
    agent = {"turns": 0, "llm_failures": 0, "malformed": 0, "fallbacks": 0}
    for episode in episodes:
        for event in episode.events:
            if event.actor == "user" and event.kind in ("user", "fallback"):
                user["turns"] += 1
                fallback = event.kind == "fallback"
                faults = (event.retries or 0) + (1 if fallback else 0)
                user["faults"] += faults
                user["fallbacks"] += fallback
                if faults:
                    reason = (event.detail or "unknown").split(":", 1)[0]
                    user_reasons[reason] += faults
                    user["llm_failures"] += faults if reason.startswith("llm_") else 0
            elif event.actor == "agent":
                if event.kind == "malformed":
                    agent["malformed"] += 1
                    agent["llm_failures"] += (event.detail or "").startswith(AGENT_NO_OUTPUT)
                elif event.kind == "fallback":
                    agent["fallbacks"] += 1
                if event.is_utterance:
                    agent["turns"] += 1
    return {"user_simulator": {**user, "faults_by_reason": dict(sorted(user_reasons.items()))}, "agent": agent}


# --- Confidence intervals and paired comparisons over goals (module docstring) -------------

#: The metrics whose differences between models are tested.
COMPARED: tuple[str, ...] = (
    "success", "turns", "inform_rate", "clarifications_per_dialogue", "over_asking_per_dialogue", "malformed_per_dialogue",
)


def _domain_parts(domain: str) -> Any:
    return lambda s: (int(s.domains[domain]), 1) if domain in s.domains else (0, 0)


def goal_sums(scores: Sequence[EpisodeScore], goal_ids: Sequence[str], parts: Any) -> tuple[np.ndarray, np.ndarray]:
    """Per goal (in ``goal_ids`` order), the integer numerator and denominator sums of
    ``parts(score)`` over the goal's episodes (every seed)."""
    index = {goal: i for i, goal in enumerate(goal_ids)}
    num = np.zeros(len(goal_ids), dtype=np.int64)
    den = np.zeros(len(goal_ids), dtype=np.int64)
    for score in scores:
        n, d = parts(score)
        num[index[score.dialogue_id]] += n
        den[index[score.dialogue_id]] += d
    return num, den


def bootstrap_summary(
    scores_by_model: Mapping[str, Sequence[EpisodeScore]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Avg@k per model (:func:`avg_at_k`) with a 95 % interval (``ci95_low``, ``ci95_high``)
    on every rate and per-domain success, and the paired comparisons of :data:`COMPARED`
    between every two models.
    Every model must have played the same goals."""
    return bootstrap_summary_seeds({name: [scores] for name, scores in scores_by_model.items()},
                                   resamples=resamples, seed=seed, alpha=alpha)


def seeds_resampled_ratios(nums: Sequence[np.ndarray], dens: Sequence[np.ndarray], indices: np.ndarray,
                           draws: np.ndarray | None) -> np.ndarray:
    """One ratio per resample of a policy trained under ``len(nums)`` seeds: the goals of
    ``indices`` and, with ``draws``, the seeds drawn with replacement (seed k of every row
    draws the same column: paired rows pair their seeds); one seed is
    :func:`pipelines.stats.resampled_ratios`.

    >>> indices = np.array([[0, 1], [1, 1]])
    >>> seeds_resampled_ratios([np.array([1, 0])], [np.array([1, 1])], indices, None).tolist()
    [0.5, 0.0]
    >>> seeds_resampled_ratios([np.array([1, 0]), np.array([1, 1])], [np.array([1, 1])] * 2, indices,
    ...                        np.array([[1, 1], [0, 1]])).tolist()
    [1.0, 0.5]
    """
    if len(nums) == 1:
        return _resampled_ratios(nums[0], dens[0], indices)
    if draws is None or draws.shape[1] != len(nums):
        raise ValueError(f"{len(nums)} training seeds need seed draws of as many columns")
    columns = np.arange(len(indices))
    num = np.stack([n[indices].sum(axis=1) for n in nums])[draws.T, columns].sum(axis=0)
    den = np.stack([d[indices].sum(axis=1) for d in dens])[draws.T, columns].sum(axis=0)
    out = np.full(len(indices), np.nan)
    np.divide(num, den, out=out, where=den > 0)
    return out


def bootstrap_summary_seeds(
    scores_by_row: Mapping[str, Sequence[Sequence[EpisodeScore]]],
    *,
    resamples: int = 2000,
    seed: int = 0,
    alpha: float = 0.05,
) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """:func:`bootstrap_summary` where a row is one policy trained under one or several seeds
    (``scores_by_row[row][k]``: training seed k's episodes; issue 28: intervals over goals
    alone miss what a re-training moves). A resample draws the goals and, for rows of several
    seeds, the seeds too (with replacement; rows of one seed, an untrained model, keep theirs);
    rows with several seeds must have as many, and seed k of one is paired with seed k of
    another (DPO from SFT seed k). All rows of one seed: the same figures as before."""
    goal_sets = {name: sorted({s.dialogue_id for scores in per_seed for s in scores}) for name, per_seed in scores_by_row.items()}
    goal_ids = next(iter(goal_sets.values()), [])
    if any(ids != goal_ids for ids in goal_sets.values()):
        raise ValueError("every model must play the same goals for a paired comparison")
    counts = {name: len(per_seed) for name, per_seed in scores_by_row.items()}
    k = max(counts.values(), default=1)
    if any(n not in (1, k) for n in counts.values()):
        raise ValueError(f"rows trained under several seeds must have as many to be paired: {counts}")
    indices = resample_indices(len(goal_ids), resamples, seed)
    draws = seed_draws(k, resamples, seed)
    results: dict[str, dict[str, Any]] = {}
    resampled: dict[str, dict[str, np.ndarray]] = {}
    for name, per_seed in scores_by_row.items():
        row_draws = draws if len(per_seed) > 1 else None
        summary = avg_over_training_seeds(per_seed)
        resampled[name] = {}
        for key, parts in RATE_PARTS.items():
            sums = [goal_sums(scores, goal_ids, parts) for scores in per_seed]
            resampled[name][key] = seeds_resampled_ratios([n for n, _ in sums], [d for _, d in sums], indices, row_draws)
            if summary.get(key) is not None:
                summary[key].update(_bounds(_interval(resampled[name][key])))
        for domain, cell in summary["domain_success"].items():
            sums = [goal_sums(scores, goal_ids, _domain_parts(domain)) for scores in per_seed]
            cell.update(_bounds(_interval(seeds_resampled_ratios([n for n, _ in sums], [d for _, d in sums], indices, row_draws))))
        results[name] = summary
    comparisons = paired_comparisons(results, resampled, alpha=alpha)
    setup = {"unit": "goal", "goals": len(goal_ids), "resamples": resamples, "seed": seed, "level": LEVEL,
             "alpha": alpha, "test": "paired bootstrap over goals, two-sided, Holm-adjusted over model pairs per metric"}
    if k > 1:
        setup.update(unit="training seed, then goal", training_seeds=counts,
                     test="paired bootstrap over training seeds (seed k with seed k) and goals, two-sided, "
                          "Holm-adjusted over model pairs per metric")
    return results, {"method": setup, "comparisons": comparisons}


def paired_comparisons(
    results: Mapping[str, Mapping[str, Any]],
    resampled: Mapping[str, Mapping[str, np.ndarray]],
    *,
    alpha: float = 0.05,
) -> dict[str, list[dict[str, Any]]]:
    """For each metric of :data:`COMPARED`, every pair of models (table order): the
    difference of the Avg@k means, its paired-bootstrap interval, p-value and Holm-adjusted
    p-value, and whether it is significant at ``alpha``."""
    names = list(results)
    out: dict[str, list[dict[str, Any]]] = {}
    for key in COMPARED:
        rows = []
        for i, a in enumerate(names):
            for b in names[i + 1 :]:
                if results[a].get(key) is None or results[b].get(key) is None:
                    continue
                diff = resampled[a][key] - resampled[b][key]
                diff = diff[~np.isnan(diff)]
                if not len(diff):
                    continue
                p = min(1.0, 2.0 * min(float(np.mean(diff <= 0)), float(np.mean(diff >= 0))))
                rows.append({
                    "a": a, "b": b,
                    "difference": round(results[a][key]["mean"] - results[b][key]["mean"], 6),
                    "ci95": _interval(diff),
                    "p": round(p, 6),
                })
        for row, adjusted in zip(rows, _holm([r["p"] for r in rows])):
            row["p_holm"] = round(adjusted, 6)
            row["significant"] = adjusted < alpha
        out[key] = rows
    return out
