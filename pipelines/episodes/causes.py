"""Why did a gold-replay episode fail? One cause per failing episode, for triage tables.

A failing gold replay is either a disagreement between askflow and the dataset or a
dialogue that really missed its goal. The episode is compared with an offline grading of
the same dialogue (its gold calls replayed once in a fresh environment, graded on every
gold system text, without dialog acts as episodes are): when the offline grade succeeds,
the user simulator cut the dialogue short or led it elsewhere; otherwise each of the
offline grade's structured problems (:class:`pipelines.env.checker.Reason`) gets a cause,
and the dialogue's cause is the first of them, unless one shows that the dialogue fails
whatever askflow does (in the order ``human_failure``, ``annotation_error``, ``db_mismatch``):

* ``simulator_ended_early``: the offline grade succeeds, the episode does not;
* ``value_normalisation``: the dataset and the goal state one value differently (a 12-hour
  time for a 24-hour one, a name with or without its article or suffix);
* ``booking_semantics``: no successful booking, wrong booking values, reference not told;
* ``requested_attributes``: the offered entity is right but a requested attribute was not
  recognised as given;
* ``cross_domain_refs``: a taxi between places other than the goal's (often the venue of
  another domain, annotated by another name);
* ``multi_entity_offers``: the entity graded as offered is not the one that fits the goal;
* ``db_mismatch``: no database entity fits the goal, or the one named is not in the database
  (a train id the timetable has on another route only is the human's booking of another
  train: ``human_failure``);
* ``replay_agent_limits``: the annotations imply no tool call where the dialogue plainly
  made one (a taxi booked without a belief-state record);
* ``annotation_error``: the belief state contradicts the user's own words (a taxi time the
  user gave as "after 22:30" recorded as ``arriveBy``; a hotel day said "starting thurs"
  and recorded "none"): the replayed call is wrong, the human dialogue may well have
  succeeded, and nothing but reading the text could tell;
* ``goal_inconsistent``: the goal contradicts itself: a value that refers to another
  domain's ("the same day as the restaurant booking", ``DomainGoal.references``) differs
  from that domain's own value in the goal, and the dialogue followed the reference (the
  value graded as wrong is the referred domain's);
* ``human_failure``: the human system never offered, booked or told what the goal asks
  (a taxi booked without a pickup place or time nobody gave, a rebooked taxi's number
  never told, one venue's area with another's phone), booked something else than it
  told, or the human user asked for something else than the goal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pipelines.env.checker import GoalResult, Reason, check_goal
from pipelines.env.replay import BOOKING_TOOLS, ReplayResult, gold_tool_calls, replay
from pipelines.env.tools import TOOLS, Database, ToolEnvironment, name_key
from pipelines.episodes.records import Episode
from pipelines.multiwoz.ontology import ACT_SLOT, TIME_SLOTS, canonical_value, is_dont_care, norm_value, parse_time, twelve_hours_apart
from pipelines.records import Dialogue, Goal

CAUSES: tuple[str, ...] = (
    "simulator_ended_early",
    "value_normalisation",
    "booking_semantics",
    "requested_attributes",
    "cross_domain_refs",
    "multi_entity_offers",
    "db_mismatch",
    "replay_agent_limits",
    "annotation_error",
    "goal_inconsistent",
    "human_failure",
)
# Causes that make the dialogue fail whatever askflow does, strongest first.
_DECISIVE: tuple[str, ...] = ("human_failure", "goal_inconsistent", "annotation_error", "db_mismatch")

# Attributes whose values differ between MultiWOZ database versions (contact details).
_DATABASE_VERSIONED = frozenset({"phone", "postcode", "address", "price", "entrance fee", "openhours", "duration"})
_SEMI_SLOTS = frozenset({"day", "departure", "destination", "leaveAt", "arriveBy", "area", "pricerange", "food", "type", "stars", "internet", "parking"})
_TAXI_WORDS = re.compile(r"\b(?:taxi|cab|car)\b", re.I)
# How a user says which of a taxi's times a clock time is.
_TIME_CUES = {
    "leaveAt": re.compile(r"\b(?:after|leave|leaving|depart|departing|pick(?:ed)? (?:me |us |you )?up|pickup)\b", re.I),
    "arriveBy": re.compile(r"\b(?:arrive|arriving|arrival|get there|be there|get (?:me )?to|gets me there)\b", re.I),
}


@dataclass(frozen=True)
class _Case:
    """One dialogue under triage, with its gold calls replayed once."""

    dialogue: Dialogue
    database: Database
    replayed: ReplayResult


def replay_offline(dialogue: Dialogue, database: Database) -> ReplayResult:
    """The dialogue's gold calls run in a fresh environment."""
    return replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))


