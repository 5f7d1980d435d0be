"""The MultiWOZ ontology askflow reads and writes: domains, slots, value normalisation.

Everything that compares a value coming from a user, an agent or a goal with a value
in the database goes through :func:`norm_value` / :func:`parse_time`, so that "King's
College", "kings college" and "KINGS COLLEGE " are the same venue and "9:05" < "10:00".
"""

from __future__ import annotations

import functools
import re

# Domains that may appear in a MultiWOZ goal (2.0-2.4). ``message`` and ``topic`` are
# goal keys that are not domains.
GOAL_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train", "taxi", "police", "hospital")
GOAL_NON_DOMAIN_KEYS: frozenset[str] = frozenset({"message", "topic"})
# Domains askflow's agents act in (SpeakRL Table 4).
TASK_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train", "taxi")
# Database files of the official layout; ``bus`` ships with MultiWOZ but no goal uses it.
DB_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train", "taxi", "police", "hospital", "bus")
# Belief-state domains in system-turn ``metadata``.
BELIEF_DOMAINS: tuple[str, ...] = ("restaurant", "hotel", "attraction", "train", "taxi", "police", "hospital", "bus")

# Goal constraint slots per domain (``info`` / ``fail_info``).
INFO_SLOTS: dict[str, tuple[str, ...]] = {
    "restaurant": ("food", "pricerange", "area", "name"),
    "hotel": ("type", "parking", "pricerange", "internet", "stars", "area", "name"),
    "attraction": ("type", "area", "name"),
    "train": ("departure", "destination", "day", "leaveAt", "arriveBy"),
    "taxi": ("departure", "destination", "leaveAt", "arriveBy"),
    "police": (),
    "hospital": ("department",),
}
# Booking slots per domain (``book`` / ``fail_book``).
BOOK_SLOTS: dict[str, tuple[str, ...]] = {
    "restaurant": ("people", "day", "time"),
    "hotel": ("people", "day", "stay"),
    "train": ("people",),
}
# Attributes a user may request (``reqt``).
REQT_SLOTS: dict[str, tuple[str, ...]] = {
    "restaurant": ("address", "phone", "postcode", "food", "area", "pricerange", "name"),
    "hotel": ("address", "phone", "postcode", "area", "pricerange", "internet", "parking", "stars", "type", "name"),
    "attraction": ("address", "phone", "postcode", "entrance fee", "area", "type", "name", "openhours"),
    "train": ("duration", "price", "arriveBy", "leaveAt", "trainID"),
    "taxi": ("car type", "phone"),
    "police": ("address", "phone", "postcode", "name"),
    "hospital": ("address", "phone", "postcode"),
}
# Keys of a goal's ``book`` dict that are flags, not constraints.
BOOK_FLAGS: frozenset[str] = frozenset({"invalid", "pre_invalid"})

# Unique id of an entity per domain (what a booking names).
UNIQUE_ID: dict[str, str] = {"restaurant": "name", "hotel": "name", "attraction": "name", "train": "trainID"}
# Time slots are compared as times, never as strings.
TIME_SLOTS: frozenset[str] = frozenset({"leaveAt", "arriveBy", "time"})
# Values that mean "no constraint".
DONT_CARE: frozenset[str] = frozenset({"", "dontcare", "dont care", "don't care", "do n't care", "not mentioned", "none", "any"})

DAYS: tuple[str, ...] = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
AREAS: tuple[str, ...] = ("centre", "north", "south", "east", "west")
PRICERANGES: tuple[str, ...] = ("cheap", "moderate", "expensive")

_SPACES = re.compile(r"\s+")
_SPLIT_POSSESSIVE = re.compile(r"(?<=\w)\s+['\u2019]\s*s\b")
_POSSESSIVE = re.compile(r"\s*['\u2019]\s*s\b")
_HOUSE_NUMBER = re.compile(r"^\d+[a-z]?(?:-\d+)?,?\s+")
_TIME = re.compile(r"^\s*(\d{1,2})\s*[:.]\s*(\d{2})\s*$")


