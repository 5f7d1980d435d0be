"""Continuous batching for an evaluation: :func:`pipelines.evaluation.play.play_policy`'s episodes
played with :mod:`pipelines.episodes.continuous` (the GPU profile's ``evaluate.continuous``)."""

from __future__ import annotations

import asyncio
from typing import Any, Callable, Sequence

from pipelines.episodes.continuous import ContinuousHFAgent, play_continuous
from pipelines.episodes.records import Episode
from pipelines.episodes.runner import EpisodeState
from pipelines.evaluation.play import episode_specs


def play_policy_continuous(agent: Any, dialogues: Sequence[Any], simulator: Any, database: Any, plan: Any,
                           progress: Callable[[int, int], Any] | None = None, *, attention: str = "sdpa",
                           draft: tuple[int, int] | None = None) -> list[Episode]:
    """:func:`~pipelines.evaluation.play.play_policy`'s episodes (the same ids, specs and
    order) played with continuous batching: ``agent`` (an hf agent, or one behind a prompt
    rewriter) wrapped in a :class:`~pipelines.episodes.continuous.ContinuousHFAgent` for this
    play, whose slot step attends with ``attention`` and verifies ``draft``'s prompt-lookup
    drafts (``(tokens, ngram)``). A plan that is not ``batched`` gets one slot and no drafts:
    every call is decoded alone, one id per step, by the same step (one dialogue at a time, as
    far as the arithmetic goes)."""
    continuous = ContinuousHFAgent(agent, slots=None if plan.batched else 1, attention=attention,
                                   draft=draft if plan.batched else None)
    specs = episode_specs(dialogues, plan.seeds, prefix=f"{agent.name}/")
    states = [EpisodeState.start(spec, continuous, simulator, database, plan.runner) for spec in specs]
    return asyncio.run(play_continuous(states, continuous, progress))
