"""How an agent writes its actions: three output formats, each with a strict parser.

One agent *step* is one model output. It parses into a tuple of :class:`AgentAction`:
an optional hidden ``think`` first, then exactly one of

* ``clarify``: a clarification question, shown to the user;
* ``respond``: a plain response, shown to the user;
* ``tool_call``: a tool call (function calling may make several at once);
* ``end``: the agent considers the task done. It may follow a ``respond`` (the agent's
  last words) or stand alone.

or into a :class:`Malformed` with the reason, which the runner records and sends back to
the agent. Parsers never guess: anything outside the grammar is malformed.

**End of task.** Every format uses one token, :data:`END_TOKEN` (``<end>``), written at
the very end of a visible response: ``Your reference is X. Goodbye! <end>``. The text
before it is shown as the agent's last message (it may be empty: a bare ``<end>``).
``<end>`` anywhere else is malformed.

The formats:

``speakrl`` (SpeakRL section 3.2, Table 1, with Qwen2.5's tool-call syntax)::

    [<think>reasoning</think>] (<clarify>question</clarify>
                               | <tool_call>{"name": ..., "arguments": {...}}</tool_call>
                               | plain response [<end>] | <end>)

  Tool results come back as a user message ``<tool_response>\\n{json}\\n</tool_response>``,
  which Qwen2.5's chat template renders token for token like a ``tool`` message, and which
  every OpenAI-compatible server accepts (a ``tool`` message without a preceding
  structured tool call is rejected by some).

``react`` (JOSH, ToolWOZ Tables 8-10; appendix C's regex
``^PLAN .+? <COMMAND_END> (APICALL ({.*?}) <COMMAND_END>|SPEAK .+? <COMMAND_END>)$``)::

    PLAN plan <COMMAND_END> APICALL {"name": ..., "parameters": {...}} <COMMAND_END>
    PLAN plan <COMMAND_END> SPEAK text [<end>] <COMMAND_END>

  The regex is applied with one relaxation: any whitespace (none, spaces, a newline) may
  separate the parts, because JOSH's own prompt asks for one command per line and its
  examples write ``<COMMAND_END>APICALL`` with no space at all. Tool results come back as
  JOSH's ``APIRETURN {json}`` user message.

``function_calling`` (OpenAI): an assistant message with ``tool_calls`` (each
``{"id"?, "type": "function", "function": {"name": ..., "arguments": JSON string or
object}}``) or with content only. Content next to tool calls is hidden reasoning (the
turn is not over, so the user cannot have seen it); content alone is the response. A
local model cannot return structured calls: its text may carry Qwen2.5 ``<tool_call>``
blocks, which the parser extracts, as an OpenAI-compatible server's tool parser would.
Tool results are ``tool`` messages; the tool schemas travel out of band (:attr:`tools`).

Every format also *renders* actions into the output an agent would produce
(``parse(*render(actions)) == actions``), which is how scripted agents speak and how the
runner writes its fixed apology into the agent's history.
"""

from __future__ import annotations

import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.records import frozen_dict

THINK, CLARIFY, RESPOND, TOOL_CALL, END = "think", "clarify", "respond", "tool_call", "end"
ACTION_KINDS: tuple[str, ...] = (THINK, CLARIFY, RESPOND, TOOL_CALL, END)
VISIBLE_KINDS: tuple[str, ...] = (CLARIFY, RESPOND)

END_TOKEN = "<end>"
# PIR's in-reasoning clarification (an interaction point in the trace) and the user's reply to it
ASK_OPEN, ASK_CLOSE = "<asking>", "</asking>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<response>", "</response>"

DEFAULT_TASK_PROMPT = (
    "You are a travel agent for Cambridge, UK. You help the user find and book restaurants, hotels, "
    "attractions, trains and taxis. Use the tools to look things up and to book; never invent venues, "
    "availability or reference numbers. When the user's request is unclear or incomplete, ask a "
    "clarification question instead of guessing."
)
FEEDBACK_TEMPLATE = "Your last output could not be used: {reason}. Reply again, following the output format exactly."

# A raw tool call as an API returns it, or as a format renders it.
RawToolCall = Mapping[str, Any]
Message = dict[str, Any]


