"""Teacher-forced next-action proxies (issue 26) and the generation limit from the data."""

from __future__ import annotations

import pytest

from pipelines.training.evaluation import next_action_metrics
from pipelines.training.limits import generation_limit

ASK_FOOD = "<think>a</think><clarify>What kind of food would you like?</clarify>"
ASK_AREA = "<think>a</think><clarify>Which part of town would you prefer?</clarify>"
CALL = '<think>b</think><tool_call>{"name": "query_restaurant", "arguments": {"food": "Thai"}}</tool_call>'
ANSWER = "<think>c</think>How about bangkok city?"
GOAL = '{"restaurant": {"info": {"food": "thai", "area": "north"}}}'


def _row(reference, said="A restaurant in the north, please.", goal=GOAL):
    row = {"prompt": [{"role": "user", "content": said}], "completion": [{"role": "assistant", "content": reference}]}
    return {**row, "goal": goal} if goal else row


def test_kind_tool_and_argument_accuracy_against_the_reference():
    rows = [_row(CALL), _row(CALL), _row(ANSWER), _row(ASK_FOOD)]
    texts = [CALL.replace("Thai", "thai"), CALL.replace("query_restaurant", "query_hotel"), "<think>x</think><clarify>oops", ASK_FOOD]
    m = next_action_metrics(texts, rows)
    assert m["action_kind_accuracy"] == 0.75  # the malformed output is wrong
    assert (m["n_tool_calls"], m["tool_name_accuracy"], m["argument_exact_match"]) == (2, 0.5, 0.5)  # values compared lower-cased


def test_clarify_precision_and_recall_read_the_goal_and_what_the_user_said():
    # The user said "north": a question about the area asks what is known; about food, what is open.
    rows = [_row(ASK_FOOD), _row(ASK_FOOD), _row(CALL), _row(ANSWER)]
    m = next_action_metrics([ASK_FOOD, ANSWER, ASK_AREA, ASK_FOOD], rows)
    assert (m["n_questions"], m["n_clarify_needed"]) == (3, 2)
    assert m["clarify_precision"] == pytest.approx(2 / 3)  # the area question is needless
    assert m["clarify_recall"] == 0.5
    without_goal = next_action_metrics([ASK_FOOD], [_row(ASK_FOOD, goal=None)])
    assert "clarify_precision" not in without_goal and without_goal["action_kind_accuracy"] == 1.0


class _Chars:
    eos_token = " </s>"

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": text.split()}


def test_generation_limit_covers_the_longest_completion_with_a_margin():
    completions = [[{"role": "assistant", "content": " ".join(["w"] * 99)}], "short turn"]
    assert generation_limit(completions, _Chars()) == 128  # 100 tokens (eos included) x 1.25 -> 125 -> 128
    assert generation_limit(completions, _Chars(), margin=0.0, multiple=1) == 100
    assert generation_limit(completions, _Chars(), maximum=96) == 96
    with pytest.raises(ValueError):
        generation_limit([], _Chars())
