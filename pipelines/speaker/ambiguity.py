"""Ambiguity points of a seed dialogue (SpeakRL section 3.1).

An *ambiguity point* is a place in a dialogue where the agent would have to act (search
and recommend, or book) while more than one reading of the user's request remains and the
user's hidden goal tells them apart:

* **underspecification**: the database entities matching what the user has said so far
  differ in slots the goal constrains (three restaurants, and only the goal knows the user
  wants the one in the north). The *discriminating slots* are the goal's constraint slots
  the user has not stated on which some candidate violates the goal; the *candidate
  values* are the values the candidates take there;
* **referential**: a phrase resolves to more than one antecedent: "the same day as my
  earlier booking" after two bookings on different days, "a taxi between the two places"
  (which way?).

Required-slot filling is not ambiguity: a train's route and travel day are the request
itself, and a booking's people/day/time/stay are required arguments, so asking for them
is slot filling and never makes a point (:data:`SLOT_FILLING`). A request with one
matching entity, or one whose candidates all satisfy the goal, is not ambiguous either.

:func:`find_ambiguity_points` walks a seed dialogue with the database, domain by domain in
the order its belief states introduce them. A search point comes from the seed's own
user turns when the constraints stated at some turn leave the goal discriminating
(``origin="seed"``); when the seed's user said everything at once, from the largest part of
that first statement that would (``origin="withheld"``): the synthesizer then rewrites that
turn to say only that part. The analysis functions (:func:`discriminating_values`,
:func:`referential_day_or_people`, :func:`taxi_direction`) are shared with the synthesizer,
which re-evaluates every point on the dialogue it actually writes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from itertools import combinations
from typing import Iterable, Mapping, Sequence

from pipelines.env.tools import Database, name_key
from pipelines.multiwoz.ontology import TIME_SLOTS, is_dont_care, parse_time, values_match
from pipelines.records import Dialogue, DomainGoal, Entity, frozen_dict

UNDERSPECIFICATION = "underspecification"
REFERENTIAL = "referential"
AMBIGUITY_TYPES: tuple[str, ...] = (UNDERSPECIFICATION, REFERENTIAL)

# What the agent would do at the point.
SEARCH, BOOK, TAXI = "search", "book", "taxi"
ACTIONS: tuple[str, ...] = (SEARCH, BOOK, TAXI)

# Where a search point's known constraints come from (see the module docstring).
# "goal": a referential point, which the goal's cross-domain values make possible.
ORIGIN_SEED, ORIGIN_WITHHELD, ORIGIN_GOAL = "seed", "withheld", "goal"
ORIGINS: tuple[str, ...] = (ORIGIN_SEED, ORIGIN_WITHHELD, ORIGIN_GOAL)

# Domains with a search tool whose goal picks one entity.
SEARCH_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train")
VENUE_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction")
# Constraints that are the request itself rather than a preference: always stated, never
# asked about as an ambiguity (section 3.1: slot filling is not clarification).
SLOT_FILLING: Mapping[str, frozenset[str]] = frozen_dict({
    "train": frozenset({"departure", "destination", "day"}),
    "taxi": frozenset({"departure", "destination", "leaveAt", "arriveBy"}),
})
# Booking values a user may give by reference to an earlier booking.
REFERABLE_SLOTS: tuple[str, ...] = ("day", "people")
# How the user words such a reference.
REFERENCE_PHRASES: Mapping[str, str] = frozen_dict({"day": "the same day as my earlier booking", "people": "the same number of people as before"})


@dataclass(frozen=True)
class Antecedent:
    """One reading of a referential phrase: what it points at and the values it implies."""

    label: str  # "the restaurant booking", "from pizza hut to the gonville hotel"
    values: Mapping[str, str]

    def __post_init__(self) -> None:
        object.__setattr__(self, "values", frozen_dict(self.values))


@dataclass(frozen=True)
class AmbiguityPoint:
    """One ambiguity point (module docstring).

    ``turn``: the seed system turn at which the agent would act (None when the seed has no
    belief states to tell). ``known``: what the user has said about the domain at that point.
    ``slots``: the discriminating slots; ``candidates``: slot -> the values still possible;
    ``goal_values``: slot -> what the hidden goal wants (what the user will answer);
    ``n_candidates``: matching entities (underspecification) or readings (referential).
    ``antecedents`` and ``reference`` (the phrase the user uses) are for referential points.
    """

    dialogue_id: str
    domain: str
    type: str
    action: str
    turn: int | None
    known: Mapping[str, str]
    slots: tuple[str, ...]
    candidates: Mapping[str, tuple[str, ...]]
    goal_values: Mapping[str, str]
    n_candidates: int
    origin: str = ORIGIN_SEED
    antecedents: tuple[Antecedent, ...] = ()
    reference: str | None = None

    def __post_init__(self) -> None:
        if self.type not in AMBIGUITY_TYPES:
            raise ValueError(f"unknown ambiguity type {self.type!r}; types: {', '.join(AMBIGUITY_TYPES)}")
        if self.action not in ACTIONS:
            raise ValueError(f"unknown action {self.action!r}; actions: {', '.join(ACTIONS)}")
        if not self.slots:
            raise ValueError("an ambiguity point needs at least one discriminating slot")
        object.__setattr__(self, "known", frozen_dict(self.known))
        object.__setattr__(self, "candidates", frozen_dict({s: tuple(v) for s, v in self.candidates.items()}))
        object.__setattr__(self, "goal_values", frozen_dict(self.goal_values))

    @property
    def key(self) -> tuple[str, str, str]:
        """(domain, action, type): a dialogue has at most one point per key."""
        return self.domain, self.action, self.type

    def as_dict(self) -> dict:
        return {
            "domain": self.domain,
            "type": self.type,
            "action": self.action,
            "turn": self.turn,
            "origin": self.origin,
            "known": dict(self.known),
            "slots": list(self.slots),
            "candidates": {s: list(v) for s, v in self.candidates.items()},
            "goal_values": dict(self.goal_values),
            "n_candidates": self.n_candidates,
            "antecedents": [{"label": a.label, "values": dict(a.values)} for a in self.antecedents],
            "reference": self.reference,
        }


# --------------------------------------------------------------------------------------
# Analysis shared with the synthesizer
# --------------------------------------------------------------------------------------


def constraints(values: Mapping[str, str]) -> dict[str, str]:
    """The stated constraints of a goal or belief mapping: don't-care values dropped."""
    return {slot: value for slot, value in values.items() if not is_dont_care(value)}