@dataclass(frozen=True)
class AgentAction:
    """One action of an agent step. ``text`` for think/clarify/respond; ``tool_name``,
    ``arguments`` and ``call_id`` (function calling's id, when the output had one) for a
    tool call."""

    kind: str
    text: str = ""
    tool_name: str | None = None
    arguments: Mapping[str, Any] | None = field(default=None, hash=False)
    call_id: str | None = None

    def __post_init__(self) -> None:
        if self.kind not in ACTION_KINDS:
            raise ValueError(f"unknown action kind {self.kind!r}; kinds: {', '.join(ACTION_KINDS)}")
        if (self.kind == TOOL_CALL) != (self.tool_name is not None):
            raise ValueError("a tool name is required for, and only for, a tool_call action")
        if self.kind == TOOL_CALL:
            object.__setattr__(self, "arguments", frozen_dict(self.arguments))

    @classmethod
    def think(cls, text: str) -> AgentAction:
        return cls(THINK, text)

    @classmethod
    def clarify(cls, text: str) -> AgentAction:
        return cls(CLARIFY, text)

    @classmethod
    def respond(cls, text: str) -> AgentAction:
        return cls(RESPOND, text)

    @classmethod
    def tool_call(cls, name: str, arguments: Mapping[str, Any] | None = None, call_id: str | None = None) -> AgentAction:
        return cls(TOOL_CALL, tool_name=name, arguments=arguments or {}, call_id=call_id)

    @classmethod
    def end(cls) -> AgentAction:
        return cls(END)

    @property
    def visible(self) -> bool:
        return self.kind in VISIBLE_KINDS

    @property
    def arguments_json(self) -> str | None:
        return None if self.arguments is None else json.dumps(dict(self.arguments), ensure_ascii=False)


@dataclass(frozen=True)
class Malformed:
    """An output outside the format's grammar: why, and the output itself."""

    reason: str
    raw: str


Parsed = tuple[AgentAction, ...] | Malformed


class AgentFormat(ABC):
    """One output format: the prompt that teaches it, its parser and renderer, and how
    outputs and tool results enter the agent's chat history.

    Built with the tool schemas the agent may call (OpenAI function definitions), kept as
    :attr:`tool_schemas`; :attr:`tools` says whether they travel next to the messages."""

    name: str

    def __init__(self, tools: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS):
        self.tool_schemas: tuple[Mapping[str, Any], ...] = tuple(tools)

    def __repr__(self) -> str:
        return f"{type(self).__name__}()"

    @property
    def tools(self) -> tuple[Mapping[str, Any], ...] | None:
        """Schemas sent next to the messages (function calling); None when the system prompt
        carries them."""
        return None

    @abstractmethod
    def system_prompt(self, task: str = DEFAULT_TASK_PROMPT) -> str:
        """The system message: the task, the tools (unless sent out of band) and the format."""

    @abstractmethod
    def parse(self, text: str, tool_calls: Sequence[RawToolCall] = ()) -> Parsed:
        """The actions of one output, or why it is malformed. ``tool_calls`` are structured
        calls from an API; text formats take none."""

    @abstractmethod
    def render(self, actions: Sequence[AgentAction]) -> tuple[str, tuple[RawToolCall, ...]]:
        """The output (text, structured tool calls) that parses into ``actions``. Raises
        ValueError for actions the format cannot express."""

    def assistant_message(self, text: str, tool_calls: Sequence[RawToolCall], actions: Sequence[AgentAction] | None) -> Message:
        """The agent's output as its own history keeps it; ``actions`` is None for a
        malformed output. Text formats keep the output verbatim."""
        return {"role": "assistant", "content": text}

    @abstractmethod
    def observation_message(self, call: AgentAction, observation: Mapping[str, Any]) -> Message:
        """The message that hands a tool result to the agent."""

    def feedback_message(self, malformed: Malformed) -> Message:
        """The message that tells the agent why its output was not accepted, so that a retry
        can differ (a greedy model asked again without it would repeat itself)."""
        return {"role": "user", "content": FEEDBACK_TEMPLATE.format(reason=malformed.reason)}

    def _tool_lines(self) -> str:
        return "\n".join(json.dumps(schema, ensure_ascii=False) for schema in self.tool_schemas)


