"""SpeakRL's format reward (section 3.3, eq. 8, with the partial credit the paper describes
after it), on the agent grammar of :mod:`pipelines.episodes.formats`.

Every output is parsed by :class:`~pipelines.episodes.formats.SpeakRLFormat`, the parser
the episode runner uses, so an output the reward accepts is one the runner can execute and
vice versa. That grammar is: an optional ``<think>`` first, then exactly one of
``<clarify>question</clarify>``, a Qwen2.5 ``<tool_call>{"name", "arguments"}</tool_call>``,
or a plain response (optionally ending in ``<end>``), or a bare ``<end>``; nothing but
whitespace around the tags.

An output has two parts: the reasoning (``<think>``) and the action. Eq. 8 gives full
credit when the structured tokens "appear correctly in valid order", and the paper gives
partial credit "when the model produces only one of the required fields (e.g., emits
``<think>`` but omits ``<clarify>``)". The required pair depends on the decision point
(the dataset column ``ask_needed``, :data:`ASK_NEEDED`):

* ``ask_needed`` true (or no such column: every decision point of the paper's GRPO data is
  a clarification point): the pair is ``<think>`` + ``<clarify>``, eq. 8 as written;
* ``ask_needed`` false (an act-here point, askflow's addition): the pair is ``<think>`` +
  an action that is not a question (``<tool_call>``, a response, ``<end>``);
* ``None`` (:func:`format_score` without a decision point, e.g. held-out SFT decisions of
  every kind): ``<think>`` + any action the grammar allows.

==========  =================================================================================
1.0         a non-empty ``<think>`` followed by the required action
0.5         only one of the required fields: a non-empty ``<think>`` alone or followed by
            another action (think, but no clarify), or the required tagged action
            (``<clarify>`` / ``<tool_call>``) without a ``<think>``
0.0         anything else: an output the grammar rejects (unclosed, nested, duplicated or
            misordered tags, an empty ``<clarify>``, invalid tool-call JSON, text outside
            the tags, several actions), an empty ``<think>``, a tagged action that is not
            the required one without a ``<think>``, or an output without a single
            structured token (a plain response alone, a bare ``<end>``)
==========  =================================================================================

Where askflow deviates from eq. 8, and why: the paper trains on clarification points only,
so its pair is always think + clarify; askflow also trains on act-here points, where a
question is the wrong output, and there the pair is think + act. Rewarding think + clarify
everywhere would pay for over-asking twice (format and clarification rewards). A plain
response alone earns nothing although the grammar accepts it: it uses none of the tokens
eq. 8 rewards, and it is what an untrained model writes anyway. An empty
``<think></think>`` is grammatical but earns nothing either, so that the reasoning part
cannot be satisfied by the tags alone.
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Sequence

from pipelines.episodes.formats import (
    CLARIFY,
    END,
    END_TOKEN,
    RESPOND,
    THINK,
    TOOL_CALL,
    Malformed,
    SpeakRLFormat,
)

FULL_CREDIT = 1.0
PARTIAL_CREDIT = 0.5
#: The dataset column saying whether asking is right at a decision point (bool).
ASK_NEEDED = "ask_needed"
_ACTS = frozenset({TOOL_CALL, RESPOND, END})

# Stateless apart from the tool schemas (which the parser does not consult): one instance
# serves every call.
_PARSER = SpeakRLFormat()


def completion_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The text of one TRL completion: the string itself, or, for conversational data, the
    first assistant message (the decision being rewarded; later messages exist only when a
    TRL tool loop ran after it).

    When TRL's response parser has moved ``<tool_call>`` blocks out of the content into
    structured ``tool_calls``, they are written back in Qwen2.5 syntax, so that the text is
    what the model generated. Raises TypeError for anything else: a reward must not score
    the repr of a value it does not understand."""
    if isinstance(completion, str):
        return completion
    if not isinstance(completion, Sequence) or not all(isinstance(m, Mapping) for m in completion):
        raise TypeError(f"a completion must be a string or a list of messages, got {type(completion).__name__}")
    message = next((m for m in completion if m.get("role") == "assistant"), None)
    if message is None:
        return ""
    content = message.get("content")
    if content is not None and not isinstance(content, str):
        raise TypeError(f"assistant content must be a string, got {type(content).__name__}")
    blocks = [content or ""]
    for call in message.get("tool_calls") or ():
        function = call.get("function", {}) if isinstance(call, Mapping) else {}
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments)
            except json.JSONDecodeError:
                pass  # left as a string: the grammar rejects non-object arguments
        payload = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        blocks.append(f"<tool_call>\n{payload}\n</tool_call>")
    return "\n".join(blocks)


def _kinds(parsed: Any) -> tuple[str, ...]:
    return () if isinstance(parsed, Malformed) else tuple(action.kind for action in parsed)


def format_score(text: str, ask_needed: bool | None = None) -> float:
    """The format reward of one output text at a decision point where asking is right
    (``ask_needed`` true), wrong (false) or not stated (None); see the module docstring.

    >>> think, ask = "<think>Two hotels fit.</think>", "<clarify>Which area?</clarify>"
    >>> format_score(think + ask, True), format_score(think + ask, False), format_score(ask, True)
    (1.0, 0.5, 0.5)
    """
    required = {True: frozenset({CLARIFY}), False: _ACTS, None: _ACTS | {CLARIFY}}[ask_needed]
    parsed = _PARSER.parse(text)
    if not isinstance(parsed, Malformed):
        first = parsed[0]
        if first.kind == THINK:  # the grammar guarantees that an action follows it
            if not first.text:
                return 0.0
            return FULL_CREDIT if parsed[1].kind in required else PARTIAL_CREDIT
        kinds = _kinds(parsed)
        return PARTIAL_CREDIT if kinds in ((CLARIFY,), (TOOL_CALL,)) and kinds[0] in required else 0.0
    # A think alone is not an output the grammar accepts (an action must follow it). Ask the
    # parser about the text completed by the smallest action there is, a bare <end>: it
    # parses as exactly (think, end) when, and only when, the text is one well-formed think.
    completed = _PARSER.parse(text + END_TOKEN)
    if _kinds(completed) == (THINK, END) and completed[0].text:
        return PARTIAL_CREDIT
    return 0.0


def clarification_question(text: str) -> str | None:
    """The question of an output whose action is a ``<clarify>``, or None (another action,
    or an output the grammar rejects: no question can be read from it)."""
    parsed = _PARSER.parse(text)
    if isinstance(parsed, Malformed):
        return None
    return next((action.text for action in parsed if action.kind == CLARIFY), None)


def format_reward(prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float]:
    """SpeakRL's format reward (eq. 8 with partial credit): :func:`format_score` of each completion.

    Completions are plain or conversational, scored at their decision point: the
    ``ask_needed`` column when the dataset has one, else a clarification point (eq. 8 as written).

    >>> act = '<think>ok</think><tool_call>{"name": "q", "arguments": {}}</tool_call>'
    >>> format_reward(["p", "p"], [act, act], ask_needed=[True, False])
    [0.5, 1.0]
    """
    ask_needed = kwargs.get(ASK_NEEDED) or [True] * len(completions)
    return [format_score(completion_text(c), None if a is None else bool(a)) for c, a in zip(completions, ask_needed)]
