"""MultiWOZ's standard Inform and Success (``standard`` grading mode), on askflow's episodes.

askflow's own goal checker (:mod:`pipelines.env.checker`, the ``strict`` mode) grades every
requested attribute and booking value. The field's papers report the standard evaluator's
numbers instead (Nekvinda & Dušek 2021, "Shades of BLEU, Flavours of Success: The Case of
MultiWOZ", and its ``mwzeval`` package; Budzianowski et al. 2018 before it). This module
implements that evaluator's published definitions on what an askflow episode leaves behind
(the environment's queries and bookings, the system's texts) instead of delexicalised
responses and belief states; no code or data of the evaluator is used:

* **domains**: every domain of the goal.
* **requestables** of a domain (what success asks for): only the standard set, phone,
  address, postcode, reference and train id. For a train: the reference when the goal books
  one, the train id when the goal requests it (nothing else). For every other domain: the
  goal's requested phone / address / postcode, and the reference when the goal books one.
  So a taxi needs its phone when requested (its car type is not checked), police and
  hospital their requested phone / address / postcode.
* **offered venues** (restaurant, hotel, attraction, train): at each system turn that
  names a venue of the domain (a database venue's name; for trains a train id), the venues
  of the database matching the system's state of that domain at that turn (here: the latest
  query's constraints, or the venue of a booking made after it); the offered set is replaced
  only when some venue offered before is not among the new matches (the evaluator's rule).
* **inform** per domain: the offered venues are a subset of the database's venues matching
  the goal's informable constraints (an empty offer fails). A goal that names its venue is
  matched without looking ("the crowd worker was told the name"); taxi, police and
  hospital have no venue to match and are always matched (the evaluator does not score
  them for inform); a train never offered, whose id was not requested, is matched.
* **provided** requestables per domain: the system said the value of one of the domain's
  database entities (phone, postcode, street address; a timetable train id; for taxis a
  booked taxi's phone; police and hospital their entity's), or, for the reference, told a
  successful booking's reference of the domain after making it (the evaluator counts a
  reference only in turns where the annotations book the domain). Like the evaluator, the
  value need not be the offered venue's: only that the slot was given in the domain.
* **active domain** of a system turn: a venue named or a requestable given in a turn counts
  only for the one domain that turn is estimated to talk about, as the evaluator estimates it
  from the dialogue state: the domain whose state changed in the turn (here: the state is
  what the domain's queries and booking attempts so far constrain); of several changed, the
  current one if it changed, else the one with most slots filled; with no change the current
  one stays (after a turn that changed several, the next unchanged turn moves to another of
  them); before any change, none.
* **dialogue**: Inform when every domain is matched; Success when it informs and every
  domain's requestables were provided.

The evaluator reads delexicalised placeholders and the gold belief states; askflow reads the
values and the tool calls. On the 999 real val dialogues replayed (``gold_replay_real``)
this gives the figures in ``reports/gold_replay_real.json`` (``standard``), beside the
evaluator's published human-reference figures on the test set (Inform 93.7, Success 90.9).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping

from pipelines.env.tools import EnvState, QueryRecord, name_key
from pipelines.multiwoz.ontology import is_dont_care, norm_value
from pipelines.multiwoz.text import TextView, states, words
from pipelines.records import Entity, Goal

STANDARD_REQUESTABLES: tuple[str, ...] = ("phone", "address", "postcode", "reference", "trainID")
VENUE_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train")
# No venue to match: always matched for inform (taxi, police, hospital).
UNMATCHED_DOMAINS: tuple[str, ...] = ("taxi", "police", "hospital")


@dataclass(frozen=True)
class StandardDomain:
    domain: str
    inform: bool
    requestables: tuple[str, ...]
    provided: tuple[str, ...]
    offered: tuple[str, ...] = ()  # the offered venues' names / train ids
    turn: int | None = None  # the turn whose state settled the offer

    @property
    def missing(self) -> tuple[str, ...]:
        return tuple(r for r in self.requestables if r not in self.provided)

    @property
    def success(self) -> bool:
        return self.inform and not self.missing

    def as_dict(self) -> dict[str, Any]:
        return {"domain": self.domain, "inform": self.inform, "success": self.success, "requestables": list(self.requestables),
                "missing": list(self.missing), "offered": list(self.offered[:5]), "offered_count": len(self.offered), "turn": self.turn}


@dataclass(frozen=True)
class StandardResult:
    domains: tuple[StandardDomain, ...] = field(default_factory=tuple)

    @property
    def inform(self) -> bool:
        return all(d.inform for d in self.domains)

    @property
    def success(self) -> bool:
        return self.inform and all(not d.missing for d in self.domains)

    def domain(self, name: str) -> StandardDomain | None:
        return next((d for d in self.domains if d.domain == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {"inform": self.inform, "success": self.success, "domains": [d.as_dict() for d in self.domains]}


def requestables(domain: str, reqt: Iterable[str], books: bool) -> tuple[str, ...]:
    """The goal's requestables the standard evaluator checks (module docstring)."""
    reqt = set(reqt)
    if domain == "train":
        wanted = (["reference"] if books else []) + (["trainID"] if "trainID" in reqt else [])
    else:
        wanted = [slot for slot in ("phone", "address", "postcode") if slot in reqt] + (["reference"] if books else [])
    return tuple(wanted)


