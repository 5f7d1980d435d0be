"""How a simulated user words things: slot phrases, reply templates, verbosity and noise.

Everything here is a pure function of its arguments and of the ``random.Random`` it is
handed, so a session that owns the RNG stays deterministic for its seed.

Values are always written exactly as the goal has them ("16:30", "the red swan"):
neither the templates nor the noise touch them, so an agent that misreads a value has
misread it, not been fed a corrupted one.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass, field
from typing import Iterable, Literal, Mapping, Sequence

from pipelines.multiwoz.ontology import ACT_SLOT
from pipelines.records import DialogAct

Verbosity = Literal["terse", "normal", "verbose"]
VERBOSITIES: tuple[str, ...] = ("terse", "normal", "verbose")

# How a user names an attribute when asking for it or saying they do not mind about it.
SLOT_WORDS: Mapping[str, str] = {
    "address": "address", "phone": "phone number", "postcode": "postcode", "food": "type of food",
    "area": "area", "pricerange": "price range", "internet": "internet", "parking": "parking",
    "stars": "star rating", "type": "type", "entrance fee": "entrance fee", "duration": "travel time",
    "price": "ticket price", "arriveBy": "arrival time", "leaveAt": "departure time", "trainID": "train ID",
    "car type": "car type", "openhours": "opening hours", "name": "name", "department": "department",
    "departure": "departure point", "destination": "destination", "day": "day", "people": "number of people",
    "time": "time", "stay": "length of stay", "reference": "reference number",
}
# The noun phrase a user asks for a domain with, when no constraint names a more precise one.
DOMAIN_NOUNS: Mapping[str, str] = {
    "restaurant": "a restaurant", "hotel": "a place to stay", "attraction": "something to do in town",
    "train": "a train", "taxi": "a taxi", "police": "the nearest police station", "hospital": "a hospital",
}


def _plural(value: str, singular: str, plural: str) -> str:
    return f"{value} {singular if value.strip() == '1' else plural}"


def slot_phrase(domain: str, slot: str, value: str) -> str:
    """A constraint or booking value as a user says it: "italian food", "in the north",
    "for 3 people", "leaving after 17:00". The value itself appears verbatim."""
    if slot == "food":
        return f"{value} food"
    if slot == "pricerange":
        return f"in the {value} price range"
    if slot == "area":
        return f"in the {value}"
    if slot == "type":
        return article(value) if domain == "hotel" else f"{article(value)} kind of place"
    if slot == "stars":
        return f"with {_plural(value, 'star', 'stars')}"
    if slot in ("parking", "internet"):
        thing = "parking" if slot == "parking" else "wifi"
        return f"with free {thing}" if value == "yes" else f"no need for {thing}"
    if slot == "name":
        return value
    if slot == "departure":
        return f"from {value}"
    if slot == "destination":
        return f"to {value}"
    if slot == "day":
        return f"on {value}"
    if slot == "leaveAt":
        return f"leaving after {value}"
    if slot == "arriveBy":
        return f"arriving by {value}"
    if slot == "people":
        return f"for {_plural(value, 'person', 'people')}"
    if slot == "time":
        return f"at {value}"
    if slot == "stay":
        return f"for {_plural(value, 'night', 'nights')}"
    if slot == "department":
        return f"with the {value} department"
    return f"{SLOT_WORDS.get(slot, slot)} {value}"


def join_words(items: Sequence[str]) -> str:
    """"a", "a and b", "a, b and c"."""
    items = [i for i in items if i]
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} and {items[-1]}"


def article(phrase: str) -> str:
    return f"{'an' if phrase[:1] in 'aeiou' else 'a'} {phrase}"


def describe(domain: str, values: Mapping[str, str], *, also: bool = False) -> str:
    """What the user is looking for, as one noun phrase: "a guesthouse in the north with
    free wifi", "a train from ely to cambridge on monday", "the red swan"."""
    if domain in ("restaurant", "hotel", "attraction") and "name" in values:
        rest = [slot_phrase(domain, s, v) for s, v in values.items() if s != "name"]
        head = f"a particular {domain} called {values['name']}" if also else values["name"]
        return " ".join([head, *rest])
    values = dict(values)
    head = DOMAIN_NOUNS[domain]
    if domain == "hotel" and "type" in values:
        head = article(values.pop("type"))
    elif domain == "attraction" and "type" in values:
        head = f"{article(values.pop('type'))} to visit"
    elif domain == "restaurant" and "food" in values:
        head = f"a restaurant serving {values.pop('food')} food"
    parts = [slot_phrase(domain, s, v) for s, v in values.items()]
    return " ".join([head, *parts])


