"""The SpeakRL prompts: the policy's training instruction (Table 1) and the judge's rubric
(Figure 6), with the conversation rendering both of them share.

Both texts are the paper's, word for word, with two repairs of its typesetting:

* the paper prints the closing clarification tag as ``<clarify>``; it is ``</clarify>``
  here, the tag the agent grammar (:mod:`pipelines.episodes.formats`) and the rewards expect;
* Table 1 ends in ``User: conversation. Agent:`` because its placeholder stands for a single
  user query. Here the placeholder is a whole dialogue rendered by
  :func:`render_conversation`, where every turn carries its own speaker label, so the
  template ends ``{conversation}`` on its own lines followed by ``Agent:`` (a literal
  ``User:`` in front would mislabel a dialogue that starts with the agent, or double the
  label of one that starts with the user).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

#: Table 1. ``{conversation}`` is the only field.
SPEAKRL_PROMPT_TEMPLATE = (
    "Given the Conversation below, carefully read the dialogue and the final user query. "
    "First, reflect on the reasoning process\u2014consider any ambiguity, missing information, "
    "or potential failure points. Then decide whether it is necessary to ask the user a "
    "clarification question before proceeding. The reasoning process and user clarification "
    "question are enclosed within <think></think> and <clarify></clarify> tags, respectively, "
    "i.e., <think> reasoning process here </think> <clarify> user clarification question here "
    "</clarify>.\n\n"
    "{conversation}\n"
    "Agent:"
)

#: Figure 6. ``{conversation}`` and ``{question}`` are the fields; the line breaks are the
#: figure's layout.
JUDGE_PROMPT_TEMPLATE = (
    "You are a judge evaluating the quality of user clarification questions. Given a "
    "conversation agent clarification question, analyze if there are any clarification "
    "questions and evaluate their quality.\n\n"
    "Rules:\n"
    "1. If clarification questions exist, evaluate them based on:\n"
    "- Relevance to the context\n"
    "- Precision and clarity\n"
    "- Specificity\n"
    "- Logical connection to previous context\n"
    "- Constructive nature of the question\n"
    "2. If no clarification questions exist, output: 0\n"
    "3. Output format:\n"
    "For high-quality clarification questions: 1\n"
    "For low-quality or no clarification questions: 0\n\n"
    "IMPORTANT: You must only output the number 0 or 1. No other text, explanations, or "
    "characters are allowed. Do not provide any reasoning.\n\n"
    "Return only an integer score in the following exact format:\n"
    "Score: [YOUR BINARY 0/1 SCORE HERE]\n\n"
    "Conversation\n"
    "{conversation}\n\n"
    "Agent Clarification Question to Judge\n"
    "{question}\n\n"
    "Your Decision (0/1)\n"
    "Score: [0 or 1]"
)

#: How each chat role is labelled in a rendered conversation. The paper's template calls
#: the assistant "Agent".
SPEAKER_LABELS: Mapping[str, str] = {"system": "System", "user": "User", "assistant": "Agent", "tool": "Tool"}


def render_conversation(turns: Sequence[Mapping[str, Any]]) -> str:
    """``Label: content`` per turn, one turn per line (``User: ...`` / ``Agent: ...``).

    Contents are rendered verbatim: the turns are meant to be the visible dialogue, as the
    SpeakER datasets store it. Raises ValueError for a turn that is not a ``{"role",
    "content"}`` mapping with a known role and string content, rather than rendering
    ``None`` or a Python repr into a prompt."""
    if isinstance(turns, (str, bytes)):
        raise ValueError("turns must be a sequence of {'role': ..., 'content': ...} mappings, not a string")
    lines = []
    for i, turn in enumerate(turns):
        if not isinstance(turn, Mapping) or turn.get("role") not in SPEAKER_LABELS or not isinstance(turn.get("content"), str):
            raise ValueError(
                f"turns[{i}] must be a mapping with a role in {sorted(SPEAKER_LABELS)} and string content, got {turn!r}"
            )
        lines.append(f"{SPEAKER_LABELS[turn['role']]}: {turn['content'].strip()}")
    return "\n".join(lines)


def render_speakrl_prompt(conversation_text: str) -> str:
    """The Table 1 training instruction for one decision point; ``conversation_text`` is
    typically ``render_conversation(turns)``."""
    return SPEAKRL_PROMPT_TEMPLATE.format(conversation=conversation_text.strip())


def render_judge_prompt(conversation_text: str, question: str) -> str:
    """The Figure 6 rubric with the conversation and the agent's clarification question."""
    return JUDGE_PROMPT_TEMPLATE.format(conversation=conversation_text.strip(), question=question.strip())
