"""The SpeakRL tool environment (SpeakRL Table 4) over a MultiWOZ-schema database.

An agent acts through eight tools::

    query_restaurant(area, pricerange, food, name)
    book_restaurant(name, people, day, time, [pricerange, stars, type])
    query_hotel(area, internet, name, parking, pricerange, stars, type)
    book_hotel(name, people, day, stay)
    query_attraction(area, name, type)
    query_train(arriveBy, day, departure, destination, leaveAt, trainID)
    buy_train_ticket(trainID, people, [arriveBy, day, departure, destination, leaveAt])
    book_taxi(departure, destination, leaveAt and/or arriveBy)

Table 4 lists only ``area, internet, name, parking`` for ``query_hotel``; MultiWOZ hotel
goals also constrain ``pricerange``, ``stars`` and ``type``, so the tool accepts them.
Bracketed arguments of the booking tools are *checks*: they do not change the booking but
make it fail when the named venue or train does not have that value, so an agent that
books the wrong thing hears about it.

Observations are plain dicts and a call never raises (an agent's mistakes are data):

* query: ``{"count": N, "results": [up to 5 entities]}``;
* booking: ``{"reference": "8 upper-case alphanumerics", ...}``;
* a malformed or impossible call: ``{"error": "<what is wrong>"}``, plus
  ``"unavailable": True`` when the goal's ``fail_book`` makes the slot unavailable.

Every call is recorded in :class:`EnvState` (calls, queries, bookings), which is what
:mod:`pipelines.env.checker` grades. A :class:`Database` is built once and shared
read-only by every environment and every :meth:`ToolEnvironment.fork`.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from pipelines.multiwoz.ontology import (
    AREAS,
    DAYS,
    PRICERANGES,
    TIME_SLOTS,
    canonical_value,
    is_dont_care,
    norm_value,
    parse_time,
    same_value,
    values_match,
)
from pipelines.records import Entity, Goal, ToolCall, frozen_dict

QUERY_RESULT_LIMIT = 5
REFERENCE_LENGTH = 8
_REFERENCE_ALPHABET = "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789"

# Attributes that are bookkeeping or long prose, not something an agent should relay.
_HIDDEN_ATTRIBUTES = frozenset({"id", "location", "introduction", "signature", "takesbookings"})

# Parameter kinds: how a raw argument is validated and normalised.
TEXT, ENUM, TIME, COUNT, IDENT = "text", "enum", "time", "count", "id"


# --------------------------------------------------------------------------------------
# Tool definitions
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Param:
    name: str
    description: str
    kind: str = TEXT
    enum: tuple[str, ...] = ()

    def schema(self) -> dict[str, Any]:
        if self.kind == COUNT:
            return {"type": "integer", "minimum": 1, "description": self.description}
        out: dict[str, Any] = {"type": "string", "description": self.description}
        if self.kind == ENUM:
            out["enum"] = list(self.enum)
        elif self.kind == TIME:
            out["pattern"] = r"^\d{1,2}:\d{2}$"
        return out


@dataclass(frozen=True)
class ToolSpec:
    name: str
    domain: str
    action: str  # "query" | "book"
    description: str
    params: tuple[Param, ...]
    required: tuple[str, ...] = ()
    # Arguments checked against the booked entity instead of being booked.
    checks: tuple[str, ...] = ()

    def param(self, name: str) -> Param | None:
        return next((p for p in self.params if p.name == name), None)

    def schema(self) -> dict[str, Any]:
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {
                    "type": "object",
                    "properties": {p.name: p.schema() for p in self.params},
                    "required": list(self.required),
                    "additionalProperties": False,
                },
            },
        }


_AREA = Param("area", "Part of Cambridge.", ENUM, AREAS)
_PRICERANGE = Param("pricerange", "Price range.", ENUM, PRICERANGES)
_DAY = Param("day", "Day of the week.", ENUM, DAYS)
_PEOPLE = Param("people", "Number of people, a whole number of at least 1.", COUNT)
_STARS = Param("stars", "Star rating, 0 to 5.", ENUM, tuple(str(n) for n in range(6)))
_YES_NO = ("yes", "no")
_DEPARTURE = Param("departure", "Station or place of departure, e.g. cambridge.")
_DESTINATION = Param("destination", "Station or place of arrival, e.g. london kings cross.")
_LEAVE_AT = Param("leaveAt", "Leave at or after this time, 24-hour HH:MM.", TIME)
_ARRIVE_BY = Param("arriveBy", "Arrive at or before this time, 24-hour HH:MM.", TIME)
_TRAIN_ID = Param("trainID", "Train id, e.g. TR7075.", IDENT)

_QUERY_NOTE = " Omitted parameters are unconstrained. Returns the number of matches and up to 5 of them."

TOOL_SPECS: tuple[ToolSpec, ...] = (
    ToolSpec(
        "query_restaurant", "restaurant", "query",
        "Search Cambridge restaurants." + _QUERY_NOTE,
        (_AREA, _PRICERANGE, Param("food", "Type of food, e.g. italian."), Param("name", "Restaurant name, e.g. pizza hut city centre.")),
    ),
    ToolSpec(
        "book_restaurant", "restaurant", "book",
        "Reserve a table at a restaurant. Optional pricerange/stars/type are checked against the restaurant. Returns a booking reference.",
        (Param("name", "Restaurant name."), _PEOPLE, _DAY, Param("time", "Reservation time, 24-hour HH:MM.", TIME),
         _PRICERANGE, _STARS, Param("type", "Venue type the restaurant must have.")),
        required=("name", "people", "day", "time"),
        checks=("pricerange", "stars", "type"),
    ),
    ToolSpec(
        "query_hotel", "hotel", "query",
        "Search Cambridge hotels and guesthouses." + _QUERY_NOTE,
        (_AREA, Param("internet", "Free internet.", ENUM, _YES_NO), Param("name", "Hotel name, e.g. acorn guest house."),
         Param("parking", "Free parking.", ENUM, _YES_NO), _PRICERANGE, _STARS,
         Param("type", "Kind of accommodation.", ENUM, ("hotel", "guesthouse"))),
    ),
    ToolSpec(
        "book_hotel", "hotel", "book",
        "Book rooms at a hotel from a day for a number of nights. Returns a booking reference.",
        (Param("name", "Hotel name."), _PEOPLE, _DAY, Param("stay", "Number of nights, a whole number of at least 1.", COUNT)),
        required=("name", "people", "day", "stay"),
    ),
    ToolSpec(
        "query_attraction", "attraction", "query",
        "Search Cambridge attractions." + _QUERY_NOTE,
        (_AREA, Param("name", "Attraction name, e.g. kings college."), Param("type", "Kind of attraction, e.g. museum, college, park.")),
    ),
    ToolSpec(
        "query_train", "train", "query",
        "Search trains to and from Cambridge. Results are sorted by departure time, or by latest arrival when only arriveBy is given."
        + _QUERY_NOTE,
        (_ARRIVE_BY, _DAY, _DEPARTURE, _DESTINATION, _LEAVE_AT, _TRAIN_ID),
    ),
    ToolSpec(
        "buy_train_ticket", "train", "book",
        "Buy tickets for a train. Optional arriveBy/day/departure/destination/leaveAt are checked against the train. "
        "Returns a booking reference and the ticket price.",
        (_ARRIVE_BY, _DAY, _DEPARTURE, _DESTINATION, _LEAVE_AT, _TRAIN_ID, _PEOPLE),
        required=("trainID", "people"),
        checks=("arriveBy", "day", "departure", "destination", "leaveAt"),
    ),
    ToolSpec(
        "book_taxi", "taxi", "book",
        "Book a taxi. Give leaveAt, arriveBy or both. Returns a reference, the car and the driver's phone number.",
        (_ARRIVE_BY, _DEPARTURE, _DESTINATION, _LEAVE_AT),
        required=("departure", "destination"),
    ),
)
TOOLS: Mapping[str, ToolSpec] = frozen_dict({spec.name: spec for spec in TOOL_SPECS})
TOOL_NAMES: tuple[str, ...] = tuple(TOOLS)
# OpenAI-style function definitions. Shared: treat as read-only, or take tool_schemas().
TOOL_SCHEMAS: tuple[dict[str, Any], ...] = tuple(spec.schema() for spec in TOOL_SPECS)


def tool_schemas() -> list[dict[str, Any]]:
    """A fresh copy of :data:`TOOL_SCHEMAS` that the caller may modify."""
    return copy.deepcopy(list(TOOL_SCHEMAS))


# --------------------------------------------------------------------------------------
# Database
# --------------------------------------------------------------------------------------


def name_key(name: object) -> str:
    """Comparison key of a venue name: normalised, without a leading "the" (users say
    "cambridge belfry" for "the cambridge belfry" and vice versa)."""
    key = norm_value(name)
    return key[4:] if key.startswith("the ") else key


# Words that name the kind of venue, not the venue: people add or drop them.
_GENERIC_NAME_WORDS = frozenset({"restaurant", "hotel", "guesthouse", "guest", "house", "the", "and", "cafe", "caffe", "bar"})


def _short_name(key: str) -> str:
    """A name key without its leading and trailing generic words ("meze bar restaurant" and
    "the meze bar" -> "meze"); "" when nothing distinctive is left."""
    parts = key.split()
    while parts and parts[-1] in _GENERIC_NAME_WORDS:
        parts.pop()
    while parts and parts[0] in _GENERIC_NAME_WORDS:
        parts.pop(0)
    return " ".join(parts)


def _spelling_key(key: str) -> str:
    """A name key read past spelling variants: without spaces ("fenditton" is "fen ditton")
    and without a word-final possessive or plural s ("christ college" is "christ's
    college", "churchills college" "churchill college")."""
    return "".join(w[:-1] if len(w) > 3 and w.endswith("s") and not w.endswith("ss") else w for w in key.split())


def same_name(a: object, b: object, shortened: bool = False) -> bool:
    """Do two spellings name the same place? Equal name keys (also past spelling variants:
    :func:`_spelling_key`), or equal without generic
    words ("ask" and "ask restaurant"). ``shortened``: also one the other's beginning
    ("good luck" for "the good luck chinese food takeaway"), for places said in free text
    such as a taxi's; never for venues, where "pizza express" is not "pizza express fen ditton"."""
    ka, kb = name_key(a), name_key(b)
    if ka == kb or (ka and _spelling_key(ka) == _spelling_key(kb)):
        return True
    sa, sb = _short_name(ka), _short_name(kb)
    if not sa or not sb:
        return False
    if not shortened:
        return sa == sb
    shorter, longer = sorted((sa.split(), sb.split()), key=len)
    return longer[: len(shorter)] == shorter


class _Table:
    """One domain's entities with value -> positions indexes for every non-time attribute."""

    def __init__(self, entities: Sequence[Entity]):
        self.entities = tuple(entities)
        index: dict[str, dict[str, set[int]]] = {}
        names: dict[str, list[int]] = {}
        for position, entity in enumerate(self.entities):
            names.setdefault(name_key(entity.name), []).append(position)
            for slot, value in entity.attributes.items():
                if slot not in TIME_SLOTS:
                    index.setdefault(slot, {}).setdefault(canonical_value(slot, value), set()).add(position)
        self._index = {slot: {value: frozenset(p) for value, p in values.items()} for slot, values in index.items()}
        self._names = {key: tuple(p) for key, p in names.items()}
        short: dict[str, list[int]] = {}
        for key, found in self._names.items():
            short.setdefault(_short_name(key), []).extend(found)
        self._short = {key: tuple(p) for key, p in short.items() if key}

    def named(self, name: object) -> tuple[Entity, ...]:
        return tuple(self.entities[p] for p in self._lookup(name))

    def _lookup(self, name: object) -> tuple[int, ...]:
        """Positions of the entities called ``name``; failing an exact match, those whose
        name is the same without generic words ("meze bar restaurant" is "the meze bar")."""
        exact = self._names.get(name_key(name))
        if exact:
            return exact
        short = _short_name(name_key(name))
        return self._short.get(short, ()) if short else ()

    def positions(self, slot: str, value: object) -> frozenset[int]:
        if slot == "name":
            return frozenset(self._lookup(value))
        return self._index.get(slot, {}).get(canonical_value(slot, value), frozenset())


class Database:
    """Entities per domain plus the taxi options, indexed once; never modified.

    ``entities`` maps a domain to its entities (as :func:`parse_database` returns them);
    ``taxi_options`` is the second value of ``parse_database("taxi", ...)``.
    """

    def __init__(self, entities: Mapping[str, Iterable[Entity]], taxi_options: Mapping[str, Sequence[str]] | None = None):
        tables = {}
        for domain, items in entities.items():
            items = tuple(items)
            wrong = next((e for e in items if e.domain != domain), None)
            if wrong is not None:
                raise ValueError(f"entity {wrong.entity_id!r} of domain {wrong.domain!r} listed under {domain!r}")
            tables[domain] = _Table(items)
        self._tables: Mapping[str, _Table] = frozen_dict(tables)
        self.taxi_options: Mapping[str, tuple[str, ...]] = frozen_dict({k: tuple(v) for k, v in (taxi_options or {}).items()})

    @property
    def domains(self) -> tuple[str, ...]:
        return tuple(self._tables)

    def entities(self, domain: str) -> tuple[Entity, ...]:
        table = self._tables.get(domain)
        return table.entities if table else ()

    def named(self, domain: str, name: object) -> tuple[Entity, ...]:
        """Entities whose name (or trainID) is ``name``, ignoring case, apostrophes and a leading "the"."""
        table = self._tables.get(domain)
        return table.named(name) if table else ()

    def search(self, domain: str, constraints: Mapping[str, object]) -> list[Entity]:
        """Entities satisfying every constraint (``values_match``), in database order.

        Don't-care values are ignored. Equality slots go through the indexes; time slots
        (at/after, at/before) are then checked on the survivors.
        """
        table = self._tables.get(domain)
        if table is None:
            return []
        positions: frozenset[int] | None = None
        timed: list[tuple[str, object]] = []
        for slot, value in constraints.items():
            if is_dont_care(value):
                continue
            if slot in TIME_SLOTS:
                timed.append((slot, value))
                continue
            hits = table.positions(slot, value)
            positions = hits if positions is None else positions & hits
        ordered = range(len(table.entities)) if positions is None else sorted(positions)
        candidates = (table.entities[p] for p in ordered)
        return [e for e in candidates if all(values_match(slot, value, e.get(slot)) for slot, value in timed)]

    def listed(self, domain: str, constraints: Mapping[str, object]) -> list[Entity]:
        """The matches in the order a query tool lists them: database order, trains by time
        (:func:`_order_trains`)."""
        matches = self.search(domain, constraints)
        return _order_trains(matches, constraints) if domain == "train" else matches


def entity_view(entity: Entity) -> dict[str, str]:
    """What a query shows the agent of one entity."""
    return {slot: value for slot, value in entity.attributes.items() if slot not in _HIDDEN_ATTRIBUTES}


# --------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class CallRecord:
    """One call as the agent made it (``arguments`` raw) and what it got back."""

    index: int
    turn: int
    tool: str
    arguments: Mapping[str, Any]
    observation: Mapping[str, Any]

    @property
    def error(self) -> str | None:
        error = self.observation.get("error")
        return None if error is None else str(error)

    @property
    def ok(self) -> bool:
        return self.error is None

    def as_tool_call(self) -> ToolCall:
        return ToolCall(self.tool, self.arguments, self.observation)


@dataclass(frozen=True)
class QueryRecord:
    call_index: int
    turn: int
    domain: str
    constraints: Mapping[str, str]  # normalised
    count: int
    results: tuple[Entity, ...]  # what the agent was shown, in order

    @property
    def entity_ids(self) -> tuple[str, ...]:
        return tuple(e.entity_id for e in self.results)


@dataclass(frozen=True)
class BookingRecord:
    """A booking attempt that reached the availability check (valid arguments, known venue)."""

    call_index: int
    turn: int
    domain: str
    entity: Entity | None  # None for taxis
    arguments: Mapping[str, str]  # normalised
    success: bool
    reference: str | None
    reason: str | None = None  # why it failed
    details: Mapping[str, str] = field(default_factory=frozen_dict)  # what else it returned: car type, phone, price

    @property
    def entity_id(self) -> str | None:
        return self.entity.entity_id if self.entity else None

    @property
    def name(self) -> str | None:
        return self.entity.name if self.entity else None


@dataclass
class EnvState:
    """Everything that happened in one episode. Records are immutable, so a copy only
    copies the lists."""

    database: Database = field(repr=False, compare=False)
    calls: list[CallRecord] = field(default_factory=list)
    queries: list[QueryRecord] = field(default_factory=list)
    bookings: list[BookingRecord] = field(default_factory=list)
    turn: int = 0  # the dialogue turn that calls are being made in

    @property
    def errors(self) -> tuple[CallRecord, ...]:
        return tuple(c for c in self.calls if not c.ok)

    @property
    def error_count(self) -> int:
        return sum(1 for c in self.calls if not c.ok)

    def successful_bookings(self, domain: str | None = None) -> tuple[BookingRecord, ...]:
        return tuple(b for b in self.bookings if b.success and (domain is None or b.domain == domain))

    def copy(self) -> EnvState:
        return EnvState(self.database, list(self.calls), list(self.queries), list(self.bookings), self.turn)


# --------------------------------------------------------------------------------------
# Environment
# --------------------------------------------------------------------------------------


class _CallError(Exception):
    """Internal: an invalid call; becomes an ``{"error": ...}`` observation."""


_DIGITS = re.compile(r"^\s*\d+\s*$")


def _normalise(param: Param, raw: object) -> str | None:
    """The canonical string of one argument; None when it states no constraint."""
    if raw is None:
        return None
    if isinstance(raw, bool) or not isinstance(raw, (str, int, float)):
        raise _CallError(f"{param.name} must be a single value, got {type(raw).__name__}")
    if isinstance(raw, str) and is_dont_care(raw):
        return None
    if param.kind == COUNT:
        # Integers only: 2.5 people or "two" are mistakes worth telling the agent about.
        if isinstance(raw, float) or not _DIGITS.match(str(raw)) or int(raw) < 1:
            raise _CallError(f"{param.name} must be a whole number of at least 1, got {raw!r}")
        return str(int(raw))
    if param.kind == TIME:
        minutes = parse_time(raw)
        if minutes is None:
            raise _CallError(f"{param.name} must be a 24-hour time HH:MM, got {raw!r}")
        # Zero-padded but not wrapped: "24:00" stays the end of the day, not midnight before it.
        return f"{minutes // 60:02d}:{minutes % 60:02d}"
    if param.kind == IDENT:
        return str(raw).strip().upper()
    # The database's spelling: a real belief's "night club" queries type "nightclub".
    value = canonical_value(param.name, raw)
    if param.kind == ENUM and value not in param.enum:
        raise _CallError(f"{param.name} must be one of {', '.join(param.enum)}; got {raw!r}")
    return value


def _digest(*parts: object) -> bytes:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).digest()


