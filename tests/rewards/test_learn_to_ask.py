"""The Learn-to-Ask reward on every branch: wrong decision, right CONTINUE (content x format),
right STOP (exact token or not), grader failures (None, counted), and its registration."""

from __future__ import annotations

import pytest

from pipelines.errors import DataError
from pipelines.rewards import REWARD_FUNCTIONS, resolve_reward
from pipelines.rewards.learn_to_ask import L2AReward, RulesGrader
from pipelines.training.config import GRPOObjective
from pipelines.training.data import reward_columns

AREA = [{"field": "restaurant-area", "value": "north"}]
FEVER = [{"field": "fever", "value": "absent"}]


def score(completion, truth, info, reward=None):
    reward = reward or L2AReward(RulesGrader())
    return reward(["prompt"], [completion], decision_truth=[truth], info_truth=[info])[0]


@pytest.mark.parametrize("completion, truth", [
    ("<stop />", "continue"),                      # stopped while there was something to collect
    ("Which area would you like?", "stop"),        # asked when the expert had stopped
    ("Which area? <stop />", "continue"),          # the stop token decides, whatever else is there
])
def test_a_wrong_decision_scores_zero_whatever_the_question(completion, truth):
    assert score(completion, truth, AREA) == 0.0


@pytest.mark.parametrize("completion, info, expected", [
    ("Which area would you like?", AREA, 1 + 2 * 1.0 + 1.0),            # precise, one question
    ("Which area would you like? And how many people?", AREA, 1 + 2 * 0.5 + 0.5),  # two questions, one beyond I*_t
    ("Which area? Price? Day?", AREA, 1 + 2 * 0.0 + 0.0),               # shotgun: mostly beyond I*_t, no format credit
    ("Which area and price range?", AREA + [{"field": "restaurant-pricerange", "value": "cheap"}], 1 + 2 * 1.0 + 1.0),  # both in I*_t
    ("How many people will be dining?", AREA, 1 + 2 * 0.5 + 1.0),       # same domain, another slot
    ("Is north good for you?", AREA, 1 + 2 * 0.5 + 1.0),                # names the value, not the slot
    ("How many nights will you stay?", [{"field": "train-day", "value": "monday"}], 1 + 0 + 1.0),  # irrelevant
    ("Do you have a fever?", FEVER, 1 + 2 * 1.0 + 1.0),                 # a free-form field by its words
    ("Is it absent?", FEVER, 1 + 2 * 0.5 + 1.0),
    ("Tell me more.", AREA, 1 + 0 + 0.0),                               # no question at all
])
def test_right_continue_is_one_plus_beta_content_plus_format(completion, info, expected):
    assert score(completion, "continue", info) == pytest.approx(expected)


def test_a_catch_all_question_hits_but_is_not_precise():
    from pipelines.rewards.learn_to_ask import CATCH_ALL_QUESTION

    # Under coverage alone it scored 1 + 2 + 1, the maximum; precision makes it the worst ask.
    assert score(CATCH_ALL_QUESTION, "continue", AREA) == 1 + 2 * 0.0 + 1.0
    many = [{"field": f"hotel-{slot}", "value": "x"} for slot in ("area", "pricerange", "type", "stars", "parking", "internet", "name", "day")]
    assert score(CATCH_ALL_QUESTION, "continue", many) == 1 + 2 * 0.5 + 1.0  # 8 of its 15 slots in I*_t


def test_right_stop_earns_the_format_bonus_only_for_the_exact_token():
    assert score("<stop />", "stop", []) == 4.0
    assert score("  <stop />\n", "stop", []) == 4.0
    assert score("I have all I need. <stop />", "stop", []) == 3.0
    assert score("<stop/>", "stop", []) == 3.0  # a STOP decision, but not the exact token
    assert score([{"role": "assistant", "content": "<stop />"}], "stop", []) == 4.0  # conversational completions


def test_beta_is_a_knob():
    assert score("Which area?", "continue", AREA, L2AReward(RulesGrader(), beta=1.0)) == 3.0
    assert score("<stop />", "stop", [], L2AReward(RulesGrader(), beta=1.0)) == 3.0


def test_a_grader_failure_is_none_and_counted_never_zero():
    reward = L2AReward(RulesGrader())
    values = reward(["p"] * 4, ["Which area?", "Which area?", "Which area?", "<stop />"],
                    decision_truth=["continue", "continue", "continue", "stop"],
                    info_truth=[[], "not json", [{"field": "x"}], None])
    # Empty and malformed references cannot be graded; a STOP sample needs no grader.
    assert values == [None, None, None, 4.0]
    assert reward.failures == {"empty_reference": 1, "malformed_reference": 2}
    logged = {}
    reward(["p"], ["Which area?"], decision_truth=["continue"], info_truth=[[]], log_metric=logged.__setitem__)
    assert logged == {"l2a/unscored": 1.0} and reward.failures["empty_reference"] == 2


def test_the_llm_grader_reads_the_dialogue_and_an_unreadable_grade_is_none():
    from pipelines.learn_to_ask.autoprompt import Prompt
    from pipelines.rewards.learn_to_ask import GRADER_FORMAT, GRADER_INSTRUCTION, LLMGrader

    replies = iter(["<think>close</think><content_score>0.5</content_score>", "I would say 0.5", ("timeout", "60 s")])
    seen = []

    def complete(conversations):
        seen.extend(conversations)
        return [next(replies) for _ in conversations]

    reward = L2AReward(LLMGrader(complete, "hf", Prompt(GRADER_INSTRUCTION, rules=(GRADER_FORMAT,))))
    prompt = [{"role": "system", "content": "policy"}, {"role": "user", "content": "A table in the north, please."}]
    values = reward([prompt] * 4, ["How many people?", "How many people?", "How many people?", "<stop />"],
                    decision_truth=["continue", "continue", "continue", "continue"], info_truth=[AREA] * 4)
    assert values == [1 + 2 * 0.5 + 1, None, None, 0.0]  # a wrong decision never reaches the grader
    assert reward.failures == {"unreadable_grade": 1, "llm_timeout": 1}
    request = seen[0][-1]["content"]
    assert "A table in the north, please." in request and "How many people?" in request and "restaurant-area: north" in request
    assert "policy" not in request  # the policy's system prompt is not part of the dialogue


def test_a_row_without_a_target_is_a_data_error():
    with pytest.raises(DataError, match="decision_truth"):
        score("Which area?", None, AREA)
    with pytest.raises(DataError, match="info_truth"):
        L2AReward(RulesGrader())(["p"], ["Which area?"], decision_truth=["continue"])


def test_registered_for_grpo_params_with_its_columns():
    assert resolve_reward("l2a") is REWARD_FUNCTIONS["l2a"]
    assert resolve_reward("l2a").__name__ == "l2a"
    assert resolve_reward("pipelines.rewards.learn_to_ask:L2AReward") is L2AReward
    assert reward_columns(GRPOObjective(rewards=(("l2a", 1.0),))) == ("decision_truth", "info_truth")
