"""A compact system prompt, and chat histories cut to fit a small model's context.

The SpeakRL system prompt (:meth:`SpeakRLFormat.system_prompt`) carries every tool's full
JSON schema: about 8,000 characters, several thousand tokens for a small byte-level
vocabulary, far beyond the 512-token context the embedded policy is trained with. The
compact prompt says the same things in a few hundred characters: the task, one line per
tool (``name(arg, optional?)``), and the SpeakRL output rules. Its tags and the
``<end>`` token are the format's own, so outputs parse with ``SpeakRLFormat().parse``.

:func:`compact_messages` is how every training flow and every agent of the embedded policy
builds its input: the compact system prompt, then the last ``max_history_messages``
messages of the conversation. Pretraining (:mod:`pipelines.policy.pretrain_data`) uses it
too, so a prompt built with it is in the distribution the base model was trained on.
Usage with a SpeakER SFT row (prompt-completion)::

    prompt = compact_messages(row["prompt"], max_history_messages=6)
    completion = row["completion"]
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.episodes.formats import END_TOKEN

COMPACT_TASK = (
    "You are a Cambridge travel agent: find and book restaurants, hotels, attractions, trains and "
    "taxis with the tools; never invent facts. Ask when a request is unclear."
)

_FORMAT_RULES = (
    "Reply with an optional <think>reasoning</think>, then exactly one of: <clarify>question</clarify>; "
    '<tool_call>{"name": tool, "arguments": {...}}</tool_call> (the result comes back in <tool_response>); '
    f"a plain response. End the last response with {END_TOKEN}."
)


def tool_signature(schema: Mapping[str, Any]) -> str:
    """``book_taxi(departure, destination, arriveBy?, leaveAt?)``: required arguments first,
    optional ones marked ``?``, each group in the schema's order."""
    function = schema["function"]
    properties = list(function["parameters"].get("properties", {}))
    required = [p for p in properties if p in function["parameters"].get("required", ())]
    optional = [f"{p}?" for p in properties if p not in required]
    return f"{function['name']}({', '.join(required + optional)})"


def compact_system_prompt(tools: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS, task: str = COMPACT_TASK) -> str:
    """The task, one line per tool, and the output rules."""
    lines = "\n".join(tool_signature(schema) for schema in tools)
    return f"{task}\nTools (? = optional):\n{lines}\n{_FORMAT_RULES}"


COMPACT_SYSTEM_PROMPT = compact_system_prompt()


def compact_messages(
    messages: Sequence[Mapping[str, Any]],
    max_history_messages: int | None,
    *,
    system_prompt: str = COMPACT_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """``messages`` with its system message (if any) replaced by ``system_prompt`` and only
    the last ``max_history_messages`` other messages kept (None keeps them all).

    Messages are copied (as dicts), never changed in place. The cut is by message count,
    not by tokens, so the kept history may begin with any role, e.g. a ``<tool_response>``
    whose call was cut away; pretraining sees such histories too."""
    if max_history_messages is not None and (
        isinstance(max_history_messages, bool) or not isinstance(max_history_messages, int) or max_history_messages < 0
    ):
        raise ValueError(f"max_history_messages must be an integer >= 0 or None, got {max_history_messages!r}")
    history = list(messages[1:] if messages and messages[0]["role"] == "system" else messages)
    if any(m["role"] == "system" for m in history):
        raise ValueError("only the first message may be a system message")
    if max_history_messages is not None:
        history = history[-max_history_messages:] if max_history_messages else []
    return [{"role": "system", "content": system_prompt}, *(dict(m) for m in history)]


def compact_messages_within(
    messages: Sequence[Mapping[str, Any]],
    tokenizer: Any,
    max_prompt_tokens: int,
    *,
    system_prompt: str = COMPACT_SYSTEM_PROMPT,
) -> list[dict[str, Any]]:
    """:func:`compact_messages` with the longest history whose prompt, rendered by
    ``tokenizer``'s chat template with the generation prompt, is at most
    ``max_prompt_tokens`` tokens (possibly no history at all, if even the last message
    does not fit)."""

    def length(candidate: list[dict[str, Any]]) -> int:
        encoded = tokenizer.apply_chat_template(candidate, tokenize=True, add_generation_prompt=True, return_dict=True)
        return len(encoded["input_ids"])

    # Longer histories render longer: bisect for the longest that fits, in [low, high].
    low, high = 0, len(compact_messages(messages, None, system_prompt=system_prompt)) - 1
    while low < high:
        middle = (low + high + 1) // 2
        if length(compact_messages(messages, middle, system_prompt=system_prompt)) <= max_prompt_tokens:
            low = middle
        else:
            high = middle - 1
    return compact_messages(messages, low, system_prompt=system_prompt)