def _reference(digest: bytes) -> str:
    return "".join(_REFERENCE_ALPHABET[b % len(_REFERENCE_ALPHABET)] for b in digest[:REFERENCE_LENGTH])


def _price_total(price: str | None, people: int) -> str | None:
    """"23.60 pounds" for 2 people -> "47.20 pounds"; None when the price is not a number."""
    match = re.match(r"^\s*(\d+(?:\.\d+)?)\s*(.*)$", price or "")
    if not match:
        return None
    total = f"{float(match.group(1)) * people:.2f}"
    return f"{total} {match.group(2)}".strip()


class ToolEnvironment:
    """One episode's tools. ``goal`` (optional) supplies the ``fail_book`` backups that make
    bookings unavailable; ``seed`` varies booking references and taxis between episodes."""

    def __init__(self, database: Database, goal: Goal | None = None, seed: int = 0, state: EnvState | None = None):
        self.database = database
        self.goal = goal
        self.seed = seed
        self.state = state if state is not None else EnvState(database)

    def fork(self) -> ToolEnvironment:
        """An independent copy of this episode: later calls on either do not affect the other."""
        return ToolEnvironment(self.database, self.goal, self.seed, self.state.copy())

    def execute(self, call: ToolCall, turn: int | None = None) -> ToolCall:
        """Run ``call`` and return it with its observation."""
        observation = self.call(call, turn=turn)
        return ToolCall(call.name, call.arguments, observation)

    def call(self, call: ToolCall | str, arguments: Mapping[str, Any] | None = None, *, turn: int | None = None) -> dict[str, Any]:
        """Run a tool: ``call(ToolCall(...))`` or ``call("query_hotel", {"area": "north"})``.

        ``turn`` is the dialogue turn the call belongs to; without it the last one given is
        kept. Returns the observation (the caller's own copy).
        """
        if isinstance(call, ToolCall):
            if arguments is not None:
                raise TypeError("pass either a ToolCall or a name and arguments, not both")
            name, arguments = call.name, call.arguments
        else:
            name = call
        if turn is not None:
            self.state.turn = turn
        index = len(self.state.calls)
        try:
            observation = self._dispatch(index, name, arguments)
        except _CallError as exc:
            observation = {"error": str(exc)}
        raw_arguments = copy.deepcopy(dict(arguments)) if isinstance(arguments, Mapping) else {}
        self.state.calls.append(CallRecord(index, self.state.turn, str(name), frozen_dict(raw_arguments), frozen_dict(observation)))
        return copy.deepcopy(observation)

    # -- validation ----------------------------------------------------------------------

    def _dispatch(self, index: int, name: object, arguments: object) -> dict[str, Any]:
        spec = TOOLS.get(name) if isinstance(name, str) else None
        if spec is None:
            raise _CallError(f"unknown tool {name!r}; tools: {', '.join(TOOL_NAMES)}")
        if not isinstance(arguments, Mapping):
            raise _CallError(f"arguments must be an object, got {type(arguments).__name__}")
        unknown = sorted(str(k) for k in arguments if spec.param(str(k)) is None)
        if unknown:
            allowed = ", ".join(p.name for p in spec.params)
            raise _CallError(f"{spec.name} has no parameter {', '.join(unknown)}; parameters: {allowed}")
        args = {}
        for key, raw in arguments.items():
            param = spec.param(str(key))
            assert param is not None  # unknown names were rejected above
            value = _normalise(param, raw)
            if value is not None:
                args[param.name] = value
        missing = [p for p in spec.required if p not in args]
        if missing:
            raise _CallError(f"{spec.name} needs {', '.join(missing)}")
        if spec.action == "query":
            return self._query(index, spec, args)
        if spec.domain == "taxi":
            return self._book_taxi(index, spec, args)
        if spec.domain == "train":
            return self._buy_ticket(index, spec, args)
        return self._book_venue(index, spec, args)

    # -- queries -------------------------------------------------------------------------

    def _query(self, index: int, spec: ToolSpec, args: dict[str, str]) -> dict[str, Any]:
        matches = self.database.listed(spec.domain, args)
        shown = tuple(matches[:QUERY_RESULT_LIMIT])
        self.state.queries.append(QueryRecord(index, self.state.turn, spec.domain, frozen_dict(args), len(matches), shown))
        return {"count": len(matches), "results": [entity_view(e) for e in shown]}

    # -- bookings ------------------------------------------------------------------------

    def _book_venue(self, index: int, spec: ToolSpec, args: dict[str, str]) -> dict[str, Any]:
        candidates = self.database.named(spec.domain, args["name"])
        if not candidates:
            raise _CallError(f"no {spec.domain} called {args['name']!r}; use query_{spec.domain} to find one")
        entity = candidates[0]
        for slot in spec.checks:
            if slot in args and not values_match(slot, args[slot], entity.get(slot)):
                actual = entity.get(slot) or "not given"
                raise _CallError(f"{entity.name} does not have {slot} {args[slot]!r} ({slot}: {actual})")
        booking = {k: args[k] for k in ("people", "day", "time", "stay") if k in args}
        return self._commit(index, spec, entity, args, {"name": entity.name, **booking})

    def _buy_ticket(self, index: int, spec: ToolSpec, args: dict[str, str]) -> dict[str, Any]:
        candidates = self.database.named("train", args["trainID"])
        if not candidates:
            raise _CallError(f"no train {args['trainID']!r}; use query_train to find one")
        checked = {slot: args[slot] for slot in spec.checks if slot in args}
        fitting = [t for t in candidates if all(values_match(s, v, t.get(s)) for s, v in checked.items())]
        if not fitting:
            stated = ", ".join(f"{s} {v}" for s, v in checked.items())
            raise _CallError(f"train {args['trainID']} does not match {stated}")
        train = self._recently_shown(fitting)
        people = int(args["people"])
        result = {"trainID": train.get("trainID") or train.name, "people": args["people"]}
        price = train.get("price")
        if price:
            result["price"] = price
            total = _price_total(price, people)
            if total:
                result["total price"] = total
        return self._commit(index, spec, train, args, result)

    def _recently_shown(self, trains: Sequence[Entity]) -> Entity:
        """The real timetable reuses train ids across days (and even within one); prefer the
        train the agent was most recently shown, else the first in timetable order."""
        for query in reversed(self.state.queries):
            for shown in query.results:
                if shown in trains:
                    return shown
        return trains[0]

    def _book_taxi(self, index: int, spec: ToolSpec, args: dict[str, str]) -> dict[str, Any]:
        if "leaveAt" not in args and "arriveBy" not in args:
            raise _CallError("book_taxi needs leaveAt or arriveBy")
        colors = self.database.taxi_options.get("taxi_colors", ())
        types = self.database.taxi_options.get("taxi_types", ())
        if not colors or not types:
            raise _CallError("no taxis are available: the database has no taxi options")
        digest = _digest("taxi", self.seed, len(self.state.bookings), sorted(args.items()))
        car = f"{colors[digest[0] % len(colors)]} {types[digest[1] % len(types)]}"
        # A UK mobile number: 10 digits, as taxi_db.json's taxi_phone pattern requires.
        phone = "07" + "".join(str(b % 10) for b in digest[2:10])
        return self._commit(index, spec, None, args, {"car type": car, "phone": phone})

    def _commit(self, index: int, spec: ToolSpec, entity: Entity | None, args: dict[str, str], result: dict[str, str]) -> dict[str, Any]:
        """Availability check, reference and record, shared by every booking tool."""
        booking_index = len(self.state.bookings)
        unavailable = self._unavailable(spec.domain, args)
        if unavailable:
            reason = f"no availability for {unavailable}"
            self.state.bookings.append(
                BookingRecord(index, self.state.turn, spec.domain, entity, frozen_dict(args), False, None, reason)
            )
            return {"error": f"{reason}; try another day, time or length of stay", "unavailable": True}
        reference = _reference(_digest(self.seed, booking_index, spec.name, sorted(args.items())))
        details = {k: v for k, v in result.items() if k not in ("name", "trainID", *args)}
        self.state.bookings.append(
            BookingRecord(index, self.state.turn, spec.domain, entity, frozen_dict(args), True, reference, None, frozen_dict(details))
        )
        return {"reference": reference, **result}

    def _unavailable(self, domain: str, args: Mapping[str, str]) -> str | None:
        """MultiWOZ's ``fail_book``: a booking stating every fail_book value is refused, which
        is what sends the user to the ``book`` backup. Returns the refused values, spelled out."""
        domain_goal = self.goal.get(domain) if self.goal else None
        if domain_goal is None or not domain_goal.fail_book:
            return None
        if all(slot in args and same_value(slot, args[slot], value) for slot, value in domain_goal.fail_book.items()):
            return ", ".join(f"{slot} {value}" for slot, value in domain_goal.fail_book.items())
        return None


def _order_trains(trains: list[Entity], args: Mapping[str, object]) -> list[Entity]:
    """Departure order, except that an arriveBy-only query lists the latest arrival first
    (the train a traveller who must arrive by then wants). Stable: ties keep timetable order."""

    latest_arrival_first = "arriveBy" in args and "leaveAt" not in args
    slot, sign = ("arriveBy", -1) if latest_arrival_first else ("leaveAt", 1)

    def key(train: Entity) -> tuple[bool, int]:
        minutes = parse_time(train.get(slot))
        return (minutes is None, sign * (minutes or 0))  # a train without the time goes last

    return sorted(trains, key=key)
