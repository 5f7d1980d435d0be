"""Did an episode meet its user goal? MultiWOZ inform/success, graded on tool-call state.

Per goal domain (SpeakRL appendix B: success = every constraint of the goal is met):

* **offered** entity: the entity of the last successful booking in the domain; else the
  latest-mentioned entity of the latest query whose results (shown, or beyond the five
  shown: a human system sees every match) the system named afterwards (a train by its id
  before a shown train by a time said in passing; after a lookup by name, another venue
  fitting the goal that the system names instead); else a database entity of the domain
  that the system named.
* **inform**: the offered entity satisfies the goal's final ``info`` (``values_match``:
  ``leaveAt`` at/after, ``arriveBy`` at/before; a ``name`` must be that venue).
* **book**: a successful booking whose entity satisfies ``info``, whose arguments match
  every ``book`` value, and whose reference the system told the user afterwards (SpeakRL
  appendix A: the task is complete when the agent returns the correct booking ids).
  Taxi goals have no ``book`` dict: a successful ``book_taxi`` matching the taxi ``info``.
* **request**: every ``reqt`` attribute of the offered entity (of the taxi booking for
  taxis) was given: a system text states it (:func:`pipelines.multiwoz.text.states`, the
  user simulator's test too), or a system dialog act informs that slot. An attribute the
  database does not know ("?") counts as given when the system talks about it by name
  ("entrance fee"); so do yes/no attributes (internet, parking), which agents state in
  words, never as "yes", or with a plain yes or no right after the user asked about them.
* **taxi**: a successful ``book_taxi`` whose places are the goal's and whose times meet
  it (``leaveAt`` at or after, ``arriveBy`` at or before, as for trains); a goal time
  that refers to another domain's booking ("arrives the restaurant by the booked time",
  ``DomainGoal.references``) is that booking's.

Every false flag comes with :class:`Reason` records (kind, domain, slot, expected, got),
which triage reads, and their English texts (``DomainResult.reasons``).

Police and hospital have no tools: their static entity (the police station; the hospital
department of ``info``) is the offered one, inform means the system named it.

A flag is ``None`` when it does not apply (no ``info``, no ``book``, no ``reqt``), and a
domain succeeds when no applicable flag is false. Every false flag comes with a reason.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipelines.env.standard import StandardResult, check_standard
from pipelines.env.tools import BookingRecord, EnvState, name_key, same_name
from pipelines.multiwoz.ontology import ACT_SLOT, TIME_SLOTS, canonical_value, is_dont_care, norm_value, parse_time, same_value, twelve_hours_apart, values_match
from pipelines.multiwoz.text import UNKNOWN_VALUES, TextView, answers, states, words
from pipelines.records import DialogAct, DomainGoal, Entity, Goal

# Domains graded on their static database entity rather than on tool calls.
STATIC_DOMAINS: tuple[str, ...] = ("police", "hospital")
# Booking acts carry no domain; in MultiWOZ they are about restaurants and hotels.
_BOOKING_ACT_DOMAINS = frozenset({"restaurant", "hotel"})
# Dialog-act intents that give the user a value (Request / NoOffer / NoBook do not).
_INFORMING_INTENTS = frozenset({"inform", "recommend", "select", "offerbook", "offerbooked", "book"})



# --------------------------------------------------------------------------------------
# Results
# --------------------------------------------------------------------------------------


# What a Reason can be about (``Reason.kind``).
REASON_KINDS: tuple[str, ...] = (
    "not_offered",  # no entity of the domain was offered
    "info_mismatch",  # the offered entity has another value for ``slot``
    "no_booking",  # no successful booking (``got``: how many attempts were refused)
    "booked_info_mismatch",  # the booked entity has another value for ``slot``
    "booking_value",  # booked with another ``slot`` value (people, day, time, stay)
    "reference_not_given",  # the booking's reference was never told
    "request_not_given",  # a requested attribute was never given (``got``: its true value)
    "request_without_offer",  # attributes requested, but nothing offered or booked
    "no_taxi",  # no taxi was booked
    "taxi_value",  # the taxi was booked with another ``slot`` value
    "static_unknown",  # no police station / hospital department fits the goal
    "static_not_named",  # the static entity was never named
)


@dataclass(frozen=True)
class Reason:
    """One way an episode missed its goal: for people (``text``) and for triage tables (the
    rest: ``expected`` is the goal's value, ``got`` what the episode has)."""

    kind: str
    domain: str
    text: str
    slot: str | None = None
    expected: str | None = None
    got: str | None = None
    entity: str | None = None  # the venue, train or taxi reference it is about

    def __post_init__(self) -> None:
        if self.kind not in REASON_KINDS:
            raise ValueError(f"unknown reason kind {self.kind!r}")


@dataclass(frozen=True)
class DomainResult:
    domain: str
    offered: str | None  # name / trainID of the offered entity; a taxi's booking reference
    inform: bool | None
    book: bool | None
    request: bool | None
    reasons: tuple[str, ...] = ()  # the problems' texts
    problems: tuple[Reason, ...] = ()

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
    """The ``strict`` grade (this module's; ``success``, ``inform``) and, for MultiWOZ
    episodes, the ``standard`` one (:mod:`pipelines.env.standard`: the field's evaluator's
    definitions) of the same episode."""

    dialogue_id: str
    domains: tuple[DomainResult, ...]
    standard: StandardResult | None = None

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

    @property
    def problems(self) -> tuple[Reason, ...]:
        return tuple(problem for d in self.domains for problem in d.problems)

    def domain(self, name: str) -> DomainResult | None:
        return next((d for d in self.domains if d.domain == name), None)

    @property
    def standard_success(self) -> bool | None:
        return None if self.standard is None else self.standard.success

    @property
    def standard_inform(self) -> bool | None:
        return None if self.standard is None else self.standard.inform

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


_words = words


@dataclass(frozen=True)
class _Utterance:
    turn: int
    text: TextView


class _Transcript:
    """The system's texts, searchable for whole-word phrases, times and compact values."""

    def __init__(self, system_texts: Iterable[str | tuple[int, str]], user_texts: Iterable[tuple[int, str]] = ()):
        user_texts = [(int(turn), str(text)) for turn, text in user_texts]
        self._user = tuple((TextView.of(text), "?" in text) for _, text in user_texts)  # (view, is a question)
        utterances, raw = [], []
        for position, item in enumerate(system_texts):
            turn, text = (position, item) if isinstance(item, str) else item
            utterances.append(_Utterance(int(turn), TextView.of(str(text))))
            raw.append((int(turn), str(text)))
        self._utterances = tuple(utterances)
        self._vocabulary = frozenset(w for u in utterances for w in u.text.padded.split())
        # Each user question with the system's next utterance: "Do they have free parking ?"
        # - "Yes , they do ." answers without naming the attribute.
        self._exchanges = tuple((question, next((t for n, t in raw if n > turn), "")) for turn, question in user_texts if "?" in question)

    def last_mention(self, phrase: object, since: int | None = None) -> int | None:
        """The last turn (at or after ``since``) whose text contains ``phrase`` as whole words."""
        needle = _words(phrase)
        if not needle or not set(needle.split()) <= self._vocabulary:
            return None
        turns = [u.turn for u in self._utterances if (since is None or u.turn >= since) and u.text.mentions(needle)]
        return max(turns) if turns else None

    def mentions(self, phrase: object, since: int | None = None) -> bool:
        return self.last_mention(phrase, since) is not None

    def mentions_time(self, value: object, since: int | None = None) -> bool:
        minutes = parse_time(value)
        return minutes is not None and any(minutes in u.text.times for u in self._utterances if since is None or u.turn >= since)

    def last_mention_compact(self, value: object, since: int | None = None) -> int | None:
        needle = _words(value).replace(" ", "")
        turns = [u.turn for u in self._utterances if (since is None or u.turn >= since) and needle and needle in u.text.compact]
        return max(turns) if turns else None

    def user_states(self, slot: str, value: str | None, questions: bool = True) -> bool:
        """Some user utterance (not a question, unless ``questions``) states ``value`` for
        ``slot`` ("I'd like to visit a park")."""
        return value is not None and any(states(view, slot, value) for view, question in self._user if questions or not question)

    def states(self, slot: str, value: str | None) -> bool:
        """Some utterance gives attribute ``slot`` of true value ``value`` (:func:`states`),
        or answers the user's yes/no question about it."""
        if any(answers(question, answer, slot, value) for question, answer in self._exchanges):
            return True
        return any(states(u.text, slot, value) for u in self._utterances)


# --------------------------------------------------------------------------------------
# Checks
# --------------------------------------------------------------------------------------


def check_goal(
    goal: Goal,
    state: EnvState,
    system_texts: Iterable[str | tuple[int, str]],
    system_acts: Iterable[DialogAct] | None = None,
    user_texts: Iterable[tuple[int, str]] = (),
) -> GoalResult:
    """Grade an episode.

    ``system_texts`` are the system's utterances: plain strings (the i-th has turn i) or
    ``(turn, text)`` pairs in the numbering the tool calls were made with, so that "a
    reference told after the booking" can be checked. ``system_acts`` are the system's
    dialog acts when the source has them. ``user_texts`` are ``(turn, text)`` pairs of the
    user's side: a yes/no attribute the user asked about ("free parking?") is given by a
    system turn that then opens with a yes or a no; one the database does not know, by a
    system turn that then says it is not known.
    """
    system_texts = list(system_texts)
    transcript = _Transcript(system_texts, user_texts)
    acts = tuple(system_acts or ())
    results = []
    for domain_goal in goal.domains:
        if domain_goal.domain == "taxi":
            results.append(_check_taxi(domain_goal, state, transcript, acts))
        elif domain_goal.domain in STATIC_DOMAINS:
            results.append(_check_static(domain_goal, state, transcript, acts))
        else:
            results.append(_check_venue(domain_goal, state, transcript, acts))
    return GoalResult(goal.dialogue_id, tuple(results), check_standard(goal, state, system_texts))


def _constraints(values: Mapping[str, str]) -> dict[str, str]:
    return {slot: value for slot, value in values.items() if not is_dont_care(value)}


def _check_venue(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    domain, info = goal.domain, _constraints(goal.info)
    reasons: list[Reason] = []
    offered = _offered(domain, state, transcript, info)

    inform = None
    if info:
        problems = _info_problems(domain, offered, info) if offered else [Reason("not_offered", domain, f"no {domain} was offered")]
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
            problems = [Reason("request_without_offer", domain, f"requested {', '.join(goal.reqt)} but no {domain} was offered", ", ".join(goal.reqt))]
        else:
            # A ticket's price is also stated as the booking's total ("70.7 GBP" for 7 tickets).
            totals = [b.details["total price"] for b in state.successful_bookings(domain) if b.entity == offered and "total price" in b.details]
            problems = _request_problems(domain, goal.reqt, lambda slot: _attribute(offered, slot), transcript, acts, offered.name, {"price": totals})
        request = not problems
        reasons += problems

    return _result(domain, offered.name if offered else None, inform, book, request, reasons)


def _result(domain: str, offered: str | None, inform: bool | None, book: bool | None, request: bool | None, problems: Sequence[Reason]) -> DomainResult:
    return DomainResult(domain, offered, inform, book, request, tuple(p.text for p in problems), tuple(problems))


def _check_taxi(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    info = _resolved(goal, state)
    booked = state.successful_bookings("taxi")
    fitting = [b for b in booked if not _taxi_problems(info, b)]
    reasons: list[Reason]
    if fitting:
        # The taxi the user was told about: the last fitting one whose details were given.
        told = [b for b in fitting if not _request_problems("taxi", goal.reqt, b.details.get, transcript, acts, b.reference)]
        chosen, reasons = (told or fitting)[-1], []
    elif booked:
        chosen, reasons = booked[-1], _taxi_problems(info, booked[-1])
    else:
        chosen, reasons = None, [Reason("no_taxi", "taxi", "no taxi was booked")]

    request = None
    if goal.reqt:
        if chosen is None:
            problems = [Reason("request_without_offer", "taxi", f"requested {', '.join(goal.reqt)} but no taxi was booked", ", ".join(goal.reqt))]
        else:
            problems = _request_problems("taxi", goal.reqt, chosen.details.get, transcript, acts, chosen.reference)
        request = not problems
        reasons += problems
    return _result("taxi", chosen.reference if chosen else None, None, bool(fitting), request, reasons)


def _resolved(goal: DomainGoal, state: EnvState) -> dict[str, str]:
    """The goal's constraints with its cross-domain references resolved: "arrive at the
    restaurant by the booked time" is the time of the restaurant booking made, which the
    goal's own value (the generator's guess) need not be."""
    info = _constraints(goal.info)
    for slot, (domain, other) in goal.references.items():
        booked = [b for b in state.successful_bookings(domain) if b.arguments.get(other)]
        if booked:
            info[slot] = booked[-1].arguments[other]
    return info


def _check_static(goal: DomainGoal, state: EnvState, transcript: _Transcript, acts: Sequence[DialogAct]) -> DomainResult:
    domain, info = goal.domain, _constraints(goal.info)
    entities = state.database.search(domain, info) if info else list(state.database.entities(domain))
    entity = entities[0] if entities else None
    reasons: list[Reason] = []

    inform = None
    if info:
        if entity is None:
            wanted = ", ".join(f"{k} {v}" for k, v in info.items())
            reasons.append(Reason("static_unknown", domain, f"no {domain} has {wanted}", expected=wanted))
        elif not transcript.mentions(name_key(entity.name)):
            reasons.append(Reason("static_not_named", domain, f"{entity.name} was never named", entity=entity.name))
        inform = not reasons

    request = None
    if goal.reqt:
        problems = _request_problems(domain, goal.reqt, lambda slot: _attribute(entity, slot) if entity else None, transcript, acts,
                                     entity.name if entity else None)
        request = not problems
        reasons += problems
    return _result(domain, entity.name if entity else None, inform, None, request, reasons)


# -- offered entity ----------------------------------------------------------------------


def _offered(domain: str, state: EnvState, transcript: _Transcript, info: Mapping[str, str]) -> Entity | None:
    booked = state.successful_bookings(domain)
    if booked:
        return booked[-1].entity
    # A train offered before the system searched again for another day or route (the user
    # corrected it: "no, it should leave on sunday") was withdrawn by that search.
    route: dict[str, str] = {}
    for query in reversed(state.queries):
        if query.domain == domain:
            if domain == "train" and not route:
                route = {slot: value for slot, value in query.constraints.items() if slot in _ROUTE_SLOTS and not is_dont_care(value)}
            named = _latest_named(query.results, transcript, query.turn, info)
            if named is None and "name" in query.constraints and query.count == 1:
                # The user named the venue and the system looked it up: what it says next
                # is about that venue, named again or not; unless it names another venue
                # that fits the goal ("curry king 's post code is cb21ug" when asked about
                # curry queen), which is then the one it offered.
                other = _latest_named(state.database.entities(domain), transcript, query.turn, info)
                if other is not None and other != query.results[0] and not _info_problems(domain, other, info):
                    return other
                return query.results[0]
            if named is None and query.count > len(query.results):
                # Real systems see every match, not the first five: "would you like the
                # Williams Art and Antiques museum?" after a query of eleven museums; a train
                # id said ("TR0035 leaves at 07:19") beats a shown train's time said in passing.
                named = _latest_named(state.database.search(domain, query.constraints), transcript, query.turn, info)
            if named is None and domain == "train":
                # By a time said: among every match too, as for ids ("the latest arrival I
                # have is 12:15" of a train beyond the five shown).
                every = state.database.search(domain, query.constraints) if query.count > len(query.results) else query.results
                named = _train_by_time(query.results, transcript, query.turn, info) or _train_by_time(every, transcript, query.turn, info)
            if named is not None and route and not all(values_match(slot, value, named.get(slot)) for slot, value in route.items()):
                continue
            if named is not None:
                # A name inside a longer name the system said ("wheel restaurant" inside
                # "cedar wheel restaurant") is not an offer of its own.
                broader = _latest_named(state.database.entities(domain), transcript, query.turn, info)
                if broader is not None and broader is not named and name_key(named.name) in name_key(broader.name):
                    return broader
                return named
    last = _latest_named(state.database.entities(domain), transcript, None, info)
    if last is not None and route and not all(values_match(slot, value, last.get(slot)) for slot, value in route.items()):
        return None
    return last


_ROUTE_SLOTS = ("day", "departure", "destination")


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
        key = (turn, -1 if said is None else said, len(name_key(entity.name)), not _info_problems(entity.domain, entity, info), -position)
        if best_key is None or key > best_key:
            best, best_key = entity, key
    return best


def _train_by_time(trains: Sequence[Entity], transcript: _Transcript, since: int, info: Mapping[str, str]) -> Entity | None:
    """The shown train whose departure (else arrival) time the system said ("I have a train
    leaving at 21:01"): within one query's results such a time picks one train, or one a
    day, for a query without a day; then, as for names, the one fitting the goal ("the
    latest train arrives at 17:52 on a Wednesday")."""
    for slot in ("leaveAt", "arriveBy"):
        said = [train for train in trains if transcript.mentions_time(train.get(slot), since)]
        if said:
            return next((train for train in said if not _info_problems("train", train, info)), said[0])
    return None


def _last_reference(entity: Entity, transcript: _Transcript, since: int | None) -> int | None:
    """The last turn that names ``entity`` ("lensfield hotel" names "the lensfield hotel"),
    or gives its phone number, postcode or street address: real systems answer "what is the phone
    number of X?" with the number alone, and that identifies X as well as its name does."""
    turns = [transcript.last_mention(name_key(entity.name), since)]
    phone, address, postcode = entity.get("phone"), entity.get("address"), entity.get("postcode")
    if phone and norm_value(phone) not in UNKNOWN_VALUES and len(_words(phone).replace(" ", "")) >= 10:
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


def _info_problems(domain: str, entity: Entity, info: Mapping[str, str], kind: str = "info_mismatch", prefix: str = "") -> list[Reason]:
    problems = []
    for slot, wanted in info.items():
        actual = _attribute(entity, slot)
        if slot == "name":
            fits = actual is not None and same_name(actual, wanted)
        else:
            fits = values_match(slot, wanted, actual)
        if not fits:
            text = f"{prefix}{entity.name} has {slot} {actual or 'unknown'}, the goal wants {wanted}"
            problems.append(Reason(kind, domain, text, slot, wanted, actual, entity.name))
    return problems


def _booking_problems(goal: DomainGoal, state: EnvState, transcript: _Transcript) -> list[Reason]:
    """No problems when some successful booking is right; else those of the last one."""
    attempts = [b for b in state.bookings if b.domain == goal.domain]
    booked = [b for b in attempts if b.success]
    if not booked:
        refused = f" ({len(attempts)} attempt(s) refused)" if attempts else ""
        return [Reason("no_booking", goal.domain, f"no successful {goal.domain} booking{refused}", got=str(len(attempts)))]
    last_problems: list[Reason] = []
    for booking in reversed(booked):
        problems = _wrong_booking(goal, booking, transcript)
        if not problems:
            return []
        last_problems = last_problems or problems
    return last_problems


def _wrong_booking(goal: DomainGoal, booking: BookingRecord, transcript: _Transcript) -> list[Reason]:
    domain = goal.domain
    problems = _info_problems(domain, booking.entity, _constraints(goal.info), "booked_info_mismatch", "booked ") if booking.entity else []
    for slot, wanted in _constraints(goal.book).items():
        actual = booking.arguments.get(slot)
        if actual is None or not same_value(slot, actual, wanted):
            text = f"booked {booking.name} with {slot} {actual or 'unset'}, the goal wants {wanted}"
            problems.append(Reason("booking_value", domain, text, slot, wanted, actual, booking.name))
    if not transcript.mentions(booking.reference, since=booking.turn):
        text = f"reference {booking.reference} of {booking.name} was never given to the user"
        problems.append(Reason("reference_not_given", domain, text, "reference", got=booking.reference, entity=booking.name))
    return problems


def _taxi_problems(info: Mapping[str, str], booking: BookingRecord) -> list[Reason]:
    problems = []
    for slot, wanted in info.items():
        actual = booking.arguments.get(slot)
        if slot in TIME_SLOTS:
            # "Leave after 20:30" / "arrive by 10:00", as for trains; a 12-hour goal time too.
            fits = actual is not None and (values_match(slot, wanted, actual) or twelve_hours_apart(actual, wanted))
        else:
            fits = actual is not None and same_name(actual, wanted, shortened=True)
        if not fits:
            text = f"taxi booked with {slot} {actual or 'unset'}, the goal wants {wanted}"
            problems.append(Reason("taxi_value", "taxi", text, slot, wanted, actual, booking.reference))
    return problems


# -- request -----------------------------------------------------------------------------


def _request_problems(
    domain: str,
    reqt: Sequence[str],
    value_of: Callable[[str], str | None],
    transcript: _Transcript,
    acts: Sequence[DialogAct],
    entity: str | None = None,
    also: Mapping[str, Sequence[str]] | None = None,
) -> list[Reason]:
    """``also``: other values that state a slot as well as its own."""
    problems = []
    for slot in reqt:
        value = value_of(slot)
        stated = transcript.states(slot, value) or any(transcript.states(slot, other) for other in (also or {}).get(slot, ()))
        if not (_act_gives(domain, slot, acts) or stated or _derivable(domain, slot, value, value_of, transcript)):
            known = value if value and norm_value(value) not in UNKNOWN_VALUES else None
            text = f"requested {slot}{f' ({known})' if known else ''} was never given"
            problems.append(Reason("request_not_given", domain, text, slot, got=known, entity=entity))
    return problems


# Attributes a user knows once offered a venue that has the value they asked for ("a park":
# the botanic gardens offered is a park). Only attributes whose values belong to one domain
# (a food, a venue type, hotel stars, internet, parking): an area or price range the user
# said may have been another domain's. Yes/no attributes only when the answer is yes.
_ASKED_FOR_SLOTS = frozenset({"food", "type", "stars", "internet", "parking"})


def _derivable(domain: str, slot: str, value: str | None, value_of: Callable[[str], str | None], transcript: _Transcript) -> bool:
    """Whether a careful reader knows ``slot`` from what was said without it being said:

    * a train's duration from its departure and arrival times, both stated;
    * a venue's area from its street address, stated (the database places that address in
      that area);
    * an attribute of one domain's vocabulary (:data:`_ASKED_FOR_SLOTS`) the user asked for
      in their own words ("a park") that the offered venue has: being offered it tells the
      user the venue has it.
    """
    if value is None or norm_value(value) in UNKNOWN_VALUES:
        return False
    if slot == "duration" and domain == "train":
        leave, arrive = value_of("leaveAt"), value_of("arriveBy")
        return bool(leave and arrive) and transcript.mentions_time(leave) and transcript.mentions_time(arrive)
    if slot == "area" and domain != "train":
        address = value_of("address")
        if address and norm_value(address) not in UNKNOWN_VALUES and transcript.states("address", address):
            return True
    if slot in _ASKED_FOR_SLOTS and domain != "train":
        if slot in ("internet", "parking"):
            # "I need free parking" asks for it; "do they have free parking?" does not.
            return canonical_value(slot, value) == "yes" and transcript.user_states(slot, value, questions=False)
        return transcript.user_states(slot, value)
    return False


def _act_gives(domain: str, slot: str, acts: Sequence[DialogAct]) -> bool:
    code = norm_value(ACT_SLOT.get(slot, slot))
    for act in acts:
        right_domain = act.domain == domain or (act.domain == "booking" and domain in _BOOKING_ACT_DOMAINS)
        if right_domain and act.intent in _INFORMING_INTENTS and norm_value(act.slot) == code:
            return True
    return False