_TRAIN_ID = re.compile(r"\btr\s?(\d{4})\b", re.I)


def check_standard(goal: Goal, state: EnvState, system_texts: Iterable[str | tuple[int, str]]) -> StandardResult:
    """Grade an episode by the standard evaluator's definitions (module docstring).
    ``system_texts`` as for :func:`pipelines.env.checker.check_goal`."""
    texts: list[tuple[int, str, TextView]] = []
    for position, item in enumerate(system_texts):
        turn, text = (position, item) if isinstance(item, str) else item
        texts.append((int(turn), str(text), TextView.of(str(text))))
    database = state.database
    active = active_domains(state, [turn for turn, _, _ in texts])
    results = []
    for domain_goal in goal.domains:
        domain = domain_goal.domain
        info = {k: v for k, v in domain_goal.info.items() if not is_dont_care(v)}
        books = bool({k: v for k, v in domain_goal.book.items() if not is_dont_care(v)})
        wanted = requestables(domain, domain_goal.reqt, books)
        spoken = [item for item in texts if active.get(item[0]) == domain]
        offered, turn = _offered(domain, state, spoken) if domain in VENUE_DOMAINS else ((), None)
        if domain in UNMATCHED_DOMAINS or "name" in info:
            inform = True
        elif domain == "train" and not offered and "trainID" not in wanted:
            inform = True
        elif not offered:
            inform = False
        else:
            goal_venues = {e.entity_id for e in database.search(domain, info)}
            inform = all(e.entity_id in goal_venues for e in offered)
        provided = tuple(slot for slot in wanted if _provided(domain, slot, state, spoken))
        names = tuple(str(e.get("trainID") or e.name) if domain == "train" else e.name for e in offered)
        results.append(StandardDomain(domain, inform, wanted, provided, names, turn))
    return StandardResult(tuple(results))


