"""ToolWOZ evaluation: an agent plays goals once per seed, without branching; the scores are
the paper's (Table 1): **average reward** (met goal APIs / all goal APIs, averaged over the
episodes) and **100 % success rate** (episodes with reward 1).

Episodes are stepped together like the evaluation runner does: each round every episode
waiting for the user hears it (concurrently), then every episode waiting for the agent goes
into one ``agent.act`` call (one batch for a local model, concurrent requests for an
endpoint).
"""

from __future__ import annotations

import asyncio
import json
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pipelines.env.toolwoz import ToolWozDatabase, ToolWozEnvironment
from pipelines.episodes.agents import Agent
from pipelines.episodes.runner import DONE, WAITS_FOR_AGENT, WAITS_FOR_USER, EpisodeSpec, EpisodeState, RunnerConfig
from pipelines.josh.beam import ERROR_EVENT_KINDS
from pipelines.josh.env import RunnerToolWoz
from pipelines.josh.goals import JoshGoal
from pipelines.simulators.base import UserSimulator


@dataclass(frozen=True)
class ToolWozEpisode:
    """One played goal: its reward, whether it is a 100 % success, and what happened."""

    dialogue_id: str
    seed: int
    agent: str
    n_goal_apis: int
    n_met: int
    reward: float
    success: bool
    exchanges: int
    ended_by: str
    errors: int
    # Evidence of how an agent failed: its api calls, its unparseable outputs (malformed or
    # fallback) and the api calls the environment rejected (an unknown api or argument).
    tool_calls: int = 0
    malformed: int = 0
    rejected_calls: int = 0
    messages_json: str = "[]"


async def play_toolwoz(
    goals: Sequence[JoshGoal],
    agent: Agent,
    simulator: UserSimulator,
    database: ToolWozDatabase,
    *,
    seeds: Sequence[int] = (0,),
    max_turns: int = 12,
    task_prompt: str | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> list[ToolWozEpisode]:
    """Every goal once per seed, in (goal, seed) order; ``progress(finished, total)`` after
    every round."""
    config = RunnerConfig(max_exchanges=max_turns, **({"task_prompt": task_prompt} if task_prompt else {}))
    states = []
    for goal in goals:
        for seed in seeds:
            spec = EpisodeSpec(f"{goal.goal_id}#{seed}", goal.dialogue.goal, seed, goal.dialogue)
            states.append(EpisodeState(
                spec, agent_name=agent.name, fmt=agent.format, simulator_name=simulator.name,
                environment=RunnerToolWoz(ToolWozEnvironment(database, goal.task)),  # type: ignore[arg-type]
                session=simulator.session(goal.dialogue.goal, seed, goal.dialogue), config=config,
            ))
    while True:
        await asyncio.gather(*(s.hear_user() for s in states if s.phase == WAITS_FOR_USER))
        waiting = [s for s in states if s.phase == WAITS_FOR_AGENT]
        if not waiting:
            break
        outputs = await agent.act([s.context() for s in waiting])
        for state, output in zip(waiting, outputs):
            state.take(output)
        if progress is not None:
            progress(sum(s.phase == DONE for s in states), len(states))
    if progress is not None:
        progress(len(states), len(states))
    episodes = []
    for state in states:
        assert state.phase == DONE
        score = state.environment.progress()  # type: ignore[attr-defined]
        episodes.append(ToolWozEpisode(
            dialogue_id=state.spec.goal.dialogue_id, seed=state.spec.seed, agent=agent.name, n_goal_apis=score.total,
            n_met=score.n_met, reward=score.reward, success=score.success, exchanges=state.exchange + 1,
            ended_by=state.ended_by or "", errors=sum(1 for e in state.events if e.kind in ERROR_EVENT_KINDS or
                                                       (e.kind == "observation" and e.detail is not None)),
            tool_calls=sum(1 for e in state.events if e.kind == "tool_call"),
            malformed=sum(1 for e in state.events if e.kind in ERROR_EVENT_KINDS),
            rejected_calls=sum(1 for e in state.events if e.kind == "observation" and e.detail is not None),
            messages_json=json.dumps(state.messages[1:], ensure_ascii=False, default=str),  # the system prompt is the format's
        ))
    return episodes


def toolwoz_scores(episodes: Sequence[ToolWozEpisode]) -> dict[str, Any]:
    """Average reward and 100 % success rate over the episodes (the paper's two columns).

    >>> e = [ToolWozEpisode("a", 0, "x", 2, 1, 0.5, False, 3, "user_end", 0),
    ...      ToolWozEpisode("b", 0, "x", 1, 1, 1.0, True, 2, "user_end", 0)]
    >>> toolwoz_scores(e)
    {'episodes': 2, 'goals': 2, 'avg_reward': 0.75, 'success_rate': 0.5}
    """
    n = len(episodes)
    return {
        "episodes": n,
        "goals": len({e.dialogue_id for e in episodes}),
        "avg_reward": sum(e.reward for e in episodes) / n if n else 0.0,
        "success_rate": sum(e.success for e in episodes) / n if n else 0.0,
    }


def toolwoz_intervals(episodes: Sequence[ToolWozEpisode], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """95 % bootstrap intervals of the average reward and the 100 % success rate, the goals
    resampled with replacement (all seeds of a goal together), as the evaluation's
    :func:`pipelines.evaluation.metrics.bootstrap_summary` does.

    >>> e = [ToolWozEpisode("a", 0, "x", 2, 1, 0.5, False, 3, "user_end", 0),
    ...      ToolWozEpisode("b", 0, "x", 1, 1, 1.0, True, 2, "user_end", 0)]
    >>> toolwoz_intervals(e, resamples=200)
    {'avg_reward_ci95': [0.5, 1.0], 'success_rate_ci95': [0.0, 1.0], 'resamples': 200, 'seed': 0, 'unit': 'goal'}
    """
    import numpy as np

    from pipelines.stats import interval, resample_indices, resampled_ratios

    goals = sorted({e.dialogue_id for e in episodes})
    if not goals:
        return {"avg_reward_ci95": None, "success_rate_ci95": None, "resamples": resamples, "seed": seed, "unit": "goal"}
    where = {g: i for i, g in enumerate(goals)}
    reward, success, count = np.zeros(len(goals)), np.zeros(len(goals)), np.zeros(len(goals))
    for e in episodes:
        reward[where[e.dialogue_id]] += e.reward
        success[where[e.dialogue_id]] += e.success
        count[where[e.dialogue_id]] += 1
    indices = resample_indices(len(goals), resamples, seed)
    return {"avg_reward_ci95": interval(resampled_ratios(reward, count, indices)),
            "success_rate_ci95": interval(resampled_ratios(success, count, indices)),
            "resamples": resamples, "seed": seed, "unit": "goal"}


def toolwoz_summary(episodes: Sequence[ToolWozEpisode]) -> dict[str, Any]:
    """The paper's two scores and, as evidence of how an agent fails, per episode means of
    its api calls, unparseable outputs and rejected calls, and how episodes ended."""
    n = len(episodes) or 1
    ended: dict[str, int] = {}
    for e in episodes:
        ended[e.ended_by] = ended.get(e.ended_by, 0) + 1
    return {
        **toolwoz_scores(episodes),
        **toolwoz_intervals(episodes),
        "tool_calls_per_episode": sum(e.tool_calls for e in episodes) / n,
        "malformed_per_episode": sum(e.malformed for e in episodes) / n,
        "rejected_calls_per_episode": sum(e.rejected_calls for e in episodes) / n,
        "ended_by": dict(sorted(ended.items())),
    }
