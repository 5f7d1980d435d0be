"""The compact system prompt and history cutting."""

from __future__ import annotations

import pytest

from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.episodes.formats import SpeakRLFormat
from pipelines.policy.prompts import (
    COMPACT_SYSTEM_PROMPT,
    compact_messages,
    compact_history,
    compact_messages_within,
    compact_system_prompt,
    is_tool_result,
    is_user_turn,
    tool_signature,
)

HISTORY = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}"} for i in range(7)]
LONG_SYSTEM = {"role": "system", "content": SpeakRLFormat().system_prompt()}


def test_the_compact_prompt_names_every_tool_and_the_format_in_a_few_hundred_characters():
    assert len(COMPACT_SYSTEM_PROMPT) < 1000 < 8 * len(COMPACT_SYSTEM_PROMPT) < len(LONG_SYSTEM["content"])
    for schema in TOOL_SCHEMAS:
        assert f"\n{tool_signature(schema)}\n" in COMPACT_SYSTEM_PROMPT
    for tag in ("<think>", "<clarify>", "<tool_call>", "<tool_response>", "<end>"):
        assert tag in COMPACT_SYSTEM_PROMPT
    assert compact_system_prompt(TOOL_SCHEMAS[:1], task="Do it.").splitlines()[:3] == [
        "Do it.",
        "Tools (? = optional):",
        "query_restaurant(area?, pricerange?, food?, name?)",
    ]


def test_signatures_put_required_arguments_first():
    book_taxi = next(s for s in TOOL_SCHEMAS if s["function"]["name"] == "book_taxi")
    assert tool_signature(book_taxi) == "book_taxi(departure, destination, arriveBy?, leaveAt?)"


def test_compact_messages_replaces_the_system_message_and_keeps_the_last_n():
    messages = [LONG_SYSTEM, *HISTORY]
    kept = compact_messages(messages, 3)
    assert kept == [{"role": "system", "content": COMPACT_SYSTEM_PROMPT}, *HISTORY[-3:]]
    assert compact_messages(messages, 0) == kept[:1]
    assert compact_messages(messages, None)[1:] == HISTORY == compact_messages(messages, 100)[1:]
    assert compact_messages(HISTORY, 2)[1:] == HISTORY[-2:]  # no system message to replace
    assert compact_messages(messages, 2, system_prompt="short")[0] == {"role": "system", "content": "short"}
    kept[1]["content"] = "changed"
    assert HISTORY[-3]["content"] == "message 4"  # copies, not the caller's dicts


@pytest.mark.parametrize("bad", [-1, 1.5, True, "3"])
def test_compact_messages_rejects_bad_counts(bad):
    with pytest.raises(ValueError, match="max_history_messages"):
        compact_messages(HISTORY, bad)


def test_a_system_message_inside_the_history_is_an_error():
    with pytest.raises(ValueError, match="system"):
        compact_messages([*HISTORY, LONG_SYSTEM], 2)


def test_compact_messages_within_keeps_the_longest_history_that_fits(tokenizer):
    def length(messages):
        return len(tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_dict=True)["input_ids"])

    messages = [LONG_SYSTEM, *HISTORY]
    budget = length(compact_messages(messages, 4))
    assert compact_messages_within(messages, tokenizer, budget) == compact_messages(messages, 4)
    assert compact_messages_within(messages, tokenizer, budget - 1) == compact_messages(messages, 3)
    assert compact_messages_within(messages, tokenizer, 10**6) == compact_messages(messages, None)
    assert compact_messages_within(messages, tokenizer, 1) == compact_messages(messages, 0)


# --- compact_history: the history training and evaluation prompts share -------------------