# --------------------------------------------------------------------------------------
# Utterances
# --------------------------------------------------------------------------------------


@dataclass
class Utterance:
    """A user turn being written: sentences with their dialog acts.

    ``niceties`` (greetings, thanks) are what the noise may drop; ``remarks`` (such as
    accepting an offer) must stay but, like niceties, leave the user's agenda step to be
    said after them. ``values`` are the words the noise must not misspell."""

    sentences: list[str] = field(default_factory=list)
    niceties: set[int] = field(default_factory=set)
    remarks: set[int] = field(default_factory=set)
    acts: list[DialogAct] = field(default_factory=list)
    values: set[str] = field(default_factory=set)

    def say(self, sentence: str, acts: Iterable[DialogAct] = (), *, nicety: bool = False, remark: bool = False) -> None:
        if not sentence:
            return
        acts = list(acts)
        if nicety:
            self.niceties.add(len(self.sentences))
        elif remark:
            self.remarks.add(len(self.sentences))
        # Sentence case, unless the sentence starts with a value ("the red swan sounds good"):
        # values are written exactly as the goal has them.
        starts_with_value = any(act.value and sentence.lower().startswith(act.value.lower()) for act in acts)
        self.sentences.append(sentence if starts_with_value else sentence[0].upper() + sentence[1:])
        for act in acts:
            self.acts.append(act)
            self.values.add(act.value)

    @property
    def has_content(self) -> bool:
        """Whether anything beyond niceties and remarks has been said."""
        return any(i not in self.niceties and i not in self.remarks for i in range(len(self.sentences)))


def inform_acts(domain: str, values: Mapping[str, str]) -> list[DialogAct]:
    act = f"{domain.capitalize()}-Inform"
    return [DialogAct(act, ACT_SLOT.get(slot, slot.capitalize()), value) for slot, value in values.items()]


def request_acts(domain: str, slots: Iterable[str]) -> list[DialogAct]:
    act = f"{domain.capitalize()}-Request"
    return [DialogAct(act, ACT_SLOT.get(slot, slot.capitalize()), "?") for slot in slots]


GENERAL_THANK = DialogAct("general-thank", "none", "none")
GENERAL_BYE = DialogAct("general-bye", "none", "none")
GENERAL_GREET = DialogAct("general-greet", "none", "none")

# --------------------------------------------------------------------------------------
# Templates: per verbosity, the variants the session's RNG chooses from. "verbose" uses
# the "normal" variants and adds niceties around them.
# --------------------------------------------------------------------------------------

