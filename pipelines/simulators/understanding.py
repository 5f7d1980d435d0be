"""What a rule-based user understands of an agent's utterance.

Shallow on purpose, like the agenda-based user simulators of the MultiWOZ literature: the
agent's text is matched against the database (venue names, train ids, attribute values)
and against a few phrase patterns (questions about slots, "no matches", "fully booked",
booking references). The user only needs to notice what concerns its own goal, and it can
check every claim against the database, so no parse of the agent's grammar is needed.

Text is compared in one normal form, ``words`` (:mod:`pipelines.multiwoz.text`, shared with
the goal checker): ``norm_value`` (lower case, no apostrophes, "&" as "and"), then runs of
letters and digits separated by single spaces. Phrases are matched as whole words by
padding both sides with spaces; whether an attribute was given is the checker's own test.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Mapping, Sequence

from pipelines.env.tools import Database
from pipelines.multiwoz.ontology import AREAS, BOOK_SLOTS, DAYS, INFO_SLOTS, PRICERANGES, VALUE_SYNONYMS, norm_value, possessive_split
from pipelines.multiwoz.text import UNKNOWN_VALUES, TextView, clock_times, states, train_ids, words
from pipelines.records import Entity

_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")
# Booking references: 8 upper-case letters/digits as the tool environment issues them, or
# 8 letters/digits with a digit among them right after the word "reference" (agents may
# lower-case them; the digit keeps "reference number is provided" from reading as one).
_REFERENCE_TOKEN = re.compile(r"(?<![A-Za-z0-9])[A-Z0-9]{8}(?![A-Za-z0-9])")
_REFERENCE_AFTER_WORD = re.compile(
    r"\b(?:reference|ref)\b(?:\s*(?:number|no|code))?(?:\s*(?:is|was|:|#|-))*\s*((?=[A-Za-z]*\d)[A-Za-z0-9]{8})(?![A-Za-z0-9])", re.I
)
_TRAIN_ID = re.compile(r"\btr\s?-?(\d{4})\b", re.I)
# A phone number once the spaces and dashes between its digits are gone.
_PHONE = re.compile(r"(?<!\d)0\d{9,10}(?!\d)")
_DIGIT_GAP = re.compile(r"(?<=\d)[\s-](?=\d)")


def _padded(text: object) -> str:
    return f" {words(text)} "


def _any(patterns: Sequence[re.Pattern[str]], text: str) -> bool:
    return any(p.search(text) for p in patterns)


def _compile(*patterns: str) -> tuple[re.Pattern[str], ...]:
    return tuple(re.compile(p) for p in patterns)


# The agent found nothing. Patterns run on ``words`` (apostrophes gone: "dont", "couldnt").
_NO_OFFER = _compile(
    r"\bno\b(?: \w+){0,5} (?:match|matches|matching|matched)\b",
    r"\bsorry\b(?: \w+){0,6} there (?:are|is|were|was) (?:no|not any)\b",
    r"\bthere (?:are|were) no\b",
    r"\bunfortunately\b(?: \w+){0,8} (?:nothing|no|none|not find|cannot find|cant find|couldnt find|could not find|dont have|do not have)\b",
    r"\b(?:couldnt|could not|cant|cannot|can not|unable to|was not able to|wasnt able to) (?:find|locate)\b",
    r"\bno (?:results|options|matches|such)\b",
    r"\bnothing (?:matches|matching|like that|fits|available|that fits|that matches)\b",
    r"\b(?:dont|do not) have anything\b",
    r"\bnone (?:of them|that|which|match)\b",
)
# A booking the user asked for did not go through.
_NO_BOOK = _compile(
    r"\bno availability\b",
    r"\bunsuccessful\b",
    r"\bfully booked\b",
    r"\bbooked up\b",
    r"\bnot available\b",
    r"\bunavailable\b",
    r"\b(?:booking|reservation) (?:failed|was not|wasnt|could not|couldnt|did not|didnt)\b",
    r"\b(?:unable|not able) to (?:book|reserve|make)\b",
    r"\b(?:couldnt|could not|cant|cannot|can not) (?:book|reserve|make (?:the|a|that) (?:booking|reservation))\b",
    r"\bno (?:rooms|tables|seats|tickets|space) (?:available|left)\b",
)
# Sentences that ask something without a question mark.
_REQUEST_CUES = _compile(
    r"^(?:please )?(?:tell|let) me\b", r"\blet me know\b", r"\bplease (?:specify|provide|tell|confirm|choose|select|share)\b",
    r"\bcould you (?:tell|let|specify|confirm|share)\b", r"\b(?:do you have|any) (?:a )?preference\b",
)
_ASKS_BOOKING = re.compile(r"\b(?:book|booking|reserve|reservation|tickets?)\b")

# Per slot, phrases by which an agent asks about it. A question about departure ("where are
# you leaving from") must not read as one about the departure time, hence the look-aheads.
_SLOT_CUES: dict[str, tuple[re.Pattern[str], ...]] = {
    "food": _compile(r"\b(?:food|cuisine|cuisines|dishes)\b"),
    "pricerange": _compile(r"\b(?:price ?range|price|prices|priced|budget|cost)\b"),
    "area": _compile(r"\b(?:area|areas|part of (?:town|the city|cambridge)|side of (?:town|the city)|location|neighbou?rhood|where in)\b"),
    "name": _compile(r"\bname\b", r"\b(?:particular|specific) (?:restaurant|hotel|guest ?house|attraction|place|venue|one)\b"),
    "type": _compile(r"\b(?:type|kind|sort)\b(?! of (?:food|cuisine))", r"\bhotel or (?:a )?guest ?house\b", r"\bguest ?house or (?:a )?hotel\b"),
    "stars": _compile(r"\b(?:stars?|rating|rated)\b"),
    "parking": _compile(r"\bpark(?:ing)?\b"),
    "internet": _compile(r"\b(?:internet|wifi|wi fi)\b"),
    "people": _compile(r"\bhow many\b(?! (?:nights|days|stars))", r"\b(?:people|persons|guests|party|group|travell?ers|passengers)\b",
                       r"\btickets?\b"),
    "day": _compile(r"\b(?:day|days|date|night of the week)\b", r"\bwhich (?:monday|tuesday|wednesday|thursday|friday|saturday|sunday)\b"),
    "time": _compile(r"\b(?:what time|time)\b"),
    "stay": _compile(r"\b(?:nights?|how long|length of (?:your |the )?stay)\b"),
    "departure": _compile(r"\b(?:leaving|departing|depart|travell?ing|coming|starting|leave|setting off) from\b", r"\bfrom where\b",
                          r"\bwhere\b(?: \w+){0,6} from\b", r"\bdeparture (?:station|point|location|place)\b",
                          r"\bpick (?:you )?up\b(?! time)", r"\bpickup\b(?! time)", r"\bstarting point\b"),
    "destination": _compile(r"\bdestination\b", r"\bwhere to\b", r"\bto where\b", r"\b(?:going|heading|travell?ing) to\b(?! (?:need|want|be|book|have|stay))",
                            r"\bwhere\b(?: \w+){0,6} (?:going|heading|go|travell?ing|headed)\b", r"\bdrop (?:you )?off\b",
                            r"\bwhere\b(?: \w+){0,4} take you\b"),
    "leaveAt": _compile(r"\b(?:leave|leaving|depart|departing|departure time|set off)\b(?! from)", r"\bpick ?(?:you )?up time\b"),
    "arriveBy": _compile(r"\b(?:arrive|arriving|arrival|be there|get there|get to)\b"),
    "department": _compile(r"\b(?:department|ward|unit|specialty)\b"),
}
# "When ...?" / "What time ...?" without "leave" or "arrive": the domain decides what it is about.
_WHEN = re.compile(r"\b(?:when|what time)\b")
# Synonyms an agent may use for a database value.
_VALUE_SYNONYMS = VALUE_SYNONYMS
# Values the database does not know ("?"): never offered as choices.
_UNKNOWN = UNKNOWN_VALUES
# Taxi makes when the database lists none (the official taxi_db.json's).
_DEFAULT_TAXI_TYPES = ("toyota", "skoda", "bmw", "honda", "ford", "audi", "lexus", "volvo", "volkswagen", "tesla")


def constraint_slots(domain: str) -> tuple[str, ...]:
    """Slots an agent may ask a user about in ``domain``: search constraints, then booking slots."""
    return INFO_SLOTS.get(domain, ()) + BOOK_SLOTS.get(domain, ())


@dataclass(frozen=True)
class Reading:
    """One agent utterance, pre-processed once for every check."""

    text: str
    padded: str  # " words " of the whole text
    compact: str  # words without spaces: "cb2 1tn" and "cb21tn" both read "cb21tn"
    questions: tuple[str, ...]  # " words " of each sentence that asks something
    times: frozenset[int]  # clock times mentioned, in minutes
    references: tuple[str, ...]  # candidate booking references, in order
    says_reference: bool  # the text talks about a reference number
    train_ids: tuple[str, ...]  # "TR1234", in order
    phones: tuple[str, ...]
    no_offer: bool
    no_book: bool
    view: TextView  # what :func:`pipelines.multiwoz.text.states` reads, shared with the goal checker

    def mentions(self, phrase: object) -> bool:
        needle = words(phrase)
        return bool(needle) and f" {needle} " in self.padded

    @property
    def asks_booking(self) -> bool:
        """Some question is about booking ("Shall I book it?", "Would you like tickets?")."""
        return any(_ASKS_BOOKING.search(q) for q in self.questions)


def read(text: str) -> Reading:
    """Everything about ``text`` that needs no database."""
    padded = _padded(text) + _padded(possessive_split(text))  # both forms of possessives
    sentences = [s.strip() for s in _SENTENCE_END.split(text) if s.strip()]
    questions = tuple(
        _padded(s) for s in sentences if s.endswith("?") or _any(_REQUEST_CUES, words(s))
    )
    references = [m.group(0) for m in _REFERENCE_TOKEN.finditer(text)]
    references += [m.group(1).upper() for m in _REFERENCE_AFTER_WORD.finditer(text)]
    digits = _DIGIT_GAP.sub("", text)
    return Reading(
        text=text,
        padded=padded,
        compact=padded.replace(" ", ""),
        questions=questions,
        times=clock_times(text),
        references=tuple(dict.fromkeys(references)),
        says_reference=bool(re.search(r"\b(?:reference|ref|confirmation)\b", padded)),
        train_ids=train_ids(text),
        phones=tuple(dict.fromkeys(_PHONE.findall(digits))),
        no_offer=_any(_NO_OFFER, padded),
        no_book=_any(_NO_BOOK, padded),
        view=TextView.of(text),
    )


def _find_phrases(text: str, phrases: Mapping[str, tuple[str, str]]) -> list[tuple[int, int, str, str]]:
    """Whole-word occurrences (start, end, slot, value) of ``phrases`` ({phrase: (slot,
    value)}) in padded ``text``, longest first with overlaps removed: "modern european"
    is one food, not "european" as well; "north american" is not the north."""
    hits = []
    for phrase, (slot, value) in phrases.items():
        needle = f" {phrase} "
        start = text.find(needle)
        while start >= 0:
            hits.append((start, start + len(needle) - 1, slot, value))
            start = text.find(needle, start + 1)
    hits.sort(key=lambda h: (-(h[1] - h[0]), h[0]))
    kept: list[tuple[int, int, str, str]] = []
    for hit in hits:
        if all(hit[1] <= k[0] or hit[0] >= k[1] for k in kept):
            kept.append(hit)
    return sorted(kept)


class AgentReader:
    """Database-aware understanding: which entities an utterance names, which slots it asks
    about (with the candidate values it offers), whether it gives an attribute's value.
    Built once per simulator from the shared read-only database."""

    def __init__(self, database: Database):
        self.database = database
        self._names: dict[str, tuple[tuple[str, Entity], ...]] = {}
        for domain in ("restaurant", "hotel", "attraction", "police", "hospital"):
            names: list[tuple[str, Entity]] = []
            for entity in database.entities(domain):
                for phrase in _name_phrases(entity.name):
                    names.append((phrase, entity))
            # Longest first, so that "pizza express fen ditton" is found before "pizza express".
            self._names[domain] = tuple(sorted(names, key=lambda item: -len(item[0])))
        # Real systems often answer "what is the number of X?" with the number alone: a
        # phone number or street address identifies a venue as well as its name does.
        self._identifiers: dict[str, tuple[tuple[str, str, Entity], ...]] = {}
        for domain in ("restaurant", "hotel", "attraction"):
            found = []
            for entity in database.entities(domain):
                phone, address = words(entity.get("phone") or "").replace(" ", ""), words(entity.get("address") or "")
                if len(phone) >= 10:
                    found.append(("phone", phone, entity))
                if len(address.split()) >= 3:
                    found.append(("address", address, entity))
            self._identifiers[domain] = tuple(found)
        self._values = {domain: self._value_phrases(domain) for domain in INFO_SLOTS}
        taxi_types = database.taxi_options.get("taxi_types") or _DEFAULT_TAXI_TYPES
        self._taxi_types = tuple(words(t) for t in taxi_types)

    def _value_phrases(self, domain: str) -> dict[str, tuple[str, str]]:
        """{phrase: (slot, value)}: the values an agent may offer as choices in ``domain``."""
        phrases: dict[str, tuple[str, str]] = {}
        for slot in ("food", "type", "department"):
            if slot in INFO_SLOTS[domain]:
                for entity in self.database.entities(domain):
                    value = entity.get(slot)
                    if value and norm_value(value) not in _UNKNOWN:
                        phrases[words(value)] = (slot, norm_value(value))
        if domain == "hotel":
            phrases.update({"hotel": ("type", "hotel"), "guesthouse": ("type", "guesthouse")})
        fixed = {"area": AREAS, "pricerange": PRICERANGES, "day": DAYS}
        for slot, values in fixed.items():
            if slot in constraint_slots(domain):
                phrases.update({value: (slot, value) for value in values})
        known_types = {value for _, (slot, value) in phrases.items() if slot == "type"}
        for slot, synonyms in _VALUE_SYNONYMS.items():
            if slot in INFO_SLOTS[domain]:
                phrases.update({phrase: (slot, value) for phrase, value in synonyms.items() if slot != "type" or value in known_types})
        return phrases

    # -- entities -------------------------------------------------------------------------

    def named(self, reading: Reading, domain: str) -> list[Entity]:
        """Entities of ``domain`` the utterance names, in order of first mention. For trains,
        every timetable entry with a mentioned id (ids repeat across days)."""
        if domain == "train":
            return [train for train_id in reading.train_ids for train in self.database.named("train", train_id)]
        found: list[tuple[int, Entity]] = []
        claimed: list[tuple[int, int]] = []
        for phrase, entity in self._names.get(domain, ()):
            position = reading.padded.find(f" {phrase} ")
            if position < 0:
                continue
            span = (position, position + len(phrase) + 1)
            if any(span[0] >= s and span[1] <= e for s, e in claimed):
                continue  # inside a longer name already found
            claimed.append(span)
            if all(entity is not e for _, e in found):
                found.append((position, entity))
        if not found:
            for kind, value, entity in self._identifiers.get(domain, ()):
                position = reading.compact.find(value) if kind == "phone" else reading.padded.find(f" {value} ")
                if position >= 0 and all(entity is not e for _, e in found):
                    found.append((position, entity))
        return [entity for _, entity in sorted(found, key=lambda item: item[0])]

    def names_any(self, padded: str, domain: str) -> bool:
        if domain == "train":
            return bool(_TRAIN_ID.search(padded))
        return any(f" {phrase} " in padded for phrase, _ in self._names.get(domain, ()))

    # -- questions ------------------------------------------------------------------------

    def asked(self, reading: Reading, domain: str) -> dict[str, tuple[str, ...]]:
        """Slots of ``domain`` the agent asks about, each with the candidate values it names
        ("the north or the centre?" -> {"area": ("north", "centre")}).

        A question that names an entity ("How about the golden curry?") is an offer, not a
        question about slots: the values in it describe the entity."""
        slots = constraint_slots(domain)
        asked: dict[str, tuple[str, ...]] = {}
        for question in reading.questions:
            if self.names_any(question, domain):
                continue
            cued = [slot for slot in slots if _any(_SLOT_CUES[slot], question)]
            if not any(s in cued for s in ("time", "leaveAt", "arriveBy")) and _WHEN.search(question):
                cued += [s for s in _when_slots(domain) if s not in cued]
            candidates: dict[str, list[str]] = {}
            for _, _, slot, value in _find_phrases(question, self._values.get(domain, {})):
                if slot in slots and value not in candidates.setdefault(slot, []):
                    candidates[slot].append(value)
            if "stars" in cued:
                candidates["stars"] = re.findall(r"\b([0-5])\b", question)  # "3 or 4 stars?"
            for slot, values in candidates.items():
                # A lone value counts when the question is about that slot, or about nothing
                # else: "Would you like something in the north?". Two values are a choice.
                if values and (slot in cued or len(values) >= 2 or (not cued and len(candidates) == 1)):
                    asked[slot] = tuple(dict.fromkeys(asked.get(slot, ()) + tuple(values)))
            for slot in cued:
                asked.setdefault(slot, ())
        return asked

    # -- attribute values -------------------------------------------------------------------

    def gives(self, reading: Reading, slot: str, value: str | None) -> bool:
        """Does the utterance give attribute ``slot`` whose true value is ``value``? The
        goal checker's test (:func:`pipelines.multiwoz.text.states`), so that the user asks
        again exactly for what the checker would not count as given."""
        return states(reading.view, slot, value)

    def taxi_details(self, reading: Reading) -> dict[str, str]:
        """What a taxi confirmation gives: the car (make, with its colour when said) and the
        driver's phone number."""
        details: dict[str, str] = {}
        for make in self._taxi_types:
            match = re.search(rf"(?:\b(\w+) )?\b{re.escape(make)}\b", reading.padded)
            if match:
                details["car type"] = match.group(0).strip()
                break
        if reading.phones:
            details["phone"] = reading.phones[0]
        return details


def _when_slots(domain: str) -> tuple[str, ...]:
    if domain in ("train", "taxi"):
        return ("leaveAt", "arriveBy")
    if domain == "restaurant":
        return ("time",)
    if domain == "hotel":
        return ("day",)
    return ()


def _name_phrases(name: str) -> tuple[str, ...]:
    """How an agent may say a venue's name: in full, or without a leading "the" when what is
    left is still distinctive (not for "the place" or "the junction")."""
    full = words(name)
    if full.startswith("the ") and len(full.split()) >= 3:
        return (full, full[4:])
    return (full,)