def offline_result(dialogue: Dialogue, database: Database, replayed: ReplayResult | None = None) -> GoalResult:
    """The dialogue's gold calls replayed in a fresh environment, graded on every gold text.
    Without dialog acts, as episodes are graded: an agent produces none."""
    result = replayed or replay_offline(dialogue, database)
    user_texts = [(t.index, t.text) for t in dialogue.turns if t.speaker == "user"]
    return check_goal(dialogue.goal, result.state, result.system_texts, None, user_texts)


def triage(dialogue: Dialogue, database: Database, replayed: ReplayResult | None = None) -> tuple[tuple[Reason, str], ...]:
    """Every problem of the dialogue's offline grade with its cause (none when it succeeds)."""
    replayed = replayed or replay_offline(dialogue, database)
    offline = offline_result(dialogue, database, replayed)
    return tuple((problem, classify_problem(problem, dialogue, database, replayed)) for problem in offline.problems)


def dialogue_cause(triaged: tuple[tuple[Reason, str], ...]) -> tuple[str, Reason]:
    """The dialogue's cause among its problems' (see the module docstring), and the problem it rests on."""
    for decisive in _DECISIVE:
        for problem, cause in triaged:
            if cause == decisive:
                return cause, problem
    problem, cause = triaged[0]
    return cause, problem


def classify(episode: Episode, dialogue: Dialogue, database: Database) -> tuple[str, tuple[str, ...]]:
    """The cause of a failing gold-replay episode (see the module docstring), with the
    reasons it rests on: the offline grade's, or the episode's when that one succeeds."""
    triaged = triage(dialogue, database)
    if not triaged:
        return "simulator_ended_early", episode.result.reasons
    return dialogue_cause(triaged)[0], tuple(f"{problem.domain}: {problem.text}" for problem, _ in triaged)


def classify_problem(problem: Reason, dialogue: Dialogue, database: Database, replayed: ReplayResult | None = None) -> str:
    """The cause of one problem the checker found in the offline grade."""
    case = _Case(dialogue, database, replayed or replay_offline(dialogue, database))
    kind, domain = problem.kind, problem.domain
    if kind in ("info_mismatch", "booked_info_mismatch", "booking_value", "taxi_value") and _follows_inconsistent_reference(problem, case):
        return "goal_inconsistent"
    if kind == "request_not_given":
        return _classify_request(domain, problem.slot or "", problem.got, case, problem.entity)
    if kind in ("not_offered", "request_without_offer") and domain != "taxi":
        return _classify_not_offered(domain, case)
    if kind in ("no_taxi", "request_without_offer"):
        unannotated = _unannotated_booking(dialogue, "taxi")
        if unannotated:
            return _classify_unannotated(dialogue, "taxi", unannotated)
        said = any(t.speaker == "system" and _TAXI_WORDS.search(t.text) and re.search(r"\d{10}", t.text.replace(" ", "")) for t in dialogue.turns)
        return "replay_agent_limits" if said else "human_failure"
    if kind == "no_booking":
        return _classify_no_booking(domain, case)
    if kind == "reference_not_given":
        return "booking_semantics"
    if kind == "booking_value":
        # The replayed booking carries the belief state's values: what the human user asked for.
        goal = dialogue.goal.get(domain)
        fail_value = goal.fail_book.get(problem.slot or "") if goal else None
        return "booking_semantics" if fail_value and norm_value(fail_value) == norm_value(problem.got or "") else "human_failure"
    if kind == "taxi_value":
        return _classify_taxi(problem, case)
    if kind in ("info_mismatch", "booked_info_mismatch"):
        return _classify_mismatch(problem, case)
    return "db_mismatch"  # static_unknown, static_not_named: the police or hospital database differs


