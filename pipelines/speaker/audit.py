"""An audit of the ``speaker_sft`` rows by kind: what the SFT data teaches a policy that
cannot see the goal (issue 26, point 1).

:func:`audit_sft` is a pure function over the rows (dicts as ``pyarrow.Table.to_pylist``
gives them) and the goals (``{dialogue_id: goal}`` in :func:`~pipelines.speaker.trajectory.goal_json`'s
shape, or the rows' own ``goal`` column). Everything is read off the rows' messages the way
the evaluation reads an episode, so the audit holds for any synthesizer:

``questions``
    Every clarify row (a question the data *teaches*). The slots a question asks about are
    read lexically by the verifiable judge (:func:`pipelines.rewards.verifiable.asked_slots`),
    the same reading the evaluation's over-asking count uses. ``absent_from_goal``: questions
    none of whose slots is a constraint of the goal (``info``, ``fail_info``, ``book``,
    ``fail_book`` of any domain; a train's "leave after, or arrive by?" question counts as
    grounded when the goal has either time); ``unread``: questions in which no slot is read.
``after_question``
    Every row whose prompt ends with an agent question and the user's reply: the reply is an
    ``answer`` or ``no_preference`` (:func:`no_preference_reply`), and what the agent does
    next (``respond`` / ``tool_call`` / ``clarify`` / ``end``). After a no-preference reply the
    right move is a recommendation among the candidates already found; ``requery_no_arguments``
    counts searches with no arguments there (the failure seen on the GPU run).
``bookings``
    Per goal domain: the dialogues whose goal books there (a taxi goal always books), the
    booking calls of the rows, and the dialogues with at least one booking call.
``tool_calls``
    Every tool-call row, by tool, and the errors in the data: an unknown tool, an argument the
    tool does not take, or an observation (the next row's prompt) that is an error.
    ``booking_unavailable`` (not an error): a booking the environment declined because the
    venue is full on the goal's ``fail_book`` values, the detour the goal asks for.
"""

from __future__ import annotations

import json
import re
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

from pipelines.env.tools import TOOLS
from pipelines.episodes.formats import CLARIFY, TOOL_CALL, Malformed, decision
from pipelines.multiwoz.ontology import is_dont_care
from pipelines.rewards.verifiable import asked_slots, words
from pipelines.speaker.trajectory import FORMAT

#: Booking tools by goal domain.
BOOKING_TOOLS: Mapping[str, str] = {"restaurant": "book_restaurant", "hotel": "book_hotel", "train": "buy_train_ticket", "taxi": "book_taxi"}
_NO_PREFERENCE = re.compile(
    r"\b(?:don ?t mind|do not mind|no preference|doesn ?t matter|does not matter|any (?:\w+ ){1,3}(?:is|would be) fine|"
    r"either|whichever|any of (?:them|those)|recommend|suggest|no particular|not really)\b"
)


def no_preference_reply(text: str) -> bool:
    """Whether a user's reply to a question says they have no preference.

    >>> no_preference_reply("I don't mind about the area."), no_preference_reply("Could you recommend one?")
    (True, True)
    >>> no_preference_reply("Somewhere in the north, please.")
    False
    """
    return bool(_NO_PREFERENCE.search(f" {words(text)} "))


def goal_constraints(goal: Mapping[str, Any]) -> dict[str, set[str]]:
    """slot -> the values the goal can make the user say (every domain's ``info``,
    ``fail_info``, ``book``, ``fail_book``; "don't care" left out)."""
    out: dict[str, set[str]] = defaultdict(set)
    for part in goal.values():
        for name in ("info", "fail_info", "book", "fail_book"):
            for slot, value in (part.get(name) or {}).items():
                if not is_dont_care(value):
                    out[slot].add(str(value))
    return dict(out)


def booking_domains(goal: Mapping[str, Any]) -> list[str]:
    """The goal's domains that ask for a booking (a taxi goal always does)."""
    return [d for d, part in goal.items() if d in BOOKING_TOOLS and (d == "taxi" or any(not is_dont_care(v) for v in (part.get("book") or {}).values()))]


def _text(messages: Sequence[Mapping[str, Any]]) -> str:
    return messages[0]["content"] if messages else ""


def _call(content: str) -> tuple[str, dict[str, Any]] | None:
    parsed = FORMAT.parse(content)
    if isinstance(parsed, Malformed):
        return None
    call = next((a for a in parsed if a.kind == TOOL_CALL), None)
    return (call.tool_name, dict(call.arguments or {})) if call is not None else None


def _question(content: str) -> str:
    parsed = FORMAT.parse(content)
    if isinstance(parsed, Malformed):
        return ""
    return " ".join(a.text for a in parsed if a.kind == CLARIFY)


def _goal_of(row: Mapping[str, Any], goals: Mapping[str, Any] | None) -> dict[str, Any] | None:
    goal = row.get("goal")
    if goal is None and goals is not None:
        goal = goals.get(row["dialogue_id"])
    if isinstance(goal, str):
        goal = json.loads(goal)
    return goal


