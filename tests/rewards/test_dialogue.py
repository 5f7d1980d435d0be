"""Whole conversations' rewards (pipelines/rewards/dialogue.py) on a conversation really
played: the rollout's columns come from the goal checker and the verifiable judge
(pipelines.evaluation.metrics.conversation_columns), registered by name for a GRPO section."""

from __future__ import annotations

import pytest
from transformers import AutoTokenizer

from pipelines.env.tools import Database
from pipelines.episodes.runner import EpisodeSpec
from pipelines.evaluation.metrics import conversation_columns, score_episode
from pipelines.rewards import REWARD_FUNCTIONS, resolve_reward
from pipelines.rewards.dialogue import dialogue_success, goal_progress, malformed_turns, useless_questions
from pipelines.simulators.agenda import AgendaSimulator
from pipelines.training.rollout import ConversationRollout, RolloutConfig, prompt_key, trl_rollout_func
from tests.episodes.test_rollout import ScriptedPolicy


def test_a_played_conversation_is_scored_by_the_goal_it_never_saw(small_corpus, tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    dialogue = next(d for d in small_corpus.dialogues if d.split == "train" and [g.domain for g in d.goal.domains] == ["hotel"]
                    and "parking" not in d.goal.domains[0].info)
    segments = [
        ("<think>\nMaybe parking matters.\n</think>\n<clarify>Do you need free parking?</clarify>", True),
        ("<think>\nAgain.\n</think>\n<clarify>Do you need free parking?</clarify>", True),
        ("<tool_call>{not json</tool_call>", True),  # malformed: the runner's feedback, then the apology
        ("<tool_call>{not json</tool_call>", True),
    ]
    config = RolloutConfig(max_exchanges=3, max_total_tokens=4096, ask_inside_reasoning=False, malformed_retries=0)
    rollout = ConversationRollout(database, AgendaSimulator(database), tokenizer, config)
    spec = EpisodeSpec(f"{dialogue.dialogue_id}#0", dialogue.goal, 0)
    goals = {spec.episode_id: spec.goal}
    func = trl_rollout_func(rollout, {prompt_key(rollout.prompt(spec)): spec},
                            lambda r: conversation_columns(r.episode, goals[r.episode.episode_id]))

    class Trainer:
        model = ScriptedPolicy(tokenizer, segments)

    out = func([rollout.prompt(spec)], Trainer())
    score = score_episode(rollout.play(ScriptedPolicy(tokenizer, segments), [spec])[0].episode, spec.goal)
    assert out["correct"] == [False] and score.n_clarifications == 2 and score.n_discriminating == 0
    assert out["useless_questions"] == [2] and out["malformed"] == [score.n_malformed] and score.n_malformed >= 1
    assert out["progress"] == [0.0]  # nothing offered, booked or told
    columns = {k: v for k, v in out.items() if k not in ("prompt_ids", "completion_ids", "logprobs", "env_mask")}
    rewards = {name: REWARD_FUNCTIONS[name](prompts=["p"], completions=["c"], **columns)
               for name in ("dialogue_success", "goal_progress", "useless_questions", "malformed_turns")}
    assert rewards == {"dialogue_success": [0.0], "goal_progress": [0.0], "useless_questions": [-2.0],
                       "malformed_turns": [-float(score.n_malformed)]}


@pytest.mark.parametrize("reward", [dialogue_success, goal_progress, useless_questions, malformed_turns])
def test_a_conversation_without_the_column_is_left_out_not_zero(reward):
    assert reward(["p", "p"], ["a", "b"]) == [None, None]
    assert resolve_reward(reward.__name__) is reward