def goal_inconsistency(goal: Goal, domain: str, slot: str) -> tuple[str, str, str, str] | None:
    """``(own value, referred domain, its value, text)`` when the domain's ``slot`` refers to
    another domain's value ("the same day as the restaurant booking") and the goal gives the
    two different values; None otherwise."""
    domain_goal = goal.get(domain)
    if domain_goal is None or slot not in domain_goal.references:
        return None
    other, other_slot = domain_goal.references[slot]
    referred = goal.get(other)
    own = domain_goal.info.get(slot) or domain_goal.book.get(slot)
    theirs = (referred.book.get(other_slot) or referred.info.get(other_slot)) if referred else None
    if not own or not theirs or is_dont_care(own) or is_dont_care(theirs):
        return None
    if parse_time(own) is not None and parse_time(own) == parse_time(theirs) or canonical_value(slot, own) == canonical_value(other_slot, theirs):
        return None
    text = f"the goal's {domain} {slot} is {own}, but it should be the same as the {other} {other_slot}, which the goal gives as {theirs}"
    return own, other, theirs, text


def _follows_inconsistent_reference(problem: Reason, case: _Case) -> bool:
    """The problem is on a value the goal contradicts itself about (:func:`goal_inconsistency`),
    and the dialogue has the referred domain's value (or what was booked there) instead."""
    found = goal_inconsistency(case.dialogue.goal, problem.domain, problem.slot or "")
    if found is None or problem.got is None:
        return False
    _, other, theirs, _ = found
    other_slot = case.dialogue.goal.get(problem.domain).references[problem.slot or ""][1]
    booked = [b.arguments.get(other_slot) for b in case.replayed.state.successful_bookings(other)]
    return any(v and norm_value(v) == norm_value(problem.got) for v in (theirs, *booked))


def _classify_mismatch(problem: Reason, case: _Case) -> str:
    slot, actual, wanted = problem.slot or "", problem.got, problem.expected or ""
    if actual is None:
        return "db_mismatch"  # the database does not know the value
    if _same_modulo_normalisation(actual, wanted):
        return "value_normalisation"
    if slot in _SEMI_SLOTS and not _belief_held(case.dialogue, problem.domain, slot, wanted):
        return "human_failure"  # the human dialogue never established the goal's value
    if case.replayed.state.successful_bookings(problem.domain):
        return "human_failure"  # graded on what the human system booked: that one breaks the goal
    return "multi_entity_offers"


def _same_modulo_normalisation(actual: str, wanted: str) -> bool:
    if parse_time(actual) is not None and parse_time(wanted) is not None:
        return twelve_hours_apart(actual, wanted) or twelve_hours_apart(wanted, actual)  # "03:30" written for "15:30"
    a, w = name_key(actual), name_key(wanted)
    return bool(a) and bool(w) and (a in w or w in a)


def _classify_taxi(problem: Reason, case: _Case) -> str:
    slot, actual, wanted = problem.slot or "", problem.got, problem.expected or ""
    if slot in TIME_SLOTS:
        return _classify_taxi_time(slot, wanted, case)
    if actual is None:
        return "human_failure"
    if _same_modulo_normalisation(actual, wanted):
        return "value_normalisation"
    return _classify_taxi_place(actual, wanted, case)