def candidate_values(slot: str, entities: Iterable[Entity]) -> tuple[str, ...]:
    """The distinct values ``entities`` take in ``slot``; times in clock order, the rest sorted."""
    values = {e.get(slot) for e in entities} - {None, "", "?"}
    if slot in TIME_SLOTS:
        return tuple(sorted(values, key=lambda v: (parse_time(v) is None, parse_time(v) or 0, v)))
    return tuple(sorted(values))


def discriminating_values(
    domain: str, candidates: Sequence[Entity], goal_info: Mapping[str, str], known: Mapping[str, str]
) -> dict[str, tuple[str, ...]]:
    """Discriminating slot -> the candidates' values there, in the goal's slot order.

    A slot discriminates when the goal constrains it, the user has not stated it, it is not
    slot filling, and some candidate violates the goal there. With fewer than two candidates
    nothing is ambiguous.
    """
    if len(candidates) < 2:
        return {}
    filling = SLOT_FILLING.get(domain, frozenset())
    out: dict[str, tuple[str, ...]] = {}
    for slot, wanted in constraints(goal_info).items():
        if slot in known or slot in filling or slot == "name":
            continue
        if any(not values_match(slot, wanted, e.get(slot)) for e in candidates):
            out[slot] = candidate_values(slot, candidates)
    return out


@dataclass(frozen=True)
class Booking:
    """A booking made before a point, as a later reference can point at it."""

    domain: str
    values: Mapping[str, str]  # day / people (and whatever else was booked)

    @property
    def label(self) -> str:
        return f"the {self.domain} booking"


def referential_day_or_people(
    goal_values: Mapping[str, str], earlier: Sequence[Booking], slots: Iterable[str] = REFERABLE_SLOTS
) -> tuple[str, tuple[Antecedent, ...]] | None:
    """(slot, antecedents) when "the same <slot> as my earlier booking" would be ambiguous:
    at least two earlier bookings state the slot with different values and one of them is
    the goal's value. The first qualifying slot of ``slots`` wins; None when none does."""
    for slot in slots:
        wanted = goal_values.get(slot)
        if wanted is None or is_dont_care(wanted):
            continue
        readings = [Antecedent(b.label, {slot: b.values[slot]}) for b in earlier if b.values.get(slot)]
        values = {a.values[slot] for a in readings}
        if len(values) >= 2 and wanted in values:
            return slot, tuple(readings)
    return None


