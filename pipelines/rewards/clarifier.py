"""The Clarifier paper's goal-aware GRPO reward (section 3.3): ``clarifier_goal`` and
``clarifier_goal_llm`` of the registry (:mod:`pipelines.rewards`).

For a state x (the Clarifier prompt), TRL samples a group of k think-mode completions; from
each only the final decision is kept (``NO NEED TO ASK`` or the question,
:func:`pipelines.clarifier.prompts.parse_clarifier`). A judge that sees the task's ground truth
G* scores the group's finals with utilities in [0, 10] (:mod:`pipelines.clarifier.judge`:
``rules`` offline, the paper's GRPO judge prompt over the ``judge`` role); the reward of
candidate i is r_i = u_i / 10, and GRPO's advantage is the centred A_i = r_i - mean(r) of
the group (TRL with ``scale_rewards: none`` computes exactly that; ``group`` also divides
by the group's standard deviation). :func:`centred_advantages` is that step, for reports
and tests.

Columns (``clarifier_grpo``): ``history`` (x as text) and ``goal`` (G*, JSON). A group is a
run of consecutive samples with the same history and goal, as TRL lays out the
``num_generations`` completions of one prompt; an LLM judge scores a group in one call
(its ranking is relative), the rules judge each candidate on its own. A group the judge
could not score gets None rewards (left out by TRL), never a silent 0.
"""

from __future__ import annotations

import json
import logging
from typing import Any, Callable, Sequence

from pipelines.clarifier.judge import JudgeState, LLMGoalJudge, RulesGoalJudge
from pipelines.clarifier.prompts import parse_clarifier
from pipelines.rewards.format import completion_text

logger = logging.getLogger(__name__)

GOAL, HISTORY = "goal", "history"


def centred_advantages(rewards: Sequence[float]) -> list[float]:
    """A_i = r_i - mean(r) over one group (section 3.3).

    >>> centred_advantages([1.0, 0.2, 0.3])
    [0.5, -0.3, -0.2]
    """
    mean = sum(rewards) / len(rewards)
    return [round(r - mean, 10) for r in rewards]


def _groups(keys: Sequence[Any]) -> list[range]:
    groups, start = [], 0
    for i in range(1, len(keys) + 1):
        if i == len(keys) or keys[i] != keys[start]:
            groups.append(range(start, i))
            start = i
    return groups


class GoalAwareClarifierReward:
    """TRL reward ``f(prompts, completions, goal=, history=, ...) -> list[float | None]``.

    >>> goal = json.dumps({"task_id": "retail/train/0", "user_id": "ann_lee_1", "instruction": "Cancel order #W1.",
    ...     "actions": [{"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}}], "outputs": []})
    >>> reward = GoalAwareClarifierReward(RulesGoalJudge())
    >>> reward(["x"] * 2, ["YES [QUESTION]Which order is it? Please give me the order id.[/QUESTION]", "NO NEED TO ASK"],
    ...        goal=[goal] * 2, history=["User: I'd like to cancel an order."] * 2)
    [1.0, 0.3]
    """

    columns: tuple[str, ...] = (GOAL, HISTORY)

    def __init__(self, judge: Any, name: str = "clarifier_goal"):
        self.judge = judge
        self.__name__ = name

    def __repr__(self) -> str:
        return f"GoalAwareClarifierReward({type(self.judge).__name__}, name={self.__name__!r})"

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        goals, histories = kwargs.get(GOAL), kwargs.get(HISTORY)
        if goals is None or histories is None:
            raise ValueError(f"{self.__name__}: the dataset needs the columns {GOAL!r} and {HISTORY!r} (clarifier_grpo)")
        if not len(prompts) == len(completions) == len(goals) == len(histories):
            raise ValueError(f"{self.__name__}: {len(prompts)} prompts, {len(completions)} completions, {len(goals)} goals, {len(histories)} histories")
        decisions = [parse_clarifier(completion_text(c)) for c in completions]
        rewards: list[float | None] = [None] * len(completions)
        for group in _groups(list(zip(histories, goals))):
            state = JudgeState(histories[group.start], json.loads(goals[group.start]))
            scores = self.judge.score(state, [decisions[i] for i in group])
            if scores is None:
                logger.warning("%s: the judge could not score a group of %d", self.__name__, len(group))
                continue
            for i, score in zip(group, scores):
                rewards[i] = score / 10.0
        log_metric: Callable[[str, float], None] | None = kwargs.get("log_metric")
        if log_metric is not None and decisions:
            log_metric(f"{self.__name__}/asked", sum(d.asks for d in decisions) / len(decisions))
            log_metric(f"{self.__name__}/malformed", sum(d.malformed for d in decisions) / len(decisions))
        return rewards


clarifier_goal = GoalAwareClarifierReward(RulesGoalJudge())
clarifier_goal.__doc__ = """Goal-aware Clarifier reward: each final decision's utility / 10, G* judged offline by the rules judge.

>>> goal = json.dumps({"task_id": "retail/train/0", "user_id": "ann_lee_1", "instruction": "Cancel order #W1.",
...     "actions": [{"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}}], "outputs": []})
>>> clarifier_goal(["x"] * 2, ["YES [QUESTION]Which order is it? Please give me the order id.[/QUESTION]", "NO NEED TO ASK"],
...                goal=[goal] * 2, history=["User: I'd like to cancel an order."] * 2)
[1.0, 0.3]
"""


def clarifier_goal_llm(client: Any) -> GoalAwareClarifierReward:
    """Goal-aware Clarifier reward judged by the paper's GRPO judge prompt over ``client`` (the ``judge`` role).

    >>> from types import SimpleNamespace
    >>> class Judge:  # stands in for the LLM client: one reply per group, the paper's "Scores" line
    ...     def complete_many_sync(self, requests): return [SimpleNamespace(text='"Scores": [8, 2]')] * len(requests)
    >>> reward = clarifier_goal_llm(Judge())
    >>> reward.__name__, reward(["x"] * 2, ["YES [QUESTION]Which order?[/QUESTION]", "NO NEED TO ASK"],
    ...                         goal=['{"task_id": "t", "actions": []}'] * 2, history=["User: hi"] * 2)
    ('clarifier_goal_llm', [0.8, 0.2])
    """
    return GoalAwareClarifierReward(LLMGoalJudge(client), name="clarifier_goal_llm")


#: The registered rewards' examples, run by doctest (an instance's docstring is not collected).
__test__ = {"clarifier_goal": clarifier_goal.__doc__}
