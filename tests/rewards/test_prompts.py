"""The Table 1 training prompt, the Figure 6 judge prompt and the conversation rendering."""

from __future__ import annotations

import pytest

from pipelines.rewards import (
    JUDGE_PROMPT_TEMPLATE,
    REWARD_FUNCTIONS,
    SPEAKRL_PROMPT_TEMPLATE,
    format_reward,
    render_conversation,
    render_judge_prompt,
    render_speakrl_prompt,
)

TURNS = [
    {"role": "user", "content": "I need a hotel in Cambridge. "},
    {"role": "assistant", "content": "Sure, any preferences?"},
    {"role": "user", "content": "Something cheap."},
]


def test_render_conversation_labels_every_turn():
    assert render_conversation(TURNS) == "User: I need a hotel in Cambridge.\nAgent: Sure, any preferences?\nUser: Something cheap."
    assert render_conversation([]) == ""


@pytest.mark.parametrize(
    "turns",
    [
        "User: hi",
        [{"role": "robot", "content": "beep"}],
        [{"role": "user", "content": None}],
        [{"role": "user"}],
        ["hi"],
    ],
)
def test_render_conversation_rejects_what_it_cannot_render(turns):
    with pytest.raises(ValueError):
        render_conversation(turns)


def test_speakrl_prompt_is_table_1_with_the_conversation():
    prompt = render_speakrl_prompt(render_conversation(TURNS))
    assert prompt.startswith("Given the Conversation below, carefully read the dialogue and the final user query.")
    assert "enclosed within <think></think> and <clarify></clarify> tags" in prompt
    assert "<clarify> user clarification question here </clarify>" in prompt
    assert prompt.endswith("\n\nUser: I need a hotel in Cambridge.\nAgent: Sure, any preferences?\nUser: Something cheap.\nAgent:")
    assert SPEAKRL_PROMPT_TEMPLATE.count("{") == 1  # the conversation is the only field


def test_judge_prompt_is_figure_6_with_conversation_and_question():
    prompt = render_judge_prompt("User: hi {not a field}", "  Which area?  ")
    assert prompt.startswith("You are a judge evaluating the quality of user clarification questions.")
    assert "Conversation\nUser: hi {not a field}\n\nAgent Clarification Question to Judge\nWhich area?\n\nYour Decision (0/1)\nScore: [0 or 1]" in prompt
    for criterion in ("Relevance to the context", "Precision and clarity", "Specificity", "Logical connection to previous context"):
        assert f"- {criterion}\n" in prompt
    assert sorted(field for field in ("{conversation}", "{question}") if field in JUDGE_PROMPT_TEMPLATE) == ["{conversation}", "{question}"]


def test_registry():
    assert set(REWARD_FUNCTIONS) == {"format", "clarify_verifiable", "l2a", "l2a_questions", "clarifier_goal", "pir_composite_rules",
                                     "dialogue_success", "goal_progress", "useless_questions", "malformed_turns"}
    assert REWARD_FUNCTIONS["format"] is format_reward
    with pytest.raises(TypeError):
        REWARD_FUNCTIONS["extra"] = format_reward  # type: ignore[index]
