"""ToolWOZ: MultiWOZ turned into a tool-use environment (JOSH paper, appendices A, D and E).

An agent gets eight tools (``search_*`` / ``book_*`` for restaurant, hotel, attraction and
train). Every dialogue gets *goal APIs*: the search and booking calls that a correct agent
would make. The environment answers calls from the MultiWOZ database but steers results
by the goal, as the paper's Algorithms 2 and 3 do: a vague search returns a result that
breaks the goal (so an agent that does not ask the user is caught out), a search that
states the whole goal returns the booking target, and a booking works only with the
goal's booking arguments. Reward is the share of goal APIs that the agent's calls met.

Where the reference implementation was wrong, this module does what it meant to do:

* names with apostrophes or capitals ("king's college", "pizza express Fen Ditton") are
  findable: both the arguments and the database go through :func:`norm_value`;
* ``leaveAt`` / ``arriveBy`` / ``time`` are compared as times (``parse_time``), never as
  strings, so "9:30" equals "09:30";
* a filter that cannot be applied (unknown parameter, a time that is not a time, a domain
  without a database) answers with an error observation instead of being silently dropped.

Everything is pure: no file is read here and nothing is kept at module level except
constant tables. :class:`ToolWozDatabase` indexes the entities once and is shared,
read-only, by every environment and every fork of one.

Observations are plain dicts, never exceptions:

* search: ``{"results": [record]}`` or ``{"results": []}`` (at most one record);
* book: ``{"success": True, "return": {...}}`` or ``{"success": False, "return": None}``;
* any misuse: ``{"error": "<what is wrong>"}``.
"""

from __future__ import annotations

import copy
import hashlib
from dataclasses import dataclass
from typing import Any, Iterable, Iterator, Mapping, Sequence

from pipelines.multiwoz.ontology import (
    TIME_SLOTS,
    UNIQUE_ID,
    is_dont_care,
    norm_value,
    parse_time,
    same_value,
    values_match,
)
from pipelines.records import Dialogue, DomainGoal, Entity, ToolCall

# ToolWOZ keeps the four MultiWOZ domains that have a database; taxi, police and hospital
# goals produce no goal APIs.
TOOLWOZ_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train")

# Where a booking target came from (ToolWozTask.domains[d].target_source).
TARGET_BOOKED = "booked"  # a `booked` record of the dialogue's belief states
TARGET_BELIEF = "belief"  # the belief state's name / trainID slot
TARGET_DATABASE = "database"  # the first database entity satisfying the goal
TARGET_UNRESOLVED = "unresolved"  # the goal books, but nothing in the database fits
TARGET_NOT_NEEDED = "not_needed"  # the goal does not book in this domain

TEST_SET_SIZE = 450  # "the first 450 conversations of the ToolWOZ test set" (appendix A)

_REFERENCE_ALPHABET = "0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ"
_REFERENCE_LENGTH = 8


# --------------------------------------------------------------------------------------
# API definitions (appendix E; names, parameters and enums as in ToolWOZ's tools.json,
# result fields as in its valid_api_defs.json)
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiParameter:
    name: str
    description: str
    enum: tuple[str, ...] = ()


@dataclass(frozen=True)
class ApiSpec:
    name: str
    domain: str
    intent: str  # "search" | "book"
    description: str
    parameters: tuple[ApiParameter, ...]
    returns: tuple[str, ...]  # fields of a search result / a booking record

    @property
    def parameter_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.parameters)

    def tool_definition(self) -> dict[str, Any]:
        """The OpenAI-style function definition. Every argument is optional, as in ToolWOZ:
        deciding what to ask the user before calling is the agent's job."""
        properties: dict[str, Any] = {}
        for parameter in self.parameters:
            prop: dict[str, Any] = {"type": "string", "description": parameter.description}
            if parameter.enum:
                prop["enum"] = list(parameter.enum)
            properties[parameter.name] = prop
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": {"type": "object", "required": [], "properties": properties},
            },
        }


_AREAS = ("west", "east", "centre", "south", "north")
_YES_NO = ("yes", "no")

