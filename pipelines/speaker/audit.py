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
``over_asking``
    ``asks_stated_slot``: clarify rows asking about a slot the user has already stated for
    the search the question follows (:func:`asks_stated_slot`; must be 0). Then every
    clarify row read as the evaluation reads a played episode's question
    (:func:`pipelines.evaluation.metrics.clarification_checks`): the goal constraints whose
    values the user has said in the prompt (whole words; tool results are not the user's
    words) are *known*, the others *open*, both read for the domain of the latest tool call
    (or of a taxi the user has just named: it has no search) and over what the user said
    since the turn that asked for it (an area said for an attraction does not answer the
    hotel's). ``asks_known_slot``: questions about a slot the
    user has already stated; ``nothing_open``: questions asked when every constraint of the
    domain was stated; the two together are the over-asking the evaluation counts.
``after_search``
    Every row whose prompt's last tool call is a search that returned several candidates,
    before anything was recommended: does the agent ``ask`` (clarify) or ``act``, split by
    whether a slot is still *open* there (the user has neither stated it, in the search's
    arguments, nor said they do not mind it, and the shown results differ in it or the
    search found more than it showed) or every such slot is *stated*. A question where
    everything is stated is over-asking the agent could have seen (``stated.ask`` must be 0).
``tool_calls``
    Every tool-call row, by tool, and the errors in the data: an unknown tool, an argument the
    tool does not take, or an observation (the next row's prompt) that is an error.
    ``booking_unavailable`` (not an error): a booking the environment declined because the
    venue is full on the goal's ``fail_book`` values, the detour the goal asks for.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from collections import Counter, defaultdict
from typing import Any, Iterable, Mapping, Sequence

from pipelines.env.replay import DomainFocus
from pipelines.env.tools import TOOLS
from pipelines.episodes.formats import CLARIFY, TOOL_CALL, Malformed, decision
from pipelines.multiwoz.ontology import is_dont_care
from pipelines.rewards.verifiable import ASKS_KNOWN, VerifiableJudge, asked_slots, words
from pipelines.speaker.trajectory import FORMAT

#: Booking tools by goal domain.
BOOKING_TOOLS: Mapping[str, str] = {"restaurant": "book_restaurant", "hotel": "book_hotel", "train": "buy_train_ticket", "taxi": "book_taxi"}
_NO_PREFERENCE = re.compile(
    r"\b(?:don ?t mind|do not mind|no preference|doesn ?t matter|does not matter|any (?:\w+ ){1,3}(?:is|would be) fine|"
    r"either|whichever|any of (?:them|those)|recommend|suggest|no particular|not really)\b"
)


#: What a search's results can differ in that a user states, per domain; a train's two
#: times are one choice ("leave after, or arrive by?"), so either settles both.
ASKABLE_SLOTS: Mapping[str, tuple[tuple[str, ...], ...]] = {
    "restaurant": (("area",), ("pricerange",), ("food",)),
    "hotel": (("area",), ("pricerange",), ("type",), ("stars",), ("parking",), ("internet",)),
    "attraction": (("area",), ("type",)),
    "train": (("leaveAt", "arriveBy"),),
}
_JUDGE = VerifiableJudge()
NOTHING_OPEN = "nothing_open"


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


def _is_observation(message: Mapping[str, Any]) -> bool:
    return message["role"] == "user" and str(message["content"]).startswith("<tool_response>")


def user_words(prompt: Sequence[Mapping[str, Any]]) -> str:
    """What the user has said in ``prompt`` (tool results left out), as padded :func:`words`."""
    return " " + "".join(f"{words(m['content'])} " for m in prompt if m["role"] == "user" and not _is_observation(m))


def _said(value: str, said: str) -> bool:
    needle = words(value)
    return bool(needle) and f" {needle} " in said


def question_check(question: str, prompt: Sequence[Mapping[str, Any]], goal: Mapping[str, Any]) -> str:
    """The evaluation's verdict on a question asked after ``prompt`` (module docstring):
    ``asks_known_slot``, ``nothing_open``, ``targets_discriminating_slot`` or ``irrelevant``.
    Read per domain, as :func:`pipelines.evaluation.metrics.clarification_checks` reads a
    played episode: the domain of the latest tool call (or a taxi the user has just named),
    what the user said since the turn that asked for it.

    >>> goal = {"hotel": {"info": {"area": "centre", "pricerange": "cheap"}},
    ...         "attraction": {"info": {"area": "centre", "type": "museum"}}}
    >>> said = [{"role": "user", "content": "A hotel in the centre, please."},
    ...         {"role": "assistant", "content": '<tool_call>{"name": "query_hotel", "arguments": {}}</tool_call>'}]
    >>> question_check("Which part of town would you prefer: the east or the centre?", said, goal)
    'asks_known_slot'
    >>> more = said + [{"role": "user", "content": "I also want to see a museum."},
    ...                {"role": "assistant", "content": '<tool_call>{"name": "query_attraction", "arguments": {}}</tool_call>'}]
    >>> question_check("Which part of town would you prefer: the east or the centre?", more, goal)
    'targets_discriminating_slot'
    """
    focus = DomainFocus(goal)
    for message in prompt:
        if message["role"] == "user" and not _is_observation(message):
            focus.user(words(message["content"]))
        elif message["role"] == "assistant":
            call = _call(message["content"])
            if call is not None:
                focus.tool_call(call[0])
    current = focus.current
    slots = goal_constraints({current: goal[current]} if current is not None else goal)
    said = focus.said
    known = sorted(s for s, values in slots.items() if any(_said(v, said) for v in values))
    open_slots = sorted(s for s in slots if s not in known)
    if not open_slots:
        return NOTHING_OPEN
    return _JUDGE.verdict(question, {"discriminating_slots": open_slots, "known_slots": known}).reason


def _sentences(text: str) -> list[str]:
    return [part for part in re.split(r"(?<=[.!?])\s+", text.strip()) if part]


@dataclass(frozen=True)
class SearchState:
    """What the agent knows at a decision after a search (:func:`search_state`): the searched
    ``domain``, the slots the user has ``stated`` (the search's arguments, answers to the
    agent's questions since, and slots they said they do not mind), the ``results`` shown
    and the ``count`` found."""

    domain: str
    stated: frozenset[str]
    results: tuple[Mapping[str, Any], ...]
    count: int

    @property
    def open_slots(self) -> list[str]:
        """Askable slots neither stated nor declined on which the candidates may differ: the
        shown results differ there, or the search found more than it showed."""
        out = []
        for group in ASKABLE_SLOTS.get(self.domain, ()):
            if self.stated & set(group):
                continue
            values = [{str(r[s]) for r in self.results if r.get(s) is not None} for s in group]
            if self.count > len(self.results) or any(len(v) > 1 for v in values):
                out.extend(group)
        return out


def search_state(prompt: Sequence[Mapping[str, Any]]) -> SearchState | None:
    """The state of a decision after ``prompt`` whose last tool call is a search, with
    nothing recommended since (only questions and the user's replies); None otherwise.

    >>> obs = '<tool_response>{"count": 2, "results": [{"area": "centre"}, {"area": "%s"}]}</tool_response>'
    >>> call = '<think>t</think><tool_call>{"name": "query_attraction", "arguments": {"type": "swimmingpool"%s}}</tool_call>'
    >>> def prompt(area, other):
    ...     return [{"role": "user", "content": "A swimmingpool."}, {"role": "assistant", "content": call % area},
    ...             {"role": "user", "content": obs % other}]
    >>> state = search_state(prompt(', "area": "centre"', "centre"))
    >>> sorted(state.stated), state.open_slots, search_situation(prompt(', "area": "centre"', "centre"))
    (['area', 'type'], [], 'stated')
    >>> search_state(prompt("", "east")).open_slots, search_situation(prompt("", "east")), search_state(prompt("", "east")[:1])
    (['area'], 'open', None)
    """
    last = None
    for index in range(len(prompt) - 1, -1, -1):
        message = prompt[index]
        if message["role"] != "assistant":
            continue
        kind = decision(message["content"])
        if kind == TOOL_CALL:
            last = index
            break
        if kind != CLARIFY:
            return None  # something was recommended or said since the search
    if last is None or last + 1 >= len(prompt) or not _is_observation(prompt[last + 1]):
        return None
    call = _call(prompt[last]["content"])
    if call is None or not call[0].startswith("query_"):
        return None
    try:
        body = json.loads(prompt[last + 1]["content"].removeprefix("<tool_response>").removesuffix("</tool_response>").strip())
    except json.JSONDecodeError:
        return None
    if not isinstance(body, dict) or not isinstance(body.get("results"), list):
        return None
    results = tuple(r for r in body["results"] if isinstance(r, dict))
    count = body.get("count", len(results))
    stated = set(call[1])
    # The user's words from the request that led to the search on: an answer states the slot
    # the agent asked about; "I don't mind (about the area)" declines one.
    start = max((i for i in range(last) if prompt[i]["role"] == "user" and not _is_observation(prompt[i])), default=last)
    for index in range(start, len(prompt)):
        message = prompt[index]
        if message["role"] != "user" or _is_observation(message):
            continue
        previous = prompt[index - 1] if index else None
        question = _question(previous["content"]) if previous is not None and previous["role"] == "assistant" else ""
        for sentence in _sentences(message["content"]):
            if no_preference_reply(sentence):
                stated |= set(asked_slots(sentence)) or set(asked_slots(question))
        if question and not no_preference_reply(message["content"]):
            stated |= set(asked_slots(question))
    return SearchState(call[0].removeprefix("query_"), frozenset(stated), results, count if isinstance(count, int) else len(results))


def search_situation(prompt: Sequence[Mapping[str, Any]]) -> str | None:
    """``open`` (some slot is open: :attr:`SearchState.open_slots`) or ``stated`` at a
    decision after a search that found several candidates; None elsewhere."""
    state = search_state(prompt)
    if state is None or state.count < 2 or state.domain not in ASKABLE_SLOTS:
        return None
    return "open" if state.open_slots else "stated"


def asks_stated_slot(question: str, prompt: Sequence[Mapping[str, Any]]) -> frozenset[str]:
    """The slots ``question`` asks about that the user has already stated for the search it
    follows (:func:`search_state`); empty where it follows no search.

    >>> call = '<think>t</think><tool_call>{"name": "query_attraction", "arguments": {"type": "swimmingpool", "area": "centre"}}</tool_call>'
    >>> prompt = [{"role": "user", "content": "A swimmingpool in the centre."}, {"role": "assistant", "content": call},
    ...           {"role": "user", "content": '<tool_response>{"count": 2, "results": []}</tool_response>'}]
    >>> sorted(asks_stated_slot("Which part of town would you prefer: the east or the centre?", prompt))
    ['area']
    """
    state = search_state(prompt)
    return frozenset(asked_slots(question)) & state.stated if state is not None else frozenset()


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
    checks: Counter = Counter()
    stated_questions = 0
    situations: dict[str, Counter] = {"open": Counter(), "stated": Counter()}
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
                checks[question_check(_question(completion), prompt, goal)] += 1
                if asks_stated_slot(_question(completion), prompt):
                    stated_questions += 1
            situation = search_situation(prompt)
            if situation is not None:
                situations[situation]["ask" if kind == CLARIFY else "act"] += 1
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
        "over_asking": {
            # Questions about a slot the user stated for the search they follow: must be 0.
            "asks_stated_slot": stated_questions,
            # The evaluation's goal-wide lexical reading (a value said for another domain counts).
            "asks_known_slot": checks[ASKS_KNOWN],
            "nothing_open": checks[NOTHING_OPEN],
            "share": _share(checks[ASKS_KNOWN] + checks[NOTHING_OPEN], questions["total"]),
            "verdicts": dict(sorted(checks.items())),
        },
        "after_search": {
            name: {"ask": counts["ask"], "act": counts["act"], "ask_share": _share(counts["ask"], counts["ask"] + counts["act"])}
            for name, counts in situations.items()
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


__all__ = [
    "ASKABLE_SLOTS", "BOOKING_TOOLS", "SearchState", "asks_stated_slot", "audit_sft", "booking_domains", "goal_constraints", "no_preference_reply", "question_check",
    "search_situation", "search_state", "user_words",
]
