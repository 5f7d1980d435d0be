"""The compact system prompt and history cutting."""

from __future__ import annotations

import pytest

from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.episodes.formats import SpeakRLFormat
from pipelines.policy.prompts import (
    COMPACT_SYSTEM_PROMPT,
    compact_messages,
    compact_messages_within,
    compact_system_prompt,
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
