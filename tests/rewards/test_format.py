"""The format reward (SpeakRL eq. 8 with partial credit) on hand-written outputs."""

from __future__ import annotations

import pytest

from pipelines.episodes.formats import SpeakRLFormat
from pipelines.rewards import (
    FULL_CREDIT,
    PARTIAL_CREDIT,
    clarification_question,
    completion_text,
    format_reward,
    format_score,
)

THINK = "<think>The user wants a hotel; three match, in different areas.</think>"
CLARIFY = "<clarify>Which part of town would you like to stay in?</clarify>"
TOOL_CALL = '<tool_call>\n{"name": "query_hotel", "arguments": {"area": "north"}}\n</tool_call>'

CASES = [
    # full credit: a non-empty think, then one action
    ("think + clarify", THINK + CLARIFY, FULL_CREDIT),
    ("think + clarify, newlines between", f"\n{THINK}\n\n{CLARIFY}\n", FULL_CREDIT),
    ("think + tool call", f"{THINK}\n{TOOL_CALL}", FULL_CREDIT),
    ("think + plain response", THINK + "The Acorn Guest House is in the north.", FULL_CREDIT),
    ("think + response + <end>", THINK + "Your reference is ABCD1234. Goodbye! <end>", FULL_CREDIT),
    ("think + bare <end>", THINK + "<end>", FULL_CREDIT),
    # partial credit: exactly one valid tagged part
    ("think only", THINK, PARTIAL_CREDIT),
    ("think only, surrounded by whitespace", f"  {THINK}\n", PARTIAL_CREDIT),
    ("clarify only", CLARIFY, PARTIAL_CREDIT),
    ("tool call only", TOOL_CALL, PARTIAL_CREDIT),
    # nothing
    ("empty output", "", 0.0),
    ("plain response only", "Which part of town would you like?", 0.0),
    ("bare <end> only", "<end>", 0.0),
    ("wrong order", CLARIFY + THINK, 0.0),
    ("unclosed think", "<think>reasoning" + CLARIFY, 0.0),
    ("unclosed think alone", "<think>reasoning", 0.0),
    ("unclosed clarify", THINK + "<clarify>Which area?", 0.0),
    ("stray closing tag", "</think>" + CLARIFY, 0.0),
    ("duplicated think", THINK + THINK + CLARIFY, 0.0),
    ("duplicated clarify", THINK + CLARIFY + CLARIFY, 0.0),
    ("clarify and tool call", THINK + CLARIFY + TOOL_CALL, 0.0),
    ("nested clarify in think", "<think>hmm <clarify>Which area?</clarify></think>", 0.0),
    ("empty think before clarify", "<think></think>" + CLARIFY, 0.0),
    ("whitespace think alone", "<think>   </think>", 0.0),
    ("empty clarify", THINK + "<clarify>  </clarify>", 0.0),
    ("text before the tags", "Sure! " + THINK + CLARIFY, 0.0),
    ("text between the tags", THINK + " so I ask: " + CLARIFY, 0.0),
    ("text after the tags", THINK + CLARIFY + " Thanks!", 0.0),
    ("text after think alone is a response, then a stray tag", THINK + "ok " + CLARIFY, 0.0),
    ("<end> after clarify", THINK + CLARIFY + "<end>", 0.0),
    ("tool call with invalid JSON", THINK + "<tool_call>{name: query_hotel}</tool_call>", 0.0),
    ("invented tool response", THINK + "<tool_response>{}</tool_response>", 0.0),
]


@pytest.mark.parametrize("text, expected", [(t, e) for _, t, e in CASES], ids=[name for name, _, _ in CASES])
def test_format_score(text, expected):
    assert format_score(text) == expected


def test_full_credit_is_exactly_a_parseable_output_with_a_non_empty_think():
    # The reward and the episode runner share one grammar: full credit goes to the outputs
    # the runner executes that start with real reasoning, and to nothing else.
    parser = SpeakRLFormat()
    for name, text, expected in CASES:
        parsed = parser.parse(text)
        reasons_first = isinstance(parsed, tuple) and parsed[0].kind == "think" and bool(parsed[0].text)
        assert (expected == FULL_CREDIT) == reasons_first, name


