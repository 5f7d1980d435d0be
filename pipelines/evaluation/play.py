"""Simulated collaborative evaluation: a policy plays held-out goals against a user simulator.

Each goal is played once per seed (the seed drives the simulator's phrasing and noise, the
environment's booking references, and the agent's sampling when it samples), so ``k``
seeds give ``k`` runs over the same goals: Avg@k. Generation is batched across
conversations: every episode waiting for the agent goes into one ``act`` call per round
(:func:`pipelines.episodes.runner.play`). ``batched=False`` plays the episodes one at a
time instead, for comparison: same episodes under greedy decoding, much slower.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from pipelines.env.tools import Database
from pipelines.episodes.agents import Agent
from pipelines.episodes.records import Episode
from pipelines.episodes.runner import EpisodeSpec, RunnerConfig, run_episodes_sync
from pipelines.records import Dialogue
from pipelines.simulators.base import UserSimulator


@dataclass(frozen=True)
class EvalPlan:
    """Which goals, how many seeded runs, and the runner's limits (20 agent turns, as in
    SpeakRL's evaluation)."""

    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    runner: RunnerConfig = RunnerConfig(max_exchanges=20)
    batched: bool = True

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds must be distinct and at least one, got {self.seeds!r}")


def held_out_goals(dialogues: Sequence[Dialogue], split: str, max_goals: int | None) -> list[Dialogue]:
    """The first ``max_goals`` dialogues of ``split``, in dialogue id order, whose goals
    need the tools (police and hospital goals only ask for fixed details)."""
    chosen = sorted(
        (d for d in dialogues if d.split == split and any(g.domain not in ("police", "hospital") for g in d.goal.domains)),
        key=lambda d: d.dialogue_id,
    )
    return chosen if max_goals is None else chosen[:max_goals]


def episode_specs(dialogues: Sequence[Dialogue], seeds: Sequence[int], prefix: str = "") -> list[EpisodeSpec]:
    """One spec per (seed, goal), id ``<prefix><dialogue id>#<seed>``; seed-major so that a
    run's episodes are contiguous."""
    return [EpisodeSpec(f"{prefix}{d.dialogue_id}#{seed}", d.goal, seed, None) for seed in seeds for d in dialogues]


def play_policy(
    agent: Agent,
    dialogues: Sequence[Dialogue],
    simulator: UserSimulator,
    database: Database,
    plan: EvalPlan = EvalPlan(),
    progress: Callable[[int, int], Any] | None = None,
) -> list[Episode]:
    """Every (seed, goal) episode played by ``agent``; batched or one at a time (module
    docstring). The reference dialogue is withheld: a policy must not see the gold side."""
    specs = episode_specs(dialogues, plan.seeds, prefix=f"{agent.name}/")
    if plan.batched:
        # progress(finished, total) after every round, and once more at the end
        return run_episodes_sync(specs, agent, simulator, database, plan.runner, progress=progress)
    episodes = []
    for done, spec in enumerate(specs, 1):
        episodes += run_episodes_sync([spec], agent, simulator, database, plan.runner)
        if progress is not None:
            progress(done, len(specs))
    return episodes


def shards(dialogues: Sequence[Dialogue], n: int) -> list[list[Dialogue]]:
    """``dialogues`` in at most ``n`` contiguous, non-empty parts of near-equal size (for
    processes that play a model's goals side by side).

    >>> [len(part) for part in shards(list(range(10)), 4)]
    [3, 3, 2, 2]
    """
    n = max(1, min(n, len(dialogues)))
    size, extra = divmod(len(dialogues), n)
    parts, start = [], 0
    for i in range(n):
        end = start + size + (i < extra)
        parts.append(list(dialogues[start:end]))
        start = end
    return [p for p in parts if p]


def in_play_order(episodes: Sequence[Episode], dialogues: Sequence[Dialogue], seeds: Sequence[int], prefix: str) -> list[Episode]:
    """Episodes played in parts, in the order :func:`play_policy` gives them (seed-major,
    then goal); an episode that is missing or not expected is a ValueError."""
    order = {spec.episode_id: i for i, spec in enumerate(episode_specs(dialogues, seeds, prefix))}
    if sorted(e.episode_id for e in episodes) != sorted(order):
        raise ValueError(f"the parts played {len(episodes)} episodes; expected {len(order)}")
    return sorted(episodes, key=lambda e: order[e.episode_id])
