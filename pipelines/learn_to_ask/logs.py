"""Offline logs for Learn-to-Ask: sessions of user and expert (assistant) messages.

Two sources give the same :class:`Session` record:

* MultiWOZ-layout dialogues (embedded or real), by :func:`session_from_dialogue`: user turns
  become ``user`` messages, system turns ``assistant`` messages, and each user message
  carries the slot values it revealed (the belief-state delta it caused, read from the
  following system turn's annotation) as ``info``;
* plain chat logs in the layout Learn-to-Ask uses, one record per session, by
  :func:`parse_chat_log`::

      {"session_id": "s1", "goal": "optional text", "split": "train",
       "messages": [{"role": "user", "content": "I have a cough."},
                    {"role": "assistant", "content": "Do you have a fever?"},
                    {"role": "user", "content": "No.", "info": [{"field": "fever", "value": "absent"}]}]}

  ``goal``, ``split`` and a user message's ``info`` (what it revealed, for the ``rules``
  extractor) are optional; without ``info`` a session needs an LLM extractor.

A malformed record raises :class:`~pipelines.errors.DataError` naming the source, the
record and the field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipelines.errors import DataError
from pipelines.records import SPLITS, Dialogue, DomainBelief

ROLES: tuple[str, ...] = ("user", "assistant")
USER, ASSISTANT = ROLES
#: Keys a chat-log record and a message may have.
SESSION_KEYS = frozenset({"session_id", "messages", "goal", "split"})
MESSAGE_KEYS = frozenset({"role", "content", "info"})


@dataclass(frozen=True)
class Message:
    """One message. ``info``: the (field, value) pairs a user message revealed, when the
    source annotates it; None when it does not (an LLM extractor must read the text)."""

    role: str
    content: str
    info: tuple[tuple[str, str], ...] | None = None
    #: An assistant message's requests as its source's annotators marked them, (domain, slot)
    #: pairs (MultiWOZ dialog acts ``Hotel-Request: [["Price", "?"]]`` -> ("hotel", "Price"),
    #: ``general-reqmore`` -> ("general", "reqmore")); None when the source has no acts.
    requests: tuple[tuple[str, str], ...] | None = None


@dataclass(frozen=True)
class Session:
    """One logged conversation: ``goal`` (text, may be empty), ``split`` (None when the
    source has none) and ``annotated``: every user message carries ``info``."""

    session_id: str
    messages: tuple[Message, ...]
    goal: str = ""
    split: str | None = None

    @property
    def annotated(self) -> bool:
        return all(m.info is not None for m in self.messages if m.role == USER)


# --- MultiWOZ dialogues ----------------------------------------------------------------------


def _belief_slots(beliefs: Sequence[DomainBelief]) -> dict[str, str]:
    """``domain-slot`` / ``domain-book-slot`` -> value, non-empty values only (as the
    ``turns`` table flattens them)."""
    slots: dict[str, str] = {}
    for belief in beliefs:
        for slot, value in belief.semi.items():
            if value and value != "not mentioned":
                slots[f"{belief.domain}-{slot}"] = value
        for slot, value in belief.book.items():
            if value:
                slots[f"{belief.domain}-book-{slot}"] = value
    return slots


def session_from_dialogue(dialogue: Dialogue) -> Session:
    """The dialogue as a session. A user message's ``info`` is what the belief state
    annotated on the next system turn added or changed; None when that turn has no
    annotation (or no system turn follows), so a partially annotated dialogue is never
    completed by guesswork."""
    messages: list[Message] = []
    previous: dict[str, str] = {}
    turns = dialogue.turns
    for i, turn in enumerate(turns):
        if turn.speaker == "system":
            requests = None if turn.dialog_acts is None else tuple(
                (act.domain, act.slot if act.intent == "request" else act.intent)
                for act in turn.dialog_acts if act.intent in ("request", "reqmore"))
            messages.append(Message(ASSISTANT, turn.text, requests=requests))
            continue
        following = turns[i + 1] if i + 1 < len(turns) else None
        info: tuple[tuple[str, str], ...] | None = None
        if following is not None and following.speaker == "system" and following.belief_state is not None:
            state = _belief_slots(following.belief_state)
            info = tuple((slot, value) for slot, value in state.items() if previous.get(slot) != value)
            previous = state
        messages.append(Message(USER, turn.text, info))
    return Session(dialogue.dialogue_id, tuple(messages), " ".join(dialogue.goal.message), dialogue.split)


# --- Chat logs -------------------------------------------------------------------------------


def _string(value: Any, source: str, record: str, field: str, *, empty: bool = False) -> str:
    if not isinstance(value, str) or (not empty and not value.strip()):
        raise DataError(source, f"expected a {'string' if empty else 'non-empty string'}, got {value!r}", record, field)
    return value


def _info(value: Any, source: str, record: str, field: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, list):
        raise DataError(source, f"expected a list of {{field, value}} objects, got {type(value).__name__}", record, field)
    items = []
    for k, item in enumerate(value):
        where = f"{field}[{k}]"
        if not isinstance(item, Mapping) or set(item) != {"field", "value"}:
            raise DataError(source, f"expected an object with exactly 'field' and 'value', got {item!r}", record, where)
        items.append((_string(item["field"], source, record, f"{where}.field"), _string(item["value"], source, record, f"{where}.value")))
    return tuple(items)


def parse_chat_log(raw: Any, source: str, position: str) -> Session:
    """One chat-log record (module docstring). ``position`` names the record until its
    ``session_id`` is known (``line 3``, ``record 0``)."""
    if not isinstance(raw, Mapping):
        raise DataError(source, f"a session must be an object, got {type(raw).__name__}", position)
    record = position
    if "session_id" not in raw:
        raise DataError(source, "missing required field", record, "session_id")
    session_id = _string(raw["session_id"], source, record, "session_id")
    record = session_id
    unknown = sorted(set(raw) - SESSION_KEYS)
    if unknown:
        raise DataError(source, f"unknown field(s) {unknown}; fields: {sorted(SESSION_KEYS)}", record, unknown[0])
    if "messages" not in raw:
        raise DataError(source, "missing required field", record, "messages")
    raw_messages = raw["messages"]
    if not isinstance(raw_messages, list) or not raw_messages:
        raise DataError(source, f"expected a non-empty list of messages, got {raw_messages!r}", record, "messages")
    messages = []
    for k, message in enumerate(raw_messages):
        where = f"messages[{k}]"
        if not isinstance(message, Mapping):
            raise DataError(source, f"a message must be an object, got {type(message).__name__}", record, where)
        for required in ("role", "content"):
            if required not in message:
                raise DataError(source, "missing required field", record, f"{where}.{required}")
        extra = sorted(set(message) - MESSAGE_KEYS)
        if extra:
            raise DataError(source, f"unknown field(s) {extra}; fields: {sorted(MESSAGE_KEYS)}", record, f"{where}.{extra[0]}")
        role = message["role"]
        if role not in ROLES:
            raise DataError(source, f"role must be one of {list(ROLES)}, got {role!r}", record, f"{where}.role")
        content = _string(message["content"], source, record, f"{where}.content")
        info = None
        if "info" in message:
            if role != USER:
                raise DataError(source, "only a user message reveals information", record, f"{where}.info")
            info = _info(message["info"], source, record, f"{where}.info")
        messages.append(Message(role, content, info))
    goal = _string(raw.get("goal", ""), source, record, "goal", empty=True)
    split = raw.get("split")
    if split is not None and split not in SPLITS:
        raise DataError(source, f"split must be one of {list(SPLITS)}, got {split!r}", record, "split")
    return Session(session_id, tuple(messages), goal, split)


def parse_chat_logs(records: Sequence[tuple[str, Any]], source: str) -> list[Session]:
    """Every record, ``(position, raw)`` in file order; a repeated ``session_id`` or an
    empty file is an error."""
    if not records:
        raise DataError(source, "no sessions: nothing to build from")
    sessions: list[Session] = []
    seen: dict[str, str] = {}
    for position, raw in records:
        session = parse_chat_log(raw, source, position)
        if session.session_id in seen:
            raise DataError(source, f"repeats the session_id of {seen[session.session_id]}", session.session_id, "session_id")
        seen[session.session_id] = position
        sessions.append(session)
    return sessions
