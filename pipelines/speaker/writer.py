"""The rules synthesizer's dialogue writer: a seed dialogue, rewritten around clarifications.

:class:`DialogueWriter` writes one :class:`~pipelines.speaker.trajectory.Trajectory` from a
seed dialogue, its goal and a :class:`Plan` (the ambiguity points to clarify). It follows
the seed's path (the domains in the order its belief states take them up, what the user
says first, ``fail_info`` / ``fail_book`` detours, the venue the seed settled on when the
agent is shown it) and rewrites it where the plan says:

* at an underspecification point the user's request says only the point's ``known``
  constraints; the agent searches, sees several candidates, reasons about what differs in
  ``<think>`` and asks in ``<clarify>``; the user answers from the goal; the agent searches
  again, and asks again while the goal still discriminates and the budget allows;
* at a referential point the user says "the same day as my earlier booking" or "a taxi
  between the two places" and the agent asks which reading is meant.

Where no point is planned, a venue or train request sometimes names only one or two of the
goal's constraints, the agent recommends the first result and the user, whom it does not suit,
names what it breaks; the agent searches again with everything said (the recommendation itself
is never a training target). Sometimes that search first leaves out what the user opened with,
the user reminds the agent, and the agent searches again with all of it (the mistaken search
is context too). A venue asked for by name is searched by the name alone, whether or not the
user says what kind of place it is; where they do not, the agent sometimes looks among another
kind first, finds nothing by that name and looks among the next (that miss is context too).
A taxi request sometimes names only one or two of the pickup, the
destination and the time, as users open one; the agent asks for the rest before booking (slot
filling: a needed question, taught, but not an ambiguity point). Everything else is stated in
full, so the agent acts at once; where several candidates fit and the goal does not care,
the user says so ("any price range is fine"). Every point is re-evaluated on the dialogue
being written (:mod:`pipelines.speaker.ambiguity`), so a clarification is only written where
the written dialogue really is ambiguous.

A *negative* (SpeakER-DPO) is written by the same code with ``guess`` set to one planned
point: there the agent does not ask but acts on its best guess (the first search result,
the most recent earlier booking, the order in which the places came up), and the
conversation goes on with the user going along with it, as a user who cannot see what the
agent assumed would. Up to that point the negative is the positive turn for turn (same
code path, same random draws), so the two outputs at the point form a preference pair.

Tool calls run in the trajectory's environment as they are written: counts, results and
booking references in the dialogue are the environment's.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipelines.env.replay import QUERY_TOOLS
from pipelines.env.tools import TOOLS, Database, entity_view, name_key
from pipelines.errors import AskflowError
from pipelines.multiwoz.ontology import values_match
from pipelines.records import Dialogue, DomainGoal, Entity
from pipelines.speaker import phrasing as say
from pipelines.speaker.ambiguity import (
    BOOK,
    REFERENCE_PHRASES,
    REFERENTIAL,
    SEARCH,
    SEARCH_DOMAINS,
    TAXI,
    UNDERSPECIFICATION,
    VENUE_DOMAINS,
    AmbiguityPoint,
    Booking,
    candidate_values,
    constraints,
    discriminating_values,
    referential_day_or_people,
    seed_view,
    taxi_direction,
)
from pipelines.speaker.trajectory import USER, Trajectory, TrajectoryBuilder

BOOKING_TOOLS: Mapping[str, str] = {"restaurant": "book_restaurant", "hotel": "book_hotel", "train": "buy_train_ticket"}
# Chance that the user adds a second question slot to the first clarification when the
# budget allows both ways; the rest of the time the agent asks one thing at a time.
_TWO_AT_ONCE = 0.3
# Chance that, where the full request still leaves candidates that differ in a slot the goal
# does not care about, the agent asks about it and hears "I don't mind" (the branch a policy
# that cannot see the goal meets: it recommends one of the results it has); otherwise the
# user says so up front ("any area is fine") and the agent acts at once.
_ASK_NO_PREFERENCE = 0.5
# Chance of the same after an answered clarification, where the narrowed search still differs.
_ASK_AGAIN_NO_PREFERENCE = 0.3
# Chance that a value shared with one earlier booking is given by an explicit reference
# ("the same day as my hotel booking"), which the agent resolves without asking.
_EXPLICIT_REFERENCE = 0.5
# Chance that a taxi request names only one or two of the pickup, the destination and the
# time, as users open one (the agenda simulator's users do), and the agent asks for the rest
# before booking; otherwise the request has all three and the agent books at once.
_TAXI_PARTIAL = 0.7
# Chance that, in a venue or train search with no planned point, the user opens with one or
# two of the goal's constraints (as the agenda user does), the agent recommends on that alone,
# and the user names what the recommendation breaks: the recommendation is in the prompts
# (never a target), the search after the correction, with everything said, is what rows teach.
_LATE_CONSTRAINTS = 0.5
# Chance that the search after the first correction leaves out a constraint the user opened
# with (what the H100 run's SFT model did after "Hmm, I'd need it european food, though."),
# the agent recommends from it, the user repeats what it dropped, and the agent searches with
# everything: the mistaken search and its recommendation are context, the recovery is taught.
_FORGOTTEN = 0.3
# Chance that a user asking for a venue by name also says what kind of place it is ("a hotel
# called wild house"): the agent searches that kind by the name alone (the H100 run's SFT model
# added type hotel to such a search and missed a guesthouse).
_KIND_SAID = 0.3
# Chance that, where the user names a venue without its kind, the agent first looks among another
# kind of place, finds nothing by that name and looks among the next (the SFT model searched the
# restaurants for an attraction, said nothing matched and searched them again): the first search
# is context (its kind is a guess the agent cannot check beforehand), the next one is taught.
_OTHER_KIND_FIRST = 0.3


class SynthesisError(AskflowError):
    """A seed that cannot be synthesized; ``reason`` is a short code for the drop reports."""

    def __init__(self, reason: str, detail: str):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}")


@dataclass(frozen=True)
class Plan:
    """The points to clarify (dialogue order) and the most clarification turns the dialogue
    may spend on them; every planned point gets at least one."""

    points: tuple[AmbiguityPoint, ...]
    max_turns: int

    def get(self, domain: str, action: str, type_: str) -> AmbiguityPoint | None:
        return next((p for p in self.points if p.key == (domain, action, type_)), None)


def plan_clarifications(points: Sequence[AmbiguityPoint], rng: random.Random, max_turns: int) -> Plan:
    """Between one and ``min(len(points), max_turns)`` of the points, chosen at random, so
    that dialogues clarify at different stages and different numbers of times."""
    if not points or max_turns < 1:
        return Plan((), max_turns)
    count = rng.randint(1, min(len(points), max_turns))
    chosen = sorted(rng.sample(range(len(points)), count))
    return Plan(tuple(points[i] for i in chosen), max_turns)


class DialogueWriter:
    """Writes one trajectory (module docstring). ``seed`` drives the phrasing; ``env_seed``
    the environment; ``guess``: write the negative for this planned point."""

    def __init__(
        self,
        dialogue: Dialogue,
        database: Database,
        plan: Plan,
        *,
        seed: int,
        env_seed: int,
        guess: AmbiguityPoint | None = None,
    ):
        self.dialogue = dialogue
        self.goal = dialogue.goal
        self.database = database
        self.plan = plan
        self.guess = guess
        self.rng = random.Random(f"speaker-writer:{seed}:{dialogue.dialogue_id}")
        self.view = seed_view(dialogue)
        self.builder = TrajectoryBuilder(dialogue.dialogue_id, dialogue.goal, database, env_seed)
        self.pending = list(plan.points)  # planned points not reached yet
        self.budget = plan.max_turns  # clarification turns left
        self.bookings: list[Booking] = []  # made so far, for references
        self.venues: list[tuple[str, str]] = []  # (domain, name) offered so far
        self.ack = False  # the next user turn first accepts an offer
        self.guessed: AmbiguityPoint | None = None
        self.indifferent: str | None = None  # the slot the user said up front they do not mind
        self.no_preference: str | None = None  # the slot the agent will ask about and hear "I don't mind"

    # -- the dialogue --------------------------------------------------------------------

    def write(self) -> Trajectory:
        for domain in self.view.order:
            domain_goal = self.goal.get(domain)
            if domain in SEARCH_DOMAINS:
                self._search_domain(domain_goal)
            elif domain == "taxi":
                self._taxi(domain_goal)
            else:
                raise SynthesisError("unsupported_domain", f"no tools for the {domain} domain")
        think, text = say.closing(self.rng)
        self.builder.user(say.goodbye(self.rng, ack=self._take_ack()))
        self.builder.agent(think, respond=text, end=True)
        return self.builder.build(self.guessed)

    def _take_ack(self) -> bool:
        ack, self.ack = self.ack, False
        return ack

    def _reach(self, point: AmbiguityPoint | None) -> None:
        if point is not None and point in self.pending:
            self.pending.remove(point)

    def _guessing(self, point: AmbiguityPoint) -> bool:
        return self.guess is not None and self.guess.key == point.key

    def _spend(self) -> None:
        self.budget -= 1

    def _can_ask_again(self) -> bool:
        """Whether one more turn at this point leaves a turn for every point still ahead."""
        return self.budget - 1 > len(self.pending)

    # -- search domains ------------------------------------------------------------------

    def _search_domain(self, goal: DomainGoal) -> None:
        domain, info = goal.domain, constraints(goal.info)
        if not info or not self.database.search(domain, info):
            raise SynthesisError("goal_unsatisfiable", f"no {domain} satisfies the goal {info}")
        under = self.plan.get(domain, SEARCH, UNDERSPECIFICATION)
        self._reach(under)
        fail = constraints(goal.fail_info)
        live: AmbiguityPoint | None = None
        if "name" in info:
            known = {"name": info["name"]}
            self._name_lookup(domain, info["name"])
        elif fail and not self.database.search(domain, fail):
            known = dict(info)
            self._fail_info(domain, info, fail)
        elif under is None and (corrected := self._late_constraints(goal)) is not None:
            known = corrected
        else:
            known = dict(under.known) if under else dict(info)
            known = self._request(goal, known, under)
            live = self._disambiguate(goal, known, under)
        no_preference, indifferent = self.no_preference, self.indifferent
        self.no_preference = self.indifferent = None
        if no_preference is not None:
            self._ask_no_preference(domain, known, no_preference)
        entity = self._offer(goal, known, live, indifferent=indifferent, no_preference=no_preference)
        self._after_offer(goal, entity)

    def _after_offer(self, goal: DomainGoal, entity: Entity) -> None:
        if constraints(goal.book):
            self._book(goal, entity)
        if goal.reqt:
            self._requests(goal, entity)
        elif not constraints(goal.book):
            self.ack = True

    def _late_constraints(self, goal: DomainGoal) -> dict[str, str] | None:
        """The corrected recommendation (:data:`_LATE_CONSTRAINTS`), when the first result of
        the partial request breaks the rest of the goal: returns what the agent then knows,
        or None (nothing written). Like the agenda user, the correction names only what the
        shown venue breaks, so the agent must carry the opening over; a constraint the venue
        happened to meet stays unsaid and may break the next result: a second correction."""
        domain, info = goal.domain, constraints(goal.info)
        if domain not in (*VENUE_DOMAINS, "train") or len(info) < 2 or self.plan.get(domain, SEARCH, REFERENTIAL) is not None:
            return None
        if self.rng.random() >= _LATE_CONSTRAINTS:
            return None
        slots = list(info)
        said = sorted(self.rng.sample(range(len(slots)), self.rng.choice((1, 2)) if len(slots) > 2 else 1))
        known = {slots[i]: info[slots[i]] for i in said}
        found = self.database.listed(domain, _tool_arguments(domain, known))
        if not found or not _broken(found[0], info):
            return None  # the first result fits anyway: nothing to correct
        self.builder.user(say.find_request(self.rng, domain, known, ack=self._take_ack()))
        self._query(say.search_think(self.rng, domain, known), domain, known)
        opening, rounds = dict(known), 0
        while True:
            query = self.builder.environment.state.queries[-1]
            offered = query.results[0]
            broken = {s: v for s, v in _broken(offered, info).items() if s not in known}
            if not broken:  # fits, or breaks only what the search cannot take: offer it
                return known
            name = self._show(goal, query.count, offered)
            self.builder.user(say.correction(self.rng, domain, broken))
            known = {**known, **broken}  # grows each round: the loop ends
            rounds += 1
            think = say.corrected_think(self.rng, domain, name, broken, known)
            if rounds == 1 and self.rng.random() < _FORGOTTEN:
                think = self._forget(goal, opening, known) or think
            self._query(think, domain, known)

    def _name_lookup(self, domain: str, name: str) -> None:
        """The user asks for a venue by name, with its kind (:data:`_KIND_SAID`) or without; the
        agent searches by the name alone, and where the kind was not said, sometimes first among
        another kind of place that has nothing by that name (:data:`_OTHER_KIND_FIRST`)."""
        known = {"name": name}
        kind_said = self.rng.random() < _KIND_SAID
        self.builder.user(say.name_request(self.rng, name, ack=self._take_ack(), domain=domain if kind_said else None))
        if not kind_said and self.rng.random() < _OTHER_KIND_FIRST:
            other = self.rng.choice([d for d in VENUE_DOMAINS if d != domain])
            if not self.database.search(other, known):  # a name two kinds share is not a miss
                self._query(say.name_think(self.rng, other, name, kind_said=False), other, known, shown=True)
                self._query(say.other_kind_think(self.rng, other, domain, name), domain, known)
                return
        self._query(say.name_think(self.rng, domain, name, kind_said), domain, known)

    def _show(self, goal: DomainGoal, count: int, offered: Entity) -> str:
        """A recommendation of the first result that the user then corrects (never taught);
        returns how the dialogue names it."""
        domain = goal.domain
        attributes, name = {**entity_view(offered), "name": offered.name}, _entity_name(domain, offered)
        self.builder.agent(say.recommend_think(self.rng, domain, count, name, guessed=True),
                           respond=say.recommendation(self.rng, domain, attributes, bool(constraints(goal.book))), shown=True)
        return name

    def _forget(self, goal: DomainGoal, opening: Mapping[str, str], known: Mapping[str, str]) -> str | None:
        """The mistaken search after a correction (:data:`_FORGOTTEN`): one opening constraint
        left out, a recommendation that breaks it, the user's reminder. Returns the think of
        the search that recovers, or None (nothing written) where the first result of the
        mistaken search happens to meet the dropped constraint."""
        domain = goal.domain
        slot = self.rng.choice(sorted(opening))
        partial = {s: v for s, v in known.items() if s != slot}
        found = self.database.listed(domain, _tool_arguments(domain, partial))
        if not found or values_match(slot, opening[slot], found[0].get(slot)):
            return None
        self._query(say.search_think(self.rng, domain, partial), domain, partial, shown=True)
        query = self.builder.environment.state.queries[-1]
        self._show(goal, query.count, query.results[0])
        self.builder.user(say.reminder(self.rng, domain, {slot: opening[slot]}))
        return say.recovered_think(self.rng, domain, {slot: opening[slot]}, known)

    def _query(self, think: str, domain: str, known: Mapping[str, str], point: AmbiguityPoint | None = None,
               shown: bool = False) -> dict[str, Any]:
        return self.builder.call(think, QUERY_TOOLS[domain], _tool_arguments(domain, known), point, shown)

    def _fail_info(self, domain: str, info: Mapping[str, str], fail: Mapping[str, str]) -> None:
        """The seed's detour: ask for what does not exist, hear so, settle for the goal."""
        self.builder.user(say.find_request(self.rng, domain, fail, ack=self._take_ack()))
        self._query(say.search_think(self.rng, domain, fail), domain, fail)
        think, text = say.no_match(self.rng, domain, fail)
        self.builder.agent(think, respond=text)
        changed = {s: v for s, v in info.items() if fail.get(s) != v} or dict(info)
        self.builder.user(say.changed_request(self.rng, domain, changed))
        self._query(say.search_think(self.rng, domain, info), domain, info)

    def _request(self, goal: DomainGoal, known: dict[str, str], under: AmbiguityPoint | None) -> dict[str, str]:
        """The user's request (and, for a train whose day is a reference, its resolution);
        returns what the agent then knows."""
        domain = goal.domain
        day_ref = self.plan.get(domain, SEARCH, REFERENTIAL)
        readings = self._readings(day_ref, "day", known.get("day"))
        self._reach(day_ref)
        explicit = None if readings else self._explicit_reference(domain, "day", known.get("day"))
        hint = ""
        if under is None and domain in VENUE_DOMAINS:
            slot = self._indifferent_slot(domain, known)
            if slot is not None and self.rng.random() < _ASK_NO_PREFERENCE:
                self.no_preference = slot
            elif slot is not None:
                self.indifferent = slot
                hint = say.dont_mind(self.rng, slot)
        phrase = REFERENCE_PHRASES["day"] if readings else (explicit[1] if explicit else None)
        text = say.find_request(self.rng, domain, known, day_phrase=phrase, ack=self._take_ack())
        self.builder.user(f"{text} {hint}".strip())
        think = say.search_think(self.rng, domain, known)
        point = None
        if readings:
            day, guess_think, point = self._resolve_reference(day_ref, "day", known["day"], readings, known)
            known = {**known, "day": day}
            think = guess_think or say.search_think(self.rng, domain, known)
        elif explicit:
            think = f"{say.reference_resolved_think('day', explicit[0], known['day'])} {think}"
        self._query(think, domain, known, point)
        return known

    def _indifferent_slot(self, domain: str, known: Mapping[str, str]) -> str | None:
        """A slot the goal does not care about in which the candidates of the full request
        still differ: the user says "any area is fine" up front (the cue that acting is
        right), or the agent asks and hears it (:meth:`_ask_no_preference`)."""
        candidates = self.database.search(domain, known)
        if len(candidates) < 2:
            return None
        for slot in ("area", "pricerange", "food", "type", "stars"):
            if slot not in known and len(candidate_values(slot, candidates)) > 1:
                return slot
        return None

    def _ask_no_preference(self, domain: str, known: Mapping[str, str], slot: str) -> None:
        """The question the goal does not need, and the user's "I don't mind": the agent
        cannot tell it from a needed one, so the data shows what follows (a recommendation
        among the results already found). The question is marked needless: it is in the
        prompts that follow, never a training target."""
        query = self.builder.environment.state.queries[-1]
        values = candidate_values(slot, query.results)
        self.builder.agent(
            say.needless_think(self.rng, domain, query.count, slot, values, self._said(known)) if len(values) > 1
            else say.clarify_think(self.rng, domain, query.count, {}, [slot], self._said(known)),
            clarify=say.questions(self.rng, domain, {slot: values}, query.count),
            needless=True,
        )
        self.builder.user(say.no_preference(self.rng, slot))

    def _disambiguate(self, goal: DomainGoal, known: dict[str, str], under: AmbiguityPoint | None) -> AmbiguityPoint | None:
        """Clarify until the goal no longer discriminates between the candidates; in a
        negative, stop at the guess. Returns the point when the agent guessed there."""
        domain, info = goal.domain, constraints(goal.info)
        asked_here = 0
        while under is not None:
            candidates = self.database.search(domain, known)
            discriminating = discriminating_values(domain, candidates, info, known)
            if not discriminating:
                if asked_here and domain in VENUE_DOMAINS and self.rng.random() < _ASK_AGAIN_NO_PREFERENCE:
                    # The answer narrowed the search, the rest differ in what the goal does not care about.
                    self.no_preference = self._indifferent_slot(domain, known)
                return None
            point = AmbiguityPoint(
                self.dialogue.dialogue_id, domain, UNDERSPECIFICATION, SEARCH, under.turn, known, tuple(discriminating),
                discriminating, {s: info[s] for s in discriminating}, len(candidates), under.origin,
            )
            if self._guessing(point) and asked_here == 0:
                self.guessed = point
                return point
            shown = self.builder.environment.state.queries[-1].results
            seen = {s: candidate_values(s, shown) for s in discriminating}
            # The slot the shown results split most on first: that is what the agent can see.
            ranked = sorted(discriminating, key=lambda s: -len(seen[s]))
            if self._can_ask_again() and len(ranked) > 1:
                asked = ranked[: 2 if self.rng.random() < _TWO_AT_ONCE else 1]
            else:
                asked = ranked
            differing = {s: v for s, v in seen.items() if len(v) > 1}
            self.builder.agent(
                say.clarify_think(self.rng, domain, len(candidates), differing, asked, self._said(known)),
                clarify=say.questions(self.rng, domain, {s: seen[s] for s in asked}, len(candidates), earliest=shown[0].get("leaveAt") if shown else None),
                point=point,
            )
            self._spend()
            asked_here += 1
            answer = {s: info[s] for s in asked}
            self.builder.user(say.answer(self.rng, domain, answer))
            known.update(answer)
            self._query(say.requery_think(self.rng, domain, answer), domain, known)
        return None

    def _offer(
        self, goal: DomainGoal, known: Mapping[str, str], guessed: AmbiguityPoint | None, indifferent: str | None = None,
        no_preference: str | None = None,
    ) -> Entity:
        """Recommend an entity of the last search: the seed's own when the agent was shown it
        (later parts of the goal, a taxi to it, refer to it), else the first; the first when
        guessing. ``known``: what the user has said; ``indifferent``: the slot the user said
        up front they do not mind; ``no_preference``: the slot they just said they do not mind
        when asked."""
        domain = goal.domain
        query = self.builder.environment.state.queries[-1]
        if not query.results:
            raise SynthesisError("goal_unsatisfiable", f"the {domain} search returned nothing")
        entity = query.results[0]
        chosen = self.view.chosen.get(domain)
        if guessed is None and chosen:
            entity = next((e for e in query.results if name_key(e.name) == name_key(chosen)), entity)
        if no_preference is not None:
            think = say.no_preference_think(self.rng, domain, query.count, entity.name, self._said(known, [no_preference]))
        else:
            said = self._said(known, [indifferent] if indifferent else [])
            think = say.recommend_think(self.rng, domain, query.count, entity.name, guessed=guessed is not None, said=said)
        attributes = {**entity_view(entity), "name": entity.name}
        self.builder.agent(think, respond=say.recommendation(self.rng, domain, attributes, bool(constraints(goal.book))), point=guessed)
        if domain in VENUE_DOMAINS:
            self.venues.append((domain, entity.name))
        return entity

    def _said(self, known: Mapping[str, str], declined: Sequence[str] = ()) -> str:
        """The think's "Said: slot=value, ..." line (:func:`~pipelines.speaker.phrasing.said_pairs`):
        the known constraints the user has said in this dialogue, and ``declined``, the slots
        they do not mind."""
        heard = [t.content for t in self.builder.turns if t.kind == USER]
        return say.said_line(say.said_pairs(heard, known), declined)

    # -- references ----------------------------------------------------------------------

    def _readings(self, point: AmbiguityPoint | None, slot: str, value: str | None) -> tuple | None:
        """The antecedents of a planned reference, if it is ambiguous in this dialogue."""
        if point is None or value is None:
            return None
        found = referential_day_or_people({slot: value}, self.bookings, slots=(slot,))
        return found[1] if found else None

    def _explicit_reference(self, domain: str, slot: str, value: str | None) -> tuple[str, str] | None:
        """(domain, phrase) for "the same day as my hotel booking", sometimes, when exactly
        one earlier booking has the value: unambiguous, so the agent resolves it itself."""
        if value is None:
            return None
        same = [b for b in self.bookings if b.values.get(slot) == value]
        if len(same) != 1 or self.rng.random() >= _EXPLICIT_REFERENCE:
            return None
        other = same[0].domain
        phrase = f"the same day as my {other} booking" if slot == "day" else f"the same number of people as my {other} booking"
        return other, phrase

    def _resolve_reference(
        self, planned: AmbiguityPoint, slot: str, wanted: str, readings: Sequence, known: Mapping[str, str]
    ) -> tuple[str, str | None, AmbiguityPoint | None]:
        """Ask which earlier booking is meant: (the user's answer, None, None). In the
        negative, do not ask: (the most recent booking's value, the reasoning for the call
        that acts on it, the point, which marks that call)."""
        domain = planned.domain
        values = tuple(sorted({a.values[slot] for a in readings}))
        point = AmbiguityPoint(
            self.dialogue.dialogue_id, domain, REFERENTIAL, planned.action, planned.turn,
            {s: v for s, v in known.items() if s != slot}, (slot,), {slot: values}, {slot: wanted},
            len(readings), planned.origin, tuple(readings), REFERENCE_PHRASES[slot],
        )
        earlier = [(b.domain, b.values[slot]) for b in self.bookings if b.values.get(slot)]
        if self._guessing(point):
            self.guessed = point
            last_domain, guess = earlier[-1]
            return guess, say.reference_guess_think(slot, last_domain, guess), point
        think, question = say.reference_clarify(self.rng, slot, earlier)
        self.builder.agent(think, clarify=question, point=point)
        self._spend()
        label = next((f"the {d} booking" for d, v in earlier if v == wanted), None)
        self.builder.user(say.reference_answer(self.rng, slot, wanted, label))
        return wanted, None, None

    # -- bookings ------------------------------------------------------------------------

    def _book(self, goal: DomainGoal, entity: Entity) -> None:
        domain = goal.domain
        book, fail_book = constraints(goal.book), constraints(goal.fail_book)
        attempt = {slot: fail_book.get(slot, value) for slot, value in book.items()}
        planned = self.plan.get(domain, BOOK, REFERENTIAL)
        slot = planned.slots[0] if planned else None
        readings = self._readings(planned, slot, attempt.get(slot)) if planned else None
        self._reach(planned)
        phrases: dict[str, str] = {}
        resolved_note = ""
        if readings:
            phrases[slot] = REFERENCE_PHRASES[slot]
        else:
            for candidate in ("day", "people"):
                explicit = self._explicit_reference(domain, candidate, attempt.get(candidate)) if candidate not in fail_book else None
                if explicit:
                    phrases[candidate] = explicit[1]
                    resolved_note = say.reference_resolved_think(candidate, explicit[0], attempt[candidate]) + " "
                    break
        self.builder.user(say.booking_request(self.rng, domain, attempt, phrases))
        values = dict(attempt)
        point = None
        if readings:
            known = {s: v for s, v in attempt.items() if s != slot}
            values[slot], guess_think, point = self._resolve_reference(planned, slot, attempt[slot], readings, known)
            resolved_note = f"{guess_think} " if guess_think else ""
        name = _entity_name(domain, entity)
        think = resolved_note + say.book_think(self.rng, name, values)
        observation = self.builder.call(think.strip(), BOOKING_TOOLS[domain], self._booking_arguments(domain, entity, values), point)
        if observation.get("unavailable"):
            failed = next(s for s in fail_book if s in values)
            think, text = say.unavailable(self.rng, name, failed, values[failed])
            self.builder.agent(think, respond=text)
            values[failed] = book[failed]
            self.builder.user(say.retry_request(self.rng, failed, book[failed]))
            observation = self.builder.call(say.book_think(self.rng, name, values), BOOKING_TOOLS[domain], self._booking_arguments(domain, entity, values))
        if "reference" not in observation:
            raise SynthesisError("booking_failed", f"booking {name} failed: {observation.get('error')}")
        self.builder.agent(
            f"The booking went through; I'll give the user the reference {observation['reference']}.",
            respond=say.booked(self.rng, domain, name, observation["reference"], observation.get("total price"), values),
        )
        booked = dict(values)
        if domain == "train" and entity.get("day"):
            booked["day"] = entity.get("day")
        self.bookings.append(Booking(domain, booked))

    @staticmethod
    def _booking_arguments(domain: str, entity: Entity, values: Mapping[str, str]) -> dict[str, Any]:
        if domain == "train":
            # The timetable reuses train ids across days: the day pins the ticket down.
            arguments: dict[str, Any] = {"trainID": entity.get("trainID") or entity.name, "people": int(values["people"])}
            if entity.get("day"):
                arguments["day"] = entity.get("day")
            return arguments
        arguments = {"name": entity.name}
        for slot, value in values.items():
            arguments[slot] = int(value) if slot in ("people", "stay") and value.isdigit() else value
        return arguments

    def _requests(self, goal: DomainGoal, entity: Entity) -> None:
        name = _entity_name(goal.domain, entity)
        text = say.reqt_request(self.rng, goal.reqt)
        if self._take_ack():
            text = f"{say.pick(self.rng, ('That sounds great.', 'Sounds good.'))} {text}"
        self.builder.user(text)
        values = {slot: (entity.name if slot == "name" else entity.get(slot)) for slot in goal.reqt}
        self.builder.agent(say.reqt_think(self.rng, name, goal.reqt), respond=say.reqt_answer(name, values))

    # -- taxi ----------------------------------------------------------------------------

    def _taxi(self, goal: DomainGoal) -> None:
        info = constraints(goal.info)
        time_slot = "leaveAt" if "leaveAt" in info else "arriveBy"
        time = info.get(time_slot, "")
        departure, destination = info.get("departure", ""), info.get("destination", "")
        planned = self.plan.get("taxi", TAXI, REFERENTIAL)
        readings = taxi_direction(info, self.venues) if planned else None
        self._reach(planned)
        point = None
        if readings is None:
            self._taxi_request({"departure": departure, "destination": destination, time_slot: time}, time_slot)
            think = say.taxi_think(self.rng, departure, destination, time_slot, time)
        else:
            self.builder.user(say.taxi_request(self.rng, None, None, time_slot, time, ack=self._take_ack()))
            first, second = readings[0].values["departure"], readings[0].values["destination"]
            point = AmbiguityPoint(
                self.dialogue.dialogue_id, "taxi", REFERENTIAL, TAXI, planned.turn, {time_slot: time}, ("departure", "destination"),
                planned.candidates, {"departure": departure, "destination": destination}, len(readings), planned.origin,
                readings, planned.reference,
            )
            if self._guessing(point):
                self.guessed = point
                departure, destination = first, second
                think = say.taxi_guess_think(first, second)
            else:
                think, question = say.taxi_clarify(self.rng, first, second)
                self.builder.agent(think, clarify=question, point=point)
                self._spend()
                self.builder.user(say.taxi_answer(self.rng, departure, destination))
                think = say.taxi_think(self.rng, departure, destination, time_slot, time)
                point = None
        arguments = {"departure": departure, "destination": destination, time_slot: time}
        observation = self.builder.call(think, "book_taxi", arguments, point)
        if "reference" not in observation:
            raise SynthesisError("booking_failed", f"taxi booking failed: {observation.get('error')}")
        self.builder.agent(
            "The taxi is booked; I'll pass on the car, the phone number and the reference.",
            respond=say.taxi_booked(self.rng, observation["car type"], observation["phone"], observation["reference"]),
        )


    def _taxi_request(self, wanted: Mapping[str, str], time_slot: str) -> None:
        """The user's taxi request: all of ``wanted`` (pickup, destination, time), or one or
        two of them and, after the agent's question for the rest, the rest (slot filling)."""
        ack = self._take_ack()
        if not all(wanted.values()) or self.rng.random() >= _TAXI_PARTIAL:
            self.builder.user(say.taxi_request(self.rng, wanted["departure"], wanted["destination"], time_slot, wanted[time_slot], ack=ack))
            return
        slots = list(wanted)
        said = sorted(self.rng.sample(range(len(slots)), self.rng.choice((1, 2))))
        stated = {slots[i]: wanted[slots[i]] for i in said}
        self.builder.user(say.taxi_partial_request(self.rng, stated, time_slot, ack=ack))
        missing = [s for s in slots if s not in stated]
        think, question = say.taxi_slot_question(self.rng, ["time" if s == time_slot else s for s in missing])
        self.builder.agent(think, clarify=question, slot_filling=True)
        self.builder.user(say.taxi_slot_answer(self.rng, {s: wanted[s] for s in missing}, time_slot))


def _tool_arguments(domain: str, known: Mapping[str, str]) -> dict[str, str]:
    """Search arguments: the known constraints the domain's query tool takes."""
    spec = TOOLS[QUERY_TOOLS[domain]]
    return {slot: value for slot, value in known.items() if spec.param(slot) is not None}


def _broken(entity: Entity, info: Mapping[str, str]) -> dict[str, str]:
    """The constraints of ``info`` that ``entity`` does not meet."""
    return {slot: value for slot, value in info.items() if not values_match(slot, value, entity.get(slot))}


def _entity_name(domain: str, entity: Entity) -> str:
    """How the dialogue names an entity: a train by its id."""
    return (entity.get("trainID") or entity.name) if domain == "train" else entity.name