_API_SPECS: tuple[ApiSpec, ...] = (
    ApiSpec(
        "book_restaurant", "restaurant", "book", "Reserve a table at a restaurant found with search_restaurant",
        (
            ApiParameter("time", "Time of the reservation, 24-hour HH:MM, e.g. 19:15"),
            ApiParameter("day", "Day of the week of the reservation, e.g. friday"),
            ApiParameter("people", "Number of people, e.g. 4"),
            ApiParameter("name", "Exact name of the restaurant, e.g. golden wok"),
        ),
        ("name", "reference"),
    ),
    ApiSpec(
        "search_restaurant", "restaurant", "search", "Find a restaurant; returns at most one match",
        (
            ApiParameter("food", "Cuisine, e.g. italian"),
            ApiParameter("pricerange", "Price range", ("cheap", "expensive", "moderate")),
            ApiParameter("name", "Name of the restaurant, e.g. golden wok"),
            ApiParameter("area", "Part of town, e.g. north"),
        ),
        ("id", "address", "area", "food", "introduction", "name", "phone", "postcode", "pricerange", "signature", "type"),
    ),
    ApiSpec(
        "book_hotel", "hotel", "book", "Book rooms at a hotel found with search_hotel",
        (
            ApiParameter("stay", "Number of nights, e.g. 3"),
            ApiParameter("day", "Day of the week of arrival, e.g. monday"),
            ApiParameter("people", "Number of guests, e.g. 2"),
            ApiParameter("name", "Exact name of the hotel, e.g. alexander bed and breakfast"),
        ),
        ("name", "reference"),
    ),
    ApiSpec(
        "search_hotel", "hotel", "search", "Find a hotel or guesthouse; returns at most one match",
        (
            ApiParameter("name", "Name of the hotel, e.g. alexander bed and breakfast"),
            ApiParameter("area", "Part of town", _AREAS),
            ApiParameter("parking", "Free parking", _YES_NO),
            ApiParameter("pricerange", "Price range", ("moderate", "expensive", "cheap")),
            ApiParameter("stars", "Star rating", ("0", "1", "2", "3", "4")),
            ApiParameter("internet", "Free internet", _YES_NO),
            ApiParameter("type", "Kind of accommodation", ("hotel", "guesthouse")),
        ),
        (
            "id", "address", "area", "internet", "parking", "single", "double", "family", "name", "phone",
            "postcode", "pricerange", "takesbookings", "stars", "type",
        ),
    ),
    # ToolWOZ lists book_attraction without parameters: attractions cannot be booked, and
    # the tool exists so that an agent trying to do so gets a failed booking, not an error.
    ApiSpec("book_attraction", "attraction", "book", "Attractions cannot be booked; this always fails", (), ()),
    ApiSpec(
        "search_attraction", "attraction", "search", "Find an attraction; returns at most one match",
        (
            ApiParameter("type", "Kind of attraction, e.g. museum"),
            ApiParameter("name", "Name of the attraction, e.g. kettle's yard"),
            ApiParameter("area", "Part of town", _AREAS),
        ),
        ("id", "address", "area", "entrance", "name", "phone", "postcode", "pricerange", "openhours", "type"),
    ),
    ApiSpec(
        "book_train", "train", "book", "Buy tickets for a train found with search_train",
        (
            ApiParameter("people", "Number of tickets, e.g. 2"),
            ApiParameter("trainID", "ID of the train, e.g. TR1234"),
        ),
        ("trainID", "reference"),
    ),
    ApiSpec(
        "search_train", "train", "search", "Find a train; returns at most one match",
        (
            ApiParameter("leaveAt", "Leave at or after this time, 24-hour HH:MM, e.g. 08:45"),
            ApiParameter("destination", "Station travelled to, e.g. cambridge"),
            ApiParameter("day", "Day of the week, e.g. tuesday"),
            ApiParameter("arriveBy", "Arrive at or before this time, 24-hour HH:MM, e.g. 12:30"),
            ApiParameter("departure", "Station travelled from, e.g. norwich"),
        ),
        ("trainID", "arriveBy", "day", "departure", "destination", "duration", "leaveAt", "price"),
    ),
)

API_SPECS: Mapping[str, ApiSpec] = {spec.name: spec for spec in _API_SPECS}