_TEMPLATES: dict[str, dict[str, tuple[str, ...]]] = {
    "intro": {
        "terse": ("I need {what}.", "Looking for {what}."),
        "normal": ("I'm looking for {what}.", "I need {what}.", "Can you help me find {what}?", "I'd like to find {what}."),
    },
    "intro_also": {
        "terse": ("Also {what}.", "I also need {what}."),
        "normal": ("I'm also looking for {what}.", "I also need {what}.", "Can you also help me find {what}?"),
    },
    "inform": {
        "terse": ("{what}.",),
        "normal": ("{what}, please.", "Preferably {what}.", "That would be {what}."),
    },
    "no_preference": {
        "terse": ("Any {slots}.", "No preference."),
        "normal": ("I don't mind about the {slots}.", "I have no preference for the {slots}.", "Any {slots} is fine."),
    },
    "no_particular": {
        "terse": ("No particular one.",),
        "normal": ("Nothing in particular.", "No, I don't have a particular one in mind."),
    },
    "either": {
        "terse": ("Either.", "Don't mind."),
        "normal": ("Either is fine.", "I don't mind, any of those.", "Either one works for me."),
    },
    "neither": {
        "terse": ("Neither, {what}.",),
        "normal": ("Neither, actually. I need {what}.", "Not really, I'm after {what}."),
    },
    "reveal": {  # a constraint the agent's offer breaks and the user had not stated yet
        "terse": ("Needs to be {what}.",),
        "normal": ("Hmm, I'd need it {what}, though.", "Actually, it should be {what}.", "That won't do, I need it {what}."),
    },
    "want_name": {  # the agent offers another venue than the one the user asked about
        "terse": ("No, {name}.",),
        "normal": ("Sorry, I'm looking for {name}.", "No, I meant {name}."),
    },
    "correct": {  # the offer breaks a constraint the user had stated already
        "terse": ("No, {what}.",),
        "normal": ("That doesn't fit, I said {what}.", "No, I need it {what}, as I said.", "That's not what I asked for: {what}, please."),
    },
    "switch": {  # no match: give up the fail_info / fail_book values for the real ones
        "terse": ("Then {what}.", "Try {what}."),
        "normal": ("How about {what} instead?", "Okay, what about {what} then?", "Could you try {what}?"),
    },
    "release": {
        "terse": ("Any {slots} then.",),
        "normal": ("The {slots} doesn't matter then.", "Any {slots} would be fine then."),
    },
    "insist": {
        "terse": ("Check again, {what}.",),
        "normal": ("Could you check again? I'm looking for {what}.", "Are you sure? I need {what}."),
    },
    "recommend": {
        "terse": ("Recommend one.", "Which one?"),
        "normal": ("Could you recommend one?", "Which one would you suggest?", "Any of them is fine, what do you recommend?"),
    },
    "recommend_train": {
        "terse": ("Which train?",),
        "normal": ("Which train would you suggest?", "Which train would work for that?"),
    },
    "book_taxi": {
        "terse": ("Book it.",),
        "normal": ("Could you book the taxi for me?", "Please book that taxi."),
    },
    "accept": {
        "terse": ("{name} is fine.",),
        "normal": ("{name} sounds good.", "{name} works for me.", "Great, {name} it is."),
    },
    "book": {
        "terse": ("Book it {what}.",),
        "normal": ("Please book it {what}.", "Could you make a reservation {what}?", "Yes, please book it {what}."),
    },
    "book_train": {
        "terse": ("Book it {what}.",),
        "normal": ("Please book tickets {what}.", "Yes, please book it {what}.", "Could you book seats {what}?"),
    },
    "correct_booking": {  # the agent booked for another number of people
        "terse": ("No, {what}.",),
        "normal": ("Actually, I need it {what}.", "Sorry, that should be {what}. Could you change it?"),
    },
    "retry_booking": {
        "terse": ("Try again {what}.",),
        "normal": ("Could you try the booking again {what}?", "Please try once more {what}."),
    },
    "no_booking": {
        "terse": ("No booking needed.",),
        "normal": ("No need to book it, thanks.", "I don't need a booking right now."),
    },
    "request": {
        "terse": ("{slots}?",),
        "normal": ("Can you give me the {slots}?", "What is the {slots}?", "Could I get the {slots}, please?"),
    },
    "which_booked": {
        "terse": ("Which {domain}?",),
        "normal": ("Which {domain} did you book for me?", "Sorry, which {domain} is that?"),
    },
    "done": {
        "terse": ("Thanks, bye.", "That's all, bye."),
        "normal": ("Thanks, that's all I need. Goodbye.", "Great, that is everything. Thank you!", "That's all, thanks for your help. Bye."),
    },
    "give_up": {
        "terse": ("Never mind, bye.",),
        "normal": ("This doesn't seem to be working. Never mind, goodbye.", "I don't think we're getting anywhere. Thanks anyway, bye."),
    },
}
_GREETINGS = ("Hi there!", "Hello!", "Good afternoon.")
_CONTEXT = ("I'm planning a trip to Cambridge.", "I'm visiting Cambridge soon.", "I could use some help with my plans.")
_THANKS = ("Thanks!", "Thank you.", "Great, thanks.")
_CLOSERS = ("Thanks a lot for your help.", "I really appreciate it.", "Thank you so much.")