def observation_json(observation: Mapping[str, Any]) -> str:
    return json.dumps(dict(observation), ensure_ascii=False)


# --------------------------------------------------------------------------------------
# Shared pieces
# --------------------------------------------------------------------------------------


def _split_end(text: str) -> tuple[str, bool] | Malformed:
    """(response text, whether it ends the task) of a visible response."""
    stripped = text.strip()
    ends = stripped.endswith(END_TOKEN)
    if ends:
        stripped = stripped[: -len(END_TOKEN)].rstrip()
    if END_TOKEN in stripped:
        return Malformed(f"{END_TOKEN} may only come at the very end of a response", text)
    return stripped, ends


def _response_actions(text: str, raw: str) -> Parsed:
    split = _split_end(text)
    if isinstance(split, Malformed):
        return Malformed(split.reason, raw)
    response, ends = split
    if not response and not ends:
        return Malformed("empty response", raw)
    actions = [AgentAction.respond(response)] if response else []
    return tuple(actions + [AgentAction.end()] if ends else actions)


def _response_text(actions: Sequence[AgentAction]) -> str:
    """The text of a trailing respond/end pair, ``<end>`` included."""
    text = " ".join(a.text for a in actions if a.kind == RESPOND)
    if any(a.kind == END for a in actions):
        text = f"{text} {END_TOKEN}".strip()
    return text


def _decode_call(raw_json: str, arguments_key: str, raw: str) -> AgentAction | Malformed:
    """A ``{"name": ..., <arguments_key>: {...}}`` object (exactly those two keys)."""
    try:
        value = json.loads(raw_json)
    except json.JSONDecodeError as exc:
        return Malformed(f"tool call is not valid JSON ({exc.msg} at character {exc.pos})", raw)
    except RecursionError:  # a generated "[[[[..." deeper than the parser can go
        return Malformed("tool call is not valid JSON (nested too deeply)", raw)
    shape = f'{{"name": <tool name>, "{arguments_key}": {{...}}}}'
    if not isinstance(value, dict) or set(value) != {"name", arguments_key}:
        return Malformed(f"a tool call must be a JSON object {shape}", raw)
    name, arguments = value["name"], value[arguments_key]
    if not isinstance(name, str) or not name.strip():
        return Malformed("the tool name must be a non-empty string", raw)
    if not isinstance(arguments, dict):
        return Malformed(f'"{arguments_key}" must be a JSON object', raw)
    return AgentAction.tool_call(name.strip(), arguments)


def _split_actions(actions: Sequence[AgentAction]) -> tuple[str | None, list[AgentAction]]:
    """(think text or None, the rest), checking the think-first shape every format shares."""
    kinds = [a.kind for a in actions]
    if kinds.count(THINK) > 1 or (THINK in kinds and kinds[0] != THINK):
        raise ValueError("at most one think action, and it must come first")
    if actions and actions[0].kind == THINK:
        return actions[0].text, list(actions[1:])
    return None, list(actions)


def _check_body(body: Sequence[AgentAction], format_name: str, *, many_calls: bool = False, clarify: bool = True) -> None:
    kinds = [a.kind for a in body]
    if kinds and all(k == TOOL_CALL for k in kinds) and (many_calls or len(kinds) == 1):
        return
    if kinds in ([RESPOND], [RESPOND, END], [END]) or (clarify and kinds == [CLARIFY]):
        return
    raise ValueError(f"{format_name} cannot express the actions {kinds}")


# --------------------------------------------------------------------------------------
# SpeakRL structured tokens
# --------------------------------------------------------------------------------------

# Every tag the grammar knows. <tool_response> is not the agent's to write: a model that
# writes one is inventing a tool result, which must not pass as a plain response.
_SPEAKRL_TAG = re.compile(r"<(/?)(think|clarify|tool_call|tool_response)>|(<end>)")
_BLOCKS = ("think", "clarify", "tool_call")


@dataclass(frozen=True)
class _Piece:
    kind: str  # "text" | "open" | "close" | "end"
    value: str  # the text, or the tag name

    def describe(self) -> str:
        return {"open": f"<{self.value}>", "close": f"</{self.value}>", "end": END_TOKEN}.get(self.kind, "text")