def _classify_taxi_time(slot: str, wanted: str, case: _Case) -> str:
    """A taxi booked for another time than the goal's. When the user's own sentence with
    the goal's time says it the goal's way ("after 22:30" for ``leaveAt``), the belief
    state recorded it the other way and no system turn confirmed that other way ("will
    pick you up at 14:45"), the annotation is wrong. Otherwise the human user asked for the
    other time (or another time, or to arrive at the place the taxi leaves from), which the
    human system booked."""
    other = "arriveBy" if slot == "leaveAt" else "leaveAt"
    minutes = parse_time(wanted)
    if minutes is None:
        return "human_failure"
    recorded = [b for t in case.dialogue.turns for b in t.belief_state or () if b.domain == "taxi"]
    if not any(parse_time(b.semi.get(other, "")) == minutes for b in recorded):
        return "human_failure"
    departures = {name_key(b.semi.get("departure", "")) for b in recorded} - {"", "not mentioned"}
    # The places the taxi leaves from, by name or by the kind of venue booked there ("the restaurant").
    booked_at = {(call.name, name_key(call.arguments.get("name", ""))) for _, call in case.replayed.calls}
    origins = departures | {d.domain for d in case.dialogue.goal.domains
                            if any((BOOKING_TOOLS.get(d.domain), place) in booked_at for place in departures)}
    user_said, system_said = False, False
    for turn in case.dialogue.turns:
        if minutes not in _clock_minutes(turn.text):
            continue
        if turn.speaker == "system" and _TIME_CUES[other].search(turn.text):
            system_said = True
        words = f" {norm_value(turn.text)} "
        if (turn.speaker == "user" and _TIME_CUES[slot].search(turn.text) and not _TIME_CUES[other].search(turn.text)
                and not (slot == "arriveBy" and any(f" {origin} " in words for origin in origins))):
            user_said = True
    return "annotation_error" if user_said and not system_said else "human_failure"


def _clock_minutes(text: str) -> set[int]:
    """Clock times in a text, in minutes, with their afternoon readings ("at 2:45")."""
    times = {int(h) * 60 + int(m) for h, m in re.findall(r"(?<!\d)(\d{1,2})[:.](\d{2})(?!\d)", text) if int(h) <= 24}
    return times | {t + 12 * 60 for t in times if t < 13 * 60}


def _classify_taxi_place(actual: str, wanted: str, case: _Case) -> str:
    """A taxi between other places than the goal's. When the goal's place is the venue of
    another of its domains and the booked one is not a venue at all ("the hotel", "home"),
    the annotation refers across domains; a different venue is the human's mistake."""
    database = case.database
    said = " ".join(f" {name_key(t.text)} " for t in case.dialogue.turns)
    if f" {name_key(actual)} " not in said and f" {name_key(wanted)} " not in said:
        # Neither place was ever said: the human system booked a pickup nobody asked for.
        return "human_failure"
    venues = {name_key(e.name) for domain in ("restaurant", "hotel", "attraction") for e in database.entities(domain)}
    other_goal_venues = {name_key(d.info.get("name", "")) for d in case.dialogue.goal.domains if d.domain != "taxi"}
    if name_key(actual) not in venues and (name_key(wanted) in other_goal_venues or name_key(wanted) in venues):
        return "cross_domain_refs"
    return "human_failure"


