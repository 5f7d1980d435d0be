"""A compact system prompt, and chat histories cut to fit a small model's context.

The SpeakRL system prompt (:meth:`SpeakRLFormat.system_prompt`) carries every tool's full
JSON schema: about 8,000 characters, several thousand tokens for a small byte-level
vocabulary, far beyond the 512-token context the embedded policy is trained with. The
compact prompt says the same things in a few hundred characters: the task, one line per
tool (``name(arg, optional?)``), and the SpeakRL output rules. Its tags and the
``<end>`` token are the format's own, so outputs parse with ``SpeakRLFormat().parse``.

:func:`compact_history` is how every training flow (:func:`pipelines.training.data.compact`)
and every evaluated policy (:class:`pipelines.evaluation.agent.PolicyPromptAgent`) builds
its input, so that training and evaluation see one format: the compact system prompt, then
the conversation with the agent's earlier reasoning dropped and tool results shortened,
cut to the context by dropping the agent's older messages and tool results before any
user turn. :func:`compact_messages` (the last ``max_history_messages`` messages) is what
pretraining (:mod:`pipelines.policy.pretrain_data`) cuts its windows with.
Usage with a SpeakER SFT row (prompt-completion)::

    prompt = compact_messages(row["prompt"], max_history_messages=6)
    completion = row["completion"]
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.episodes.formats import END_TOKEN, FEEDBACK_TEMPLATE

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

COMPACT_TOOLWOZ_TASK = (
    "You are a Cambridge customer service agent: find and book restaurants, hotels, attractions and trains "
    "with the apis; never use your own knowledge. Ask the user for what you need before you search or book."
)

_REACT_RULES = (
    "Reply with PLAN your reasoning <COMMAND_END>, then exactly one of: "
    'APICALL {"name": api, "parameters": {...}} <COMMAND_END> (the result comes back as APIRETURN); '
    "SPEAK your words to the user <COMMAND_END>. When the user has everything, end your last SPEAK with <end>."
)


def compact_react_prompt(tools: Sequence[Mapping[str, Any]], task: str = COMPACT_TOOLWOZ_TASK) -> str:
    """JOSH's ReAct prompt (Table 8) for a small context: the task, one line per api and
    the command rules, where the full prompt carries every api's JSON schema (~2,700
    tokens of the embedded tokenizer, more than its whole context)."""
    lines = "\n".join(tool_signature(schema) for schema in tools)
    return f"{task}\nApis (? = optional):\n{lines}\n{_REACT_RULES}"


# The system prompts a training source or an evaluated policy can be given, by name:
# ``compact`` (SpeakRL, askflow's tools), ``toolwoz_react`` (JOSH's ReAct, the ToolWOZ apis),
# ``own`` (None: the prompt's own system message, unchanged).
SYSTEM_PROMPT_NAMES: tuple[str, ...] = ("compact", "toolwoz_react", "own")


def named_system_prompt(name: str) -> str | None:
    """The system prompt called ``name`` (:data:`SYSTEM_PROMPT_NAMES`); None for ``own``.

    >>> named_system_prompt("own") is None, named_system_prompt("toolwoz_react").startswith("You are")
    (True, True)
    """
    if name == "compact":
        return COMPACT_SYSTEM_PROMPT
    if name == "toolwoz_react":
        from pipelines.env.toolwoz import toolwoz_tools

        return compact_react_prompt(toolwoz_tools())
    if name == "own":
        return None
    raise ValueError(f"system prompt: expected one of {list(SYSTEM_PROMPT_NAMES)}, got {name!r}")


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
    positive_int(max_history_messages, "max_history_messages", optional=True, minimum=0)
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


# --- Conversation history, compacted --------------------------------------------------------

_THINK = re.compile(r"<think>.*?</think>\s*", re.DOTALL)
_TOOL_RESULT_PREFIXES = ("<tool_response>", "APIRETURN ")


def is_tool_result(message: Mapping[str, Any]) -> bool:
    """A tool's observation: a ``tool`` message, or a user message in which a text format
    (SpeakRL's ``<tool_response>``, ReAct's ``APIRETURN``) brings a result back."""
    content = message.get("content")
    return message["role"] == "tool" or (
        message["role"] == "user" and isinstance(content, str) and content.startswith(_TOOL_RESULT_PREFIXES)
    )


def is_user_turn(message: Mapping[str, Any]) -> bool:
    """What the user said: a user message that is neither a tool result nor the format's
    feedback on a malformed output."""
    content = message.get("content")
    feedback = FEEDBACK_TEMPLATE.split("{reason}")[0]
    return message["role"] == "user" and not is_tool_result(message) and not (isinstance(content, str) and content.startswith(feedback))


def compact_history(
    messages: Sequence[Mapping[str, Any]],
    fits: Callable[[list[dict[str, Any]]], bool] | None = None,
    *,
    shorten: Callable[[str], str] | None = None,
    system_prompt: str | None = COMPACT_SYSTEM_PROMPT,
    max_history_messages: int | None = None,
    keep_reasoning: bool = False,
) -> list[dict[str, Any]] | None:
    """The conversation a policy sees, shared by training-data building and evaluation
    prompting so that both see one format.

    Every message is first rewritten on its own: the system message becomes
    ``system_prompt`` (None keeps it), the agent's earlier ``<think>`` reasoning goes (the
    reply it decided on stays), and tool results pass through ``shorten``. Being per
    message, this keeps a growing episode's prompt append-only from one round to the next
    (what the hf agent's per-episode key/value cache reuses). ``max_history_messages``
    then keeps only that many recent messages (None: all). ``keep_reasoning`` keeps the
    agent's ``<think>`` (a whole dialogue trained at once: every assistant message is a
    target, and a target's reasoning is what it learns, as a decision row's completion has it).

    If ``fits`` refuses the result, history goes oldest first until it fits: first the
    agent's messages, tool results and format feedback (but not the latest tool result),
    then user turns, then the latest tool result; never the system message nor the last
    message. So every user turn stays whenever the agent's side can make room for them.
    None when even the system message with the last message does not fit.

    >>> chat = [{"role": "user", "content": "a boat trip"}, {"role": "assistant", "content": "<think>hm</think><clarify>when?</clarify>"},
    ...         {"role": "user", "content": "at noon"}]
    >>> [m["content"] for m in compact_history(chat, system_prompt="S")]
    ['S', 'a boat trip', '<clarify>when?</clarify>', 'at noon']
    """
    positive_int(max_history_messages, "max_history_messages", optional=True, minimum=0)
    first = 1 if messages and messages[0]["role"] == "system" else 0
    system = [] if system_prompt is None and not first else [{"role": "system", "content": system_prompt if system_prompt is not None else messages[0]["content"]}]
    history = [_compact_message(m, shorten, keep_reasoning) for m in messages[first:]]
    if any(m["role"] == "system" for m in history):
        raise ValueError("only the first message may be a system message")
    if max_history_messages is not None:
        history = history[-max_history_messages:] if max_history_messages else []
    chat = [*system, *history]
    if fits is None or fits(chat):
        return chat
    if not history or not fits([*system, history[-1]]):
        return None
    # Drop order: the agent's side oldest first, then user turns oldest first.
    last_tool = max((i for i, m in enumerate(history) if is_tool_result(m)), default=None)
    keep = {len(history) - 1, last_tool}
    agent_side = [i for i, m in enumerate(history) if i not in keep and not is_user_turn(m)]
    users = [i for i, m in enumerate(history) if i not in keep and is_user_turn(m)]
    order = agent_side + users + ([last_tool] if last_tool not in (None, len(history) - 1) else [])

    def without(k: int) -> list[dict[str, Any]]:
        dropped = set(order[:k])
        return [*system, *(m for i, m in enumerate(history) if i not in dropped)]

    # More dropped never renders longer: bisect for the fewest drops that fit.
    low, high = 0, len(order)  # without(low) does not fit, without(high) does
    while high - low > 1:
        middle = (low + high) // 2
        if fits(without(middle)):
            high = middle
        else:
            low = middle
    return without(high)


def _compact_message(message: Mapping[str, Any], shorten: Callable[[str], str] | None, keep_reasoning: bool = False) -> dict[str, Any]:
    content = message.get("content")
    if not isinstance(content, str):
        return dict(message)
    if message["role"] == "assistant":
        if keep_reasoning:
            return {**message, "content": content}
        content = _THINK.sub("", content)
    elif shorten is not None and is_tool_result(message):
        content = shorten(content)
    return {**message, "content": content}


def prompt_fits(tokenizer: Any, max_prompt_tokens: int) -> Callable[[list[dict[str, Any]]], bool]:
    """Whether a chat, rendered by ``tokenizer``'s chat template with the generation prompt,
    is at most ``max_prompt_tokens`` tokens."""

    def fits(chat: list[dict[str, Any]]) -> bool:
        encoded = tokenizer.apply_chat_template(chat, tokenize=True, add_generation_prompt=True, return_dict=True)
        return len(encoded["input_ids"]) <= max_prompt_tokens

    return fits