# Contractions the "casual" noise applies: same meaning, different surface.
_CASUAL = ((r"\bI would\b", "I'd"), (r"\bI am\b", "I'm"), (r"\bdo not\b", "don't"), (r"\bCould you\b", "could u"),
           (r"\bplease\b", "pls"), (r"\bthanks\b", "thx"), (r"\bThanks\b", "Thx"))
_LETTERS = re.compile(r"^[A-Za-z]{4,}$")


class Phraser:
    """Picks templates with the session's RNG and applies verbosity and noise."""

    def __init__(self, rng: random.Random, verbosity: str, noise: float):
        self.rng = rng
        self.verbosity = verbosity
        self.noise = noise

    def line(self, key: str, **fields: str) -> str:
        variants = _TEMPLATES[key]["terse" if self.verbosity == "terse" else "normal"]
        return self.rng.choice(variants).format(**fields)

    def greeting(self, utterance: Utterance) -> None:
        """Opening pleasantries: none when terse, sometimes when normal, always when verbose."""
        if self.verbosity == "verbose":
            utterance.say(self.rng.choice(_GREETINGS), [GENERAL_GREET], nicety=True)
            utterance.say(self.rng.choice(_CONTEXT), nicety=True)
        elif self.verbosity == "normal" and self.rng.random() < 0.3:
            utterance.say(self.rng.choice(_GREETINGS), [GENERAL_GREET], nicety=True)

    def thanks(self, utterance: Utterance) -> None:
        if self.verbosity == "verbose" or (self.verbosity == "normal" and self.rng.random() < 0.3):
            utterance.say(self.rng.choice(_THANKS), [GENERAL_THANK], nicety=True)

    def closer(self, utterance: Utterance) -> None:
        if self.verbosity == "verbose":
            utterance.say(self.rng.choice(_CLOSERS), nicety=True)

    def finish(self, utterance: Utterance) -> str:
        """The text of ``utterance``, with noise applied with probability ``noise``."""
        sentences = list(utterance.sentences)
        if self.noise > 0 and self.rng.random() < self.noise:
            kind = self.rng.choice(("omit_niceties", "casual", "misspell"))
            # With no niceties to drop, or nothing but niceties, a misspelling instead.
            if kind == "omit_niceties" and utterance.niceties and len(utterance.niceties) < len(sentences):
                sentences = [s for i, s in enumerate(sentences) if i not in utterance.niceties]
            elif kind == "casual":
                sentences = [self._casual(s) for s in sentences]
            else:
                sentences = self._misspell(sentences, utterance.values)
        return " ".join(sentences)

    def _casual(self, sentence: str) -> str:
        for pattern, replacement in _CASUAL:
            sentence = re.sub(pattern, replacement, sentence)
        return sentence.rstrip(".")

    def _misspell(self, sentences: list[str], values: set[str]) -> list[str]:
        """Swap two inner letters of one word that is not part of any value."""
        protected = {w.lower() for v in values for w in re.findall(r"[A-Za-z0-9']+", v)}
        slots = [
            (i, j)
            for i, sentence in enumerate(sentences)
            for j, word in enumerate(sentence.split(" "))
            if _LETTERS.match(word) and word.lower() not in protected
        ]
        if not slots:
            return sentences
        i, j = self.rng.choice(slots)
        words = sentences[i].split(" ")
        word = words[j]
        k = self.rng.randrange(1, len(word) - 2)
        words[j] = word[:k] + word[k + 1] + word[k] + word[k + 2:]
        return [*sentences[:i], " ".join(words), *sentences[i + 1:]]