def _classify_request(domain: str, slot: str, value: str | None, case: _Case, entity: str | None = None) -> str:
    """A requested attribute not recognised as given. The gold dialog acts say what the
    human system informed: the database's value (the checker missed it in the text), a
    value of another venue the system named that fits the goal (the checker graded the
    wrong offer), of one that does not (the human answered about the wrong one), a value
    no venue has (the dataset's database differs from this one), or nothing at all."""
    dialogue, database = case.dialogue, case.database
    code = norm_value(ACT_SLOT.get(slot, slot))
    told = [act.value for turn in dialogue.turns if turn.speaker == "system" for act in turn.dialog_acts or ()
            if (act.domain == domain or (act.domain == "booking" and domain in ("restaurant", "hotel")))
            and act.intent in ("inform", "recommend", "offerbooked", "book")
            and norm_value(act.slot) == code]
    if not told:
        return "human_failure"
    if slot in ("internet", "parking"):
        # "Do they have free parking?" - "Yes, they do.": the answer names no attribute, and
        # the checker reads the system's side only.
        return "requested_attributes"
    if domain == "taxi" and value is not None and _told_for_an_earlier_taxi(dialogue, slot, told):
        return "human_failure"  # the taxi was booked again and the new one's detail never told
    if domain == "taxi" or value is None:
        # A taxi's details are the environment's own; told ones that did not reach the
        # graded booking were told about a booking the annotations did not tie to it.
        return "requested_attributes" if value is None else "replay_agent_limits"
    if any(canonical_value(slot, t) == canonical_value(slot, value) or norm_value(value) in norm_value(t) for t in told):
        return "requested_attributes"
    if slot in ("phone", "postcode") and any(_one_character_off(t, value) for t in told):
        return "db_mismatch"  # "01223525724" for the database's "01223525725": a typo or another database version
    goal = dialogue.goal.get(domain)
    info = {k: v for k, v in goal.info.items() if k != "name"} if goal else {}
    texts = " ".join(norm_value(t.text) for t in dialogue.turns if t.speaker == "system")
    fitting = {norm_value(e.get(slot)) for e in database.search(domain, info) if e.get(slot) and name_key(e.name) in texts}
    if any(norm_value(t) in fitting for t in told):
        if entity and goal and _told_other_requests(dialogue, domain, slot, entity, case):
            return "human_failure"  # one venue's area, another's phone and address: the human mixed two venues up
        if case.replayed.state.successful_bookings(domain):
            return "human_failure"  # it told one train's id and booked another: graded on what it booked
        return "multi_entity_offers"  # the human told a fitting venue's value; the checker graded another
    others = {norm_value(e.get(slot)) for e in database.entities(domain) if e.get(slot)}
    if slot not in _DATABASE_VERSIONED:
        # A category or a timetable time no venue or train has ("an exhibit" for a museum, an
        # arrival at the departure time): database versions differ in contact details, not in
        # these, so the human told a wrong value.
        return "human_failure"
    return "human_failure" if any(norm_value(t) in others for t in told) else "db_mismatch"


def _told_other_requests(dialogue: Dialogue, domain: str, slot: str, entity: str, case: _Case) -> bool:
    """Whether the system's acts told the graded venue's own phone, address or postcode (values
    no other venue shares, unlike a train's price or duration) for another requested attribute."""
    venues = case.database.named(domain, entity)
    goal = dialogue.goal.get(domain)
    if not venues or goal is None:
        return False
    acts = [act for turn in dialogue.turns if turn.speaker == "system" for act in turn.dialog_acts or ()
            if act.intent in ("inform", "recommend") and act.domain in (domain, "booking", "attraction")]
    for other in set(goal.reqt) & {"phone", "address", "postcode"}:
        wanted = venues[0].get(other)
        code = norm_value(ACT_SLOT.get(other, other))
        if other != slot and wanted and any(norm_value(a.slot) == code and _compact(a.value) == _compact(wanted) for a in acts):
            return True
    return False


def _told_for_an_earlier_taxi(dialogue: Dialogue, slot: str, told: list[str]) -> bool:
    """Whether every told value of ``slot`` (phone, car type) is an earlier taxi booking's,
    none the last one's: the system rebooked the taxi and never gave the new detail."""
    key = "type" if slot == "car type" else slot
    records: list = []
    for turn in dialogue.turns:
        for belief in turn.belief_state or ():
            if belief.domain == "taxi":
                records += [r for r in belief.booked if r not in records]
    if len(records) < 2:
        return False
    last = _compact(records[-1].values.get(key, ""))
    earlier = {_compact(r.values.get(key, "")) for r in records[:-1]} - {""}
    said = {_compact(t) for t in told}
    return bool(last) and last not in said and bool(said & earlier)


def _compact(value: str) -> str:
    """A value without spaces or dashes: "0 7000 - 333 - 444" is "07000333444"."""
    return re.sub(r"[\s-]", "", norm_value(value))


def _one_character_off(told: str, value: str) -> bool:
    """A phone number or postcode told with one character changed (a train id one digit
    off is another train)."""
    a, b = _compact(told), _compact(value)
    return len(a) == len(b) >= 6 and sum(x != y for x, y in zip(a, b)) == 1