# The eight tool definitions in ToolWOZ's order. A tuple so that nobody appends to the
# shared table; use toolwoz_tools() for a list that a caller may modify.
TOOLWOZ_TOOLS: tuple[dict[str, Any], ...] = tuple(spec.tool_definition() for spec in _API_SPECS)


def toolwoz_tools() -> list[dict[str, Any]]:
    """A fresh copy of :data:`TOOLWOZ_TOOLS` (e.g. for an OpenAI ``tools=`` argument)."""
    return copy.deepcopy(list(TOOLWOZ_TOOLS))


def search_api(domain: str) -> ApiSpec:
    return API_SPECS[f"search_{domain}"]


def book_api(domain: str) -> ApiSpec:
    return API_SPECS[f"book_{domain}"]


# A result field whose database attribute has another name. Entities store nested values
# flattened ("price.single", see pipelines.multiwoz.parse); ToolWOZ flattens hotel prices to
# single/double/family and renames "entrance fee" to "entrance".
_RESULT_SOURCES: Mapping[tuple[str, str], str] = {
    ("hotel", "single"): "price.single",
    ("hotel", "double"): "price.double",
    ("hotel", "family"): "price.family",
    ("attraction", "entrance"): "entrance fee",
}


# --------------------------------------------------------------------------------------
# Database index
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DatabaseRow:
    """An entity with what the environment needs of it, computed once."""

    entity: Entity
    uid: str  # normalised unique id (name / trainID); "" when the entity has none
    result: Mapping[str, str]  # the cleaned record a search returns; never mutated


class ToolWozDatabase:
    """Read-only index of the ToolWOZ domains' entities.

    Build it once per corpus and pass it to every :func:`derive_goal_apis` and
    :class:`ToolWozEnvironment`; a plain ``{domain: [Entity]}`` mapping is accepted too
    but is indexed again on every call.

    Unique ids are not unique in the real data: train_db.json reuses ~340 trainIDs for
    different trains. So a unique id maps to *all* rows that carry it, and the target of a
    goal is the row that carries it *and* satisfies the goal.
    """

    def __init__(self, entities: Mapping[str, Sequence[Entity]]):
        self._rows: dict[str, tuple[DatabaseRow, ...]] = {}
        self._by_uid: dict[str, dict[str, tuple[DatabaseRow, ...]]] = {}
        for domain in TOOLWOZ_DOMAINS:
            if domain not in entities:
                continue
            rows = tuple(_make_row(domain, entity) for entity in entities[domain])
            by_uid: dict[str, list[DatabaseRow]] = {}
            for row in rows:
                if row.uid:
                    by_uid.setdefault(row.uid, []).append(row)
            self._rows[domain] = rows
            self._by_uid[domain] = {uid: tuple(found) for uid, found in by_uid.items()}

    def has_domain(self, domain: str) -> bool:
        return domain in self._rows

    def rows(self, domain: str) -> tuple[DatabaseRow, ...]:
        return self._rows.get(domain, ())

    def with_uid(self, domain: str, uid: object) -> tuple[DatabaseRow, ...]:
        return self._by_uid.get(domain, {}).get(norm_value(uid), ())


def _make_row(domain: str, entity: Entity) -> DatabaseRow:
    uid_value = entity.get(UNIQUE_ID[domain])
    result: dict[str, str] = {}
    for name in search_api(domain).returns:
        value = entity.get(_RESULT_SOURCES.get((domain, name), name))
        if value is not None:  # absent attributes (e.g. most restaurants' signature) are left out, not invented
            result[name] = value
    return DatabaseRow(entity, norm_value(uid_value) if uid_value is not None else "", result)


def as_database(entities: ToolWozDatabase | Mapping[str, Sequence[Entity]]) -> ToolWozDatabase:
    return entities if isinstance(entities, ToolWozDatabase) else ToolWozDatabase(entities)


def _satisfies(entity: Entity, constraints: Mapping[str, str]) -> bool:
    """Does the entity meet every constraint? leaveAt = at/after, arriveBy = at/before."""
    return all(values_match(slot, wanted, entity.get(slot)) for slot, wanted in constraints.items())


def _subset(small: Mapping[str, str], large: Mapping[str, str]) -> bool:
    """``small ⊆ large`` as argument sets: same slots, same normalised values, times as times."""
    return all(slot in large and same_value(slot, value, large[slot]) for slot, value in small.items())


