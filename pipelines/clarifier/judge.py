"""Goal-aware judges of Clarifier outputs: they see the task's ground truth G*.

Two questions are asked of a judge, both about extracted final outputs (``NO NEED TO ASK``
or the question; never the reasoning):

* ``prefer(state, a, b)``: the DPO judge's A / B / TIE / BOTH_BAD (appendix 7.1's prompt);
* ``score(state, finals)``: the GRPO judge's 0-10 score per candidate of a group.

:class:`RulesGoalJudge` (offline) answers both from :func:`pipelines.clarifier.grounding.utility`;
:class:`LLMGoalJudge` sends the paper's prompts (role ``judge``) with G* as the "user
requirement". A failed or unreadable LLM verdict is None, counted in ``stats``, never a
silent preference.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

from pipelines.clarifier.grounding import goal_task, preference, utility
from pipelines.clarifier.prompts import (
    DPO_JUDGE_PROMPT,
    GRPO_JUDGE_PROMPT,
    ClarifierDecision,
    candidates_block,
    parse_preference,
    parse_scores,
)
from pipelines.llm import CompletionRequest, Failure, LLMClient, SamplingParams


@dataclass(frozen=True)
class JudgeState:
    """What a goal-aware judge sees: the dialogue so far (x) and G* (:func:`task_goal`'s record)."""

    history: str
    goal: dict[str, Any]

    @property
    def requirement(self) -> str:
        return json.dumps(self.goal, ensure_ascii=False)


@dataclass
class GoalJudgeStats:
    calls: int = 0
    failures: int = 0
    unparseable: int = 0
    outcomes: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "failures": self.failures, "unparseable": self.unparseable, "outcomes": dict(self.outcomes)}


class GoalJudge(Protocol):
    name: str
    stats: GoalJudgeStats

    def prefer(self, states: Sequence[JudgeState], pairs: Sequence[tuple[ClarifierDecision, ClarifierDecision]]) -> list[str | None]: ...

    def score(self, state: JudgeState, candidates: Sequence[ClarifierDecision]) -> list[float] | None: ...


class RulesGoalJudge:
    """The offline goal-aware judge: utilities from the task's ground truth (module docstring)."""

    name = "rules"
    columns: tuple[str, ...] = ("goal", "history")  # what a reward over this judge reads

    def __init__(self) -> None:
        self.stats = GoalJudgeStats()

    def utilities(self, state: JudgeState, candidates: Sequence[ClarifierDecision]) -> list[tuple[float, str]]:
        task = goal_task(state.goal)
        return [utility(task, state.history, c.question, malformed=c.malformed) for c in candidates]

    def prefer(self, states: Sequence[JudgeState], pairs: Sequence[tuple[ClarifierDecision, ClarifierDecision]]) -> list[str | None]:
        verdicts = []
        for state, (a, b) in zip(states, pairs, strict=True):
            (u_a, _), (u_b, _) = self.utilities(state, (a, b))
            verdict = preference(u_a, u_b)
            self.stats.calls += 1
            self.stats.outcomes[verdict] += 1
            verdicts.append(verdict)
        return verdicts

    def score(self, state: JudgeState, candidates: Sequence[ClarifierDecision]) -> list[float] | None:
        self.stats.calls += 1
        return [u for u, _ in self.utilities(state, candidates)]


class LLMGoalJudge:
    """The paper's DPO and GRPO judge prompts over ``client`` (role ``judge``), greedy and
    seeded so that a verdict is a function of its prompt (and the response cache's key)."""

    name = "llm"
    columns: tuple[str, ...] = ("goal", "history")

    def __init__(self, client: LLMClient, sampling: SamplingParams | None = None, *, role: str = "judge", seed: int = 0):
        self.client = client
        self.sampling = sampling if sampling is not None else SamplingParams(temperature=0.0, max_tokens=512)
        self.role = role
        self.seed = seed
        self.stats = GoalJudgeStats()

    def _request(self, prompt: str) -> CompletionRequest:
        return CompletionRequest([{"role": "user", "content": prompt}], self.role, self.sampling, self.seed)

    def prefer(self, states: Sequence[JudgeState], pairs: Sequence[tuple[ClarifierDecision, ClarifierDecision]]) -> list[str | None]:
        requests = [
            self._request(DPO_JUDGE_PROMPT.format(requirement=s.requirement, history=s.history, a=a.final, b=b.final))
            for s, (a, b) in zip(states, pairs, strict=True)
        ]
        verdicts: list[str | None] = []
        for result in self.client.complete_many_sync(requests):
            self.stats.calls += 1
            if isinstance(result, Failure):
                self.stats.failures += 1
                verdicts.append(None)
                continue
            verdict = parse_preference(result.text)
            if verdict is None:
                self.stats.unparseable += 1
            else:
                self.stats.outcomes[verdict] += 1
            verdicts.append(verdict)
        return verdicts

    def score(self, state: JudgeState, candidates: Sequence[ClarifierDecision]) -> list[float] | None:
        prompt = GRPO_JUDGE_PROMPT.format(
            requirement=state.requirement, history=state.history, candidates=candidates_block([c.final for c in candidates]), n=len(candidates)
        )
        (result,) = self.client.complete_many_sync([self._request(prompt)])
        self.stats.calls += 1
        if isinstance(result, Failure):
            self.stats.failures += 1
            return None
        scores = parse_scores(result.text, len(candidates))
        if scores is None:
            self.stats.unparseable += 1
        return scores