def _classify_no_booking(domain: str, case: _Case) -> str:
    """No successful booking in ``domain``: refused for ``fail_book`` (booking semantics), the
    annotated venue or train unknown to this database, a ``booked`` record whose call the
    annotations do not determine, or no booking in the annotations at all."""
    attempts = [call for _, call in case.replayed.calls if call.name == BOOKING_TOOLS.get(domain)]
    if any(call.observation.get("unavailable") for call in attempts):
        return "booking_semantics"
    if attempts and _booked_another_route(domain, attempts, case):
        return "human_failure"
    if attempts:
        return "db_mismatch"
    annotated = any(belief.domain == domain and belief.booked for turn in case.dialogue.turns for belief in turn.belief_state or ())
    unannotated = _unannotated_booking(case.dialogue, domain)
    if annotated and unannotated:
        return _classify_unannotated(case.dialogue, domain, unannotated)
    return "replay_agent_limits" if annotated else "human_failure"


def _booked_another_route(domain: str, attempts, case: _Case) -> bool:
    """Every refused train booking names a train the timetable has, only on another day or
    route ("TR9809" of cambridge-ely for ely-cambridge), and none of the route leaves at its
    time (the replay repairs those): the human system booked another train than the one
    wanted, which the database does not contradict."""
    if domain != "train":
        return False
    errors = [call for call in attempts if "error" in call.observation]
    return bool(errors) and all(case.database.named("train", call.arguments.get("trainID", "")) for call in errors)


def _unannotated_booking(dialogue: Dialogue, domain: str) -> set[str]:
    """The values a booking call needs that no belief holding one of the domain's ``booked``
    records states (empty when there is no such record or nothing is missing)."""
    holding = [b for t in dialogue.turns for b in t.belief_state or () if b.domain == domain and b.booked]
    if not holding:
        return set()
    if domain == "taxi":
        needed = {"departure": ("departure",), "destination": ("destination",), "time": ("leaveAt", "arriveBy")}
        return {what for what, slots in needed.items()
                if not any(not is_dont_care(b.semi.get(slot, "")) for b in holding for slot in slots)}
    tool = TOOLS.get(BOOKING_TOOLS.get(domain, ""))
    wanted = [slot for slot in (tool.required if tool else ()) if slot not in ("name", "trainID")]
    return {slot for slot in wanted if not any(not is_dont_care(b.book.get(slot, "")) for b in holding)}


def _classify_unannotated(dialogue: Dialogue, domain: str, missing: set[str]) -> str:
    """A ``booked`` record whose beliefs lack a value the booking needs (a hotel's day, a
    taxi's pickup place or time): when the user's own words gave it (their dialog acts, or
    the goal's booking value in their text: "starting thurs" for thursday) the annotation
    dropped it; otherwise the human system booked without it, which the goal does not allow."""
    goal = dialogue.goal.get(domain)
    booking = dict(goal.book) if goal else {}
    for what in missing:
        slots = ("leaveAt", "arriveBy") if what == "time" else (what,)
        codes = {norm_value(ACT_SLOT.get(slot, slot)) for slot in slots}
        for turn in dialogue.turns:
            if turn.speaker != "user":
                continue
            if any(act.domain in (domain, "booking") and act.intent == "inform" and norm_value(act.slot) in codes
                   and not is_dont_care(act.value) for act in turn.dialog_acts or ()):
                return "annotation_error"
            # The text only for booking values: a taxi's time may be another domain's ("a table at 19:30").
            if any(slot in booking and _user_states(turn.text, slot, booking[slot]) for slot in slots):
                return "annotation_error"
    return "human_failure"


def _user_states(text: str, slot: str, value: str) -> bool:
    """Whether a user's text states ``value``: as whole words, a day also by its first
    three or more letters ("thurs")."""
    words = norm_value(text).split()
    wanted = norm_value(value)
    if slot == "day":
        return any(len(w) >= 3 and wanted.startswith(w) for w in words)
    return bool(wanted) and f" {wanted} " in f" {' '.join(words)} "


