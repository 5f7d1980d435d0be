"""The agenda-based user simulator: the ``rules`` backend and the offline default.

A session plays one user with a hidden ``Goal`` and pursues its domains one at a time, in
the order the goal message introduces them. Within a domain the agenda is MultiWOZ's:

1. **find** the venue (or train): state the domain and one or two constraints, then more
   piecemeal: when the agent asks, when its offer breaks a constraint not yet stated, or
   when the agent says nothing useful. ``fail_info`` constraints come first when the goal
   has them; a "no match" from the agent switches to the final ``info`` ones;
2. **book** it, when the goal books: people/day/time/stay, ``fail_book`` values first and
   ``book`` after the agent reports the booking failed, until a reference comes back;
3. **request** every ``reqt`` attribute until the agent has given each one.

The user can check everything the agent claims: an offer counts only when the entity the
agent names exists in the database and satisfies the goal's final ``info``, and an
attribute counts only when the agent states that entity's value. A taxi is done once the
agent gives a car and a phone number; police and hospital once the requested details came.

Clarification questions are answered from the goal: its value for the slot asked about
("the north or the centre?" included), or "no preference" when the goal is silent. The
user ends the conversation once every domain is done, or gives up after
``max_stalled_turns`` consecutive agent turns that moved nothing forward.

Sessions are deterministic for a seed (one ``random.Random(seed)`` each, which picks the
phrasing and the noise) and fork by copying their small state; the database and the
reader built from it are shared read-only by all sessions of a simulator.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Mapping

from pipelines.config import positive_int, rate
from pipelines.env.tools import Database, name_key, same_name
from pipelines.errors import ConfigError
from pipelines.multiwoz.ontology import ACT_SLOT, BOOK_SLOTS, INFO_SLOTS, is_dont_care, norm_value, parse_time, values_match
from pipelines.multiwoz.text import answers
from pipelines.records import DialogAct, Dialogue, DomainGoal, Entity, Goal
from pipelines.simulators.base import UserTurn
from pipelines.simulators.goals import pursuit_order, reference_order
from pipelines.simulators.phrasing import (
    GENERAL_BYE,
    GENERAL_THANK,
    SLOT_WORDS,
    VERBOSITIES,
    Verbosity,
    Phraser,
    Utterance,
    describe,
    inform_acts,
    join_words,
    request_acts,
    slot_phrase,
)
from pipelines.simulators.understanding import AgentReader, Reading, read

STATIC_DOMAINS: tuple[str, ...] = ("police", "hospital")
# Either one answers "when do you want to travel?"; the user's goal has one of them.
_TIME_GROUP = frozenset({"leaveAt", "arriveBy"})
# A party size an agent states with its booking: "for 1 person", "6 tickets", "a table for two".
_COUNTS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
_PARTY = re.compile(r"\b(\d{1,2}|" + "|".join(_COUNTS) + r") (?:people|persons?|guests|adults|tickets?|seats?)\b")
_PRICE = re.compile(r"\d+(?:\.\d+)?")
# A price said per unit: "14.08 pounds each", "per ticket", "a ticket costs".
_PER_UNIT = re.compile(r"\b(?:each|per|apiece|a ticket|one ticket)\b")
# Attributes whose value, said by the agent, shows it is talking about a venue.
_DESCRIBING: tuple[str, ...] = ("address", "phone", "postcode", "area", "type", "food", "pricerange", "stars")


@dataclass(frozen=True)
class SimulatorSpec:
    """A params ``simulator`` section (``evaluate``, the gold replays, JOSH, PIR's evaluation,
    US-GRPO): ``kind`` (``agenda``, the rules simulator and the default; ``goal_llm`` or
    ``guide_llm``, the ``user_simulator`` LLM role) and the agenda user's settings, which the
    LLM simulators fall back to. ``verbosity``: how much the user says around the content
    (greetings, thanks). ``noise``: probability per turn of a surface perturbation (dropped
    niceties, casual spelling, one misspelt word that is not a value). ``max_stalled_turns``:
    consecutive agent turns without progress after which the user gives up. The LLM kinds'
    failure protection (:mod:`pipelines.simulators.protection`, PIR appendix A.2):
    ``max_retries`` attempts after the first before the fallback turn, ``turn_timeout_s`` the
    bound on one attempt (None: only the LLM client's own request timeouts apply).

    >>> SimulatorSpec(kind="goal_llm", noise=0.1, turn_timeout_s=30)
    SimulatorSpec(verbosity='normal', noise=0.1, max_stalled_turns=4, kind='goal_llm', max_retries=2, turn_timeout_s=30)
    >>> SimulatorSpec(max_retries=-1)
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigValueError: max_retries: expected an integer >= 0, got -1
    """

    verbosity: Verbosity = "normal"
    noise: float = 0.0
    max_stalled_turns: int = 4
    # Left out of model cards and reports at their defaults (training.config.config_dict): they
    # came after the cards written with the first three.
    kind: str = field(default="agenda", metadata={"omit_if_default": True})
    max_retries: int = field(default=2, metadata={"omit_if_default": True})
    turn_timeout_s: float | None = field(default=None, metadata={"omit_if_none": True})

    def __post_init__(self) -> None:
        if self.verbosity not in VERBOSITIES:
            raise ConfigError(f"verbosity: expected one of {list(VERBOSITIES)}, got {self.verbosity!r}")
        rate(self.noise, "noise")
        positive_int(self.max_stalled_turns, "max_stalled_turns")
        positive_int(self.max_retries, "max_retries", minimum=0)
        timeout = self.turn_timeout_s
        if timeout is not None and (isinstance(timeout, bool) or not isinstance(timeout, (int, float)) or timeout <= 0):
            raise ConfigError(f"turn_timeout_s: expected a positive number or null, got {timeout!r}")


def _constraints(values: Mapping[str, str]) -> dict[str, str]:
    return {slot: value for slot, value in values.items() if not is_dont_care(value)}


def _fits(entity: Entity, slot: str, wanted: str) -> bool:
    if slot == "name":
        return same_name(entity.name, wanted)
    return values_match(slot, wanted, entity.get(slot))


def _violations(entity: Entity, constraints: Mapping[str, str]) -> dict[str, str]:
    return {slot: wanted for slot, wanted in constraints.items() if not _fits(entity, slot, wanted)}


# --------------------------------------------------------------------------------------
# State
# --------------------------------------------------------------------------------------


@dataclass
class _DomainState:
    """Where the user stands with one domain of its goal."""

    goal: DomainGoal
    fail_info_active: bool
    fail_book_active: bool
    opened: bool = False  # the user has brought the domain up
    stated: dict[str, str] = field(default_factory=dict)  # values told to the agent
    indifferent: set[str] = field(default_factory=set)  # slots the user said it does not mind about
    entity: Entity | None = None  # the accepted offer; a static domain's entity once opened
    booking_requested: bool = False
    reference: str | None = None
    taxi: dict[str, str] = field(default_factory=dict)  # car type / phone of a booked taxi
    received: set[str] = field(default_factory=set)  # reqt attributes the agent has given
    heard_back: bool = False  # an agent turn came after the domain was opened

    @classmethod
    def start(cls, goal: DomainGoal) -> _DomainState:
        return cls(goal, fail_info_active=bool(_constraints(goal.fail_info)), fail_book_active=bool(_constraints(goal.fail_book)))

    @property
    def domain(self) -> str:
        return self.goal.domain

    @property
    def is_static(self) -> bool:
        return self.domain in STATIC_DOMAINS

    def constraints(self) -> dict[str, str]:
        """The search constraints the user holds now: ``fail_info`` until given up."""
        return _constraints(self.goal.fail_info if self.fail_info_active else self.goal.info)

    def final_constraints(self) -> dict[str, str]:
        return _constraints(self.goal.info)

    def booking(self) -> dict[str, str]:
        """The booking values the user asks for now: ``fail_book`` over ``book`` until given up."""
        values = _constraints(self.goal.book)
        if self.fail_book_active:
            values.update(_constraints(self.goal.fail_book))
        return values

    def unstated(self) -> dict[str, str]:
        return {slot: value for slot, value in self.constraints().items() if self.stated.get(slot) != value}

    def value_for(self, slot: str) -> str | None:
        """What the goal says about ``slot``: the constraint in force, the final one, the
        booking value; None when the goal is silent."""
        for values in (self.constraints(), self.final_constraints(), self.booking()):
            if slot in values:
                return values[slot]
        return None

    @property
    def needs_booking(self) -> bool:
        return self.goal.wants_booking or self.domain == "taxi"

    @property
    def booked(self) -> bool:
        return self.reference is not None or bool(self.taxi)

    def attribute(self, slot: str) -> str | None:
        if self.domain == "taxi":
            return self.taxi.get(slot)
        if self.entity is None:
            return None
        return self.entity.name if slot == "name" else self.entity.get(slot)

    def pending_requests(self) -> list[str]:
        return [slot for slot in self.goal.reqt if slot not in self.received]

    @property
    def done(self) -> bool:
        if not self.opened:
            return False
        if self.domain == "taxi":
            return self.booked and not self.pending_requests()
        if self.is_static:
            return not self.pending_requests() and (bool(self.goal.reqt) or self.heard_back)
        if self.entity is None or (self.needs_booking and not self.booked):
            return False
        return not self.pending_requests()

    def signature(self) -> tuple:
        """Everything that counts as progress when it changes. (Not ``heard_back``: that any
        agent turn came is no progress; when it completes a domain, the next one opens.)"""
        return (
            self.opened, self.fail_info_active, self.fail_book_active, tuple(sorted(self.stated.items())),
            tuple(sorted(self.indifferent)), self.entity.entity_id if self.entity else None, self.booking_requested,
            self.reference, tuple(sorted(self.taxi.items())), tuple(sorted(self.received)),
        )

    def copy(self) -> _DomainState:
        # Goals and entities are frozen records, shared; only the containers are copied.
        return _DomainState(
            self.goal, self.fail_info_active, self.fail_book_active, self.opened, dict(self.stated), set(self.indifferent),
            self.entity, self.booking_requested, self.reference, dict(self.taxi), set(self.received), self.heard_back,
        )


@dataclass
class _SessionState:
    domains: list[_DomainState]
    rng: random.Random
    stalled: int = 0  # consecutive agent turns without progress
    ended: bool = False
    said: str = ""  # the user's last utterance: "Yes , they do ." answers what it asked


    def focus(self) -> _DomainState | None:
        """The domain being pursued: the first one not done."""
        return next((d for d in self.domains if not d.done), None)

    def signature(self) -> tuple:
        return tuple(d.signature() for d in self.domains)

    def copy(self) -> _SessionState:
        rng = random.Random()
        rng.setstate(self.rng.getstate())
        return _SessionState([d.copy() for d in self.domains], rng, self.stalled, self.ended, self.said)


# --------------------------------------------------------------------------------------
# Simulator and session
# --------------------------------------------------------------------------------------


class AgendaSimulator:
    """Rule-based users over ``database`` (shared read-only with the tool environment)."""

    name = "agenda"

    def __init__(self, database: Database, config: SimulatorSpec = SimulatorSpec()):
        self.database = database
        self.config = config
        self.reader = AgentReader(database)

    def session(self, goal: Goal, seed: int, reference: Dialogue | None = None) -> AgendaSession:
        """A new user for ``goal``. With a ``reference`` dialogue the user takes the domains
        up in the order its user did (a gold replay's system answers in that order);
        otherwise in the order the goal message gives."""
        if isinstance(seed, bool) or not isinstance(seed, int):
            raise TypeError(f"seed must be an int, got {seed!r}")
        order = reference_order(goal, reference) if reference is not None else pursuit_order(goal)
        state = _SessionState([_DomainState.start(d) for d in order], random.Random(seed))
        return AgendaSession(self, goal, state)


class AgendaSession:
    """One agenda-driven user; see the module docstring for what it does."""

    def __init__(self, simulator: AgendaSimulator, goal: Goal, state: _SessionState):
        self._simulator = simulator
        self.goal = goal
        self._state = state

    # -- the SimulatorSession interface ---------------------------------------------------

    async def opening(self) -> UserTurn:
        return self.opening_turn()

    async def respond(self, agent_text: str) -> UserTurn:
        return self.reply(agent_text)

    def fork(self) -> AgendaSession:
        return AgendaSession(self._simulator, self.goal, self._state.copy())

    # -- synchronous core (the agenda never waits for anything) ---------------------------

    @property
    def done(self) -> bool:
        """Every domain of the goal is done."""
        return self._state.focus() is None

    def pending_domains(self) -> tuple[str, ...]:
        return tuple(d.domain for d in self._state.domains if not d.done)

    def opening_turn(self) -> UserTurn:
        utterance = Utterance()
        phraser = self._phraser()
        phraser.greeting(utterance)
        focus = self._state.focus()
        if focus is None:  # a goal without domains: nothing to ask for
            return self._end(utterance, phraser, "done")
        self._open(focus, utterance, phraser, also=False)
        return self._said(UserTurn(phraser.finish(utterance), acts=tuple(utterance.acts)))

    def reply(self, agent_text: str) -> UserTurn:
        state = self._state
        phraser = self._phraser()
        utterance = Utterance()
        if state.ended:
            utterance.say("Goodbye.", [GENERAL_BYE])
            return UserTurn(phraser.finish(utterance), end=True, acts=tuple(utterance.acts))
        before = state.signature()
        reading = read(agent_text)
        focus = state.focus()
        if focus is not None and focus.opened:
            self._hear(focus, reading, utterance, phraser)
        self._move_on(utterance, phraser)
        if state.focus() is None:
            return self._end(utterance, phraser, "done")
        state.stalled = 0 if state.signature() != before else state.stalled + 1
        if state.stalled >= self._simulator.config.max_stalled_turns:
            return self._end(Utterance(), phraser, "give_up")
        return self._said(UserTurn(phraser.finish(utterance), acts=tuple(utterance.acts)))

    def _said(self, turn: UserTurn) -> UserTurn:
        self._state.said = turn.text
        return turn

    # -- one agent turn ---------------------------------------------------------------------

    def _hear(self, d: _DomainState, reading: Reading, utterance: Utterance, phraser: Phraser) -> None:
        """Take in what the agent said about the focus domain, and answer it."""
        d.heard_back = True
        offered, violations = self._consider_offers(d, reading, utterance, phraser)
        news = self._take_booking_news(d, reading)
        self._take_attributes(d, reading)
        if d.done:
            phraser.thanks(utterance)
            return
        if news == "failed":
            self._retry_booking(d, utterance, phraser)
        elif news == "wrong_party":
            self._correct_party(d, utterance, phraser)
        elif reading.no_offer and not offered and d.entity is None and not d.is_static and d.domain != "taxi":
            self._no_match(d, utterance, phraser)
        if violations:
            self._object(d, violations, utterance, phraser)
        deferred_booking = self._answer(d, reading, utterance, phraser, booking_only=offered and not violations)
        if not utterance.has_content or deferred_booking:
            self._step(d, reading, utterance, phraser)

    def _consider_offers(
        self, d: _DomainState, reading: Reading, utterance: Utterance, phraser: Phraser
    ) -> tuple[bool, dict[str, str]]:
        """(whether the agent named an entity, the constraints it breaks). The first named
        entity that satisfies the goal is accepted; else the best one's violations return."""
        if d.entity is not None or d.is_static or d.domain == "taxi":
            return False, {}
        named = self._simulator.reader.named(reading, d.domain) or self._implied(d, reading)
        if not named:
            return False, {}
        fitting = [e for e in named if not _violations(e, d.final_constraints())]
        if fitting:
            d.entity = fitting[0]
            # An offer that meets the final constraints ends the fail_info detour as well.
            d.fail_info_active = False
            slot = "trainID" if d.domain == "train" else "name"
            shown = d.entity.get(slot) or d.entity.name
            utterance.say(phraser.line("accept", name=shown), inform_acts(d.domain, {slot: shown}), remark=True)
            return True, {}
        best = min(named, key=lambda e: len(_violations(e, d.constraints())))
        violations = _violations(best, d.constraints())
        if not violations and d.fail_info_active:
            # The agent found something for the fail_info constraints after all (possible
            # with another database than the goal was made for): the final ones still hold.
            self._give_up_fail_info(d, utterance, phraser)
            violations = _violations(best, d.constraints())
        return True, violations

    def _implied(self, d: _DomainState, reading: Reading) -> list[Entity]:
        """Entities the agent talks about without naming them, as real systems do: the venue
        the user asked for by name, once the agent gives one of its attributes; a train of
        the user's route and day whose departure (else arrival) time the agent says."""
        database, reader = self._simulator.database, self._simulator.reader
        if d.domain == "train":
            constraints = {s: v for s, v in d.final_constraints().items() if s in ("day", "departure", "destination")}
            if len(constraints) < 3 or not reading.times:
                return []
            trains = database.search("train", constraints)
            return [t for slot in ("leaveAt", "arriveBy") for t in trains if parse_time(t.get(slot)) in reading.times][:1]
        name = d.stated.get("name")
        if not name or reading.no_offer:
            return []
        return [e for e in database.named(d.domain, name) if any(reader.gives(reading, slot, e.get(slot)) for slot in _DESCRIBING)][:1]

    def _take_booking_news(self, d: _DomainState, reading: Reading) -> str | None:
        """Record a booking reference or taxi confirmation. "failed" when the agent reports
        that the booking the user asked for failed; "wrong_party" when it confirms one for
        another number of people than the user's ("for 1 person" for a party of six), which
        the user does not take."""
        if not d.needs_booking or d.booked:
            return None
        if d.domain == "taxi":
            d.taxi.update(self._simulator.reader.taxi_details(reading))
        # A reference counts after the user asked for a booking, or when the agent calls it one;
        # and only once a venue or train was accepted: before that it is another domain's
        # booking (the restaurant confirmed after the user moved on to the hotel).
        offered = d.entity is not None or d.domain == "taxi"
        if reading.references and offered and (d.booking_requested or reading.says_reference):
            people = d.booking().get("people", "")
            said = {int(n) if n.isdigit() else _COUNTS.index(n) for n in _PARTY.findall(reading.padded)}
            if people.isdigit() and said and int(people) not in said:
                return "wrong_party"
            if people.isdigit() and int(people) > 1 and not said and self._one_ticket_cost(d, reading):
                return "wrong_party"
            d.reference = reading.references[0]
        return "failed" if not d.booked and d.booking_requested and reading.no_book else None

    @staticmethod
    def _one_ticket_cost(d: _DomainState, reading: Reading) -> bool:
        """A train booking whose stated cost is one ticket's price, not said to be per ticket
        ("the cost for the ticket is 14.08 GBP" for a party of five): booked for one person."""
        if d.domain != "train" or d.entity is None:
            return False
        price = _PRICE.search(d.entity.get("price") or "")
        return (price is not None and float(price.group(0)) in reading.view.numbers
                and not _PER_UNIT.search(reading.padded))

    def _take_attributes(self, d: _DomainState, reading: Reading) -> None:
        if d.entity is None and not d.is_static and not d.booked:
            return
        reader = self._simulator.reader
        for slot in d.pending_requests():
            if d.domain == "taxi":
                given = slot in d.taxi
            elif slot == "name":
                given = d.entity is not None and reading.mentions(name_key(d.entity.name))
            else:
                given = reader.gives(reading, slot, d.attribute(slot))
                # The checker's rule too: a yes or a no right after "Do they have free parking?".
                given = given or answers(self._state.said, reading.text, slot, d.attribute(slot))
            if given:
                d.received.add(slot)

    # -- failures -----------------------------------------------------------------------------

    def _retry_booking(self, d: _DomainState, utterance: Utterance, phraser: Phraser) -> None:
        """The booking failed: switch from ``fail_book`` to ``book``, or ask again."""
        d.fail_book_active = False
        changed = {slot: value for slot, value in d.booking().items() if d.stated.get(slot) != value}
        if changed:
            d.stated.update(changed)
            what = " ".join(slot_phrase(d.domain, s, v) for s, v in changed.items())
            utterance.say(phraser.line("switch", what=what), inform_acts(d.domain, changed))
        else:
            values = d.booking()
            what = " ".join(slot_phrase(d.domain, s, v) for s, v in values.items())
            utterance.say(phraser.line("retry_booking", what=what), inform_acts(d.domain, values))
        d.booking_requested = True

    def _correct_party(self, d: _DomainState, utterance: Utterance, phraser: Phraser) -> None:
        """The agent booked for another party size: ask for the booking the user wants."""
        values = d.booking()
        d.booking_requested = True
        d.stated.update(values)
        what = " ".join(slot_phrase(d.domain, s, v) for s, v in values.items())
        utterance.say(phraser.line("correct_booking", what=what), inform_acts(d.domain, values))

    def _no_match(self, d: _DomainState, utterance: Utterance, phraser: Phraser) -> None:
        if d.fail_info_active:
            self._give_up_fail_info(d, utterance, phraser)
            return
        # The final constraints are satisfiable by construction: say everything and insist.
        constraints = d.constraints()
        d.stated.update(constraints)
        utterance.say(phraser.line("insist", what=describe(d.domain, constraints)), inform_acts(d.domain, constraints))

    def _give_up_fail_info(self, d: _DomainState, utterance: Utterance, phraser: Phraser) -> None:
        """Switch from ``fail_info`` to ``info``: say the stated values that change and the
        ones that no longer matter; unstated ones come later, piecemeal."""
        d.fail_info_active = False
        final = d.constraints()
        changed = {slot: final[slot] for slot, value in d.stated.items() if slot in final and final[slot] != value}
        released = [slot for slot in d.stated if slot not in final and slot in INFO_SLOTS.get(d.domain, ())]
        for slot in released:
            del d.stated[slot]
            d.indifferent.add(slot)
        d.stated.update(changed)
        if changed:
            what = join_words([slot_phrase(d.domain, s, v) for s, v in changed.items()])
            utterance.say(phraser.line("switch", what=what), inform_acts(d.domain, changed))
        if released:
            words = join_words([SLOT_WORDS.get(s, s) for s in released])
            utterance.say(phraser.line("release", slots=words), inform_acts(d.domain, {s: "dontcare" for s in released}))

    def _object(self, d: _DomainState, violations: Mapping[str, str], utterance: Utterance, phraser: Phraser) -> None:
        """The offer breaks constraints: reveal the unstated ones, repeat the stated ones."""
        if "name" in violations:
            name = violations["name"]
            d.stated["name"] = name
            utterance.say(phraser.line("want_name", name=name), inform_acts(d.domain, {"name": name}))
            return
        new = {s: v for s, v in violations.items() if d.stated.get(s) != v}
        repeated = {s: v for s, v in violations.items() if s not in new}
        for key, values in (("reveal", new), ("correct", repeated)):
            if values:
                what = join_words([slot_phrase(d.domain, s, v) for s, v in values.items()])
                utterance.say(phraser.line(key, what=what), inform_acts(d.domain, values))
        d.stated.update(new)

    # -- questions ------------------------------------------------------------------------------

    def _answer(self, d: _DomainState, reading: Reading, utterance: Utterance, phraser: Phraser, booking_only: bool) -> bool:
        """Answer the agent's questions about slots of the focus domain. Returns True when
        the agent asked for booking details of an accepted venue: the booking request, with
        all its values, is the answer then. ``booking_only``: the user has just accepted an
        offer, so questions that would narrow the search down are moot."""
        asked = self._simulator.reader.asked(reading, d.domain)
        said = {act.slot for act in utterance.acts}
        booking_slots = BOOK_SLOTS.get(d.domain, ())
        deferred = False
        informed: dict[str, str] = {}
        rejected: dict[str, str] = {}
        indifferent: list[str] = []
        choice = False
        for slot, candidates in asked.items():
            if ACT_SLOT.get(slot, slot.capitalize()) in said or (booking_only and slot not in booking_slots):
                continue
            if slot in booking_slots and d.entity is not None and d.needs_booking and not d.booked:
                deferred = True
                continue
            value = d.value_for(slot)
            if value is None:
                partner_known = slot in _TIME_GROUP and any(d.value_for(s) for s in _TIME_GROUP & asked.keys())
                if not partner_known:
                    indifferent.append(slot)
                    choice = choice or bool(candidates)
            elif candidates and not any(values_match(slot, value, c) or norm_value(c) == norm_value(value) for c in candidates):
                rejected[slot] = value
            else:
                informed[slot] = value
        if informed:
            what = join_words([slot_phrase(d.domain, s, v) for s, v in informed.items()])
            utterance.say(phraser.line("inform", what=what), inform_acts(d.domain, informed))
        if rejected:
            what = join_words([slot_phrase(d.domain, s, v) for s, v in rejected.items()])
            utterance.say(phraser.line("neither", what=what), inform_acts(d.domain, rejected))
        if indifferent:
            acts = inform_acts(d.domain, {s: "dontcare" for s in indifferent})
            if indifferent == ["name"]:
                utterance.say(phraser.line("no_particular"), acts)
            elif choice and len(indifferent) == 1:
                utterance.say(phraser.line("either"), acts)
            else:
                utterance.say(phraser.line("no_preference", slots=join_words([SLOT_WORDS.get(s, s) for s in indifferent])), acts)
        d.stated.update(informed)
        d.stated.update(rejected)
        d.indifferent.update(indifferent)
        return deferred

    # -- the agenda -------------------------------------------------------------------------------

    def _step(self, d: _DomainState, reading: Reading, utterance: Utterance, phraser: Phraser) -> None:
        """The next thing on the user's agenda for domain ``d``: find, book, request."""
        domain = d.domain
        if reading.asks_booking and d.entity is not None and not d.needs_booking:
            utterance.say(phraser.line("no_booking"))
        if domain == "taxi" and not d.booked:
            # A taxi has nothing to offer: once it knows the route and the time, book it.
            unstated = d.unstated()
            if unstated:
                self._reveal(d, unstated, utterance, phraser)
            else:
                d.booking_requested = True
                utterance.say(phraser.line("book_taxi"), inform_acts(domain, d.constraints()))
        elif d.entity is None and domain != "taxi" and not d.is_static:
            unstated = d.unstated()
            if d.booked:  # the agent booked without saying what
                utterance.say(phraser.line("which_booked", domain=domain), request_acts(domain, ["name"]))
            elif unstated:
                self._reveal(d, unstated, utterance, phraser)
            else:
                utterance.say(phraser.line("recommend_train" if domain == "train" else "recommend"))
        elif d.needs_booking and not d.booked:
            self._request_booking(d, utterance, phraser)
        elif d.pending_requests():
            wanted = d.pending_requests()
            slots = join_words([SLOT_WORDS.get(s, s) for s in wanted])
            utterance.say(phraser.line("request", slots=slots), request_acts(domain, wanted))

    def _reveal(self, d: _DomainState, unstated: Mapping[str, str], utterance: Utterance, phraser: Phraser) -> None:
        """One more constraint (two when verbose: such users say more at once)."""
        count = 2 if phraser.verbosity == "verbose" else 1
        values = dict(list(unstated.items())[:count])
        d.stated.update(values)
        what = join_words([slot_phrase(d.domain, s, v) for s, v in values.items()])
        utterance.say(phraser.line("inform", what=what), inform_acts(d.domain, values))

    def _request_booking(self, d: _DomainState, utterance: Utterance, phraser: Phraser) -> None:
        values = d.booking()
        d.booking_requested = True
        d.stated.update(values)
        what = " ".join(slot_phrase(d.domain, s, v) for s, v in values.items())
        utterance.say(phraser.line("book_train" if d.domain == "train" else "book", what=what), inform_acts(d.domain, values))

    def _open(self, d: _DomainState, utterance: Utterance, phraser: Phraser, also: bool) -> None:
        """Bring up domain ``d``: the domain and one or two of its constraints."""
        d.opened = True
        if d.is_static:
            d.entity = self._static_entity(d)
        constraints = d.constraints()
        if "name" in constraints:
            first = ["name"]
        elif len(constraints) <= 1 or d.is_static:
            first = list(constraints)
        else:
            first = phraser.rng.sample(list(constraints), phraser.rng.choice((1, 2)))
        values = {slot: constraints[slot] for slot in constraints if slot in first}  # goal order
        d.stated.update(values)
        acts = inform_acts(d.domain, values) or [DialogAct(f"{d.domain.capitalize()}-Inform", "none", "none")]
        utterance.say(phraser.line("intro_also" if also else "intro", what=describe(d.domain, values, also=also)), acts)

    def _static_entity(self, d: _DomainState) -> Entity | None:
        """Police and hospital have no search: the user's entity is the one the goal names
        (the department), else the domain's only one."""
        database = self._simulator.database
        candidates = database.search(d.domain, d.final_constraints()) if d.final_constraints() else database.entities(d.domain)
        return candidates[0] if candidates else None

    def _move_on(self, utterance: Utterance, phraser: Phraser) -> None:
        """After a domain is done, bring up the next one."""
        focus = self._state.focus()
        if focus is not None and not focus.opened:
            self._open(focus, utterance, phraser, also=any(d.opened for d in self._state.domains))

    def _end(self, utterance: Utterance, phraser: Phraser, key: str) -> UserTurn:
        self._state.ended = True
        utterance.say(phraser.line(key), [GENERAL_THANK, GENERAL_BYE])
        phraser.closer(utterance)
        return UserTurn(phraser.finish(utterance), end=True, acts=tuple(utterance.acts))

    def _phraser(self) -> Phraser:
        config = self._simulator.config
        return Phraser(self._state.rng, config.verbosity, config.noise)
