"""Does a text state an attribute's value? One matcher for the goal checker and the user simulator.

The checker asks it of every system utterance ("was the requested postcode given?"), the
rule-based user of every agent utterance ("did the agent answer my question?"); both must
hear the same things, or a simulated user stops asking for what the checker then misses.

Texts are compared in one normal form, :func:`words`: :func:`norm_value` (lower case, no
apostrophes, "&" as "and"), then runs of letters and digits separated by single spaces,
matched as whole words by padding both sides with spaces. Possessives are searched both
joined and split ("king 's college", "lotus garden 's number").
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass

from pipelines.multiwoz.ontology import TIME_SLOTS, VALUE_SYNONYMS, norm_value, parse_time, possessive_split, street_of

_WORD = re.compile(r"[a-z0-9]+")
CLOCK = re.compile(r"(?<!\d)(\d{1,2})\s*[:.]\s*(\d{2})(?!\d)")
_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_TRAIN_ID = re.compile(r"\btr\s?-?(\d{4})\b", re.I)

# How a system talks about an attribute without stating a value: the evidence for values
# the database does not know ("?"), for yes/no flags (said "free wifi", never "yes") and
# for opening hours (paraphrased).
ATTRIBUTE_WORDS: dict[str, tuple[str, ...]] = {
    "internet": ("internet", "wifi", "wi fi"),
    "parking": ("parking", "park"),
    # "is there an entrance free for ...?": a typo real users make (six times in the validation split)
    "entrance fee": ("entrance fee", "entrance free", "admission", "entry fee", "free entry", "free to enter"),
    "openhours": ("opening hours", "open", "opens"),
    "pricerange": ("price range", "priced", "cheap", "moderate", "expensive"),
    "car type": ("car",),
    "stars": ("star", "stars", "star rating"),
}
# Values written with or without inner spaces ("CB1 2DP", "01223 315702").
COMPACT_SLOTS = frozenset({"phone", "postcode"})
# Values whose number alone is how people state them ("£23.60", "5 quid", "51 min").
NUMERIC_SLOTS = frozenset({"price", "entrance fee", "duration"})
# Counts people say in words ("a zero star rating", "two nights").
_COUNT_SLOTS = frozenset({"stars", "people", "stay"})
_NUMBER_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten")
UNKNOWN_VALUES = frozenset({"", "?", "none"})
# An unknown fee said without its name: "the cost is not listed", "I do n't have price
# info on either" (a bare "fee" or "cost" would be a train ticket's as well).
_FEE_UNKNOWN = re.compile(r" (?:cost|fee|price|charge)s? (?:is |are )?(?:not|nt|unknown) |"
                          r" (?:information|info) (?:on |about )?(?:the |their |its )?(?:cost|fee|price|charge)s? | (?:cost|fee|price) (?:information|info) ")
# A free entrance said as a negation: "neither park has an entrance fee", "no fee at all".
_NO_FEE = re.compile(r" (?:no|neither|none of them|nor) (?:(?!the |its |their )\w+ ){0,3}(?:entrance fee|entry fee|admission fee|fee|charge) ")


def words(text: object) -> str:
    return _words(str(text))


@functools.lru_cache(maxsize=1 << 16)  # the checker reads every venue's name, phone and address at every grade
def _words(text: str) -> str:
    return " ".join(_WORD.findall(norm_value(text)))


def clock_times(text: str) -> frozenset[int]:
    """Clock times a text mentions, in minutes after midnight."""
    return frozenset(int(h) * 60 + int(m) for h, m in CLOCK.findall(text) if int(h) <= 24 and int(m) < 60)


def train_ids(text: str) -> tuple[str, ...]:
    """Train ids a text mentions ("TR1234", "TR 4765"), upper case, in order."""
    return tuple(dict.fromkeys(f"TR{m.group(1)}" for m in _TRAIN_ID.finditer(text)))


@dataclass(frozen=True)
class TextView:
    """One utterance, pre-processed once for every check."""

    padded: str  # " words " (both forms of possessives)
    compact: str  # words without spaces: "cb2 1tn" and "cb21tn" both read "cb21tn"
    times: frozenset[int]
    numbers: frozenset[float]  # "10.1 GBP" states a price of 10.10 pounds
    train_ids: tuple[str, ...]

    @classmethod
    def of(cls, text: str) -> TextView:
        padded = f" {words(text)}  {words(possessive_split(text))} "
        return cls(padded, padded.replace(" ", ""), clock_times(text), frozenset(float(n) for n in _NUMBER.findall(text)), train_ids(text))

    def mentions(self, phrase: object) -> bool:
        needle = words(phrase)
        return bool(needle) and f" {needle} " in self.padded


def states(text: TextView, slot: str, value: str | None) -> bool:
    """Does ``text`` give attribute ``slot`` whose true value is ``value``?"""
    if value is None or norm_value(value) in UNKNOWN_VALUES or norm_value(value) in ("yes", "no"):
        if slot == "entrance fee" and _FEE_UNKNOWN.search(text.padded):
            return True
        return any(text.mentions(word) for word in ATTRIBUTE_WORDS.get(slot, (slot,)))
    if slot == "openhours" and any(text.mentions(word) for word in ATTRIBUTE_WORDS[slot]):
        return True
    if slot in TIME_SLOTS and parse_time(value) is not None:
        return parse_time(value) in text.times
    if slot == "trainID":
        return value.strip().upper() in text.train_ids
    if slot in COMPACT_SLOTS:
        needle = words(value).replace(" ", "")
        return bool(needle) and needle in text.compact
    phrases = [value, *(phrase for phrase, meant in VALUE_SYNONYMS.get(slot, {}).items() if meant == norm_value(value))]
    if slot == "address":
        # "on saint mary's lane" gives "12 saint mary's lane"; the database's "cafe jello
        # gallery, 13 magdalene street" is said from its street on.
        parts = [p for p in str(value).split(",") if len(words(p).split()) >= 2]
        phrases += [street_of(value), *parts, *(street_of(p) for p in parts)]
    if slot == "type":
        phrases.append(f"{value}s")  # a category is often said in the plural: "both are guesthouses"
    if slot in _COUNT_SLOTS and norm_value(value).isdigit() and int(norm_value(value)) < len(_NUMBER_WORDS):
        said = _NUMBER_WORDS[int(norm_value(value))]
        # "a zero star rating": the word alone ("two options") would say nothing about stars.
        phrases += [f"{said} star", f"{said} stars"] if slot == "stars" else [said]
    if any(text.mentions(phrase) for phrase in phrases):
        return True
    if slot == "entrance fee" and norm_value(value) == "free" and _NO_FEE.search(text.padded):
        return True
    number = _NUMBER.search(value) if slot in NUMERIC_SLOTS else None
    return number is not None and float(number.group()) in text.numbers


# Attributes asked about as yes/no questions ("Do they have free parking?").
FLAG_SLOTS = frozenset({"internet", "parking"})
_YES_NO = re.compile(r"^(?:yes|no|yeah|yep|nope|indeed|they do|it does|they dont|it doesnt|unfortunately not)\b")
# "I am actually unsure of that", "we do n't have that information", "that information is
# only available in person": an unknown value told.
_NOT_KNOWN = re.compile(r"\b(?:unsure|not sure|not listed|(?:dont|nt|not) (?:have|know)\b(?: \w+){0,3} (?:information|info|details)|no (?:information|info)"
                        r"|only available (?:in person|on site|at|by))\b")


def asks_flag(text: str, slot: str) -> bool:
    """Is ``text`` a question about the yes/no attribute ``slot`` ("Do they have free wifi?")?"""
    return slot in FLAG_SLOTS and asks_about(text, slot)


def asks_about(text: str, slot: str) -> bool:
    """Is ``text`` a question that names attribute ``slot`` ("How much is the entrance fee?")?"""
    return "?" in text and any(TextView.of(text).mentions(word) for word in ATTRIBUTE_WORDS.get(slot, (slot,)))


def answers_yes_or_no(text: str) -> bool:
    """Does ``text`` open with a yes or a no ("Yes , they do .")? Right after a question
    about a flag, that states the flag without naming it."""
    return bool(_YES_NO.match(words(text)))


def answers_not_known(text: str) -> bool:
    """Does ``text`` say the value is not known ("we do n't have that information")? Right
    after a question about an attribute the database does not know, that is the answer."""
    return bool(_NOT_KNOWN.search(words(text)))


def answers(question: str, answer: str, slot: str, value: str | None) -> bool:
    """Does ``answer``, right after the user's ``question``, give ``slot`` (true value
    ``value``) without naming it: a yes or a no to a flag, "not known" to an unknown value?"""
    if value is None or norm_value(value) in UNKNOWN_VALUES:
        return asks_about(question, slot) and answers_not_known(answer)
    return norm_value(value) in ("yes", "no") and asks_flag(question, slot) and answers_yes_or_no(answer)