def test_format_reward_batch_plain_and_conversational():
    completions = [
        THINK + CLARIFY,
        [{"role": "assistant", "content": THINK + CLARIFY}],
        [{"role": "assistant", "content": THINK}],
        [{"role": "assistant", "content": CLARIFY + THINK}],
    ]
    rewards = format_reward(
        prompts=["p"] * 4, completions=completions, completion_ids=[[1]] * 4, trainer_state=None, log_metric=print
    )
    assert rewards == [FULL_CREDIT, FULL_CREDIT, PARTIAL_CREDIT, 0.0]


def test_structured_tool_calls_are_scored_as_the_text_the_model_wrote():
    # TRL's response parser moves <tool_call> blocks out of the content.
    message = {
        "role": "assistant",
        "content": THINK,
        "tool_calls": [{"type": "function", "function": {"name": "query_hotel", "arguments": {"area": "north"}}}],
    }
    act = {"ask_needed": [False]}  # a tool call is the required action at an act-here point
    assert format_reward(prompts=["p"], completions=[[message]], **act) == [FULL_CREDIT]
    as_string = dict(message, tool_calls=[{"type": "function", "function": {"name": "query_hotel", "arguments": '{"area": "north"}'}}])
    assert format_reward(prompts=["p"], completions=[[as_string]], **act) == [FULL_CREDIT]
    two_calls = dict(message, tool_calls=message["tool_calls"] * 2)
    assert format_reward(prompts=["p"], completions=[[two_calls]], **act) == [0.0]  # one action per output
    # Without the column every row is a clarification point (eq. 8 as written): think, no clarify.
    assert format_reward(prompts=["p"], completions=[[message]]) == [PARTIAL_CREDIT]


PAIR_CASES = [
    # (output, score where asking is right, score where acting is right)
    (THINK + CLARIFY, FULL_CREDIT, PARTIAL_CREDIT),
    (f"{THINK}\n{TOOL_CALL}", PARTIAL_CREDIT, FULL_CREDIT),
    (THINK + "The Acorn is in the north. <end>", PARTIAL_CREDIT, FULL_CREDIT),
    (THINK, PARTIAL_CREDIT, PARTIAL_CREDIT),
    (CLARIFY, PARTIAL_CREDIT, 0.0),
    (TOOL_CALL, 0.0, PARTIAL_CREDIT),
    ("Which area?", 0.0, 0.0),
    (CLARIFY + THINK, 0.0, 0.0),
]


@pytest.mark.parametrize("text, ask, act", PAIR_CASES)
def test_eq8_pair_is_think_and_clarify_where_asking_is_right_and_think_and_act_where_it_is_not(text, ask, act):
    assert format_score(text, True) == ask and format_score(text, False) == act
    assert format_reward(prompts=["p", "p"], completions=[text, text], ask_needed=[True, False]) == [ask, act]


def test_completion_text_takes_the_first_assistant_message():
    completion = [
        {"role": "assistant", "content": THINK + TOOL_CALL},
        {"role": "tool", "content": "{}"},
        {"role": "assistant", "content": "more"},
    ]
    assert completion_text(completion) == THINK + TOOL_CALL
    assert completion_text([{"role": "tool", "content": "{}"}]) == ""
    assert completion_text([{"role": "assistant", "content": None}]) == ""
    with pytest.raises(TypeError, match="completion must be a string or a list of messages"):
        completion_text(42)
    with pytest.raises(TypeError, match="assistant content must be a string"):
        completion_text([{"role": "assistant", "content": [{"type": "text", "text": "hi"}]}])


def test_clarification_question():
    assert clarification_question(THINK + CLARIFY) == "Which part of town would you like to stay in?"
    assert clarification_question(CLARIFY) == "Which part of town would you like to stay in?"
    assert clarification_question(THINK + TOOL_CALL) is None
    assert clarification_question(THINK + "<clarify>Which area?") is None  # malformed: nothing can be read
    assert clarification_question("Which area?") is None
