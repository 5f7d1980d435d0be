"""Rewards of whole conversations (multi-turn GRPO: SpeakRL's chain on the GPU, where the
single-turn rewards start near their ceiling from the SFT model and carry no task signal).

Each reads a column that the rollout (:func:`pipelines.training.rollout.trl_rollout_func`)
gives every played conversation: ``correct`` (the world's grade: MultiWOZ's goal checker),
and the columns of :func:`pipelines.evaluation.metrics.conversation_columns` (``progress``,
``useless_questions``, ``malformed``). The goal is the environment's: the reward is the
environment's verdict on a conversation the policy played without seeing it. A conversation
without the column gets ``None`` (TRL leaves it out of that reward)."""

from __future__ import annotations

from typing import Any, Sequence


def _column(values: Sequence[Any] | None, completions: Sequence[Any], score: Any) -> list[float | None]:
    if values is None:
        return [None] * len(completions)
    return [None if value is None else float(score(value)) for value in values]


def dialogue_success(prompts: Sequence[Any], completions: Sequence[Any], correct: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """1.0 for a conversation the world graded a success, else 0.0.

    >>> dialogue_success(["p", "p"], ["a", "b"], correct=[True, False])
    [1.0, 0.0]
    """
    return _column(correct, completions, bool)


def goal_progress(prompts: Sequence[Any], completions: Sequence[Any], progress: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """The share of the goal's checks (inform, book, request) the conversation met: credit where success is rare.

    >>> goal_progress(["p", "p"], ["a", "b"], progress=[0.5, 1.0])
    [0.5, 1.0]
    """
    return _column(progress, completions, float)


def useless_questions(prompts: Sequence[Any], completions: Sequence[Any], useless_questions: Sequence[Any] | None = None,
                      **_: Any) -> list[float | None]:
    """Minus the questions that asked for nothing the goal constrains and the user had not said (over-asking).

    >>> useless_questions(["p", "p"], ["a", "b"], useless_questions=[0, 2])
    [0.0, -2.0]
    """
    return _column(useless_questions, completions, lambda n: -n)


def malformed_turns(prompts: Sequence[Any], completions: Sequence[Any], malformed: Sequence[Any] | None = None, **_: Any) -> list[float | None]:
    """Minus the turns the agent format could not parse.

    >>> malformed_turns(["p"], ["a"], malformed=[1]), malformed_turns(["p"], ["a"])
    ([-1.0], [None])
    """
    return _column(malformed, completions, lambda n: -n)


__all__ = ["dialogue_success", "goal_progress", "malformed_turns", "useless_questions"]