def taxi_direction(info: Mapping[str, str], venues: Sequence[tuple[str, str]]) -> tuple[Antecedent, ...] | None:
    """The two readings of "a taxi between the two places" when the taxi goal runs between
    two venues discussed before (``venues``: (domain, name) in the order they came up), in
    that order of mention; None otherwise."""
    departure, destination = info.get("departure"), info.get("destination")
    if not departure or not destination:
        return None
    keys = {name_key(name): (domain, name) for domain, name in venues}
    if name_key(departure) not in keys or name_key(destination) not in keys or name_key(departure) == name_key(destination):
        return None
    first, second = sorted((keys[name_key(departure)], keys[name_key(destination)]), key=lambda v: list(keys).index(name_key(v[1])))
    return (
        Antecedent(f"from {first[1]} to {second[1]}", {"departure": first[1], "destination": second[1]}),
        Antecedent(f"from {second[1]} to {first[1]}", {"departure": second[1], "destination": first[1]}),
    )


# --------------------------------------------------------------------------------------
# The seed as its belief states tell it
# --------------------------------------------------------------------------------------


@dataclass
class SeedView:
    """What a seed's belief states say per domain: when it first comes up, what the user had
    stated at each change, which entity the seed settled on and when it was booked."""

    order: tuple[str, ...]
    statements: dict[str, list[tuple[int, dict[str, str]]]] = field(default_factory=dict)  # domain -> [(turn, semi)]
    chosen: dict[str, str] = field(default_factory=dict)  # domain -> name / trainID
    booked_turn: dict[str, int] = field(default_factory=dict)


def seed_view(dialogue: Dialogue) -> SeedView:
    goal_domains = [d.domain for d in dialogue.goal.domains]
    first_turn: dict[str, int] = {}
    statements: dict[str, list[tuple[int, dict[str, str]]]] = {}
    chosen: dict[str, str] = {}
    booked_turn: dict[str, int] = {}
    for turn in dialogue.turns:
        for belief in turn.belief_state or ():
            if belief.domain not in goal_domains:
                continue
            semi = constraints(belief.semi)
            if semi or belief.booked:
                first_turn.setdefault(belief.domain, turn.index)
            history = statements.setdefault(belief.domain, [])
            if semi and (not history or history[-1][1] != semi):
                history.append((turn.index, semi))
            if semi.get("name"):
                chosen[belief.domain] = semi["name"]
            for record in belief.booked:
                booked_turn.setdefault(belief.domain, turn.index)
                name = record.values.get("name") or record.values.get("trainID")
                if name and not is_dont_care(name):
                    chosen[belief.domain] = name
    # Domains the belief states never show keep the goal's order, after the others.
    order = sorted(goal_domains, key=lambda d: (first_turn.get(d, len(dialogue.turns)), goal_domains.index(d)))
    return SeedView(tuple(order), statements, chosen, booked_turn)


# --------------------------------------------------------------------------------------
# The walk
# --------------------------------------------------------------------------------------


def find_ambiguity_points(dialogue: Dialogue, database: Database) -> list[AmbiguityPoint]:
    """Every ambiguity point of ``dialogue``, in dialogue order (module docstring)."""
    view = seed_view(dialogue)
    goal = dialogue.goal
    points: list[AmbiguityPoint] = []
    earlier: list[Booking] = []
    venues: list[tuple[str, str]] = []
    for domain in view.order:
        domain_goal = goal.get(domain)
        if domain_goal is None:
            continue
        if domain in SEARCH_DOMAINS:
            point = search_point(dialogue.dialogue_id, domain_goal, database, view)
            if point is not None:
                points.append(point)
            points.extend(reference_points(dialogue.dialogue_id, domain_goal, earlier, view))
        if domain == "taxi":
            point = taxi_point(dialogue.dialogue_id, domain_goal, venues, view.booked_turn.get(domain))
            if point is not None:
                points.append(point)
        booking = goal_booking(domain_goal)
        if booking is not None:
            earlier.append(booking)
        venue = view.chosen.get(domain) or constraints(domain_goal.info).get("name")
        if domain in VENUE_DOMAINS and venue:
            venues.append((domain, venue))
    return points


def goal_booking(goal: DomainGoal) -> Booking | None:
    """The booking a domain goal ends with, as later references see it (a train's day is a
    search constraint, but the ticket is for that day)."""
    book = constraints(goal.book)
    if not book:
        return None
    values = dict(book)
    if goal.domain == "train" and goal.info.get("day"):
        values["day"] = goal.info["day"]
    return Booking(goal.domain, values)