def _pieces(text: str) -> list[_Piece]:
    """Tags and the non-blank text between them."""
    pieces: list[_Piece] = []
    position = 0
    for match in _SPEAKRL_TAG.finditer(text):
        between = text[position : match.start()]
        if between.strip():
            pieces.append(_Piece("text", between.strip()))
        if match.group(3):
            pieces.append(_Piece("end", END_TOKEN))
        else:
            pieces.append(_Piece("close" if match.group(1) else "open", match.group(2)))
        position = match.end()
    if text[position:].strip():
        pieces.append(_Piece("text", text[position:].strip()))
    return pieces


class SpeakRLFormat(AgentFormat):
    name = "speakrl"

    def system_prompt(self, task: str = DEFAULT_TASK_PROMPT) -> str:
        return (
            f"{task}\n\n"
            "# Tools\n\nYou can call these tools (JSON schemas):\n"
            f"<tools>\n{self._tool_lines()}\n</tools>\n\n"
            "# Output format\n\n"
            "Start every reply with your private reasoning in <think></think>; the user never sees it. "
            "Then write exactly one of:\n"
            "- <clarify>a question</clarify> to ask the user for missing or ambiguous information;\n"
            '- <tool_call>{"name": <tool name>, "arguments": <arguments as a JSON object>}</tool_call> '
            "to call one tool; its result comes back in <tool_response></tool_response> and you continue;\n"
            "- a plain response to the user, without tags.\n"
            f"When the user has everything they asked for, finish with a plain response that ends with {END_TOKEN}. "
            "Write nothing else outside these parts."
        )

    def parse(self, text: str, tool_calls: Sequence[RawToolCall] = ()) -> Parsed:
        if tool_calls:
            return Malformed("speakrl writes tool calls in the text, inside <tool_call></tool_call>", text)
        pieces = _pieces(text)
        if not pieces:
            return Malformed("empty output", text)
        actions: list[AgentAction] = []
        i = 0
        if pieces[0] == _Piece("open", "think"):
            block = self._block(pieces, 0, text)
            if isinstance(block, Malformed):
                return block
            content, i = block
            actions.append(AgentAction.think(content))
            if i == len(pieces):
                return Malformed("nothing after </think>: a clarification, a tool call or a response must follow", text)

        piece = pieces[i]
        if piece.kind == "open" and piece.value in ("clarify", "tool_call"):
            block = self._block(pieces, i, text)
            if isinstance(block, Malformed):
                return block
            content, i = block
            if piece.value == "clarify":
                if not content:
                    return Malformed("empty <clarify></clarify>", text)
                action: AgentAction | Malformed = AgentAction.clarify(content)
            else:
                action = _decode_call(content, "arguments", text)
            if isinstance(action, Malformed):
                return action
            actions.append(action)
        elif piece.kind == "text":
            actions.append(AgentAction.respond(piece.value))
            i += 1
            if i < len(pieces) and pieces[i].kind == "end":
                actions.append(AgentAction.end())
                i += 1
        elif piece.kind == "end":
            actions.append(AgentAction.end())
            i += 1
        else:
            return Malformed(self._misplaced(piece), text)

        if i < len(pieces):
            return Malformed(self._trailing(actions[-1], pieces[i]), text)
        return tuple(actions)

    @staticmethod
    def _block(pieces: Sequence[_Piece], i: int, raw: str) -> tuple[str, int] | Malformed:
        """(content, index after the block) of the block opened at ``pieces[i]``."""
        name = pieces[i].value
        j = i + 1
        content = ""
        if j < len(pieces) and pieces[j].kind == "text":
            content, j = pieces[j].value, j + 1
        if j < len(pieces) and pieces[j] == _Piece("close", name):
            return content, j + 1
        found = f"found {pieces[j].describe()} first" if j < len(pieces) else "the output ends first"
        return Malformed(f"<{name}> is not closed by </{name}> ({found})", raw)

    @staticmethod
    def _misplaced(piece: _Piece) -> str:
        if piece.kind == "close":
            return f"{piece.describe()} without a matching <{piece.value}>"
        if piece.value == "think":
            return "<think> may only come once, at the start"
        return f"the agent must not write {piece.describe()}: tool results are given to it"

    @staticmethod
    def _trailing(last: AgentAction, piece: _Piece) -> str:
        """Why something after the action makes the output malformed."""
        if last.kind == END:
            return f"nothing may follow {END_TOKEN}"
        if piece.kind == "text":
            return f"text outside tags after the {last.kind.replace('_', ' ')}"
        if last.kind == RESPOND:
            return f"text outside tags: a plain response cannot be combined with {piece.describe()}"
        if piece.kind == "open" and piece.value in ("clarify", "tool_call"):
            return "more than one action: write one clarification, tool call or response per output"
        if piece.kind == "end":
            return f"{END_TOKEN} may only follow a plain response"
        return SpeakRLFormat._misplaced(piece)

    def render(self, actions: Sequence[AgentAction]) -> tuple[str, tuple[RawToolCall, ...]]:
        think, body = _split_actions(actions)
        _check_body(body, self.name)
        parts = [f"<think>{think}</think>"] if think is not None else []
        first = body[0]
        if first.kind == CLARIFY:
            parts.append(f"<clarify>{first.text}</clarify>")
        elif first.kind == TOOL_CALL:
            call = json.dumps({"name": first.tool_name, "arguments": dict(first.arguments or {})}, ensure_ascii=False)
            parts.append(f"<tool_call>\n{call}\n</tool_call>")
        else:
            parts.append(_response_text(body))
        return "\n".join(parts), ()

    def observation_message(self, call: AgentAction, observation: Mapping[str, Any]) -> Message:
        return {"role": "user", "content": f"<tool_response>\n{observation_json(observation)}\n</tool_response>"}


