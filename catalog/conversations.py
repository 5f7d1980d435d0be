"""A multi-turn GRPO run's conversations, read from their MultiWOZ directory: the sampling
rollout and its greedy twin over one database and agenda user, the train goals and the
held-out ones (:class:`pipelines.training.rollout.ConversationEnv`). Read by US-GRPO's flow
and by the GPU job, which runs without Prefect."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from catalog.multiwoz_dir import load_multiwoz
from pipelines.env.tools import Database
from pipelines.evaluation.play import held_out_goals
from pipelines.simulators.agenda import AgendaSimulator
from pipelines.training.rollout import ConversationEnv, ConversationRollout


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


__all__ = ["build_environment"]
