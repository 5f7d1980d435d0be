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
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pipelines.episodes.records import Episode
from pipelines.multiwoz.ontology import is_dont_care
from pipelines.records import Goal
from pipelines.rewards.verifiable import VerifiableJudge, words

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


def goal_slot_values(goal: Goal) -> dict[str, list[str]]:
    """Every constraint the goal can make the user say: slot -> values (``info``,
    ``fail_info``, ``book``, ``fail_book`` of every domain; "don't care" left out)."""
    values: dict[str, list[str]] = defaultdict(list)
    for domain in goal.domains:
        for part in (domain.info, domain.fail_info, domain.book, domain.fail_book):
            for slot, value in part.items():
                if not is_dont_care(value) and str(value) not in values[slot]:
                    values[slot].append(str(value))
    return dict(values)


def _said(value: str, said: str) -> bool:
    needle = words(value)
    return bool(needle) and f" {needle} " in said


def clarification_verdicts(episode: Episode, goal: Goal) -> list[float]:
    """The verifiable judge's score of each clarification question, in order (docstring)."""
    slots = goal_slot_values(goal)
    said = " "
    scores = []
    for event in episode.events:
        if event.kind == "user" and event.text:
            said += f"{words(event.text)} "
        elif event.kind == "clarify":
            known = sorted(s for s, values in slots.items() if any(_said(v, said) for v in values))
            open_slots = sorted(s for s in slots if s not in known)
            verdict = _JUDGE.verdict(event.text or "", {"discriminating_slots": open_slots, "known_slots": known})
            scores.append(verdict.score)
    return scores


def _rate(flags: Iterable[bool | None]) -> tuple[int, int]:
    applicable = [f for f in flags if f is not None]
    return sum(applicable), len(applicable)


def score_episode(episode: Episode, goal: Goal) -> EpisodeScore:
    domains = episode.result.domains
    verdicts = clarification_verdicts(episode, goal)
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
        n_discriminating=int(sum(verdicts)),
        n_malformed=episode.n_malformed,
        n_agent_fallbacks=episode.n_agent_fallbacks,
    )


def mean_std(values: Sequence[float]) -> dict[str, float]:
    """``{"mean", "std"}``: the sample standard deviation (0 for a single run)."""
    values = [float(v) for v in values]
    if not values:
        raise ValueError("no runs to average")
    return {"mean": statistics.fmean(values), "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def _pooled(pairs: Iterable[tuple[int, int]]) -> float | None:
    hits = total = 0
    for h, t in pairs:
        hits, total = hits + h, total + t
    return hits / total if total else None


def run_rates(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """One seeded run's rates (one episode per goal)."""
    n = len(scores)
    if not n:
        raise ValueError("a run without episodes")
    domain_flags: dict[str, list[bool]] = defaultdict(list)
    for score in scores:
        for domain, ok in score.domains.items():
            domain_flags[domain].append(ok)
    questions = sum(s.n_clarifications for s in scores)
    return {
        "success": sum(s.success for s in scores) / n,
        "turns": sum(s.n_turns for s in scores) / n,
        "inform_rate": _pooled(s.inform for s in scores),
        "book_rate": _pooled(s.book for s in scores),
        "request_rate": _pooled(s.request for s in scores),
        "clarifications_per_dialogue": questions / n,
        "discriminating_share": sum(s.n_discriminating for s in scores) / questions if questions else None,
        "malformed_per_dialogue": sum(s.n_malformed for s in scores) / n,
        "fallbacks_per_dialogue": sum(s.n_agent_fallbacks for s in scores) / n,
        "domain_success": {d: sum(f) / len(f) for d, f in sorted(domain_flags.items())},
    }


def avg_at_k(scores: Sequence[EpisodeScore]) -> dict[str, Any]:
    """Avg@k over the seeded runs in ``scores`` (grouped by seed): every rate's mean and
    std across runs; a rate that applies to no episode of a run is left out of that run
    (``None`` when it applies in none). ``runs``: the seeds, ``episodes``: the total."""
    by_seed: dict[int, list[EpisodeScore]] = defaultdict(list)
    for score in scores:
        by_seed[score.seed].append(score)
    runs = [run_rates(by_seed[seed]) for seed in sorted(by_seed)]
    summary: dict[str, Any] = {"runs": len(runs), "episodes": len(scores), "seeds": sorted(by_seed)}
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


#: How the runner words a malformed output that is an agent backend failure (no output at all).
AGENT_NO_OUTPUT = "the agent produced no output ("


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
