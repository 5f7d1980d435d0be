"""Why did a gold-replay episode fail? One cause per failing episode, for triage tables.

A failing gold replay is either a disagreement between askflow and the dataset or a
dialogue that really missed its goal. The episode is compared with an offline grading of
the same dialogue (its gold calls replayed in a fresh environment, graded on every gold
system text, without dialog acts as episodes are): when the offline grade succeeds, the user simulator cut the dialogue short or
led it elsewhere; otherwise the offline grade's first reason names the cause:

* ``simulator_ended_early``: the offline grade succeeds, the episode does not;
* ``value_normalisation``: the dataset and the goal state one value differently (a 12-hour
  time for a 24-hour one, a name with or without its article or suffix);
* ``booking_semantics``: no successful booking, wrong booking values, reference not told;
* ``requested_attributes``: the offered entity is right but a requested attribute was not
  recognised as given;
* ``cross_domain_refs``: a taxi between places other than the goal's (often the venue of
  another domain, annotated by another name);
* ``multi_entity_offers``: the entity graded as offered is not the one that fits the goal;
* ``db_mismatch``: no database entity fits the goal, or the one named is not in the database;
* ``replay_agent_limits``: the annotations imply no tool call where the dialogue plainly
  made one (a taxi booked without a belief-state record);
* ``human_failure``: the human system never offered or booked what the goal asks.
"""

from __future__ import annotations

import re

from pipelines.env.checker import GoalResult, check_goal
from pipelines.env.replay import BOOKING_TOOLS, gold_tool_calls, replay
from pipelines.env.tools import Database, ToolEnvironment, name_key
from pipelines.episodes.records import Episode
from pipelines.multiwoz.ontology import ACT_SLOT, norm_value, parse_time
from pipelines.records import Dialogue

CAUSES: tuple[str, ...] = (
    "simulator_ended_early",
    "value_normalisation",
    "booking_semantics",
    "requested_attributes",
    "cross_domain_refs",
    "multi_entity_offers",
    "db_mismatch",
    "replay_agent_limits",
    "human_failure",
)

_MISMATCH = re.compile(r"^(?P<domain>\w+): (?P<who>.+?) (?:has|with) (?P<slot>[\w ]+?) (?P<actual>.+), the goal wants (?P<wanted>.+)$")
_REQUESTED = re.compile(r"^requested (?P<slot>[\w ]+?)(?: \((?P<value>.*)\))? was never given$")
_BOOKED_WITH = re.compile(r"^booked (?P<who>.+?) with (?P<slot>people|day|time|stay) (?P<actual>.+), the goal wants (?P<wanted>.+)$")
_SEMI_SLOTS = frozenset({"day", "departure", "destination", "leaveAt", "arriveBy", "area", "pricerange", "food", "type", "stars", "internet", "parking"})
_TAXI_WORDS = re.compile(r"\b(?:taxi|cab|car)\b", re.I)


def offline_result(dialogue: Dialogue, database: Database) -> GoalResult:
    """The dialogue's gold calls replayed in a fresh environment, graded on every gold text.
    Without dialog acts, as episodes are graded: an agent produces none."""
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    return check_goal(dialogue.goal, result.state, result.system_texts, None)


def _same_modulo_normalisation(slot: str, actual: str, wanted: str) -> bool:
    a, w = parse_time(actual), parse_time(wanted)
    if a is not None and w is not None:
        return (a - w) % (12 * 60) == 0  # "03:30" written for "15:30"
    a, w = name_key(actual), name_key(wanted)
    return bool(a) and bool(w) and (a in w or w in a)


def _classify_request(domain: str, slot: str, value: str | None, dialogue: Dialogue, database: Database) -> str:
    """A requested attribute not recognised as given. The gold dialog acts say what the
    human system informed: the database's value (the checker missed it in the text), a
    value of another venue the system named that fits the goal (the checker graded the
    wrong offer), of one
    that does not (the human answered about the wrong one), a value no venue
    has (the dataset's database differs from this one), or nothing at all."""
    code = norm_value(ACT_SLOT.get(slot, slot))
    told = [act.value for turn in dialogue.turns if turn.speaker == "system" for act in turn.dialog_acts or ()
            if act.domain in (domain, "booking") and act.intent in ("inform", "recommend", "offerbooked", "book")
            and norm_value(act.slot) == code]
    if not told or value is None:
        return "requested_attributes" if told else "human_failure"
    if any(norm_value(t) == norm_value(value) or norm_value(value) in norm_value(t) for t in told):
        return "requested_attributes"
    goal = dialogue.goal.get(domain)
    info = {k: v for k, v in goal.info.items() if k != "name"} if goal else {}
    texts = " ".join(norm_value(t.text) for t in dialogue.turns if t.speaker == "system")
    fitting = {norm_value(e.get(slot)) for e in database.search(domain, info) if e.get(slot) and name_key(e.name) in texts}
    if any(norm_value(t) in fitting for t in told):
        return "multi_entity_offers"  # the human told a fitting venue's value; the checker graded another
    others = {norm_value(e.get(slot)) for e in database.entities(domain) if e.get(slot)}
    return "human_failure" if any(norm_value(t) in others for t in told) else "db_mismatch"


