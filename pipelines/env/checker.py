"""Did an episode meet its user goal? MultiWOZ inform/success, graded on tool-call state.

Per goal domain (SpeakRL appendix B: success = every constraint of the goal is met):

* **offered** entity: the entity of the last successful booking in the domain; else the
  latest-mentioned entity of the latest query whose results the system named afterwards;
  else a database entity of the domain that the system named.
* **inform**: the offered entity satisfies the goal's final ``info`` (``values_match``:
  ``leaveAt`` at/after, ``arriveBy`` at/before; a ``name`` must be that venue).
* **book**: a successful booking whose entity satisfies ``info``, whose arguments match
  every ``book`` value, and whose reference the system told the user afterwards (SpeakRL
  appendix A: the task is complete when the agent returns the correct booking ids).
  Taxi goals have no ``book`` dict: a successful ``book_taxi`` matching the taxi ``info``.
* **request**: every ``reqt`` attribute of the offered entity (of the taxi booking for
  taxis) was given: its value appears in a system text, or a system dialog act informs
  that slot. An attribute the database does not know ("?") counts as given when the system
  talks about it by name ("entrance fee"); so do yes/no attributes (internet, parking),
  which agents state in words, never as "yes".

Police and hospital have no tools: their static entity (the police station; the hospital
department of ``info``) is the offered one, inform means the system named it.

A flag is ``None`` when it does not apply (no ``info``, no ``book``, no ``reqt``), and a
domain succeeds when no applicable flag is false. Every false flag comes with a reason.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipelines.env.tools import BookingRecord, EnvState, name_key, same_name
from pipelines.multiwoz.ontology import ACT_SLOT, TIME_SLOTS, VALUE_SYNONYMS, possessive_split, street_of, is_dont_care, norm_value, parse_time, same_value, values_match
from pipelines.records import DialogAct, DomainGoal, Entity, Goal

# Domains graded on their static database entity rather than on tool calls.
STATIC_DOMAINS: tuple[str, ...] = ("police", "hospital")
# Booking acts carry no domain; in MultiWOZ they are about restaurants and hotels.
_BOOKING_ACT_DOMAINS = frozenset({"restaurant", "hotel"})
# Dialog-act intents that give the user a value (Request / NoOffer / NoBook do not).
_INFORMING_INTENTS = frozenset({"inform", "recommend", "select", "offerbook", "offerbooked", "book"})
# How a system talks about an attribute without stating a value.
_SLOT_WORDS: dict[str, tuple[str, ...]] = {
    "entrance fee": ("entrance fee", "admission"),
    "openhours": ("opening hours", "open"),
    "internet": ("internet", "wifi", "wi fi"),
    "parking": ("parking",),
    "pricerange": ("price range", "priced"),
    "car type": ("car",),
}
# Values written with or without inner spaces ("CB1 2DP", "01223 315702").
_COMPACT_SLOTS = frozenset({"phone", "postcode"})
# Values whose number alone is how people state them ("£23.60", "5 quid", "51 min").
_NUMERIC_SLOTS = frozenset({"price", "entrance fee", "duration"})
_UNKNOWN_VALUES = frozenset({"", "?"})

_WORD = re.compile(r"[a-z0-9]+")
_CLOCK = re.compile(r"(?<!\d)(\d{1,2})\s*[:.]\s*(\d{2})(?!\d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")


# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DomainResult:
    domain: str
    offered: str | None  # name / trainID of the offered entity; a taxi's booking reference
    inform: bool | None
    book: bool | None
    request: bool | None
    reasons: tuple[str, ...] = ()

    @property
    def success(self) -> bool:
        return all(flag is not False for flag in (self.inform, self.book, self.request))

    def as_dict(self) -> dict[str, Any]:
        return {
            "domain": self.domain,
            "offered": self.offered,
            "inform": self.inform,
            "book": self.book,
            "request": self.request,
            "success": self.success,
            "reasons": list(self.reasons),
        }


@dataclass(frozen=True)
class GoalResult:
    dialogue_id: str
    domains: tuple[DomainResult, ...]

    @property
    def success(self) -> bool:
        return all(d.success for d in self.domains)

    @property
    def inform(self) -> bool:
        """MultiWOZ's Inform: every domain's offered entity fits the goal."""
        return all(d.inform is not False for d in self.domains)

    @property
    def reasons(self) -> tuple[str, ...]:
        return tuple(f"{d.domain}: {reason}" for d in self.domains for reason in d.reasons)

    def domain(self, name: str) -> DomainResult | None:
        return next((d for d in self.domains if d.domain == name), None)

    def as_dict(self) -> dict[str, Any]:
        return {
            "dialogue_id": self.dialogue_id,
            "success": self.success,
            "inform": self.inform,
            "domains": [d.as_dict() for d in self.domains],
        }


def inform_rate(results: Iterable[GoalResult]) -> float:
    """Share of dialogues whose every offered entity fits the goal (0.0 for none)."""
    results = list(results)
    return sum(r.inform for r in results) / len(results) if results else 0.0


def success_rate(results: Iterable[GoalResult]) -> float:
    """Share of successful dialogues (0.0 for none)."""
    results = list(results)
    return sum(r.success for r in results) / len(results) if results else 0.0


# --------------------------------------------------------------------------------------
# What the system said
# --------------------------------------------------------------------------------------


def _words(text: object) -> str:
    return " ".join(_WORD.findall(norm_value(text)))


@dataclass(frozen=True)
class _Utterance:
    turn: int
    padded: str  # " words " so that " phrase " matches whole words only
    compact: str  # words without spaces
    times: frozenset[int]  # clock times mentioned, in minutes
    numbers: frozenset[float]  # numbers mentioned: "10.1 GBP" states a price of 10.10 pounds


class _Transcript:
    """The system's texts, searchable for whole-word phrases, times and compact values."""

    def __init__(self, system_texts: Iterable[str | tuple[int, str]]):
        utterances = []
        for position, item in enumerate(system_texts):
            turn, text = (position, item) if isinstance(item, str) else item
            # Both forms of possessives: "king 's college" and "curry prince 's phone".
            words = f"{_words(text)}  {_words(possessive_split(text))}"
            times = frozenset(int(h) * 60 + int(m) for h, m in _CLOCK.findall(text) if int(h) <= 24 and int(m) < 60)
            numbers = frozenset(float(n) for n in _NUMBER.findall(str(text)))
            utterances.append(_Utterance(int(turn), f" {words} ", words.replace(" ", ""), times, numbers))
        self._utterances = tuple(utterances)
        self._vocabulary = frozenset(w for u in utterances for w in u.padded.split())

    def last_mention(self, phrase: object, since: int | None = None) -> int | None:
        """The last turn (at or after ``since``) whose text contains ``phrase`` as whole words."""
        words = _words(phrase)
        if not words or not set(words.split()) <= self._vocabulary:
            return None
        needle = f" {words} "
        turns = [u.turn for u in self._utterances if (since is None or u.turn >= since) and needle in u.padded]
        return max(turns) if turns else None

    def mentions(self, phrase: object, since: int | None = None) -> bool:
        return self.last_mention(phrase, since) is not None

    def mentions_time(self, value: object, since: int | None = None) -> bool:
        minutes = parse_time(value)
        return minutes is not None and any(minutes in u.times for u in self._utterances if since is None or u.turn >= since)

    def mentions_number(self, number: float) -> bool:
        return any(number in u.numbers for u in self._utterances)

    def mentions_compact(self, value: object) -> bool:
        return self.last_mention_compact(value) is not None

    def last_mention_compact(self, value: object, since: int | None = None) -> int | None:
        needle = _words(value).replace(" ", "")
        turns = [u.turn for u in self._utterances if (since is None or u.turn >= since) and needle and needle in u.compact]
        return max(turns) if turns else None


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------