# --------------------------------------------------------------------------------------
# Goal APIs
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GoalApi:
    """One API call the agent has to make.

    ``parameters`` are the goal's arguments (original spelling; compared normalised).
    ``unique_id`` is the booking target's name / trainID, None where the domain has no
    booking goal. ``returns`` is what the call should return: the booking record for a
    book goal, the target's search result for a search goal with a target, else None.
    Dicts rather than mapping proxies so that tasks pickle and deep-copy.
    """

    name: str
    domain: str
    parameters: dict[str, str]
    unique_id: str | None = None
    returns: dict[str, str] | None = None

    @property
    def intent(self) -> str:
        return API_SPECS[self.name].intent


@dataclass(frozen=True)
class DomainTask:
    """The goal of one domain as ToolWOZ sees it."""

    domain: str
    search_parameters: dict[str, str]
    book_parameters: dict[str, str] | None  # incl. the unique id; None: no booking goal
    unique_id: str | None  # the booking target
    booking_return: dict[str, str] | None  # {"name"/"trainID": target, "reference": ...}
    target_source: str  # one of the TARGET_* constants

    @property
    def books(self) -> bool:
        return self.book_parameters is not None


@dataclass(frozen=True)
class ToolWozTask:
    dialogue_id: str
    goal_apis: tuple[GoalApi, ...]
    domains: dict[str, DomainTask]  # domains with goal APIs, in goal order

    def domain(self, name: str) -> DomainTask | None:
        return self.domains.get(name)

    @property
    def has_goal_apis(self) -> bool:
        return bool(self.goal_apis)

    @property
    def target_sources(self) -> dict[str, str]:
        return {name: domain.target_source for name, domain in self.domains.items()}


def derive_goal_apis(dialogue: Dialogue, entities: ToolWozDatabase | Mapping[str, Sequence[Entity]]) -> ToolWozTask:
    """The ToolWOZ task of a MultiWOZ dialogue: per domain a search goal API and, where the
    user books, a book goal API.

    Search arguments are the goal's final ``info`` constraints that the search API takes
    ("dont care" values are no constraint). Book arguments are the goal's ``book``
    constraints that the book API takes, plus the target's unique id.

    The target is what the dialogue actually booked: the newest ``booked`` record of the
    belief states, else the belief state's name / trainID slot, else the first database
    entity meeting the goal. A candidate from the dialogue is taken only if it is in the
    database and meets the goal's search constraints: otherwise no search could ever
    return it and the task would be unwinnable (annotations are noisy).
    """
    database = as_database(entities)
    goal_apis: list[GoalApi] = []
    domains: dict[str, DomainTask] = {}
    for domain_goal in dialogue.goal.domains:
        if domain_goal.domain not in TOOLWOZ_DOMAINS:
            continue
        task, target = _domain_task(dialogue, domain_goal, database)
        apis = _domain_goal_apis(task, target)
        if apis:
            domains[task.domain] = task
            goal_apis.extend(apis)
    return ToolWozTask(dialogue.dialogue_id, tuple(goal_apis), domains)


def _api_arguments(constraints: Mapping[str, str], spec: ApiSpec) -> dict[str, str]:
    return {slot: value for slot, value in constraints.items() if slot in spec.parameter_names and not is_dont_care(value)}


def _domain_task(dialogue: Dialogue, goal: DomainGoal, database: ToolWozDatabase) -> tuple[DomainTask, DatabaseRow | None]:
    """The domain's task and the database row of its booking target (None: no target)."""
    domain = goal.domain
    search_parameters = _api_arguments(goal.info, search_api(domain))
    booking = book_api(domain)
    if not goal.wants_booking or not booking.parameters:  # attractions cannot be booked
        return DomainTask(domain, search_parameters, None, None, None, TARGET_NOT_NEEDED), None

    target, source, reference = _find_target(dialogue, domain, search_parameters, database)
    if target is None:
        # Without a target, booking any venue would count; leave the book goal out and say so.
        return DomainTask(domain, search_parameters, None, None, None, TARGET_UNRESOLVED), None
    uid_slot = UNIQUE_ID[domain]
    unique_id = target.entity.get(uid_slot)  # the database's spelling, not the annotator's
    book_parameters = _api_arguments(goal.book, booking)
    book_parameters[uid_slot] = unique_id
    booking_return = {uid_slot: unique_id, "reference": reference or booking_reference(dialogue.dialogue_id, domain)}
    return DomainTask(domain, search_parameters, book_parameters, unique_id, booking_return, source), target