# --------------------------------------------------------------------------------------
# JOSH ReACT
# --------------------------------------------------------------------------------------

COMMAND_END = "<COMMAND_END>"
_REACT = re.compile(
    r"PLAN\s+(?P<plan>.+?)\s*<COMMAND_END>\s*"
    r"(?:APICALL\s*(?P<call>\{.*?\})\s*<COMMAND_END>|SPEAK\s+(?P<speak>.+?)\s*<COMMAND_END>)",
    re.DOTALL,
)
_COMMAND_AFTER_PLAN = re.compile(r"^\s*(APICALL|SPEAK)\b")


class ReActFormat(AgentFormat):
    name = "react"

    def system_prompt(self, task: str = DEFAULT_TASK_PROMPT) -> str:
        return (
            f"{task}\n\n"
            "# General Instructions\n"
            "You have three commands you can use: PLAN, APICALL, and SPEAK.\n"
            "Always start with a PLAN message, then always end your turn with either a SPEAK or APICALL message.\n"
            "Your output must include PLAN and APICALL or PLAN and SPEAK.\n"
            f"You MUST finish each command by saying {COMMAND_END}.\n\n"
            "## PLAN\nThink step by step about what you will do next. The user never sees your plan.\n\n"
            "## SPEAK\nThe only way to talk to the user. Using SPEAK ends your turn, so make any APICALLs you need first.\n"
            f"When the user has everything they asked for, end the conversation with SPEAK and your last words followed by {END_TOKEN}.\n\n"
            "## APICALL\n"
            "Output only a JSON dictionary with 'name' and 'parameters' keys, e.g. "
            f'APICALL {{"name": "query_hotel", "parameters": {{"area": "north"}}}} {COMMAND_END}\n'
            "Call one api at a time; its result is given to you as APIRETURN. The user cannot see APICALLs or APIRETURNs. "
            "Leave out parameters you do not know.\n\n"
            f"# APIs\n{self._tool_lines()}\n\n"
            "# Example\n"
            f"PLAN The user wants a hotel in the north; I will search for one. {COMMAND_END}\n"
            f'APICALL {{"name": "query_hotel", "parameters": {{"area": "north"}}}} {COMMAND_END}'
        )

    def parse(self, text: str, tool_calls: Sequence[RawToolCall] = ()) -> Parsed:
        if tool_calls:
            return Malformed("react writes api calls in the text, after APICALL", text)
        stripped = text.strip()
        match = _REACT.fullmatch(stripped)
        # ".+?" could reach over a <COMMAND_END> into a second command; that is two commands.
        if match is None or any(COMMAND_END in (group or "") for group in match.groups()):
            return Malformed(self._diagnose(stripped), text)
        actions = [AgentAction.think(match.group("plan"))]
        if match.group("call") is not None:
            call = _decode_call(match.group("call"), "parameters", text)
            if isinstance(call, Malformed):
                return call
            return (*actions, call)
        response = _response_actions(match.group("speak"), text)
        return response if isinstance(response, Malformed) else (*actions, *response)

    @staticmethod
    def _diagnose(text: str) -> str:
        if not text.startswith("PLAN"):
            return "the output must start with PLAN"
        ends = text.count(COMMAND_END)
        if ends < 2:
            return f"PLAN and the command after it must each end with {COMMAND_END}"
        after_plan = text.split(COMMAND_END, 1)[1]
        if not _COMMAND_AFTER_PLAN.match(after_plan):
            return "PLAN must be followed by exactly one APICALL or SPEAK"
        if ends > 2:
            return "more than one command after PLAN: use one APICALL or one SPEAK per output"
        if not text.endswith(COMMAND_END):
            return f"text after the last {COMMAND_END}"
        return "the output does not match PLAN ... <COMMAND_END> (APICALL {...} | SPEAK ...) <COMMAND_END>"

    def render(self, actions: Sequence[AgentAction]) -> tuple[str, tuple[RawToolCall, ...]]:
        think, body = _split_actions(actions)
        _check_body(body, self.name, clarify=False)
        first = body[0]
        if first.kind == TOOL_CALL:
            plan = think or f"I will call {first.tool_name}."
            call = json.dumps({"name": first.tool_name, "parameters": dict(first.arguments or {})}, ensure_ascii=False)
            return f"PLAN {plan} {COMMAND_END}\nAPICALL {call} {COMMAND_END}", ()
        plan = think or "I will reply to the user."
        return f"PLAN {plan} {COMMAND_END}\nSPEAK {_response_text(body)} {COMMAND_END}", ()

    def observation_message(self, call: AgentAction, observation: Mapping[str, Any]) -> Message:
        return {"role": "user", "content": f"APIRETURN {observation_json(observation)}"}


