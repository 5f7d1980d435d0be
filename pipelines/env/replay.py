"""The tool calls behind a gold MultiWOZ dialogue, and their replay in a ToolEnvironment.

MultiWOZ records no API calls, only what they left behind: each system turn's belief
state (``semi`` constraints, ``book`` slots and ``booked`` records). Read back:

* a domain whose ``semi`` constraints changed to a non-empty set was searched with them:
  ``query_<domain>`` (taxis have no search tool);
* a ``booked`` record that was not there before was booked: ``book_restaurant`` /
  ``book_hotel`` with the venue's name and the belief's ``book`` slots,
  ``buy_train_ticket`` with the trainID, the party size and the belief's day and route
  (the timetable reuses train ids across days and directions), ``book_taxi`` with the taxi ``semi`` slots.

Queries come before bookings within a turn. A turn without metadata yields no calls and
a booking whose required values the annotation lacks is left out: nothing is invented.
Two repairs stay within the annotations: a ``booked`` record whose belief lacks a required
value ("people": "none") takes it from the first later belief that holds the same record
and states it (the booking is still made at the record's own turn), else from the latest
earlier belief of the domain that stated it (a rebooking "for the same party"); and, given the
database, a booked train id that does not run on the belief's day and route (the wizard
clicked the same departure on another day's or direction's timetable: MultiWOZ's booked
ids disagree with their beliefs in about 1 % of real dialogues) is the belief's train
leaving at that same time, when exactly one does.

:func:`replay` runs those calls and returns what :func:`pipelines.env.checker.check_goal`
needs, so gold dialogues (real or embedded) can be graded like agent episodes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace
from typing import Iterable, Mapping, Sequence

from pipelines.env.tools import TOOLS, Database, EnvState, ToolEnvironment
from pipelines.multiwoz.ontology import TIME_SLOTS, format_time, is_dont_care, parse_time, spoken_time, values_match
from pipelines.records import BookedRecord, DialogAct, Dialogue, DomainBelief, ToolCall, frozen_dict

QUERY_TOOLS: Mapping[str, str] = frozen_dict(
    {"restaurant": "query_restaurant", "hotel": "query_hotel", "attraction": "query_attraction", "train": "query_train"}
)
BOOKING_TOOLS: Mapping[str, str] = frozen_dict(
    {"restaurant": "book_restaurant", "hotel": "book_hotel", "train": "buy_train_ticket", "taxi": "book_taxi"}
)
#: Domains with tools but no search (a taxi is booked straight away): a user turn opens them.
UNSEARCHED_DOMAINS: frozenset[str] = frozenset(spec.domain for spec in TOOLS.values()) - frozenset(QUERY_TOOLS)


def names_unsearched(said: str, domains: Iterable[str], opened: Mapping[str, int]) -> str | None:
    """The goal domain without a search (:data:`UNSEARCHED_DOMAINS`) that a user turn names
    and that is not ``opened`` yet, or None. ``said``: the turn in lower-case words, as
    :func:`pipelines.rewards.verifiable.words` gives them. The evaluation's question checks
    (:func:`pipelines.evaluation.metrics.clarification_checks`) and SpeakER's audit read a
    question asked after such a turn against that domain.

    >>> names_unsearched("i also need a taxi to the museum", {"taxi", "attraction"}, {})
    'taxi'
    >>> names_unsearched("i also need a taxi", {"taxi"}, {"taxi": 3}), names_unsearched("a taxi", {"hotel"}, {})
    (None, None)
    """
    return next((d for d in sorted(UNSEARCHED_DOMAINS & set(domains)) if d not in opened and f" {d} " in f" {said} "), None)


class DomainFocus:
    """The goal domain a dialogue is on, read turn by turn, and what the user has said about
    it: the domain of the agent's latest tool call (``query_hotel`` -> hotel), or a domain
    without a search that the user has just named (:func:`names_unsearched`); its words are
    the user's since the turn that asked for it. Before either, no domain (``current`` None)
    and every user turn. The evaluation's question checks and SpeakER's audit read a question
    against this state.

    >>> focus = DomainFocus({"hotel", "taxi"})
    >>> focus.user("a hotel in the centre"); focus.tool_call("query_hotel"); focus.current
    'hotel'
    >>> focus.user("i also need a taxi"); focus.current, focus.said
    ('taxi', ' i also need a taxi ')
    >>> focus.tool_call("query_police"); focus.current
    'taxi'
    """

    def __init__(self, domains: Iterable[str]):
        self.domains = frozenset(domains)
        self.turns: list[str] = []  # the user's turns so far, lower-case words
        self.opened: dict[str, int] = {}  # domain -> index in turns of the turn that asked for it
        self.current: str | None = None

    def user(self, said: str) -> None:
        """A user turn, in lower-case words."""
        self.turns.append(said)
        named = names_unsearched(said, self.domains, self.opened)
        if named is not None:
            self.opened[named], self.current = len(self.turns) - 1, named

    def tool_call(self, tool: str) -> None:
        domain = next((d for d in self.domains if tool.endswith(f"_{d}")), None)
        if domain is not None:
            self.opened.setdefault(domain, max(len(self.turns) - 1, 0))
            self.current = domain

    @property
    def said(self) -> str:
        """What the user has said about the current domain (everything before one), padded
        with spaces for whole-word matching."""
        return " " + " ".join(self.turns[self.opened[self.current] :] if self.current is not None else self.turns) + " "


# Which value of a gold ``booked`` record an environment booking's observation replaces.
_GOLD_TO_OBSERVED: tuple[tuple[str, str], ...] = (("reference", "reference"), ("type", "car type"), ("phone", "phone"))


@dataclass(frozen=True)
class _GoldStep:
    turn: int
    call: ToolCall
    booked: BookedRecord | None  # the gold record a booking call stands for


@dataclass(frozen=True)
class ReplayResult:
    state: EnvState
    system_texts: tuple[tuple[int, str], ...]  # (turn index, text)
    system_acts: tuple[DialogAct, ...]
    calls: tuple[tuple[int, ToolCall], ...]  # (turn index, call with its observation)


def has_annotations(dialogue: Dialogue) -> bool:
    """Whether any system turn carries a belief state. Without one (text-only dialogues) no
    tool call can be read back, so a replay of the dialogue verifies nothing: its grade is
    neither a pass nor a fail of the corpus, simulator, environment or checker."""
    return any(turn.belief_state is not None for turn in dialogue.turns if turn.speaker == "system")


def gold_tool_calls(dialogue: Dialogue, database: Database | None = None) -> list[tuple[int, ToolCall]]:
    """``(system turn index, call)`` for every call the annotations imply, in order; with
    ``database``, booked train ids are read against the timetable (module docstring)."""
    return [(step.turn, step.call) for step in _gold_steps(dialogue, database)]


class GoldCalls:
    """:func:`gold_tool_calls` and :func:`replay` for an agent that asks at every exchange of
    every episode: each dialogue's gold steps are read once per database (recomputing them
    was a third of gold_replay's time). It holds the objects it keys by ``id``, so no id is
    reused while they are cached; one lives as long as its agent."""

    def __init__(self) -> None:
        self._steps: dict[tuple[int, int], tuple[Dialogue, Database | None, tuple[_GoldStep, ...]]] = {}

    def _gold(self, dialogue: Dialogue, database: Database | None) -> tuple[_GoldStep, ...]:
        key = (id(dialogue), id(database))
        cached = self._steps.get(key)
        if cached is None:
            cached = self._steps[key] = (dialogue, database, tuple(_gold_steps(dialogue, database)))
        return cached[2]

    def calls(self, dialogue: Dialogue, database: Database | None = None) -> list[tuple[int, ToolCall]]:
        return [(step.turn, step.call) for step in self._gold(dialogue, database)]

    def replay(self, dialogue: Dialogue, environment: ToolEnvironment) -> ReplayResult:
        return replay(dialogue, environment, self._gold(dialogue, environment.database))


def replay(dialogue: Dialogue, environment: ToolEnvironment, steps: Sequence[_GoldStep] | None = None) -> ReplayResult:
    """Run the dialogue's gold calls in ``environment`` (it is changed: pass a fresh one
    or a fork), with turn numbers the dialogue's own; ``steps``: the dialogue's gold steps
    for ``environment.database`` where they were read already (:class:`GoldCalls`).

    The gold system texts quote MultiWOZ's own booking references and taxis, which the
    environment cannot reproduce; from a replayed booking's turn on, they are replaced by
    what the environment returned for it, so that "the system told the user the
    reference" is graded on what the system said.
    """
    calls = []
    substitutions: list[tuple[int, str, str]] = []  # (from turn, gold value, environment's value)
    for step in _gold_steps(dialogue, environment.database) if steps is None else steps:
        observed = environment.call(step.call, turn=step.turn)
        calls.append((step.turn, ToolCall(step.call.name, step.call.arguments, observed)))
        if step.booked is None or "error" in observed:
            continue
        for gold_key, observed_key in _GOLD_TO_OBSERVED:
            gold, mine = step.booked.values.get(gold_key), observed.get(observed_key)
            if gold and mine and not is_dont_care(gold):
                substitutions.append((step.turn, str(gold), str(mine)))

    def rewrite(turn: int, text: str) -> str:
        for since, gold, mine in substitutions:
            if turn >= since:
                text = _as_said(gold).sub(mine, text)
        return text

    system_turns = [t for t in dialogue.turns if t.speaker == "system"]
    texts = tuple((t.index, rewrite(t.index, t.text)) for t in system_turns)
    acts = tuple(
        DialogAct(act.act, act.slot, rewrite(t.index, act.value)) for t in system_turns for act in t.dialog_acts or ()
    )
    return ReplayResult(environment.state, texts, acts, tuple(calls))


def _as_said(gold: str) -> re.Pattern[str]:
    """How a system text states a gold value: a phone number with spaces or dashes between
    its digits ("0 754 - 399 - 4513"), a car's colour spelled either way ("gray skoda")."""
    if re.fullmatch(r"\d{6,}", gold):
        return re.compile(r"[\s-]*".join(gold))
    pattern = r"\s+".join(re.escape(word) for word in gold.split())
    return re.compile(re.sub(r"gr[ae]y", "gr[ae]y", pattern, flags=re.IGNORECASE), re.IGNORECASE)