def _find_target(
    dialogue: Dialogue, domain: str, search_parameters: Mapping[str, str], database: ToolWozDatabase
) -> tuple[DatabaseRow | None, str, str | None]:
    """(target row, TARGET_* source, the booked reference if the dialogue has one)."""
    for value, source, reference in _dialogue_candidates(dialogue, domain):
        row = _first_satisfying(database.with_uid(domain, value), search_parameters)
        if row is not None:
            return row, source, reference
    bookable = (row for row in database.rows(domain) if row.uid)  # a target needs a unique id
    row = _first_satisfying(bookable, search_parameters)
    if row is not None:
        return row, TARGET_DATABASE, None
    return None, TARGET_UNRESOLVED, None


def _first_satisfying(rows: Iterable[DatabaseRow], constraints: Mapping[str, str]) -> DatabaseRow | None:
    return next((row for row in rows if _satisfies(row.entity, constraints)), None)


def _dialogue_candidates(dialogue: Dialogue, domain: str) -> Iterator[tuple[str, str, str | None]]:
    """Target candidates from the belief states, best first: booked records (newest turn,
    newest record first; a rebooking replaces the first booking), then the name / trainID
    slot of the belief state, newest first."""
    uid_slot = UNIQUE_ID[domain]
    system_beliefs = [turn.belief(domain) for turn in reversed(dialogue.turns) if turn.belief_state is not None]
    beliefs = [belief for belief in system_beliefs if belief is not None]
    # Some releases' booked records carry only a reference; it still names this domain's
    # booking, so it goes with the venue that the belief state names.
    orphan_reference = None
    for belief in beliefs:
        if belief.booked:
            for record in reversed(belief.booked):
                value = record.values.get(uid_slot)
                reference = record.values.get("reference") or None
                if value is not None and not is_dont_care(value):
                    yield value, TARGET_BOOKED, reference
                elif orphan_reference is None:
                    orphan_reference = reference
            break  # `booked` accumulates over the dialogue: the newest non-empty list has them all
    for belief in beliefs:
        for slots in (belief.semi, belief.book):
            value = slots.get(uid_slot)
            if value is not None and not is_dont_care(value):
                yield value, TARGET_BELIEF, orphan_reference


def _domain_goal_apis(task: DomainTask, target: DatabaseRow | None) -> list[GoalApi]:
    domain = task.domain
    if not task.search_parameters and not task.books:
        return []  # nothing that a search could be checked against
    target_result = dict(target.result) if target is not None else None
    apis = [GoalApi(search_api(domain).name, domain, dict(task.search_parameters), task.unique_id, target_result)]
    if task.books:
        apis.append(
            GoalApi(book_api(domain).name, domain, dict(task.book_parameters or {}), task.unique_id, dict(task.booking_return or {}))
        )
    return apis


def booking_reference(dialogue_id: str, domain: str) -> str:
    """A stable 8-character reference for a booking the dialogue did not record: the same
    task always gets the same reference, so rollouts and reruns agree."""
    digest = int.from_bytes(hashlib.sha256(f"{dialogue_id}\x00{domain}".encode()).digest(), "big")
    chars = []
    for _ in range(_REFERENCE_LENGTH):
        digest, index = divmod(digest, len(_REFERENCE_ALPHABET))
        chars.append(_REFERENCE_ALPHABET[index])
    return "".join(chars)


# --------------------------------------------------------------------------------------
# Calls
# --------------------------------------------------------------------------------------