# How people state a database value in words, per slot: {phrase: value}. Shared by the
# goal checker and the user simulator, so that both hear "moderately priced" as moderate.
VALUE_SYNONYMS: dict[str, dict[str, str]] = {
    "area": {"center": "centre", "city centre": "centre", "town centre": "centre", "city center": "centre", "town center": "centre",
             "centre of town": "centre", "center of town": "centre", "centre of the city": "centre"},
    "type": {"guest house": "guesthouse", "b and b": "guesthouse", "bed and breakfast": "guesthouse", "swimming pool": "swimmingpool",
             "nightclub": "nightclub", "night club": "nightclub", "concert hall": "concerthall",
             # Real belief states spell MultiWOZ's database typo correctly; "boating attraction".
             "multiple sports": "mutliple sports", "boating": "boat"},
    "food": {"portugese": "portuguese"},
    "pricerange": {"moderately priced": "moderate", "moderately": "moderate", "mid range": "moderate", "midrange": "moderate",
                   "inexpensive": "cheap", "cheaply priced": "cheap", "pricey": "expensive"},
    "entrance fee": {"no entrance fee": "free", "no fee": "free", "not a fee": "free", "no charge": "free", "free of charge": "free",
                     "free entry": "free", "free to enter": "free", "free admission": "free", "doesnt charge": "free",
                     # "does not charge an entrance fee", "does n't charge" (tokenised), "with no entry fee"
                     "not charge": "free", "nt charge": "free", "no entry fee": "free", "no admission": "free"},
}


def norm_value(value: object) -> str:
    """Canonical form of a slot value for comparison: lower case, no apostrophes, single spaces."""
    return _norm_text(str(value))


@functools.lru_cache(maxsize=1 << 16)  # the checker and the simulators ask for the same few values again and again
def _norm_text(value: str) -> str:
    text = value.strip().lower()
    # MultiWOZ's tokenised texts split the possessive off: "king 's college" is "kings college".
    text = _SPLIT_POSSESSIVE.sub("s", text)
    text = text.replace("\u2019", "").replace("'", "").replace("`", "")
    text = text.replace("&", " and ")
    return _SPACES.sub(" ", text).strip()


def possessive_split(text: str) -> str:
    """``text`` with possessives as separate words ("the curry prince 's phone" -> "the curry
    prince s phone"): :func:`norm_value` joins them ("kings college"), which hides a name
    followed by its possessive; searches look in both forms."""
    return _POSSESSIVE.sub(" s", str(text))


def street_of(address: object) -> str:
    """An address without its house number ("12 saint mary's lane" -> "saint marys lane"),
    as people say it; the whole address when what is left would be a single word."""
    text = norm_value(address)
    street = _HOUSE_NUMBER.sub("", text)
    return street if len(street.split()) >= 2 else text


# Values (not phrases in a text) that real belief states spell otherwise than the database:
# "free parking" recorded as parking "free". Kept apart from VALUE_SYNONYMS, which the user
# simulator also hears in texts, where a bare "free" is not about parking.
VALUE_SPELLINGS: dict[str, dict[str, str]] = {"parking": {"free": "yes"}, "internet": {"free": "yes"}}


def canonical_value(slot: str, value: object) -> str:
    """:func:`norm_value`, then the database's own spelling when ``value`` is one of the
    slot's :data:`VALUE_SYNONYMS` or :data:`VALUE_SPELLINGS` ("night club" -> "nightclub",
    "center" -> "centre"): real belief states and goals write values either way."""
    text = norm_value(value)
    text = VALUE_SPELLINGS.get(slot, {}).get(text, text)
    return VALUE_SYNONYMS.get(slot, {}).get(text, text)


def is_dont_care(value: object) -> bool:
    return value is None or norm_value(value) in DONT_CARE


def parse_time(value: object) -> int | None:
    """Minutes after midnight for "HH:MM" / "H:MM" / "HH.MM"; None when it is not a time."""
    match = _TIME.match(str(value))
    if not match:
        return None
    hours, minutes = int(match.group(1)), int(match.group(2))
    if hours > 24 or minutes > 59:
        return None
    return hours * 60 + minutes