def _classify_not_offered(domain: str, case: _Case) -> str:
    goal = case.dialogue.goal.get(domain)
    info = dict(goal.info) if goal else {}
    if info and not case.database.search(domain, info):
        return "db_mismatch"
    if not any(call.name.endswith(domain) for _, call in gold_tool_calls(case.dialogue)):
        # Annotated constraints without a call the replay could make, or a dialogue that
        # never took the domain up (the human user left it out).
        stated = any(b.domain == domain and (_stated_values(b.semi) or b.booked) for t in case.dialogue.turns for b in t.belief_state or ())
        return "replay_agent_limits" if stated else "human_failure"
    refused = [call for _, call in case.replayed.calls
               if call.name == BOOKING_TOOLS.get(domain) and "error" in call.observation and not call.observation.get("unavailable")]
    if refused and _booked_another_route(domain, refused, case):
        return "human_failure"
    if refused:
        return "db_mismatch"  # the annotated booking names a venue or train this database lacks
    return "human_failure"


def _stated_values(values) -> dict[str, str]:
    return {k: v for k, v in values.items() if not is_dont_care(v)}


def _belief_held(dialogue: Dialogue, domain: str, slot: str, wanted: str) -> bool:
    """Did some belief state of the dialogue hold the goal's value for ``slot``?"""
    return any(
        belief.domain == domain and canonical_value(slot, belief.semi.get(slot, "")) == canonical_value(slot, wanted)
        for turn in dialogue.turns for belief in turn.belief_state or ()
    )


# --------------------------------------------------------------------------------------
# Evidence: what settles a verdict
# --------------------------------------------------------------------------------------


def evidence(problem: Reason, cause: str, dialogue: Dialogue, replayed: ReplayResult | None = None) -> dict[str, object]:
    """What settles ``problem``'s verdict, for a reviewer: the dialogue turn (index and text)
    where the wrong value was booked, named or told, or where the user asked for what never
    came; and ``missing``, the fact the dialogue lacks (the checker's reason, which names the
    value expected: "requested duration (79 minutes) was never given"). Every verdict has
    ``missing``; ``turn`` is None when no single turn settles it (nothing was ever offered)."""
    found: dict[str, object] = {"domain": problem.domain, "kind": problem.kind, "slot": problem.slot, "cause": cause,
                                "missing": problem.text, "turn": None, "text": None}
    if cause == "goal_inconsistent":
        inconsistency = goal_inconsistency(dialogue.goal, problem.domain, problem.slot or "")
        if inconsistency:
            found["missing"] = inconsistency[3]
    turn = _settling_turn(problem, dialogue, replayed)
    if turn is not None:
        found["turn"], found["text"] = turn.index, turn.text
    return found


def _settling_turn(problem: Reason, dialogue: Dialogue, replayed: ReplayResult | None):
    turns = {t.index: t for t in dialogue.turns}
    system = [t for t in dialogue.turns if t.speaker == "system"]
    if problem.kind in ("booking_value", "booked_info_mismatch", "taxi_value", "reference_not_given") and replayed is not None:
        # The system turn of the booking graded.
        for booking in reversed(replayed.state.bookings):
            if booking.domain == problem.domain and booking.success and (problem.entity in (None, booking.name, booking.reference)
                                                                        or problem.domain == "train"):
                return turns.get(booking.turn)
    if problem.kind in ("no_booking", "not_offered") and replayed is not None:
        refused = [t for t, call in replayed.calls if call.name == BOOKING_TOOLS.get(problem.domain) and call.observation and "error" in call.observation]
        if refused:
            return turns.get(refused[-1])  # the booking the annotations record, which this database refuses
    if problem.kind == "info_mismatch" and problem.entity:
        key = name_key(problem.entity)
        named = [t for t in system if f" {key} " in f" {name_key(t.text)} "]
        if named:
            return named[-1]
    if problem.kind == "request_not_given" and problem.slot:
        from pipelines.multiwoz.text import asks_about

        asked = [t for t in dialogue.turns if t.speaker == "user" and asks_about(t.text, problem.slot)]
        if asked:
            return asked[-1]  # the user's question that no system turn answered
    return None