def parse_arguments(spec: ApiSpec, arguments: object) -> tuple[dict[str, str], str | None]:
    """Normalised call arguments (lower case, no apostrophes, "dont care" and empty values
    dropped) or an error message. Values must be scalars: a list or object is an error,
    never silently stringified."""
    if not isinstance(arguments, Mapping):
        return {}, f"arguments of {spec.name} must be an object, got {type(arguments).__name__}"
    parsed: dict[str, str] = {}
    for slot, value in arguments.items():
        if slot not in spec.parameter_names:
            valid = ", ".join(spec.parameter_names) or "none"
            return {}, f"unknown parameter {slot!r} for {spec.name} (valid parameters: {valid})"
        if isinstance(value, bool):
            value = "yes" if value else "no"
        elif value is not None and not isinstance(value, (str, int, float)):
            return {}, f"parameter {slot!r} of {spec.name} must be a single value, got {type(value).__name__}"
        if is_dont_care(value):
            continue
        text = norm_value(value)
        if slot in TIME_SLOTS and parse_time(text) is None:
            return {}, f"parameter {slot!r} of {spec.name} must be a time like 09:30, got {value!r}"
        parsed[slot] = text
    return parsed, None


def _snapshot(arguments: object) -> dict[str, Any]:
    """What the call log keeps of the arguments: a private deep copy, so that the caller
    mutating its dict later cannot rewrite history (and forks stay independent)."""
    if isinstance(arguments, Mapping):
        return {str(key): copy.deepcopy(value) for key, value in arguments.items()}
    return {}


class ToolWozEnvironment:
    """The ToolWOZ environment of one task.

    State is the call log only (the database is never written: bookings do not consume
    capacity in ToolWOZ), so :meth:`fork` is a copy of a list of immutable records.
    """

    def __init__(
        self,
        entities: ToolWozDatabase | Mapping[str, Sequence[Entity]],
        task: ToolWozTask,
        calls: Iterable[ToolCall] = (),
    ):
        self.database = as_database(entities)
        self.task = task
        self._calls: list[ToolCall] = list(calls)

    @property
    def calls(self) -> tuple[ToolCall, ...]:
        return tuple(self._calls)

    def fork(self) -> ToolWozEnvironment:
        """An independent copy in O(calls); database and task are shared read-only."""
        return ToolWozEnvironment(self.database, self.task, self._calls)

    def call(self, name: str, arguments: Mapping[str, Any] | None = None) -> dict[str, Any]:
        """Run one tool call, record it and return its observation (a copy: the caller may
        modify it without touching the log)."""
        observation = self._answer(name, {} if arguments is None else arguments)
        self._calls.append(ToolCall(str(name), _snapshot(arguments), observation))
        return copy.deepcopy(observation)

    def progress(self) -> ToolWozScore:
        return goal_progress(self.task, self._calls)

    def _answer(self, name: object, arguments: object) -> dict[str, Any]:
        spec = API_SPECS.get(name) if isinstance(name, str) else None
        if spec is None:
            return {"error": f"unknown tool {name!r} (available: {', '.join(API_SPECS)})"}
        args, error = parse_arguments(spec, arguments)
        if error is not None:
            return {"error": error}
        if spec.intent == "search":
            return self._search(spec.domain, args)
        return self._book(spec.domain, args)

    def _search(self, domain: str, args: dict[str, str]) -> dict[str, Any]:
        """Algorithm 2: at most one result, chosen by how the call relates to the goal."""
        if not self.database.has_domain(domain):
            return {"error": f"no {domain} database is loaded"}
        matches = [row for row in self.database.rows(domain) if _satisfies(row.entity, args)]
        chosen = _choose_result(matches, args, self.task.domain(domain))
        return {"results": [dict(chosen.result)] if chosen is not None else []}

    def _book(self, domain: str, args: dict[str, str]) -> dict[str, Any]:
        """Algorithm 3, with the paper's prose (appendix A / reference notes): success iff
        all of the goal's booking arguments, the unique id included, are in the call."""
        task = self.task.domain(domain)
        if task is None or task.book_parameters is None or not _subset(task.book_parameters, args):
            return {"success": False, "return": None}
        return {"success": True, "return": dict(task.booking_return or {})}