_SPOKEN_TIME = re.compile(r"^\s*(?:after|before|by|at|around)?\s*(\d{1,2})(?:\s*[:.]\s*(\d{2}))?\s*([ap])\.?\s*m\.?\s*$|"
                          r"^\s*(?:after|before|by|at|around)\s+(\d{1,2})\s*[:.]\s*(\d{2})\s*$", re.I)


def spoken_time(value: object) -> int | None:
    """Minutes after midnight for the times real belief states record as said: "5:45pm",
    "8pm", "after 15:45"; :func:`parse_time` for plain "HH:MM"; None otherwise ("9" could
    be morning or evening)."""
    minutes = parse_time(value)
    if minutes is not None:
        return minutes
    match = _SPOKEN_TIME.match(str(value))
    if not match:
        return None
    if match.group(1) is not None:
        hours, mins, half = int(match.group(1)), int(match.group(2) or 0), match.group(3).lower()
        if not 1 <= hours <= 12 or mins > 59:
            return None
        return (hours % 12 + (12 if half == "p" else 0)) * 60 + mins
    hours, mins = int(match.group(4)), int(match.group(5))
    return hours * 60 + mins if hours <= 24 and mins <= 59 else None


def format_time(minutes: int) -> str:
    minutes %= 24 * 60
    return f"{minutes // 60:02d}:{minutes % 60:02d}"


def values_match(slot: str, wanted: object, actual: object) -> bool:
    """Does ``actual`` satisfy the constraint ``slot = wanted``?

    ``leaveAt`` means "leave at or after", ``arriveBy`` "arrive at or before"; ``time``
    (a reservation time) must be the same time. Other slots compare normalised strings; a
    food is also met by the same food qualified ("modern european" for european).
    """
    if is_dont_care(wanted):
        return True
    if actual is None:
        return False
    if slot in TIME_SLOTS:
        want, have = parse_time(wanted), parse_time(actual)
        if want is None or have is None:
            return norm_value(wanted) == norm_value(actual)
        if slot == "leaveAt":
            return have >= want
        if slot == "arriveBy":
            return have <= want
        return have == want
    want, have = canonical_value(slot, wanted), canonical_value(slot, actual)
    if slot == "food" and want and have.endswith(f" {want}"):
        return True  # a qualified cuisine is one of its kind: "modern european" food is european
    return want == have


def same_value(slot: str, a: object, b: object) -> bool:
    """Equality of two stated values (times as times), used for booking arguments."""
    if slot in TIME_SLOTS:
        ta, tb = parse_time(a), parse_time(b)
        if ta is not None and tb is not None:
            return ta == tb
    return canonical_value(slot, a) == canonical_value(slot, b)


def twelve_hours_apart(actual: object, wanted: object) -> bool:
    """MultiWOZ goals sometimes give a 12-hour time ("03:30" for half past three in the
    afternoon) that the dialogue states as 15:30; users say "at 5" for 17:00. True when
    ``actual`` is ``wanted`` read as an afternoon time."""
    a, w = parse_time(actual), parse_time(wanted)
    return a is not None and w is not None and w < 13 * 60 and a - w == 12 * 60

# MultiWOZ dialog-act slot codes (data.json ``dialog_act``), keyed by goal/DB slot name.
ACT_SLOT: dict[str, str] = {
    "food": "Food", "pricerange": "Price", "area": "Area", "name": "Name", "type": "Type", "parking": "Parking",
    "internet": "Internet", "stars": "Stars", "people": "People", "day": "Day", "time": "Time", "stay": "Stay",
    "departure": "Depart", "destination": "Dest", "leaveAt": "Leave", "arriveBy": "Arrive", "trainID": "Id",
    "duration": "Time", "price": "Ticket", "address": "Addr", "phone": "Phone", "postcode": "Post",
    "entrance fee": "Fee", "reference": "Ref", "car type": "Car", "openhours": "Open", "department": "Department",
}
