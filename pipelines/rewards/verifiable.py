"""A verifiable clarification judge: does the question target what is actually ambiguous?

SpeakER's clarifications resolve referential ambiguity: at a decision point several
database entities still fit what the user said, and they differ in some slots (section
3.1). The dataset records which, so a question's relevance can be checked by rule instead
of by an LLM.

Dataset columns (one value per row; TRL hands them to the reward function as lists)
--------------------------------------------------------------------------------------

``discriminating_slots`` (required): ``list[str]``, or a JSON string of one
    The slots whose value tells the remaining candidates apart at this decision point. An
    empty list means nothing is ambiguous there: every question then scores 0.
``candidate_values`` (optional): ``{slot: list[str]}``, or a JSON string of one
    The values the candidates take in those slots (``{"area": ["north", "centre"]}``).
    ``None`` values (what an Arrow struct column holds for a key a row lacks) are skipped.
``known_slots`` (optional): ``list[str]``, or ``{slot: value}`` (the slots are its keys
    whose value is not None), or a JSON string of either
    The slots the user has already given at this decision point.

Slot names are MultiWOZ's, bare (``area``) or as belief-state keys (``hotel-area``,
``hotel-book-people``): the domain and ``book`` parts are dropped and case is ignored
(``leaveat`` is ``leaveAt``). A name outside the ontology's constraint slots is a
:class:`~pipelines.errors.DataError`, so that a typo cannot silently never match. The
goal (``goal``) is not read: what is ambiguous is the decision point's business, not the
whole task's.

The rule
--------

A question *asks about* a slot when it uses one of the slot's words ("price range",
"budget", "part of town", "how many people", "wifi", "leaving from" ...: :data:`SLOT_CUES`)
or when it names at least two values of the slot: a choice ("the north or the centre?",
"cheap or expensive?"). The values are the row's ``candidate_values`` plus the ontology's
closed sets (areas, price ranges, days), matched after :func:`norm_value` as whole words,
longest first ("north american" food is not the north). A single value is context or a
guess ("a table at the cheap one in the north?"), not a question about the slot.

========  =======================================================================
score     when
========  =======================================================================
1         it asks about a discriminating slot, and about no known slot
0         it asks about a known slot (even next to a good question: re-asking
          what the user said is the rubric's non-constructive question, and a free
          pass would let the policy pad questions), or about no discriminating
          slot (irrelevant)
========  =======================================================================

A slot that is both known and discriminating (the same bare name in two domains, "day"
of a hotel and of a train) counts as discriminating.

Limits: this is lexical matching. "When" alone is not a cue (it may mean a day, a time, a
departure or an arrival). A question listing many unknown slots at once is credited if one
of them discriminates; the LLM judge's "specificity" is what penalises that.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping, Sequence

from pipelines.errors import DataError
from pipelines.multiwoz.ontology import AREAS, BOOK_SLOTS, DAYS, INFO_SLOTS, PRICERANGES, norm_value
from pipelines.records import frozen_dict
from pipelines.rewards.clarify import Clarification, ClarifyReward, Verdict

DISCRIMINATING_SLOTS = "discriminating_slots"
CANDIDATE_VALUES = "candidate_values"
KNOWN_SLOTS = "known_slots"

TARGETS_DISCRIMINATING = "targets_discriminating_slot"
ASKS_KNOWN = "asks_known_slot"
IRRELEVANT = "irrelevant"

#: Every slot a user can constrain: the ontology's search and booking slots.
CONSTRAINT_SLOTS: tuple[str, ...] = tuple(
    dict.fromkeys(slot for slots in (*INFO_SLOTS.values(), *BOOK_SLOTS.values()) for slot in slots)
)
_CANONICAL: Mapping[str, str] = frozen_dict({slot.lower(): slot for slot in CONSTRAINT_SLOTS})


def _cues(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


#: Phrases by which a question asks about each slot, matched on :func:`words` text (lower
#: case, no punctuation, apostrophes gone). Look-aheads keep neighbouring slots apart: "what
#: kind of food" is food, not type; "leaving from" is the departure place, not the time.
SLOT_CUES: Mapping[str, tuple[re.Pattern[str], ...]] = frozen_dict({
    "food": _cues(r"\b(?:food|cuisine|cuisines|dishes)\b"),
    "pricerange": _cues(r"\b(?:price ?range|price|prices|priced|budget|cost|spend)\b"),
    "area": _cues(
        r"\b(?:area|areas|location|neighbou?rhood)\b",
        r"\b(?:part|side) of (?:town|the city|cambridge)\b",
        r"\bwhere in (?:town|the city|cambridge)\b",
    ),
    "name": _cues(
        r"\b(?:name|called)\b",
        r"\bwhich one\b",
        r"\b(?:particular|specific) (?:restaurant|hotel|guest ?house|attraction|place|venue|one)\b",
    ),
    "type": _cues(
        r"\b(?:type|kind|sort)\b(?! of (?:food|cuisine|dishes))",
        r"\bhotel or (?:a )?guest ?house\b",
        r"\bguest ?house or (?:a )?hotel\b",
    ),
    "stars": _cues(r"\b(?:stars?|rating|rated)\b"),
    "parking": _cues(r"\bpark(?:ing)?\b"),
    "internet": _cues(r"\b(?:internet|wifi|wi fi)\b"),
    "people": _cues(
        r"\bhow many\b(?! (?:nights|days|stars))",
        r"\b(?:people|persons|guests|party|group|travell?ers|passengers)\b",
    ),
    "day": _cues(r"\b(?:day|date)\b"),
    "time": _cues(r"\btime\b"),
    "stay": _cues(r"\b(?:nights?|how long|length of (?:your |the )?stay|how many days)\b"),
    "departure": _cues(
        r"\b(?:leaving|departing|depart|travell?ing|coming|starting|leave|setting off|going) from\b",
        r"\bfrom where\b",
        r"\bwhere\b(?: \w+){0,6} from\b",
        r"\b(?:departure (?:station|point|location|place)|starting point|origin)\b",
        r"\bpick (?:you )?up\b(?! time)",
        r"\bpickup\b(?! time)",
    ),
    "destination": _cues(
        r"\b(?:destination|where to|to where)\b",
        r"\b(?:going|heading|travell?ing|headed) to\b(?! (?:need|want|be|book|have|stay))",
        r"\bwhere\b(?: \w+){0,6} (?:going|heading|go|travell?ing|headed)\b",
        r"\bdrop (?:you )?off\b",
    ),
    "leaveAt": _cues(
        r"\b(?:leave|leaving|depart|departing|departure time|set off|setting off)\b(?! from)",
        r"\bpick ?(?:you )?up time\b",
    ),
    "arriveBy": _cues(r"\b(?:arrive|arriving|arrival|be there|get there)\b"),
    "department": _cues(r"\b(?:department|ward|unit)\b"),
})
# "What time would you like to leave?" is about the departure time: a reservation time is
# only read when no travel time is.
_TRAVEL_TIMES = frozenset({"leaveAt", "arriveBy"})

#: Slots whose every value the ontology lists; their values count even when the row's
#: ``candidate_values`` does not name them.
CLOSED_VALUES: Mapping[str, tuple[str, ...]] = frozen_dict({"area": AREAS, "pricerange": PRICERANGES, "day": DAYS})
#: Other ways of writing a value: {slot: {phrase: value}}.
VALUE_SYNONYMS: Mapping[str, Mapping[str, str]] = frozen_dict({
    "area": frozen_dict({"center": "centre", "city centre": "centre", "city center": "centre", "town centre": "centre"}),
    "pricerange": frozen_dict({"moderately priced": "moderate", "mid range": "moderate", "inexpensive": "cheap"}),
    "type": frozen_dict({"guest house": "guesthouse", "bed and breakfast": "guesthouse"}),
})

_WORD = re.compile(r"[a-z0-9]+")


def words(text: object) -> str:
    """``norm_value`` text as runs of letters and digits separated by single spaces."""
    return " ".join(_WORD.findall(norm_value(text)))


def canonical_slot(name: str) -> str:
    """``hotel-book-people`` -> ``people``; ``leaveat`` -> ``leaveAt``. ValueError for a
    name outside :data:`CONSTRAINT_SLOTS`."""
    bare = name.rsplit("-", 1)[-1].strip().lower()
    if bare not in _CANONICAL:
        raise ValueError(f"unknown slot {name!r}; slots: {', '.join(CONSTRAINT_SLOTS)}")
    return _CANONICAL[bare]


def _named_values(padded: str, values: Mapping[str, Sequence[str]]) -> dict[str, set[str]]:
    """{slot: values named} in `` words `` text, longest phrase first, each stretch of text
    read once."""
    phrases: list[tuple[str, str, str]] = []  # (phrase, slot, value)
    for slot, slot_values in values.items():
        for value in slot_values:
            phrases.append((words(value), slot, norm_value(value)))
        for phrase, value in VALUE_SYNONYMS.get(slot, {}).items():
            phrases.append((words(phrase), slot, value))
    named: dict[str, set[str]] = {}
    for phrase, slot, value in sorted(phrases, key=lambda p: -len(p[0])):
        needle = f" {phrase} "
        if phrase and needle in padded:
            named.setdefault(slot, set()).add(value)
            padded = padded.replace(needle, " | ")  # a shorter phrase must not re-read it
    return named


def asked_slots(question: str, candidate_values: Mapping[str, Sequence[str]] | None = None) -> frozenset[str]:
    """The slots ``question`` asks about (see the module docstring): cue words, or a choice
    between two or more values of a slot."""
    padded = f" {words(question)} "
    cued = {slot for slot, patterns in SLOT_CUES.items() if any(p.search(padded) for p in patterns)}
    if cued & _TRAVEL_TIMES:
        cued.discard("time")
    values: dict[str, list[str]] = {slot: list(v) for slot, v in CLOSED_VALUES.items()}
    for slot, slot_values in (candidate_values or {}).items():
        values.setdefault(slot, []).extend(slot_values)
    choices = {slot for slot, named in _named_values(padded, values).items() if len(named) >= 2}
    return frozenset(cued | choices)


class VerifiableJudge:
    """Scores 1 when the question asks about a discriminating slot and about no known slot,
    0 otherwise (module docstring). Stateless; a bad column value raises DataError."""

    name = "verifiable"
    columns: tuple[str, ...] = (DISCRIMINATING_SLOTS, CANDIDATE_VALUES, KNOWN_SLOTS)

    def __repr__(self) -> str:
        return "VerifiableJudge()"

    def judge(self, clarifications: Sequence[Clarification]) -> list[Verdict]:
        return [self.verdict(c.question, c.columns) for c in clarifications]

    def verdict(self, question: str, columns: Mapping[str, Any]) -> Verdict:
        if columns.get(DISCRIMINATING_SLOTS) is None:
            raise _column_error(DISCRIMINATING_SLOTS, "the verifiable judge needs a value (a list, possibly empty)")
        discriminating = set(_slot_list(columns[DISCRIMINATING_SLOTS], DISCRIMINATING_SLOTS))
        known = set(_slot_list(columns.get(KNOWN_SLOTS), KNOWN_SLOTS)) - discriminating
        asked = asked_slots(question, _candidate_values(columns.get(CANDIDATE_VALUES)))
        if asked & known:
            return Verdict(0.0, ASKS_KNOWN)
        if asked & discriminating:
            return Verdict(1.0, TARGETS_DISCRIMINATING)
        return Verdict(0.0, IRRELEVANT)


# --------------------------------------------------------------------------------------
# Column values
# --------------------------------------------------------------------------------------


def _column_error(column: str, message: str) -> DataError:
    return DataError("clarify reward dataset row", message, field=column)


def _decoded(value: Any, column: str) -> Any:
    """A column value, with a JSON string decoded (Arrow cannot hold a mapping with
    row-dependent keys, so datasets may store these columns as JSON)."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError as exc:
        raise _column_error(column, f"not valid JSON ({exc.msg} at character {exc.pos}): {value!r}") from None


