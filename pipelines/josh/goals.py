"""ToolWOZ goals from any MultiWOZ-layout corpus (JOSH paper, appendix A).

A goal is a dialogue whose goal has goal APIs (:func:`pipelines.env.toolwoz.derive_goal_apis`)
and no taxi, police or hospital domain: ToolWOZ has no tools for those, so a user who
wants a taxi could never be served. Train goals are harvested; test goals evaluate; the
official test set is the first 450 sorted ids of the test list that are goals (on the
embedded corpus the same rule over its own test list).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable, Mapping

from pipelines.env.toolwoz import TEST_SET_SIZE, TOOLWOZ_DOMAINS, ToolWozDatabase, ToolWozTask, derive_goal_apis, toolwoz_test_ids
from pipelines.records import Dialogue


@dataclass(frozen=True)
class JoshGoal:
    """One ToolWOZ goal: the seed dialogue (its goal drives the user simulator), its goal
    APIs and its corpus split."""

    dialogue: Dialogue
    task: ToolWozTask
    split: str

    @property
    def goal_id(self) -> str:
        return self.dialogue.dialogue_id

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(self.task.domains)


def toolwoz_goals(dialogues: Iterable[Dialogue], splits: Mapping[str, str], database: ToolWozDatabase) -> list[JoshGoal]:
    """Every dialogue that is a ToolWOZ goal, in sorted id order."""
    goals = []
    for dialogue in sorted(dialogues, key=lambda d: d.dialogue_id):
        if any(domain not in TOOLWOZ_DOMAINS for domain in dialogue.goal.domain_names):
            continue
        task = derive_goal_apis(dialogue, database)
        if task.has_goal_apis:
            goals.append(JoshGoal(dialogue, task, splits.get(dialogue.dialogue_id, "train")))
    return goals


def harvest_goals(goals: Iterable[JoshGoal], limit: int | None = None) -> list[JoshGoal]:
    """The train goals, the first ``limit`` of them in id order (None: all)."""
    train = [g for g in goals if g.split == "train"]
    return train if limit is None else train[:limit]


def evaluation_goals(goals: Iterable[JoshGoal], test_list_ids: Iterable[str], limit: int = TEST_SET_SIZE) -> list[JoshGoal]:
    """The official test set: the first ``limit`` sorted ids of the test list that are goals."""
    goals = list(goals)
    by_id = {g.goal_id: g for g in goals}
    return [by_id[i] for i in toolwoz_test_ids(test_list_ids, [g.task for g in goals], limit)]
