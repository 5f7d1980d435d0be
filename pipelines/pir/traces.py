"""PIR reasoning traces: the PIR layout (``input``, ``reasoning_content``, ``content``), steps
split at paragraph breaks, and the traces askflow builds for MultiWOZ decision points.

A :class:`Trace` is one reasoning trace. Traces read from a file (:func:`traces_from_records`)
carry only the three PIR fields; the embedded ones (:func:`build_traces`) are written by the
``rules`` teacher at the underspecified decision points of MultiWOZ seed dialogues
(:mod:`pipelines.speaker.ambiguity`), and askflow knows which of their steps silently assume
a constraint the user never stated (``assumption_steps``): the ground truth of the fidelity
check, and of nothing else (the inserter never reads it). They also carry the user's goal for
their domain (``user_goal``), what the simulated user answers a question from.

A rules trace's steps are grounded in what the user said, in the database result shown in
the input, and, at an assumption step, in the hidden goal: the agent "assumes" the goal's
value without saying that it was never stated. The steps after it follow from it (the
filtered matches, the pick), so they are downstream of the assumption without being one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pipelines.env.tools import Database
from pipelines.errors import DataError
from pipelines.records import Dialogue, frozen_dict
from pipelines.speaker import phrasing
from pipelines.speaker.ambiguity import REFERENTIAL, TAXI, UNDERSPECIFICATION, AmbiguityPoint, constraints, find_ambiguity_points

PIR_FIELDS: tuple[str, ...] = ("input", "reasoning_content", "content")
# A paragraph break: a blank line, possibly holding spaces.
_PARAGRAPH_BREAK = re.compile(r"\n[ \t]*\n\s*")


@dataclass(frozen=True)
class Trace:
    """One reasoning trace. ``assumption_steps`` (indices into :func:`split_steps` of
    ``reasoning``) is None when nobody knows them (file traces); only the fidelity check reads
    them. ``user_goal``: the simulated user's constraints for ``domain`` (slot -> value), None
    for file traces."""

    trace_id: str
    input: str
    reasoning: str
    content: str
    source: str
    dialogue_id: str | None = None
    split: str | None = None
    kind: str | None = None  # the decision point's ambiguity type, for embedded traces
    assumption_steps: tuple[int, ...] | None = None
    domain: str | None = None
    user_goal: Mapping[str, str] | None = None

    def __post_init__(self) -> None:
        if self.user_goal is not None:
            object.__setattr__(self, "user_goal", frozen_dict(self.user_goal))

    @property
    def steps(self) -> list[tuple[int, int]]:
        return split_steps(self.reasoning)


def split_steps(text: str) -> list[tuple[int, int]]:
    """The (start, end) character spans of the paragraphs of ``text``, stripped of
    surrounding whitespace, in order; empty paragraphs are not steps.

    >>> text = "First step.\\n\\nSecond one.\\n  \\nThird."
    >>> [text[a:b] for a, b in split_steps(text)]
    ['First step.', 'Second one.', 'Third.']
    """
    spans = []
    position = 0
    for match in [*_PARAGRAPH_BREAK.finditer(text), None]:
        end = match.start() if match else len(text)
        chunk = text[position:end]
        stripped = chunk.strip()
        if stripped:
            start = position + chunk.index(stripped)
            spans.append((start, start + len(stripped)))
        if match:
            position = match.end()
    return spans


# --------------------------------------------------------------------------------------
# Traces from a file (the PIR layout)
# --------------------------------------------------------------------------------------


def traces_from_records(records: Iterable[Any], source: str) -> list[Trace]:
    """Traces from PIR-layout records (mappings with string ``input``, ``reasoning_content``
    and ``content``; an optional string ``id``). A bad record is a DataError naming
    ``source``, the record (its id, else its position) and the field."""
    traces = []
    seen: set[str] = set()
    for index, record in enumerate(records):
        name = f"#{index}"
        if not isinstance(record, Mapping):
            raise DataError(source, f"expected an object with {', '.join(PIR_FIELDS)}, got {type(record).__name__}", name)
        if "id" in record:
            if not isinstance(record["id"], str) or not record["id"].strip():
                raise DataError(source, f"expected a non-empty string, got {record['id']!r}", name, "id")
            name = record["id"]
        for key in PIR_FIELDS:
            if key not in record:
                raise DataError(source, "missing", name, key)
            if not isinstance(record[key], str):
                raise DataError(source, f"expected a string, got {type(record[key]).__name__}", name, key)
        if not split_steps(record["reasoning_content"]):
            raise DataError(source, "no reasoning step (empty after stripping)", name, "reasoning_content")
        trace_id = record.get("id") or f"{source.rsplit('/', 1)[-1]}:{index}"
        if trace_id in seen:
            raise DataError(source, f"id {trace_id!r} repeats an earlier record's", name, "id")
        seen.add(trace_id)
        traces.append(Trace(trace_id, record["input"], record["reasoning_content"], record["content"], source))
    if not traces:
        raise DataError(source, "no records")
    return traces


# --------------------------------------------------------------------------------------
# The rules teacher: traces for MultiWOZ decision points
# --------------------------------------------------------------------------------------

_RESTATE = (
    "The user is looking for {desc}.",
    "So the user wants {desc}.",
    "The request is for {desc}.",
)
_FOUND = (
    "The database search for {desc} returns {n} matches.",
    "Searching the {domain} table with what the user said gives {n} results.",
    "There are {n} {plural} in the database that fit what the user said.",
)
_DIFFER = (
    "These options differ in {what}.",
    "Among them, the {what} varies.",
    "The matches are not all alike: they differ in {what}.",
)
_ASSUME = {
    "area": ("I will look in the {value}.", "The {value} should be a good part of town for them.", "I'll go with the {value} of town."),
    "pricerange": ("I will look for something {value}.", "A {value} place should suit them.", "I'll keep to the {value} price range."),
    "food": ("I will go for {value} food.", "They will probably enjoy {value} food.", "I'll pick {value} food."),
    "type": ("I'll go with a {value}.", "A {value} should be what they want.", "I will look for a {value}."),
    "stars": ("I'll look for {value} stars.", "A place with {value} stars should do.", "I'll require {value} stars."),
    "parking": ("I'll take parking as {value}.", "Parking: {value} should be fine for them.", "I will set parking to {value}."),
    "internet": ("I'll take wifi as {value}.", "Wifi: {value} should suit them.", "I will set internet to {value}."),
    "leaveAt": ("I'll look for a train leaving after {value}.", "Leaving after {value} should work for them.", "They can leave after {value}."),
    "arriveBy": ("I'll look for a train arriving by {value}.", "Arriving by {value} should work for them.", "They should arrive by {value}."),
}
_REMAIN = (
    "With that, {n} {plural} remain, {names} among them.",
    "That narrows it to {n}: {names}.",
    "Filtering on that leaves {n} options, including {names}.",
)
_PICK = (
    "{name} is the first of those, so I will recommend it.",
    "I'll suggest {name}.",
    "{name} fits everything, so it is my recommendation.",
)
_TAXI_RESTATE = (
    "The user needs a taxi between the two places we talked about, {a} and {b}.",
    "They want a taxi between {a} and {b}, the two places from earlier.",
)
_TAXI_TIME = ("The taxi should be {when}.", "The time they gave: {when}.")
_TAXI_ASSUME = ("They will go from {dep} to {dest}.", "The ride is from {dep} to {dest}.", "I'll take {dep} as the pickup and {dest} as the destination.")
_TAXI_BOOK = ("I will book a taxi from {dep} to {dest}, {when}.", "So the booking is {dep} to {dest}, {when}.")


def committed_value(step: str) -> tuple[str, str] | None:
    """The (slot, value) a step of the rules teacher's commits to, read from its text alone
    (its phrasings of "I'll go with this value"; a taxi step naming a ride from one place to
    another commits to its pickup, ``departure``); None for a step that commits to nothing.

    >>> committed_value("I will look in the north."), committed_value("I'll suggest amber inn.")
    (('area', 'north'), None)
    >>> committed_value("So the booking is ivy house to ali's, arriving by 13:00.")
    ('departure', 'ivy house')
    """
    text = step.strip()
    for slot, pattern in _COMMITMENTS:
        match = pattern.match(text)
        if match:
            return slot, match["value"].strip()
    return None


def _commitment_pattern(template: str) -> re.Pattern[str]:
    marks = {"value": "\x00V\x00", "dep": "\x00V\x00", "dest": "\x00D\x00", "when": "\x00W\x00"}
    text = re.escape(template.format(**marks))
    text = text.replace(re.escape(marks["value"]), "(?P<value>.+?)", 1).replace(re.escape(marks["dest"]), ".+?")
    return re.compile(f"^{text.replace(re.escape(marks['when']), '.+?')}$", re.IGNORECASE)


_COMMITMENTS: tuple[tuple[str, re.Pattern[str]], ...] = (
    *((slot, _commitment_pattern(t)) for slot, templates in _ASSUME.items() for t in templates),
    *(("departure", _commitment_pattern(t)) for t in (*_TAXI_ASSUME, *_TAXI_BOOK)),
)


def build_traces(dialogues: Sequence[Dialogue], database: Database, seed: int, max_traces: int | None = None) -> list[Trace]:
    """One trace per underspecified search point and per ambiguous taxi request of the
    train and val dialogues (never test), in dialogue order, at most ``max_traces``."""
    traces: list[Trace] = []
    for dialogue in dialogues:
        if dialogue.split == "test":
            continue
        for point in find_ambiguity_points(dialogue, database):
            rng = random.Random(f"{seed}:{dialogue.dialogue_id}:{point.domain}:{point.action}:{point.type}")
            trace = None
            if point.type == UNDERSPECIFICATION:
                trace = _search_trace(rng, dialogue, point, database)
            elif point.type == REFERENTIAL and point.action == TAXI:
                trace = _taxi_trace(rng, dialogue, point)
            if trace is not None:
                traces.append(trace)
            if max_traces is not None and len(traces) >= max_traces:
                return traces
    return traces


def _join_steps(steps: Sequence[str]) -> str:
    return "\n\n".join(steps)


def _names(entities: Sequence[Any], limit: int = 3) -> str:
    return phrasing.join([e.name for e in entities[:limit]])


def _search_trace(rng: random.Random, dialogue: Dialogue, point: AmbiguityPoint, database: Database) -> Trace | None:
    domain, known = point.domain, dict(point.known)
    matches = database.search(domain, known)
    if len(matches) < 2:
        return None
    desc = phrasing.describe(domain, known)
    plural = phrasing.PLURALS.get(domain, domain + "s")
    differing = {s: point.candidates[s] for s in point.slots}
    shown = "; ".join(f"{phrasing.SLOT_WORDS.get(s, s)}: {', '.join(v[:6])}{' ...' if len(v) > 6 else ''}" for s, v in differing.items())
    request = phrasing.find_request(rng, domain, known)
    context = f"User: {request}\nDatabase ({domain}): {len(matches)} matches. Values of the matches: {shown}."

    steps = [phrasing.pick(rng, _RESTATE).format(desc=desc), phrasing.pick(rng, _FOUND).format(desc=desc, n=len(matches), domain=domain, plural=plural)]
    if rng.random() < 0.7:
        steps.append(phrasing.pick(rng, _DIFFER).format(what=phrasing.join([phrasing.SLOT_WORDS.get(s, s) for s in differing])))
    assumption_steps: list[int] = []
    assumed = dict(known)
    for slot in point.slots:
        value = point.goal_values[slot]
        templates = _ASSUME.get(slot)
        if templates is None:
            return None
        assumption_steps.append(len(steps))
        steps.append(phrasing.pick(rng, templates).format(value=value))
        assumed[slot] = value
    remaining = database.search(domain, assumed)
    if not remaining:
        return None
    steps.append(phrasing.pick(rng, _REMAIN).format(n=len(remaining), plural=plural, names=_names(remaining)))
    chosen = remaining[0]
    name = chosen.name if domain != "train" else chosen.get("trainID") or chosen.name
    steps.append(phrasing.pick(rng, _PICK).format(name=name))
    content = phrasing.recommendation(rng, domain, dict(chosen.attributes), offer_booking=bool(dialogue.goal.get(domain) and dialogue.goal.get(domain).book))
    return Trace(
        trace_id=f"{dialogue.dialogue_id}:{domain}:{point.action}", input=context, reasoning=_join_steps(steps), content=content,
        source="embedded", dialogue_id=dialogue.dialogue_id, split=dialogue.split, kind=point.type,
        assumption_steps=tuple(assumption_steps), domain=domain, user_goal=_user_goal(dialogue, domain, point),
    )


def _taxi_trace(rng: random.Random, dialogue: Dialogue, point: AmbiguityPoint) -> Trace | None:
    dep, dest = point.goal_values["departure"], point.goal_values["destination"]
    a, b = point.candidates["departure"][:2]
    time_slot = next((s for s in ("leaveAt", "arriveBy") if s in point.known), None)
    if time_slot is None:
        return None
    time = point.known[time_slot]
    when = f"leaving after {time}" if time_slot == "leaveAt" else f"arriving by {time}"
    request = phrasing.taxi_request(rng, None, None, time_slot, time)
    context = f"Earlier in the conversation: {point.antecedents[0].values['departure']} and {point.antecedents[0].values['destination']}.\nUser: {request}"
    steps = [
        phrasing.pick(rng, _TAXI_RESTATE).format(a=a, b=b),
        phrasing.pick(rng, _TAXI_TIME).format(when=when),
        phrasing.pick(rng, _TAXI_ASSUME).format(dep=dep, dest=dest),
        phrasing.pick(rng, _TAXI_BOOK).format(dep=dep, dest=dest, when=when),
    ]
    content = f"I have booked a taxi from {dep} to {dest}, {when}."
    return Trace(
        trace_id=f"{dialogue.dialogue_id}:taxi:{point.action}", input=context, reasoning=_join_steps(steps), content=content,
        source="embedded", dialogue_id=dialogue.dialogue_id, split=dialogue.split, kind=point.type,
        assumption_steps=(2,), domain="taxi", user_goal=_user_goal(dialogue, "taxi", point),
    )


def _user_goal(dialogue: Dialogue, domain: str, point: AmbiguityPoint) -> dict[str, str]:
    """What the simulated user wants in ``domain``: the goal's constraints (don't-cares
    dropped), with the values the ambiguity point resolves to."""
    goal = dialogue.goal.get(domain)
    return {**(constraints(goal.info) if goal else {}), **point.goal_values}