def _slots(names: Any, column: str) -> list[str]:
    if isinstance(names, (str, bytes)) or not isinstance(names, Sequence) or not all(isinstance(n, str) for n in names):
        raise _column_error(column, f"expected a list of slot names, got {names!r}")
    try:
        return [canonical_slot(name) for name in names]
    except ValueError as exc:
        raise _column_error(column, str(exc)) from None


def _slot_list(value: Any, column: str) -> list[str]:
    value = _decoded(value, column)
    if isinstance(value, Mapping):
        # A belief-state-like {slot: value}: its slots. None marks a key the row lacks.
        value = [slot for slot, slot_value in value.items() if slot_value is not None]
    return [] if value is None else _slots(value, column)


def _candidate_values(value: Any) -> dict[str, list[str]]:
    value = _decoded(value, CANDIDATE_VALUES)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise _column_error(CANDIDATE_VALUES, f"expected a mapping slot -> list of values, got {value!r}")
    candidates: dict[str, list[str]] = {}
    for slot, values in value.items():
        if values is None:
            continue
        if isinstance(values, (str, bytes)) or not isinstance(values, Sequence):
            raise _column_error(CANDIDATE_VALUES, f"values of {slot!r} must be a list, got {values!r}")
        (name,) = _slots([slot], CANDIDATE_VALUES)
        candidates.setdefault(name, []).extend(str(v) for v in values if v is not None)
    return candidates


clarify_verifiable = ClarifyReward(VerifiableJudge())
clarify_verifiable.__doc__ = """SpeakRL's clarification reward: 1 for a question about a discriminating slot and no known slot, else 0.

>>> think = "<think>Three hotels match; they differ in area.</think>"
>>> clarify_verifiable(["p"] * 3, [think + "<clarify>Which area?</clarify>", think + "<clarify>Which hotel?</clarify>", think],
...                    discriminating_slots=[["area"]] * 3, known_slots=[[]] * 3)
[1.0, 0.0, 0.0]
"""

#: The registered reward's example, run by doctest (an instance's docstring is not collected).
__test__ = {"clarify_verifiable": clarify_verifiable.__doc__}
