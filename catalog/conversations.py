"""A multi-turn GRPO run's conversations, read from their MultiWOZ directory: the sampling
rollout and its greedy twin over one database and agenda user, the train goals and the
held-out ones (:class:`pipelines.training.rollout.ConversationEnv`). Read by US-GRPO's flow
and by the GPU job, which runs without Prefect."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any, Sequence

from catalog.multiwoz_dir import load_multiwoz
from pipelines.config import from_params
from pipelines.errors import ConfigError
from pipelines.env.tools import Database
from pipelines.evaluation.play import held_out_goals
from pipelines.simulators.agenda import AgendaSimulator
from pipelines.training.rollout import ConversationEnv, ConversationRollout


def read_environment(value: Any, objective: Any, where: str, *, without: Sequence[str] = ()) -> ConversationEnv:
    """A GRPO section's ``env`` (``where``: the section), checked against the files and the
    section's GRPO ``objective``: the directory exists, and the rollouts sample at the
    objective's temperature (TRL recomputes their log-probabilities at that one). ``without``:
    fields this reader does not take. US-GRPO and the GPU job read their sections so."""
    env = from_params(ConversationEnv, value, f"{where}.env", without=without)
    if not Path(env.source).exists():
        raise ConfigError(f"{where}.env.source: {env.source} does not exist")
    if env.rollout.temperature != objective.temperature:
        raise ConfigError(f"{where}: env.rollout.temperature ({env.rollout.temperature}) must equal objective.temperature "
                          f"({objective.temperature}): the policy is trained at the temperature it was sampled at")
    return env


def build_environment(env: ConversationEnv, tokenizer: Any) -> tuple[ConversationRollout, ConversationRollout, list, list]:
    """The sampling rollout, its greedy twin for the held-out conversations (each with its own
    simulator and counters, over one database), and the train and held-out dialogues: the
    corpus is read once."""
    corpus = load_multiwoz(env.source, env.db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    rollout, greedy = (ConversationRollout(database, AgendaSimulator(database, env.simulator), tokenizer, config)
                       for config in (env.rollout, replace(env.rollout, temperature=0.0)))
    return (rollout, greedy, held_out_goals(corpus.dialogues, env.split, env.max_goals),
            held_out_goals(corpus.dialogues, env.eval_split, env.eval_goals))


__all__ = ["build_environment", "read_environment"]