def _share(part: int, whole: int) -> float | None:
    return round(part / whole, 4) if whole else None


def audit_sft(rows: Iterable[Mapping[str, Any]], goals: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The audit of ``speaker_sft`` rows (module docstring); ``goals`` where the rows have no
    ``goal`` column. Rows of a dialogue without a goal are counted in ``no_goal`` only."""
    by_dialogue: dict[str, list[Mapping[str, Any]]] = defaultdict(list)
    for row in rows:
        by_dialogue[row["dialogue_id"]].append(row)
    kinds: Counter = Counter()
    questions = Counter(total=0, absent_from_goal=0, unread=0)
    replies: Counter = Counter()
    after: dict[str, Counter] = {"answer": Counter(), "no_preference": Counter()}
    requery_empty = 0
    goal_bookings: Counter = Counter()
    booking_calls: Counter = Counter()
    booked_dialogues: Counter = Counter()
    tools: Counter = Counter()
    errors: Counter = Counter()
    no_goal = 0
    unavailable = 0
    for dialogue_id, dialogue_rows in sorted(by_dialogue.items()):
        dialogue_rows = sorted(dialogue_rows, key=lambda r: r["step"])
        goal = _goal_of(dialogue_rows[0], goals)
        if goal is None:
            no_goal += len(dialogue_rows)
            continue
        constraints = goal_constraints(goal)
        for domain in booking_domains(goal):
            goal_bookings[domain] += 1
        booked_here: set[str] = set()
        for position, row in enumerate(dialogue_rows):
            kind = row["kind"]
            kinds[kind] += 1
            completion = _text(row["completion"])
            prompt = row["prompt"]
            if kind == CLARIFY:
                questions["total"] += 1
                asked = set(asked_slots(_question(completion)))
                if not asked:
                    questions["unread"] += 1
                elif not asked & set(constraints):
                    questions["absent_from_goal"] += 1
            if len(prompt) >= 2 and prompt[-1]["role"] == "user" and prompt[-2]["role"] == "assistant" and decision(prompt[-2]["content"]) == CLARIFY:
                reply = "no_preference" if no_preference_reply(prompt[-1]["content"]) else "answer"
                replies[reply] += 1
                after[reply][decision(completion) or "malformed"] += 1
                call = _call(completion) if reply == "no_preference" else None
                if call is not None and call[0].startswith("query_") and not call[1]:
                    requery_empty += 1
            if kind == TOOL_CALL:
                call = _call(completion)
                if call is None:
                    errors["malformed_call"] += 1
                    continue
                name, arguments = call
                tools[name] += 1
                spec = TOOLS.get(name)
                if spec is None:
                    errors["unknown_tool"] += 1
                else:
                    if any(spec.param(a) is None for a in arguments):
                        errors["invalid_argument"] += 1
                    if spec.action == "book":
                        booking_calls[spec.domain] += 1
                        booked_here.add(spec.domain)
                following = dialogue_rows[position + 1]["prompt"] if position + 1 < len(dialogue_rows) else []
                observation = following[len(prompt) + 1]["content"] if len(following) > len(prompt) + 1 else ""
                try:
                    body = json.loads(observation.removeprefix("<tool_response>").removesuffix("</tool_response>").strip())
                except json.JSONDecodeError:
                    body = {}
                if isinstance(body, dict) and body.get("unavailable"):
                    unavailable += 1  # the goal's fail_book detour: the venue is full, not a wrong call
                elif isinstance(body, dict) and "error" in body:
                    errors["error_observation"] += 1
        for domain in booked_here:
            booked_dialogues[domain] += 1
    n_calls = sum(tools.values())
    return {
        "rows": sum(kinds.values()),
        "rows_by_kind": dict(sorted(kinds.items())),
        "no_goal": no_goal,
        "questions": {
            **dict(questions),
            "absent_from_goal_share": _share(questions["absent_from_goal"], questions["total"]),
        },
        "after_question": {
            "replies": {k: replies[k] for k in ("answer", "no_preference")},
            "next_after_answer": dict(sorted(after["answer"].items())),
            "next_after_no_preference": dict(sorted(after["no_preference"].items())),
            "requery_no_arguments_after_no_preference": requery_empty,
        },
        "bookings": {
            domain: {
                "goal_dialogues": goal_bookings[domain],
                "dialogues_booked": booked_dialogues[domain],
                "booking_calls": booking_calls[domain],
            }
            for domain in BOOKING_TOOLS
        },
        "tool_calls": {
            "total": n_calls,
            "by_tool": dict(sorted(tools.items())),
            "errors": sum(errors.values()),
            "errors_by_kind": dict(sorted(errors.items())),
            "booking_unavailable": unavailable,
        },
    }


__all__ = ["BOOKING_TOOLS", "audit_sft", "booking_domains", "goal_constraints", "no_preference_reply"]