TOOL = '<tool_response>\n{"results": [{"name": "x"}]}\n</tool_response>'
EPISODE = [
    LONG_SYSTEM,
    {"role": "user", "content": "I want a cheap hotel in the north."},
    {"role": "assistant", "content": "<think>area given</think><clarify>Which day?</clarify>"},
    {"role": "user", "content": "Friday, for 2 people."},
    {"role": "assistant", "content": '<think>search</think><tool_call>{"name": "query_hotel"}</tool_call>'},
    {"role": "user", "content": TOOL.replace("x", "old")},
    {"role": "user", "content": "Your last output could not be used: bad. Reply again, following the output format exactly."},
    {"role": "assistant", "content": '<tool_call>{"name": "query_hotel"}</tool_call>'},
    {"role": "user", "content": TOOL.replace("x", "latest")},
]


def chars_at_most(limit):
    return lambda chat: sum(len(m["content"]) for m in chat) <= limit


def test_compact_history_keeps_everything_that_fits_without_old_thinking():
    chat = compact_history(EPISODE, chars_at_most(10**6), shorten=str.upper)
    assert chat[0] == {"role": "system", "content": COMPACT_SYSTEM_PROMPT}
    assert [m["role"] for m in chat[1:]] == [m["role"] for m in EPISODE[1:]]
    assert chat[2]["content"] == "<clarify>Which day?</clarify>"  # the reasoning went, the decision stayed
    assert chat[-1]["content"] == TOOL.replace("x", "latest").upper()  # tool results through shorten
    assert chat[1]["content"] == EPISODE[1]["content"]  # user turns are not shortened
    assert compact_history(EPISODE, system_prompt=None)[0] == LONG_SYSTEM


def test_compact_history_keeps_every_user_turn_and_the_latest_tool_result_within_the_budget():
    full = compact_history(EPISODE)
    users = [m for m in full if is_user_turn(m)]
    assert [m["content"] for m in users] == [EPISODE[1]["content"], EPISODE[3]["content"]]
    needed = sum(len(m["content"]) for m in [full[0], *users, full[-1]])
    for budget in (needed, needed + 40, sum(len(m["content"]) for m in full) - 1):
        chat = compact_history(EPISODE, chars_at_most(budget))
        assert sum(len(m["content"]) for m in chat) <= budget
        assert [m for m in chat if is_user_turn(m)] == users
        assert chat[-1] == full[-1] and chat[0] == full[0]
    # The agent's side goes oldest first: at the tightest budget only the latest tool result is left of it.
    assert compact_history(EPISODE, chars_at_most(needed)) == [full[0], *users, full[-1]]
    assert compact_history(EPISODE, chars_at_most(sum(len(m["content"]) for m in full) - 1)) == [full[0], full[1], *full[3:]]
    # Less room: the oldest user turn goes, then everything but the system and last message.
    chat = compact_history(EPISODE, chars_at_most(needed - 1))
    assert [m["content"] for m in chat if is_user_turn(m)] == [EPISODE[3]["content"]]
    assert compact_history(EPISODE, chars_at_most(len(full[0]["content"]) + len(full[-1]["content"]))) == [full[0], full[-1]]
    assert compact_history(EPISODE, chars_at_most(len(full[0]["content"]))) is None


def test_compact_history_grows_append_only_while_it_fits():
    # Per-message rewriting: an episode's prompt at round k is a prefix of its prompt at
    # round k + 1 (what the hf agent's per-episode cache relies on).
    for end in range(2, len(EPISODE)):
        assert compact_history(EPISODE[: end + 1])[: end] == compact_history(EPISODE[:end])


def test_compact_history_classifies_user_turns_tool_results_and_feedback():
    assert [is_user_turn(m) for m in EPISODE[1:]] == [True, False, True, False, False, False, False, False]
    assert [is_tool_result(m) for m in EPISODE[1:]] == [False, False, False, False, True, False, False, True]
    assert is_tool_result({"role": "tool", "content": "{}"}) and is_tool_result({"role": "user", "content": "APIRETURN {}"})
    with pytest.raises(ValueError, match="max_history_messages"):
        compact_history(EPISODE, max_history_messages=-1)
    assert compact_history(EPISODE, max_history_messages=2)[1:] == compact_history(EPISODE)[-2:]