def _classify_no_booking(domain: str, dialogue: Dialogue, database: Database) -> str:
    """No successful booking in ``domain``: refused for ``fail_book`` (booking semantics), the
    annotated venue or train unknown to this database, a ``booked`` record whose call the
    annotations do not determine, or no booking in the annotations at all."""
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    attempts = [call for _, call in result.calls if call.name == BOOKING_TOOLS.get(domain)]
    if any(call.observation.get("unavailable") for call in attempts):
        return "booking_semantics"
    if attempts:
        return "db_mismatch"
    annotated = any(belief.domain == domain and belief.booked for turn in dialogue.turns for belief in turn.belief_state or ())
    if annotated:
        return "replay_agent_limits"
    return "human_failure"


def _belief_held(dialogue: Dialogue, domain: str, slot: str, wanted: str) -> bool:
    """Did some belief state of the dialogue hold the goal's value for ``slot``?"""
    return any(
        belief.domain == domain and norm_value(belief.semi.get(slot, "")) == norm_value(wanted)
        for turn in dialogue.turns for belief in turn.belief_state or ()
    )


def _classify_taxi_place(actual: str, wanted: str, dialogue: Dialogue, database: Database) -> str:
    """A taxi between other places than the goal's. When the goal's place is the venue of
    another of its domains and the booked one is not a venue at all ("the hotel", "home"),
    the annotation refers across domains; a different venue is the human's mistake."""
    venues = {name_key(e.name) for domain in ("restaurant", "hotel", "attraction") for e in database.entities(domain)}
    other_goal_venues = {name_key(d.info.get("name", "")) for d in dialogue.goal.domains if d.domain != "taxi"}
    if name_key(actual) not in venues and (name_key(wanted) in other_goal_venues or name_key(wanted) in venues):
        return "cross_domain_refs"
    return "human_failure"


def classify_reason(reason: str, dialogue: Dialogue, database: Database) -> str:
    """The cause of one checker reason (``"<domain>: <what is wrong>"``)."""
    domain, _, what = reason.partition(": ")
    requested = _REQUESTED.match(what)
    if requested:
        return _classify_request(domain, requested["slot"], requested["value"], dialogue, database)
    if what.startswith("requested") and "but no" in what:
        return classify_reason(f"{domain}: no {domain} was offered", dialogue, database)
    if what.startswith("no successful"):
        return _classify_no_booking(domain, dialogue, database)
    if what.startswith("reference"):
        return "booking_semantics"
    booked = _BOOKED_WITH.match(what)
    if booked:
        # The replayed booking carries the belief state's values: what the human user asked for.
        goal = dialogue.goal.get(domain)
        fail_value = goal.fail_book.get(booked["slot"]) if goal else None
        return "booking_semantics" if fail_value and norm_value(fail_value) == norm_value(booked["actual"]) else "human_failure"
    match = _MISMATCH.match(reason)
    if match:
        slot, actual, wanted = match["slot"], match["actual"], match["wanted"]
        if actual in ("unset", "unknown"):
            # A taxi booked by the other time than the goal's: the human user asked so.
            return "human_failure" if domain == "taxi" else "db_mismatch"
        if _same_modulo_normalisation(slot, actual, wanted):
            return "value_normalisation"
        if domain == "taxi":
            if parse_time(actual) is not None:
                return "human_failure"  # the human user asked for another time than the goal's
            return _classify_taxi_place(actual, wanted, dialogue, database)
        if slot in _SEMI_SLOTS and not _belief_held(dialogue, domain, slot, wanted):
            return "human_failure"  # the human dialogue never established the goal's value
        return "multi_entity_offers"
    if what == "no taxi was booked":
        said = any(t.speaker == "system" and _TAXI_WORDS.search(t.text) and re.search(r"\d{10}", t.text.replace(" ", "")) for t in dialogue.turns)
        return "replay_agent_limits" if said else "human_failure"
    if what.startswith(f"no {domain} was offered"):
        goal = dialogue.goal.get(domain)
        info = {k: v for k, v in (goal.info if goal else {}).items()}
        if info and not database.search(domain, info):
            return "db_mismatch"
        if not any(call.name.endswith(domain) for _, call in gold_tool_calls(dialogue)):
            return "replay_agent_limits"
        result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
        if any(call.name == BOOKING_TOOLS.get(domain) and "error" in call.observation and not call.observation.get("unavailable")
               for _, call in result.calls):
            return "db_mismatch"  # the annotated booking names a venue or train this database lacks
        return "human_failure"
    if what.startswith(f"no {domain} has") or "was never named" in what:
        return "db_mismatch"
    return "human_failure"


def classify(episode: Episode, dialogue: Dialogue, database: Database) -> tuple[str, tuple[str, ...]]:
    """The cause of a failing gold-replay episode (see the module docstring), with the
    reasons it rests on: the offline grade's, or the episode's when that one succeeds."""
    offline = offline_result(dialogue, database)
    if offline.success:
        return "simulator_ended_early", episode.result.reasons
    return classify_reason(offline.reasons[0], dialogue, database), offline.reasons