def check_goal(
    goal: Goal,
    state: EnvState,
    system_texts: Iterable[str | tuple[int, str]],
    system_acts: Iterable[DialogAct] | None = None,
) -> GoalResult:
    """Grade an episode.

    ``system_texts`` are the system's utterances: plain strings (the i-th has turn i) or
    ``(turn, text)`` pairs in the numbering the tool calls were made with, so that "a
    reference told after the booking" can be checked. ``system_acts`` are the system's
    dialog acts when the source has them.
    """
    transcript = _Transcript(system_texts)
    acts = tuple(system_acts or ())
    results = []
    for domain_goal in goal.domains:
        if domain_goal.domain == "taxi":
            results.append(_check_taxi(domain_goal, state, transcript, acts))
        elif domain_goal.domain in STATIC_DOMAINS:
            results.append(_check_static(domain_goal, state, transcript, acts))
        else:
            results.append(_check_venue(domain_goal, state, transcript, acts))
    return GoalResult(goal.dialogue_id, tuple(results))


def _constraints(values: Mapping[str, str]) -> dict[str, str]:
    return {slot: value for slot, value in values.items() if not is_dont_care(value)}


def _check_venue(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    domain, info = goal.domain, _constraints(goal.info)
    reasons: list[str] = []
    offered = _offered(domain, state, transcript, info)

    inform = None
    if info:
        problems = _info_problems(offered, info) if offered else [f"no {domain} was offered"]
        inform = not problems
        reasons += problems

    book = None
    if _constraints(goal.book):
        problems = _booking_problems(goal, state, transcript)
        book = not problems
        reasons += problems

    request = None
    if goal.reqt:
        if offered is None:
            problems = [f"requested {', '.join(goal.reqt)} but no {domain} was offered"]
        else:
            problems = _request_problems(domain, goal.reqt, lambda slot: _attribute(offered, slot), transcript, acts)
        request = not problems
        reasons += problems

    return DomainResult(domain, offered.name if offered else None, inform, book, request, tuple(reasons))


def _check_taxi(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    info = _constraints(goal.info)
    booked = state.successful_bookings("taxi")
    fitting = [b for b in booked if not _taxi_problems(info, b)]
    if fitting:
        chosen, reasons = fitting[-1], []
    elif booked:
        chosen, reasons = booked[-1], _taxi_problems(info, booked[-1])
    else:
        chosen, reasons = None, ["no taxi was booked"]

    request = None
    if goal.reqt:
        if chosen is None:
            problems = [f"requested {', '.join(goal.reqt)} but no taxi was booked"]
        else:
            problems = _request_problems("taxi", goal.reqt, chosen.details.get, transcript, acts)
        request = not problems
        reasons += problems
    return DomainResult("taxi", chosen.reference if chosen else None, None, bool(fitting), request, tuple(reasons))


def _check_static(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    domain, info = goal.domain, _constraints(goal.info)
    entities = state.database.search(domain, info) if info else list(state.database.entities(domain))
    entity = entities[0] if entities else None
    reasons: list[str] = []

    inform = None
    if info:
        if entity is None:
            reasons.append(f"no {domain} has {', '.join(f'{k} {v}' for k, v in info.items())}")
        elif not transcript.mentions(name_key(entity.name)):
            reasons.append(f"{entity.name} was never named")
        inform = not reasons

    request = None
    if goal.reqt:
        problems = _request_problems(domain, goal.reqt, lambda slot: _attribute(entity, slot) if entity else None, transcript, acts)
        request = not problems
        reasons += problems
    return DomainResult(domain, entity.name if entity else None, inform, None, request, tuple(reasons))


# -- offered entity ----------------------------------------------------------------------


def _offered(domain: str, state: EnvState, transcript: _Transcript, info: Mapping[str, str]) -> Entity | None:
    booked = state.successful_bookings(domain)
    if booked:
        return booked[-1].entity
    for query in reversed(state.queries):
        if query.domain == domain:
            named = _latest_named(query.results, transcript, query.turn, info)
            if named is None and "name" in query.constraints and query.count == 1:
                # The user named the venue and the system looked it up: what it says next
                # is about that venue, named again or not.
                return query.results[0]
            if named is None and domain == "train":
                named = _train_by_time(query.results, transcript, query.turn)
            if named is None and query.count > len(query.results):
                # Real systems see every match, not the first five: "would you like the
                # Williams Art and Antiques museum?" after a query of eleven museums.
                named = _latest_named(state.database.search(domain, query.constraints), transcript, query.turn, info)
            if named is not None:
                # A name inside a longer name the system said ("wheel restaurant" inside
                # "cedar wheel restaurant") is not an offer of its own.
                broader = _latest_named(state.database.entities(domain), transcript, query.turn, info)
                if broader is not None and broader is not named and name_key(named.name) in name_key(broader.name):
                    return broader
                return named
    return _latest_named(state.database.entities(domain), transcript, None, info)


def _latest_named(entities: Iterable[Entity], transcript: _Transcript, since: int | None, info: Mapping[str, str]) -> Entity | None:
    """The entity the system named last. In a tie the longer name wins ("pizza express fen
    ditton" over "pizza express", which it contains); then, for ids the timetable reuses,
    the one fitting the goal; then database order."""
    best, best_key = None, None
    for position, entity in enumerate(entities):
        turn = _last_reference(entity, transcript, since)
        if turn is None:
            continue
        # Then the venue whose name was said last: details may be shared (two branches of a
        # chain share a phone number, "newmarket road fen ditton" is inside "451 newmarket
        # road fen ditton").
        said = transcript.last_mention(name_key(entity.name), since)
        key = (turn, -1 if said is None else said, len(name_key(entity.name)), not _info_problems(entity, info), -position)
        if best_key is None or key > best_key:
            best, best_key = entity, key
    return best


def _train_by_time(trains: Sequence[Entity], transcript: _Transcript, since: int) -> Entity | None:
    """The shown train whose departure (else arrival) time the system said ("I have a train
    leaving at 21:01"): within one query's results such a time picks one train."""
    for slot in ("leaveAt", "arriveBy"):
        for train in trains:
            if transcript.mentions_time(train.get(slot), since):
                return train
    return None


def _last_reference(entity: Entity, transcript: _Transcript, since: int | None) -> int | None:
    """The last turn that names ``entity`` ("lensfield hotel" names "the lensfield hotel"),
    or gives its phone number, postcode or street address: real systems answer "what is the phone
    number of X?" with the number alone, and that identifies X as well as its name does."""
    turns = [transcript.last_mention(name_key(entity.name), since)]
    phone, address, postcode = entity.get("phone"), entity.get("address"), entity.get("postcode")
    if phone and norm_value(phone) not in _UNKNOWN_VALUES and len(_words(phone).replace(" ", "")) >= 10:
        turns.append(transcript.last_mention_compact(phone, since))
    if postcode and len(_words(postcode).replace(" ", "")) >= 5:
        # Which of two venues offered together "it" is: the one whose postcode came next.
        turns.append(transcript.last_mention_compact(postcode, since))
    if address and len(_words(address).split()) >= 3:
        turns.append(transcript.last_mention(address, since))
    known = [t for t in turns if t is not None]
    return max(known) if known else None


# -- inform / book -----------------------------------------------------------------------


def _attribute(entity: Entity, slot: str) -> str | None:
    return entity.name if slot == "name" else entity.get(slot)


def _info_problems(entity: Entity, info: Mapping[str, str]) -> list[str]:
    problems = []
    for slot, wanted in info.items():
        actual = _attribute(entity, slot)
        if slot == "name":
            fits = actual is not None and same_name(actual, wanted)
        else:
            fits = values_match(slot, wanted, actual)
        if not fits:
            problems.append(f"{entity.name} has {slot} {actual or 'unknown'}, the goal wants {wanted}")
    return problems


def _booking_problems(goal: DomainGoal, state: EnvState, transcript: _Transcript) -> list[str]:
    """No problems when some successful booking is right; else those of the last one."""
    attempts = [b for b in state.bookings if b.domain == goal.domain]
    booked = [b for b in attempts if b.success]
    if not booked:
        refused = f" ({len(attempts)} attempt(s) refused)" if attempts else ""
        return [f"no successful {goal.domain} booking{refused}"]
    last_problems: list[str] = []
    for booking in reversed(booked):
        problems = _wrong_booking(goal, booking, transcript)
        if not problems:
            return []
        last_problems = last_problems or problems
    return last_problems


def _wrong_booking(goal: DomainGoal, booking: BookingRecord, transcript: _Transcript) -> list[str]:
    problems = [f"booked {p}" for p in _info_problems(booking.entity, _constraints(goal.info))] if booking.entity else []
    for slot, wanted in _constraints(goal.book).items():
        actual = booking.arguments.get(slot)
        if actual is None or not same_value(slot, actual, wanted):
            problems.append(f"booked {booking.name} with {slot} {actual or 'unset'}, the goal wants {wanted}")
    if not transcript.mentions(booking.reference, since=booking.turn):
        problems.append(f"reference {booking.reference} of {booking.name} was never given to the user")
    return problems


def _taxi_problems(info: Mapping[str, str], booking: BookingRecord) -> list[str]:
    problems = []
    for slot, wanted in info.items():
        actual = booking.arguments.get(slot)
        if slot in TIME_SLOTS:
            fits = actual is not None and (same_value(slot, actual, wanted) or _twelve_hours_apart(actual, wanted))
        else:
            fits = actual is not None and same_name(actual, wanted, shortened=True)
        if not fits:
            problems.append(f"taxi booked with {slot} {actual or 'unset'}, the goal wants {wanted}")
    return problems


def _twelve_hours_apart(actual: object, wanted: object) -> bool:
    """MultiWOZ goals sometimes give a 12-hour time ("03:30" for half past three in the
    afternoon) that the dialogue states as 15:30."""
    a, w = parse_time(actual), parse_time(wanted)
    return a is not None and w is not None and w < 13 * 60 and a - w == 12 * 60


# -- request -----------------------------------------------------------------------------


def _request_problems(
    domain: str,
    reqt: Sequence[str],
    value_of: Callable[[str], str | None],
    transcript: _Transcript,
    acts: Sequence[DialogAct],
) -> list[str]:
    problems = []
    for slot in reqt:
        value = value_of(slot)
        if not (_act_gives(domain, slot, acts) or _text_gives(slot, value, transcript)):
            shown = f" ({value})" if value and norm_value(value) not in _UNKNOWN_VALUES else ""
            problems.append(f"requested {slot}{shown} was never given")
    return problems


def _act_gives(domain: str, slot: str, acts: Sequence[DialogAct]) -> bool:
    code = norm_value(ACT_SLOT.get(slot, slot))
    for act in acts:
        right_domain = act.domain == domain or (act.domain == "booking" and domain in _BOOKING_ACT_DOMAINS)
        if right_domain and act.intent in _INFORMING_INTENTS and norm_value(act.slot) == code:
            return True
    return False


def _text_gives(slot: str, value: str | None, transcript: _Transcript) -> bool:
    if value is None or norm_value(value) in _UNKNOWN_VALUES or norm_value(value) in ("yes", "no"):
        return any(transcript.mentions(word) for word in _SLOT_WORDS.get(slot, (slot,)))
    if slot in TIME_SLOTS and parse_time(value) is not None:
        return transcript.mentions_time(value)
    if slot in _COMPACT_SLOTS:
        return transcript.mentions_compact(value)
    synonyms = [phrase for phrase, meant in VALUE_SYNONYMS.get(slot, {}).items() if meant == norm_value(value)]
    if slot == "address":
        synonyms.append(street_of(value))  # "on saint mary's lane" gives "12 saint mary's lane"
    # A category is often said in the plural: "both are guesthouses", "two museums".
    if any(transcript.mentions(phrase) for phrase in (value, *synonyms)) or (slot == "type" and transcript.mentions(f"{value}s")):
        return True
    number = _NUMBER.search(value) if slot in _NUMERIC_SLOTS else None
    return number is not None and transcript.mentions_number(float(number.group()))