def _gold_steps(dialogue: Dialogue, database: Database | None = None) -> list[_GoldStep]:
    steps: list[_GoldStep] = []
    last_semi: dict[str, dict[str, str]] = {}
    last_booked: dict[str, tuple[BookedRecord, ...]] = {}
    last_book: dict[str, dict[str, str]] = {}  # the latest stated value of each book slot, per domain
    annotated = [t for t in dialogue.turns if t.speaker == "system" and t.belief_state is not None]
    for position, turn in enumerate(annotated):
        queries, bookings = [], []
        for belief in turn.belief_state:
            domain, semi = belief.domain, _stated(belief.semi)
            if domain in QUERY_TOOLS and semi and semi != last_semi.get(domain, {}):
                queries.append(_GoldStep(turn.index, _call(QUERY_TOOLS[domain], semi), None))
            for record in belief.booked:
                if domain in BOOKING_TOOLS and record not in last_booked.get(domain, ()):
                    # The record's own belief first, then later ones still holding it, then its
                    # own with the values the booking before it stated (a rebooking elsewhere
                    # "for the same party", annotated "people": "none").
                    later = (b for t in annotated[position + 1:] for b in t.belief_state if b.domain == domain and record in b.booked)
                    carried = replace(belief, book={**last_book.get(domain, {}), **_stated(belief.book)})
                    call = next((c for b in (belief, *later, carried) if (c := _booking_call(b, record, database)) is not None), None)
                    if call is not None:
                        bookings.append(_GoldStep(turn.index, call, record))
            last_semi[domain] = semi
            last_booked[domain] = belief.booked
            last_book.setdefault(domain, {}).update(_stated(belief.book))
        steps += queries + bookings
    return steps