# --------------------------------------------------------------------------------------
# OpenAI function calling
# --------------------------------------------------------------------------------------

_TEXT_TOOL_CALL = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


class FunctionCallingFormat(AgentFormat):
    name = "function_calling"

    @property
    def tools(self) -> tuple[Mapping[str, Any], ...]:
        return self.tool_schemas

    def system_prompt(self, task: str = DEFAULT_TASK_PROMPT) -> str:
        return (
            f"{task}\n\n"
            "Call the tools you need through function calls; the user never sees them or their results. "
            "Reply to the user in plain text. "
            f"When the user has everything they asked for, end the conversation with a reply that ends with {END_TOKEN}."
        )

    def parse(self, text: str, tool_calls: Sequence[RawToolCall] = ()) -> Parsed:
        content = text or ""
        calls: list[AgentAction] = []
        if tool_calls:
            for raw_call in tool_calls:
                call = self._structured_call(raw_call, content)
                if isinstance(call, Malformed):
                    return call
                calls.append(call)
        else:
            extracted = self._text_calls(content)
            if isinstance(extracted, Malformed):
                return extracted
            content, calls = extracted
        if not calls:
            return _response_actions(content, text)
        if END_TOKEN in content:
            return Malformed(f"{END_TOKEN} cannot come with tool calls: the turn goes on after them", text)
        hidden = [AgentAction.think(content.strip())] if content.strip() else []
        return (*hidden, *calls)

    @staticmethod
    def _structured_call(raw_call: RawToolCall, raw: str) -> AgentAction | Malformed:
        function = raw_call.get("function") if isinstance(raw_call, Mapping) else None
        if not isinstance(function, Mapping) or not isinstance(function.get("name"), str) or not function["name"].strip():
            return Malformed('a tool call must be {"type": "function", "function": {"name": ..., "arguments": ...}}', raw)
        arguments = function.get("arguments", {})
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as exc:
                return Malformed(f"arguments of {function['name']} are not valid JSON ({exc.msg} at character {exc.pos})", raw)
            except RecursionError:
                return Malformed(f"arguments of {function['name']} are not valid JSON (nested too deeply)", raw)
        if not isinstance(arguments, Mapping):
            return Malformed(f"arguments of {function['name']} must be a JSON object", raw)
        call_id = raw_call.get("id")
        return AgentAction.tool_call(function["name"].strip(), arguments, call_id if isinstance(call_id, str) else None)

    @staticmethod
    def _text_calls(text: str) -> tuple[str, list[AgentAction]] | Malformed:
        """(content without the blocks, the calls) of Qwen2.5 ``<tool_call>`` blocks in text."""
        calls: list[AgentAction] = []
        for match in _TEXT_TOOL_CALL.finditer(text):
            call = _decode_call(match.group(1).strip(), "arguments", text)
            if isinstance(call, Malformed):
                return call
            calls.append(call)
        content = _TEXT_TOOL_CALL.sub("", text)
        if "<tool_call>" in content or "</tool_call>" in content:
            return Malformed("<tool_call> is not closed by </tool_call>", text)
        return content.strip(), calls

    def render(self, actions: Sequence[AgentAction]) -> tuple[str, tuple[RawToolCall, ...]]:
        think, body = _split_actions(actions)
        _check_body(body, self.name, many_calls=True, clarify=False)
        if body[0].kind == TOOL_CALL:
            return think or "", tuple(self._raw_call(call) for call in body)
        # A visible reply has no channel for hidden text next to it: the think is dropped.
        return _response_text(body), ()

    @staticmethod
    def _raw_call(call: AgentAction) -> RawToolCall:
        raw: dict[str, Any] = {"type": "function", "function": {"name": call.tool_name, "arguments": call.arguments_json}}
        if call.call_id is not None:
            raw["id"] = call.call_id
        return raw

    def assistant_message(self, text: str, tool_calls: Sequence[RawToolCall], actions: Sequence[AgentAction] | None) -> Message:
        calls = [a for a in actions or () if a.kind == TOOL_CALL]
        if actions is None:
            # Malformed: unanswerable calls cannot stay structured (every call needs a tool
            # message), so the agent sees them as text next to the feedback.
            shown = "\n".join([text, *(json.dumps(dict(c), ensure_ascii=False, default=str) for c in tool_calls)])
            return {"role": "assistant", "content": shown.strip()}
        if not calls:
            return {"role": "assistant", "content": text}
        think = next((a.text for a in actions if a.kind == THINK), "")
        return {
            "role": "assistant",
            "content": think,
            # Arguments as objects: the form chat templates (Qwen2.5) and TRL render.
            "tool_calls": [
                {"id": c.call_id, "type": "function", "function": {"name": c.tool_name, "arguments": dict(c.arguments or {})}}
                for c in calls
            ],
        }

    def observation_message(self, call: AgentAction, observation: Mapping[str, Any]) -> Message:
        return {"role": "tool", "tool_call_id": call.call_id, "name": call.tool_name, "content": observation_json(observation)}


FORMATS: Mapping[str, type[AgentFormat]] = frozen_dict(
    {cls.name: cls for cls in (SpeakRLFormat, ReActFormat, FunctionCallingFormat)}
)


_SPEAKRL = SpeakRLFormat()


def decision(text: str) -> str | None:
    """What a SpeakRL output does: ``clarify``, ``tool_call``, ``respond`` or ``end`` (a
    response that ends the dialogue); None when the agent grammar rejects it.

    >>> decision("<think>a</think><clarify>Which area?</clarify>"), decision("<think>b</think>Here."), decision("<think>b</think>")
    ('clarify', 'respond', None)
    """
    parsed = _SPEAKRL.parse(text)
    if isinstance(parsed, Malformed):
        return None
    kinds = [action.kind for action in parsed if action.kind != THINK]
    if END in kinds:
        return END
    return kinds[0] if kinds else None


def get_format(name: str, tools: Sequence[Mapping[str, Any]] = TOOL_SCHEMAS) -> AgentFormat:
    if name not in FORMATS:
        raise ValueError(f"unknown agent format {name!r}; formats: {', '.join(FORMATS)}")
    return FORMATS[name](tools)