def _choose_result(matches: Sequence[DatabaseRow], args: Mapping[str, str], task: DomainTask | None) -> DatabaseRow | None:
    """Algorithm 2 of the JOSH paper, case by case."""
    goal = task.search_parameters if task is not None else {}
    booking_id = norm_value(task.unique_id) if task is not None and task.unique_id is not None else None
    correct = wrong = None
    for row in matches:
        # No goal check is needed for `correct`: it is only returned when every match meets
        # the goal (case 1 filters by the goal, case 2 returns `wrong` first), which also
        # picks the right train among trains that share a trainID.
        if booking_id is not None and row.uid == booking_id:
            correct = row
        if not _satisfies(row.entity, goal):
            wrong = row  # the paper's loop keeps the last violating match
    if _subset(goal, args):
        # The call states the whole goal: the target, else something visibly wrong, else nothing.
        if booking_id is not None:
            return correct or wrong or None
    elif _subset(args, goal):
        # Underspecified: prefer a goal-violating result, so an agent that did not ask fails.
        if wrong is not None:
            return wrong
        if booking_id is not None and correct is not None:
            return correct
    return matches[0] if matches else None


# --------------------------------------------------------------------------------------
# Scoring
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ToolWozScore:
    goal_apis: tuple[GoalApi, ...]
    met: tuple[bool, ...]  # per goal API, aligned with goal_apis
    met_by: tuple[int | None, ...]  # index of the first call that met each goal API
    reward: float  # met / total; 0.0 for a task without goal APIs (nothing was achieved)
    success: bool  # reward == 1.0

    @property
    def n_met(self) -> int:
        return sum(self.met)

    @property
    def total(self) -> int:
        return len(self.goal_apis)


def call_meets_goal(goal: GoalApi, call: ToolCall) -> bool:
    """Does one call complete one goal API? A call that got an error observation never does."""
    if call.name != goal.name or (call.observation is not None and "error" in call.observation):
        return False
    args, error = parse_arguments(API_SPECS[goal.name], call.arguments)
    if error is not None:
        return False
    if API_SPECS[goal.name].intent == "book":
        return _subset(goal.parameters, args)
    results = (call.observation or {}).get("results")
    if not isinstance(results, list) or len(results) != 1 or not isinstance(results[0], Mapping):
        return False
    item = results[0]
    # Both checks for a target: trainIDs repeat in the database, so the id alone does not
    # say that the returned train is the goal's train.
    if goal.unique_id is not None:
        uid_slot = UNIQUE_ID[goal.domain]
        if item.get(uid_slot) is None or norm_value(item[uid_slot]) != norm_value(goal.unique_id):
            return False
    return all(values_match(slot, wanted, item.get(slot)) for slot, wanted in goal.parameters.items())


def goal_progress(task: ToolWozTask, calls: Iterable[ToolCall]) -> ToolWozScore:
    """Which goal APIs the calls completed. Extra or failed calls cost nothing."""
    calls = list(calls)
    met_by: list[int | None] = []
    for goal in task.goal_apis:
        met_by.append(next((i for i, call in enumerate(calls) if call_meets_goal(goal, call)), None))
    met = tuple(index is not None for index in met_by)
    total = len(task.goal_apis)
    reward = sum(met) / total if total else 0.0
    return ToolWozScore(task.goal_apis, met, tuple(met_by), reward, total > 0 and reward == 1.0)


# --------------------------------------------------------------------------------------
# Official test set
# --------------------------------------------------------------------------------------


def _bare_id(dialogue_id: str) -> str:
    return dialogue_id[:-5] if dialogue_id.endswith(".json") else dialogue_id


def toolwoz_test_ids(
    test_list_ids: Iterable[str],
    tasks: Mapping[str, ToolWozTask] | Iterable[ToolWozTask],
    limit: int = TEST_SET_SIZE,
) -> list[str]:
    """The official ToolWOZ test set: the first ``limit`` sorted ids of testListFile that
    have goal APIs. Ids match with or without ".json"; the result uses the tasks' ids.
    (Sorting bare ids and ".json" ids gives the same order: "." sorts before any letter or digit.)"""
    listed = {_bare_id(i.strip()) for i in test_list_ids if i.strip()}
    task_list = tasks.values() if isinstance(tasks, Mapping) else tasks
    by_id = {_bare_id(task.dialogue_id): task.dialogue_id for task in task_list if task.has_goal_apis}
    return [by_id[bare] for bare in sorted(listed & by_id.keys())][:limit]