def _stated(values: Mapping[str, str]) -> dict[str, str]:
    """The values a belief states; times as "HH:MM" when recorded as said ("5:45pm")."""
    stated = {}
    for slot, value in values.items():
        if is_dont_care(value):
            continue
        minutes = spoken_time(value) if slot in TIME_SLOTS and parse_time(value) is None else None
        stated[slot] = format_time(minutes) if minutes is not None else value
    return stated


def _call(tool: str, values: Mapping[str, str]) -> ToolCall:
    """A call of ``tool`` with those of ``values`` it takes."""
    spec = TOOLS[tool]
    return ToolCall(tool, frozen_dict({k: v for k, v in values.items() if spec.param(k) is not None}))


def _booking_call(belief: DomainBelief, record: BookedRecord, database: Database | None = None) -> ToolCall | None:
    """The call that made ``record``; None when the annotation lacks a required value."""
    domain, semi, book = belief.domain, _stated(belief.semi), _stated(belief.book)
    booked = _stated(record.values)
    if domain == "train":
        # The timetable reuses ids across days and directions: the belief's route picks the train.
        route = {slot: semi[slot] for slot in ("day", "departure", "destination") if semi.get(slot)}
        train_id = booked.get("trainID")
        values = {"trainID": _timetable_train(database, train_id, route) if database and train_id else train_id,
                  "people": book.get("people"), **route}
    elif domain == "taxi":
        values = {k: semi.get(k) for k in ("departure", "destination", "leaveAt", "arriveBy")}
        if not (values["leaveAt"] or values["arriveBy"]):
            return None
    else:
        values = {"name": booked.get("name") or semi.get("name"), **book}
    call = _call(BOOKING_TOOLS[domain], {k: v for k, v in values.items() if v})
    if any(slot not in call.arguments for slot in TOOLS[call.name].required):
        return None
    return call


def _timetable_train(database: Database, train_id: str, route: Mapping[str, str]) -> str:
    """``train_id`` when it runs on ``route`` (or is unknown, or the route is empty); else
    the one train of ``route`` that leaves when ``train_id`` does on its own timetable."""
    runs = database.named("train", train_id)
    if not runs or not route or any(all(values_match(s, v, t.get(s)) for s, v in route.items()) for t in runs):
        return train_id
    times = {t.get("leaveAt") for t in runs}
    same_time = [t for t in database.search("train", route) if t.get("leaveAt") in times]
    return str(same_time[0].get("trainID")) if len(same_time) == 1 else train_id