def active_domains(state: EnvState, turns: Iterable[int]) -> dict[int, str | None]:
    """The domain each system turn talks about, estimated from state changes as the standard
    evaluator does (module docstring): the state of a domain is every constraint its queries
    and booking attempts up to the turn named.

    >>> from pipelines.env.tools import Database, QueryRecord
    >>> s = EnvState(Database({}), queries=[QueryRecord(0, 1, "hotel", {"area": "north"}, 2, ()),
    ...     QueryRecord(1, 3, "restaurant", {"food": "thai"}, 1, ()), QueryRecord(2, 4, "hotel", {"area": "north"}, 2, ())])
    >>> active_domains(s, [0, 1, 2, 3, 4, 5])
    {0: None, 1: 'hotel', 2: 'hotel', 3: 'restaurant', 4: 'restaurant', 5: 'restaurant'}
    """
    changes: dict[int, list[tuple[str, Mapping[str, str]]]] = {}
    for record in sorted([*state.queries, *state.bookings], key=lambda r: (r.turn, r.call_index)):
        slots = record.constraints if isinstance(record, QueryRecord) else record.arguments
        changes.setdefault(record.turn, []).append((record.domain, slots))
    filled: dict[str, dict[str, str]] = {}
    current: str | None = None
    before: list[str] = []
    active: dict[int, str | None] = {}
    pending = sorted(changes)
    for turn in sorted(set(turns)):
        changed: list[str] = []
        while pending and pending[0] <= turn:
            for domain, slots in changes[pending.pop(0)]:
                new = {str(k): str(v) for k, v in slots.items() if v is not None}
                if set(new.items()) - set(filled.get(domain, {}).items()) and domain not in changed:
                    changed.append(domain)
                filled[domain] = {**filled.get(domain, {}), **new}
        if not changed:
            if current is None:
                active[turn] = None
                continue
            if len(before) > 1:
                others = [d for d in before if d != current]
                current = others[0] if others else current
        elif current not in changed:
            current = max(changed, key=lambda d: len(filled[d]))
        before = changed
        active[turn] = current
    return active


def _offered(domain: str, state: EnvState, texts: list[tuple[int, str, TextView]]) -> tuple[tuple[Entity, ...], int | None]:
    """The venues offered last (module docstring), with the turn that set them."""
    database = state.database
    events = sorted([(q.turn, q.call_index, "query", q) for q in state.queries if q.domain == domain]
                    + [(b.turn, b.call_index, "booking", b) for b in state.successful_bookings(domain) if b.entity is not None],
                    key=lambda e: (e[0], e[1]))
    names = None if domain == "train" else [(name_key(e.name), e) for e in database.entities(domain)]
    offered: tuple[Entity, ...] = ()
    settled = None
    cache: dict[int, tuple[Entity, ...]] = {}
    for turn, text, view in texts:
        if domain == "train":
            named = bool(_TRAIN_ID.search(text))
        else:
            named = any(key and view.mentions(key) for key, _ in names or ())
        if not named:
            continue
        latest = [e for e in events if e[0] <= turn]
        if not latest:
            matching: tuple[Entity, ...] = ()
        else:
            _, index, kind, record = latest[-1]
            if index not in cache:
                cache[index] = (record.entity,) if kind == "booking" else tuple(database.search(domain, record.constraints))
            matching = cache[index]
        if not offered or any(e not in matching for e in offered):
            if matching or not offered:
                offered, settled = matching, turn
    return offered, settled


def _provided(domain: str, slot: str, state: EnvState, texts: list[tuple[int, str, TextView]]) -> bool:
    if slot == "reference":
        return any(b.reference and any(t >= b.turn and f" {words(b.reference)} " in v.padded for t, _, v in texts)
                   for b in state.successful_bookings(domain))
    if slot == "trainID":
        known = {str(e.get("trainID") or "").upper() for e in state.database.entities("train")}
        return any(f"TR{m}" in known for _, text, _ in texts for m in _TRAIN_ID.findall(text))
    values = _values(domain, slot, state)
    for _, _, view in texts:
        for value in values:
            if slot == "address":
                if states(view, "address", value):
                    return True
            elif value in view.compact:
                return True
    return False


def _values(domain: str, slot: str, state: EnvState) -> set[str]:
    """How ``slot`` of the domain's entities reads in a text (compact for phone and postcode)."""
    if domain == "taxi":
        raw = [b.details.get(slot) for b in state.successful_bookings("taxi")]
    else:
        raw = [e.get(slot) for e in state.database.entities(domain)]
    values = set()
    for value in raw:
        if not value or norm_value(value) in ("?", "", "none"):
            continue
        if slot == "address":
            values.add(value)
        else:
            compact = words(value).replace(" ", "")
            if len(compact) >= 5:
                values.add(compact)
    return values