def search_point(dialogue_id: str, goal: DomainGoal, database: Database, view: SeedView) -> AmbiguityPoint | None:
    """The domain's underspecification point, from the seed's statements (module docstring)."""
    domain, info = goal.domain, constraints(goal.info)
    # A named venue, or a goal that first asks for what does not exist (fail_info), is
    # settled by name or by the failure: no search ambiguity is introduced there.
    if not info or "name" in info or constraints(goal.fail_info):
        return None
    if not database.search(domain, info):
        return None  # unsatisfiable goal: nothing to disambiguate towards
    filling = SLOT_FILLING.get(domain, frozenset())
    history = view.statements.get(domain, [])
    for turn, semi in history:
        if semi.get("name"):
            break  # an entity was settled on
        known = {s: v for s, v in semi.items() if s in info and values_match(s, info[s], v)}
        known.update({s: info[s] for s in filling if s in info})
        point = _underspecified(dialogue_id, domain, info, known, database, turn, ORIGIN_SEED)
        if point is not None:
            return point
    # The user said everything at once: withhold part of the first statement.
    turn, first = history[0] if history else (None, info)
    stated = [s for s in first if s in info and s not in filling] or [s for s in info if s not in filling]
    base = {s: info[s] for s in filling if s in info}
    for size in range(len(stated) - 1, -1, -1):
        for kept in combinations(stated, size):
            known = {**base, **{s: info[s] for s in kept}}
            point = _underspecified(dialogue_id, domain, info, known, database, turn, ORIGIN_WITHHELD)
            if point is not None:
                return point
    return None


def _underspecified(
    dialogue_id: str, domain: str, info: Mapping[str, str], known: Mapping[str, str], database: Database, turn: int | None, origin: str
) -> AmbiguityPoint | None:
    candidates = database.search(domain, known)
    slots = discriminating_values(domain, candidates, info, known)
    if not slots:
        return None
    return AmbiguityPoint(
        dialogue_id, domain, UNDERSPECIFICATION, SEARCH, turn, known, tuple(slots), slots,
        {s: info[s] for s in slots}, len(candidates), origin,
    )


def reference_points(dialogue_id: str, goal: DomainGoal, earlier: Sequence[Booking], view: SeedView) -> list[AmbiguityPoint]:
    """"The same day / number of people as my earlier booking", where ambiguous: a train's
    day when the user asks for the train, a venue's day or party size (day preferred) and a
    train's party size when they book. A ``fail_book`` slot is stated outright first, so it
    is never given by reference."""
    domain = goal.domain
    book = {s: v for s, v in constraints(goal.book).items() if s not in constraints(goal.fail_book)}
    history = view.statements.get(domain, [])
    if domain == "train":
        sites = [
            (SEARCH, {"day": goal.info.get("day", "")}, history[0][0] if history else None),
            (BOOK, {"people": book.get("people", "")}, view.booked_turn.get(domain)),
        ]
    else:
        sites = [(BOOK, book, view.booked_turn.get(domain))]
    points = []
    for action, values, turn in sites:
        found = referential_day_or_people(values, earlier)
        if found is None:
            continue
        slot, antecedents = found
        known = {s: v for s, v in constraints(goal.info if action == SEARCH else book).items() if s != slot}
        points.append(AmbiguityPoint(
            dialogue_id, domain, REFERENTIAL, action, turn, known, (slot,),
            {slot: tuple(sorted({a.values[slot] for a in antecedents}))}, {slot: values[slot]},
            len(antecedents), ORIGIN_GOAL, antecedents, REFERENCE_PHRASES[slot],
        ))
    return points


def taxi_point(dialogue_id: str, goal: DomainGoal, venues: Sequence[tuple[str, str]], turn: int | None) -> AmbiguityPoint | None:
    """"A taxi between the two places", when both ends are venues discussed before."""
    info = constraints(goal.info)
    readings = taxi_direction(info, venues)
    if readings is None:
        return None
    names = tuple(sorted({info["departure"], info["destination"]}))
    known = {s: v for s, v in info.items() if s not in ("departure", "destination")}
    return AmbiguityPoint(
        dialogue_id, "taxi", REFERENTIAL, TAXI, turn, known, ("departure", "destination"),
        {"departure": names, "destination": names}, {"departure": info["departure"], "destination": info["destination"]},
        len(readings), ORIGIN_GOAL, readings, "the two places",
    )
