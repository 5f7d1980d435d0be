"""The Clarifier's training data (paper section 3.2) from Clarifier-augmented episodes.

Every τ-bench task of the given splits is played once by an agent with the *teacher*
Clarifier plugged into the runner; every consultation of the teacher is a *state* (the
dialogue so far, ending with a tool call and its result). From each state:

* **SFT**: the teacher's think-mode answer (``NO NEED TO ASK`` or a question);
* **DPO**: two teacher *candidates* (independent samples), judged by a goal-aware judge
  that sees G* (A / B / TIE / BOTH_BAD); only A and B become chosen/rejected pairs;
* **GRPO contexts**: the states whose two candidates got A, B or BOTH_BAD (TIE is
  uninformative): only the history x (as the Clarifier prompt), the rendered history and
  G* are kept; the candidates are discarded (GRPO samples its own, on-policy).

Every judge verdict is counted, including the unparseable ones of an LLM judge (None).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from pipelines.clarifier.grounding import task_goal
from pipelines.clarifier.judge import GoalJudge, JudgeState
from pipelines.clarifier.prompts import ClarifierDecision, clarifier_messages
from pipelines.env.taubench.data import TauTask
from pipelines.env.world import World
from pipelines.episodes.agents import Agent
from pipelines.episodes.clarify import ClarifyContext
from pipelines.episodes.records import Episode
from pipelines.episodes.runner import RunnerConfig, run_episodes
from pipelines.episodes.taubench import tau_specs
from pipelines.simulators.base import UserSimulator

ASK, NO_NEED_KIND = "ask", "no_need"
WIN_LOSE = ("A", "B")
SCREENED = ("A", "B", "BOTH_BAD")


class RecordingClarifier:
    """A Clarifier that records every state it was consulted at and what it answered."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.name = inner.name
        self.records: list[tuple[ClarifyContext, ClarifierDecision]] = []

    async def decide(self, contexts: Sequence[ClarifyContext]) -> list[ClarifierDecision]:
        decisions = await self.inner.decide(contexts)
        self.records.extend(zip(contexts, decisions))
        return decisions


@dataclass(frozen=True)
class ClarifierState:
    """One consultation of the teacher, with its two candidates and the judge's verdict."""

    state_id: str
    task: TauTask
    split: str
    context: ClarifyContext
    teacher: ClarifierDecision
    candidates: tuple[ClarifierDecision, ClarifierDecision]
    verdict: str | None


@dataclass
class ClarifierData:
    states: list[ClarifierState]
    episodes: list[Episode]
    judge_stats: dict[str, Any] = field(default_factory=dict)

    def metrics(self) -> dict[str, Any]:
        verdicts = Counter("unparseable" if s.verdict is None else s.verdict for s in self.states)
        return {
            "episodes": len(self.episodes),
            "episodes_passed": sum(e.success for e in self.episodes),
            "states": len(self.states),
            "sft": {"rows": sum(not s.teacher.malformed for s in self.states), ASK: sum(s.teacher.asks for s in self.states),
                    NO_NEED_KIND: sum(not s.teacher.asks and not s.teacher.malformed for s in self.states),
                    "teacher_malformed": sum(s.teacher.malformed for s in self.states)},
            "judge_outcomes": {k: verdicts.get(k, 0) for k in ("A", "B", "TIE", "BOTH_BAD", "unparseable")},
            "dpo_pairs": sum(s.verdict in WIN_LOSE for s in self.states),
            "grpo_contexts": sum(s.verdict in SCREENED for s in self.states),
            "judge": self.judge_stats,
        }


def collect(
    tasks: Mapping[str, Sequence[TauTask]],
    world: World,
    make_agent: Callable[[dict[str, TauTask]], Agent],
    user: UserSimulator,
    config: RunnerConfig,
    teacher: Any,
    candidates: tuple[Any, Any],
    judge: GoalJudge,
    *,
    budget: int | None = 3,
    seed: int = 0,
) -> ClarifierData:
    """Play ``tasks`` (split label -> tasks; e.g. ``{"train": retail train, "val": retail
    dev}``) with the teacher, then sample two candidates per state and judge them."""
    specs = [spec for split_tasks in tasks.values() for spec in tau_specs(split_tasks, seed)]
    split_of = {task.task_id: split for split, split_tasks in tasks.items() for task in split_tasks}
    agent = make_agent({spec.episode_id: spec.goal for spec in specs})
    recorder = RecordingClarifier(teacher)
    episodes = asyncio.run(run_episodes(specs, agent, user, world, config, recorder, budget))
    contexts = [context for context, _ in recorder.records]
    first, second = (asyncio.run(c.decide(contexts)) for c in candidates)
    judge_states = [JudgeState(context.history, task_goal(context.goal)) for context in contexts]
    verdicts = judge.prefer(judge_states, list(zip(first, second))) if contexts else []
    states = [
        ClarifierState(f"{context.episode_id}@{context.step}", context.goal, split_of[context.goal.task_id], context, decision, (a, b), verdict)
        for (context, decision), a, b, verdict in zip(recorder.records, first, second, verdicts)
    ]
    return ClarifierData(states, episodes, judge.stats.as_dict())


def _assistant(text: str) -> list[dict[str, str]]:
    return [{"role": "assistant", "content": text}]


def sft_rows(data: ClarifierData, prompt_cut: tuple[int | None, int | None] = (None, None)) -> list[dict[str, Any]]:
    return [
        {
            "state_id": s.state_id, "dialogue_id": s.task.task_id, "split": s.split, "tool_name": s.context.tool_name,
            "prompt": clarifier_messages(s.context.history, *prompt_cut), "completion": _assistant(s.teacher.raw),
            "kind": ASK if s.teacher.asks else NO_NEED_KIND,
        }
        for s in data.states
        if not s.teacher.malformed  # an unreadable teacher answer teaches nothing
    ]


def dpo_rows(data: ClarifierData, prompt_cut: tuple[int | None, int | None] = (None, None)) -> list[dict[str, Any]]:
    rows = []
    for s in data.states:
        if s.verdict not in WIN_LOSE:
            continue
        chosen, rejected = s.candidates if s.verdict == "A" else s.candidates[::-1]
        rows.append({
            "state_id": s.state_id, "dialogue_id": s.task.task_id, "split": s.split,
            "prompt": clarifier_messages(s.context.history, *prompt_cut), "chosen": _assistant(chosen.raw), "rejected": _assistant(rejected.raw),
            "chosen_final": chosen.final, "rejected_final": rejected.final, "preference": s.verdict,
        })
    return rows


def grpo_rows(data: ClarifierData, prompt_cut: tuple[int | None, int | None] = (None, None)) -> list[dict[str, Any]]:
    import json

    return [
        {
            "state_id": s.state_id, "dialogue_id": s.task.task_id, "split": s.split,
            "prompt": clarifier_messages(s.context.history, *prompt_cut), "history": s.context.history,
            "goal": json.dumps(task_goal(s.task), ensure_ascii=False, sort_keys=True), "screen": s.verdict,
        }
        for s in data.states
        if s.verdict in SCREENED
    ]
