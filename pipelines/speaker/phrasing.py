"""How the rules synthesizer words things: user requests and answers, the agent's reasoning,
clarification questions and responses.

Every function takes the ``random.Random`` that picks among phrasings, so a dialogue is a
function of its seed. Values are written exactly as the goal or the database has them
("16:30", "the gonville hotel"): the goal checker and the user's answers depend on them.

Clarification questions never repeat what the user has already said: a question that
names a known slot reads as asking about it again, which the clarification reward (and a
reader) counts against it. They name the slot they ask about, or offer two or more of its
values, which is what makes them specific.
"""

from __future__ import annotations

import random
import re
from typing import Mapping, Sequence

from pipelines.multiwoz.ontology import TIME_SLOTS

SLOT_WORDS: Mapping[str, str] = {
    "address": "address", "phone": "phone number", "postcode": "postcode", "food": "type of food",
    "area": "area", "pricerange": "price range", "internet": "internet", "parking": "parking",
    "stars": "star rating", "type": "type", "entrance fee": "entrance fee", "duration": "travel time",
    "price": "ticket price", "arriveBy": "arrival time", "leaveAt": "departure time", "trainID": "train ID",
    "car type": "car type", "openhours": "opening hours", "name": "name", "department": "department",
    "departure": "pickup point", "destination": "destination", "day": "day", "people": "number of people",
    "time": "time", "stay": "length of stay",
}
PLURALS: Mapping[str, str] = {"restaurant": "restaurants", "hotel": "places to stay", "attraction": "attractions", "train": "trains"}
_MAX_LISTED = 4  # values offered in one question; more read as a catalogue


def pick(rng: random.Random, options: Sequence[str]) -> str:
    return options[rng.randrange(len(options))]


def join(items: Sequence[str], conjunction: str = "and") -> str:
    items = list(items)
    if len(items) <= 1:
        return "".join(items)
    return f"{', '.join(items[:-1])} {conjunction} {items[-1]}"


def capitalise(text: str) -> str:
    return text[:1].upper() + text[1:]


def _article(word: str) -> str:
    return "an" if word[:1].lower() in "aeiou" else "a"


def _plural(value: str, singular: str, plural: str) -> str:
    return f"{value} {singular if value.strip() == '1' else plural}"


# --------------------------------------------------------------------------------------
# Constraints as phrases
# --------------------------------------------------------------------------------------


# Attraction types as a request reads them; each keeps the database value verbatim.
_ATTRACTION_PHRASES: Mapping[str, str] = {
    "architecture": "some interesting architecture", "boat": "a boat trip", "entertainment": "some entertainment",
    "multiple sports": "a multiple sports centre",
}


def attraction_phrase(kind: str) -> str:
    return _ATTRACTION_PHRASES.get(kind, f"{_article(kind)} {kind}")


def constraint_phrase(domain: str, slot: str, value: str) -> str:
    """One constraint as a user says it: "in the north", "with free parking", "leaving after 17:00"."""
    if slot == "area":
        return "in the centre of town" if value == "centre" else f"in the {value}"
    if slot == "pricerange":
        return f"in the {value} price range"
    if slot == "food":
        return f"serving {value} food"
    if slot == "type":
        return f"a {value}" if domain == "hotel" else attraction_phrase(value)
    if slot in ("stars", "parking", "internet"):
        return _feature(slot, value)
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
    if slot == "name":
        return value
    return f"with {SLOT_WORDS.get(slot, slot)} {value}"


def _feature(slot: str, value: str) -> str:
    """A hotel feature: "with 4 stars", "with free parking", "without free wifi"."""
    if slot == "stars":
        return f"with {_plural(value, 'star', 'stars')}"
    thing = "free parking" if slot == "parking" else "free wifi"
    return f"with {thing}" if value == "yes" else f"without {thing}"


def describe(domain: str, known: Mapping[str, str]) -> str:
    """A request as one noun phrase: "a cheap italian restaurant in the north",
    "a guesthouse in the east with 4 stars and free parking", "a train from cambridge to ely
    on friday leaving after 09:00"."""
    known = dict(known)
    if domain == "restaurant":
        head = " ".join(v for v in (known.pop("pricerange", None), known.pop("food", None)) if v)
        phrase = f"{_article(head or 'restaurant')} {head + ' ' if head else ''}restaurant"
    elif domain == "hotel":
        kind = known.pop("type", None) or "place to stay"
        price = known.pop("pricerange", None)
        phrase = f"{_article(price or kind)} {price + ' ' if price else ''}{kind}"
    elif domain == "attraction":
        kind = known.pop("type", None)
        phrase = attraction_phrase(kind) if kind else "something to do"
    else:
        phrase = f"{_article(domain)} {domain}"
    where = [constraint_phrase(domain, s, known.pop(s)) for s in ("departure", "destination", "day", "leaveAt", "arriveBy", "area") if s in known]
    features = [_plural(known.pop("stars"), "star", "stars")] if "stars" in known else []
    without = []
    for slot, thing in (("parking", "free parking"), ("internet", "free wifi")):
        if slot in known:
            (features if known.pop(slot) == "yes" else without).append(thing)
    rest = [constraint_phrase(domain, s, v) for s, v in known.items()]
    text = " ".join([phrase, *where, *rest])
    if features:
        text += " with " + join(features)
    if without:
        text += (", but " if features else " ") + "without " + join(without, "or")
    return text


def slot_summary(slot: str, values: Sequence[str]) -> str:
    """"area (centre, north or west)" for reasoning about what differs."""
    if not values:
        return SLOT_WORDS.get(slot, slot)
    if slot in TIME_SLOTS and len(values) > 2:
        return f"{SLOT_WORDS.get(slot, slot)} (from {values[0]} to {values[-1]})"
    shown = list(values[:_MAX_LISTED]) + (["more"] if len(values) > _MAX_LISTED else [])
    return f"{SLOT_WORDS.get(slot, slot)} ({join(shown, 'or')})"


# --------------------------------------------------------------------------------------
# The user
# --------------------------------------------------------------------------------------

_FIND = {
    "restaurant": ("I'm looking for {desc}.", "Can you help me find {desc}?", "I'd like to book a table somewhere. I'm after {desc}."),
    "hotel": ("I need somewhere to stay: {desc}.", "Can you find me {desc}?", "I'm looking for accommodation, {desc}."),
    "attraction": ("I'm looking for {desc}.", "Can you recommend {desc}?", "I'd like to visit {desc}."),
    "train": ("I need {desc}.", "Can you find me {desc}?", "I'm looking for {desc}."),
}
_ACKS = ("That sounds great.", "Perfect, thanks.", "Great, that works for me.", "Sounds good.")
ACKS = _ACKS  # how a user accepts an offer before their next request


def find_request(rng: random.Random, domain: str, known: Mapping[str, str], day_phrase: str | None = None, ack: bool = False) -> str:
    """The user's request for a search. ``day_phrase`` replaces the day (a reference)."""
    shown = {s: v for s, v in known.items() if not (day_phrase and s == "day")}
    desc = describe(domain, shown)
    if day_phrase:
        desc += f" on {day_phrase}"
    text = pick(rng, _FIND.get(domain, _FIND["attraction"])).format(desc=desc)
    return f"{pick(rng, _ACKS)} {capitalise(text)}" if ack else capitalise(text)


#: What a user calls a venue of each domain when asking for it by name: a hotel-domain venue is
#: "a hotel" whatever its type (a guesthouse too), as users say; not a type to search on.
KIND_WORDS: Mapping[str, tuple[str, ...]] = {
    "restaurant": ("restaurant",), "hotel": ("hotel", "place to stay"), "attraction": ("attraction", "place to visit"),
}


def name_request(rng: random.Random, name: str, ack: bool = False, domain: str | None = None) -> str:
    """The user asks for a venue by name; with ``domain``, they also say what kind of place it is."""
    if domain is None:
        options = ("I'm looking for {name}.", "Can you tell me about {name}?", "Do you know a place called {name}?")
    else:
        kind = pick(rng, KIND_WORDS[domain])
        options = (f"I'm looking for {_article(kind)} {kind} called {{name}}.", f"Can you tell me about the {kind} {{name}}?",
                   f"Do you know {_article(kind)} {kind} called {{name}}?")
    text = pick(rng, options).format(name=name)
    return f"{pick(rng, _ACKS)} {text}" if ack else text


def dont_mind(rng: random.Random, slot: str) -> str:
    word = SLOT_WORDS.get(slot, slot)
    return pick(rng, (f"I don't mind about the {word}.", f"The {word} doesn't matter to me.", f"Any {word} is fine."))


def answer(rng: random.Random, domain: str, values: Mapping[str, str]) -> str:
    """The user's answer to a clarification question, from the goal."""
    return " ".join(capitalise(_answer_one(rng, domain, slot, value)) for slot, value in values.items())


def _answer_one(rng: random.Random, domain: str, slot: str, value: str) -> str:
    if slot == "area":
        where = "the centre" if value == "centre" else f"the {value}"
        return pick(rng, (f"{where}, please.", f"somewhere in {where}.", f"I'd prefer {where}."))
    if slot == "pricerange":
        return pick(rng, (f"something {value}, please.", f"{value} would be best.", f"I'm looking for something {value}."))
    if slot == "food":
        return pick(rng, (f"{value} food, please.", f"I'd like {value} food.", f"{value}, if possible."))
    if slot == "type":
        return pick(rng, (f"a {value}, please.", f"I'd prefer a {value}.", f"a {value} would be ideal."))
    if slot == "stars":
        return pick(rng, (f"{_plural(value, 'star', 'stars')}, please.", f"it should have {_plural(value, 'star', 'stars')}."))
    if slot in ("parking", "internet"):
        thing = "free parking" if slot == "parking" else "free wifi"
        if value == "yes":
            return pick(rng, (f"yes, I need {thing}.", f"yes, {thing} is a must."))
        return pick(rng, (f"no, I can do without {thing}.", f"no, I'm fine without {thing}."))
    if slot == "leaveAt":
        return pick(rng, (f"I'd like to leave after {value}.", f"after {value}, please.", f"I want to leave after {value}."))
    if slot == "arriveBy":
        return pick(rng, (f"I need to arrive by {value}.", f"I have to be there by {value}.", f"arriving by {value}, please."))
    return f"{SLOT_WORDS.get(slot, slot)} {value}."


def booking_request(rng: random.Random, domain: str, values: Mapping[str, str], phrases: Mapping[str, str] | None = None) -> str:
    """"Yes, please book it for 2 people on friday at 18:00." ``phrases`` replace values
    given by reference."""
    request = booking_values(values, phrases)
    if domain == "train":
        return pick(rng, (f"Yes, please book tickets {request}.", f"Great, I'd like tickets {request}.", f"Please book it {request}."))
    return pick(rng, (f"Yes, please book it {request}.", f"Could you make a reservation {request}?", f"Please book that {request}."))


def retry_request(rng: random.Random, slot: str, value: str) -> str:
    shown = {"day": f"on {value}", "time": f"at {value}", "stay": f"for {_plural(value, 'night', 'nights')}", "people": f"for {_plural(value, 'person', 'people')}"}[slot]
    return pick(rng, (f"Okay, how about {shown}?", f"Then let's try {shown}.", f"Could you try {shown} instead?"))


def reqt_request(rng: random.Random, reqt: Sequence[str]) -> str:
    asked = join([f"the {SLOT_WORDS.get(r, r)}" for r in reqt])
    return pick(rng, (f"Could you give me {asked}?", f"What is {asked}?", f"Can I have {asked}, please?"))


def taxi_request(rng: random.Random, departure: str | None, destination: str | None, time_slot: str, time: str, ack: bool = False) -> str:
    """None ends: "between the two places" (the referential request)."""
    when = _taxi_when(time_slot, time)
    if departure is None or destination is None:
        route = pick(rng, ("between the two places", "to get from one place to the other", "between those two places"))
    else:
        route = f"from {departure} to {destination}"
    text = pick(rng, (f"I also need a taxi {route}, {when}.", f"Can you book me a taxi {route}? I want to be {when}.", f"I'll need a taxi {route}, {when}."))
    return f"{pick(rng, _ACKS)} {text}" if ack else text


def taxi_partial_request(rng: random.Random, stated: Mapping[str, str], time_slot: str, ack: bool = False) -> str:
    """A taxi request with one or two of the pickup, the destination and the time, as users
    open one ("I need a taxi to the museum."): the rest is for the agent to ask."""
    parts = [f"from {stated['departure']}" if "departure" in stated else "", f"to {stated['destination']}" if "destination" in stated else ""]
    route = " ".join(p for p in parts if p)
    when = _taxi_when(time_slot, stated[time_slot]) if time_slot in stated else ""
    what = ", ".join(p for p in (route, when) if p)
    text = pick(rng, (f"I also need a taxi {what}.", f"Can you book me a taxi {what}?", f"I'll need a taxi {what}."))
    return f"{pick(rng, _ACKS)} {text}" if ack else text


def _taxi_when(time_slot: str, time: str) -> str:
    return f"leaving after {time}" if time_slot == "leaveAt" else f"arriving by {time}"


def taxi_slot_answer(rng: random.Random, answer: Mapping[str, str], time_slot: str) -> str:
    """The user's answer to the agent's question for a taxi's missing places and time."""
    departure, destination, time = answer.get("departure"), answer.get("destination"), answer.get(time_slot)
    if departure and destination:
        route = pick(rng, (f"From {departure} to {destination}.", f"Pick me up at {departure} and take me to {destination}."))
    elif departure:
        route = pick(rng, (f"From {departure}, please.", f"Pick me up at {departure}.", f"I'll be leaving from {departure}."))
    elif destination:
        route = pick(rng, (f"To {destination}, please.", f"I'm going to {destination}.", f"Take me to {destination}."))
    else:
        route = ""
    if time is None:
        return route
    if time_slot == "leaveAt":
        when = pick(rng, (f"I'd like to leave after {time}.", f"Leaving after {time}, please."))
    else:
        when = pick(rng, (f"I need to arrive by {time}.", f"I have to be there by {time}."))
    return f"{route} {when}".strip()


def correction(rng: random.Random, domain: str, values: Mapping[str, str]) -> str:
    """The user's reply to a recommendation that breaks what they have not said yet, as the
    agenda user corrects one ("Hmm, I'd need it in the south, though.")."""
    what = describe(domain, values)
    return pick(rng, (f"Hmm, I'd need {what}, though.", f"That doesn't fit: I'm looking for {what}.", f"Not that one, I need {what}."))


def reminder(rng: random.Random, domain: str, values: Mapping[str, str]) -> str:
    """The user's reply to a recommendation that breaks what they had already said ("As I
    said, I need a restaurant in the south.")."""
    what = describe(domain, values)
    return pick(rng, (f"As I said, I need {what}.", f"No, remember I asked for {what}.", f"That's not it, I did say {what}."))


def taxi_answer(rng: random.Random, departure: str, destination: str) -> str:
    return pick(rng, (f"From {departure} to {destination}, please.", f"Pick me up at {departure} and take me to {destination}.", f"I'm going from {departure} to {destination}."))


def reference_answer(rng: random.Random, slot: str, value: str, label: str | None) -> str:
    same = f", the same as {label}" if label else ""
    if slot == "day":
        return pick(rng, (f"{capitalise(value)}{same}.", f"I meant {value}{same}."))
    return pick(rng, (f"{_plural(value, 'person', 'people')}{same}.", f"I meant {_plural(value, 'person', 'people')}{same}."))


def goodbye(rng: random.Random, ack: bool = False) -> str:
    text = pick(rng, ("That's all I need, thank you.", "Thanks, that is everything.", "Thank you for your help. Goodbye.", "That will be all. Thanks!"))
    return f"{pick(rng, _ACKS)} {text}" if ack else text


# --------------------------------------------------------------------------------------
# The agent
# --------------------------------------------------------------------------------------


def options(rng: random.Random, slot: str, values: Sequence[str]) -> str:
    """The values a question offers, in a random order (no option is favoured), written as
    the slot reads: "the north, the centre or the west"."""
    values = list(values)
    rng.shuffle(values)
    listed = values[:_MAX_LISTED]
    if slot == "area":
        shown = [f"the {v}" for v in listed]
    elif slot == "stars":
        shown = [f"{v} stars" for v in listed]
    else:
        shown = listed
    return join(shown + (["something else"] if len(values) > _MAX_LISTED else []), "or")


_QUESTIONS: Mapping[str, tuple[str, ...]] = {
    "area": (
        "Which part of town would you prefer{offer}?", "Is there an area you'd like{offer}?", "Where in town should it be{offer}?",
        "Do you have a part of town in mind{offer}?", "Which area suits you best{offer}?",
    ),
    "pricerange": (
        "What price range do you have in mind{offer}?", "Do you have a budget in mind{offer}?",
        "How much would you like to spend{offer}?", "Which price range works for you{offer}?",
    ),
    "food": (
        "What kind of food would you like{offer}?", "Which cuisine do you fancy{offer}?", "What food are you in the mood for{offer}?",
        "Is there a particular cuisine you prefer{offer}?",
    ),
    "type": (
        "What kind of place would you like to visit{offer}?", "What type of attraction are you interested in{offer}?",
        "What sort of thing would you enjoy{offer}?",
    ),
    "stars": ("How many stars should it have{offer}?", "Do you have a star rating in mind{offer}?", "What star rating are you after{offer}?"),
    "parking": ("Do you need free parking?", "Will you need parking there?", "Is free parking important to you?"),
    "internet": ("Do you need free wifi?", "Is internet access important to you?", "Will you need wifi?"),
    "time": (
        "What time would you like to leave, or do you need to arrive by a certain time?",
        "When do you want to depart, or is there a time you must arrive by?",
        "Do you have a preferred departure time, or a time you need to arrive by?",
        "Would you like to leave after a certain time, or arrive before one?",
    ),
}


def question(rng: random.Random, domain: str, slot: str, values: Sequence[str]) -> str:
    """One clarification question about ``slot``; ``values`` are the options the agent can
    offer (those it has seen), none for an open question."""
    if slot == "type" and domain == "hotel":
        return pick(rng, ("Would you prefer a hotel or a guesthouse?", "Are you after a hotel or a guesthouse?")) if len(values) >= 2 else "What type of place would you like to stay in?"
    if slot in ("leaveAt", "arriveBy"):
        return pick(rng, _QUESTIONS["time"])
    offer = f": {options(rng, slot, values)}" if len(values) >= 2 else ""
    templates = _QUESTIONS.get(slot)
    return pick(rng, templates).format(offer=offer) if templates else f"What {SLOT_WORDS.get(slot, slot)} would you like?"


def questions(rng: random.Random, domain: str, asked: Mapping[str, Sequence[str]], count: int, earliest: str | None = None) -> str:
    """The clarification: a short lead-in with the number of matches (for trains, and when
    known, the earliest departure), then one question per asked slot (a train's two time
    slots are one question)."""
    noun = PLURALS.get(domain, "options")
    if domain == "train" and earliest:
        lead = pick(rng, (f"There are {count} trains on that route, the first at {earliest}.", f"I see {count} trains; the earliest goes at {earliest}."))
    else:
        lead = pick(rng, (
            f"I found {count} {noun} that fit.", f"There are {count} {noun} that match.", f"I have {count} options for you.",
            f"{count} {noun} match so far.", f"That gives me {count} options.",
        ))
    seen: list[str] = []
    for slot, values in asked.items():
        text = question(rng, domain, slot, values)
        if text not in seen:
            seen.append(text)
    return " ".join([lead, *seen])


def search_think(rng: random.Random, domain: str, known: Mapping[str, str]) -> str:
    what = describe(domain, known)
    return pick(rng, (
        f"The user wants {what}. I'll search the database with what they have told me.",
        f"I need to look up {what}; searching with the stated constraints.",
        f"Let me query the {domain} database for {what}.",
    ))


def name_think(rng: random.Random, domain: str, name: str, kind_said: bool) -> str:
    """Why search ``domain`` for a venue the user named: the kind they said (searched by the name
    alone), or, where they did not say it, the kind tried first."""
    if kind_said:
        return pick(rng, (
            f"The user asks about the {KIND_WORDS[domain][0]} {name}. I'll look it up by its name.",
            f"I need the details of {name}, which the user says is {_article(KIND_WORDS[domain][0])} {KIND_WORDS[domain][0]}; searching by the name.",
        ))
    return pick(rng, (
        f"The user asks about {name} without saying what kind of place it is. I'll look among the {PLURALS[domain]} first.",
        f"{capitalise(name)} could be a restaurant, a place to stay or an attraction; the user did not say. Searching the {PLURALS[domain]} for it first.",
    ))


def other_kind_think(rng: random.Random, searched: str, domain: str, name: str) -> str:
    """Why search ``domain`` for a named venue after the ``searched`` kind had nothing by that name."""
    return pick(rng, (
        f"Nothing called {name} among the {PLURALS[searched]}, so it is another kind of place. I'll look among the {PLURALS[domain]}.",
        f"No {KIND_WORDS[searched][0]} is called {name}; the user did not say what it is. Searching the {PLURALS[domain]} for it instead.",
    ))


def corrected_think(rng: random.Random, domain: str, name: str, added: Mapping[str, str], known: Mapping[str, str]) -> str:
    """Why search again after the user corrected a recommendation: with everything they have
    said, not only the correction."""
    said = join([_added_words(domain, s, v) for s, v in added.items()])
    return pick(rng, (
        f"{name} does not fit: the user also wants {said}. I'll search again with everything they have said: {describe(domain, known)}.",
        f"The user adds {said} to their request. Searching again with all of it, not just the new part: {describe(domain, known)}.",
    ))


def recovered_think(rng: random.Random, domain: str, dropped: Mapping[str, str], known: Mapping[str, str]) -> str:
    """Why search again after the user repeated what the last search left out."""
    said = join([_added_words(domain, s, v) for s, v in dropped.items()])
    return pick(rng, (
        f"My last search left out {said}, which the user had said. Searching again with everything they have said: {describe(domain, known)}.",
        f"The user reminds me of {said}; I dropped it. I'll search with all of it: {describe(domain, known)}.",
    ))


def _added_words(domain: str, slot: str, value: str) -> str:
    """A corrected constraint in a think: "free parking", "area north", for a train "departure
    from ely", "leaving after 09:15" (a train's places are not a taxi's pickup point)."""
    if slot in ("parking", "internet"):
        return said_value(slot, value)
    if domain == "train":
        words = {"departure": f"departure from {value}", "destination": f"destination {value}", "day": f"day {value}"}
        return words.get(slot) or constraint_phrase(domain, slot, value)
    return f"{SLOT_WORDS.get(slot, slot)} {value}"


def requery_think(rng: random.Random, domain: str, values: Mapping[str, str]) -> str:
    said = join([f"{SLOT_WORDS.get(s, s)} {v}" for s, v in values.items()])
    return pick(rng, (f"The user answered: {said}. I'll search again with that.", f"Now I know the {said}; searching again to narrow the options."))


def said_value(slot: str, value: str) -> str:
    """A stated value as the user's words have it, for the think to copy: "free parking"
    for parking yes, "without free wifi" for internet no, else the value itself."""
    if slot in ("parking", "internet"):
        thing = "free parking" if slot == "parking" else "free wifi"
        return thing if value == "yes" else f"without {thing}"
    return value


def said_pairs(user_texts: Sequence[str], known: Mapping[str, str]) -> dict[str, str]:
    """slot -> :func:`said_value` for the ``known`` constraints whose words occur in what the
    user said (``user_texts``); a value given by reference ("the same day as my hotel
    booking") is not among them."""
    from pipelines.rewards.verifiable import words  # the judge reads this module's slot words

    heard = " " + " ".join(words(text) for text in user_texts) + " "
    said = {}
    for slot, value in known.items():
        shown = said_value(slot, value)
        if words(shown) and f" {words(shown)} " in heard:
            said[slot] = shown
    return said


def said_line(said: Mapping[str, str], declined: Sequence[str] = ()) -> str:
    """What the user has said so far, copied from the dialogue: "Said: type=swimmingpool,
    area=centre." (``said``: slot -> the words as the user said them), with "No preference:
    area." for the slots they said they do not mind."""
    pairs = ", ".join(f"{slot}={value}" for slot, value in said.items()) or "nothing yet"
    line = f"Said: {pairs}."
    return f"{line} No preference: {', '.join(declined)}." if declined else line


def clarify_think(
    rng: random.Random, domain: str, count: int, differing: Mapping[str, Sequence[str]], asked: Sequence[str], said: str,
) -> str:
    """Why ask, in reasons the agent can check without seeing the goal: what the user has
    said (``said``, a :func:`said_line`), what they have not (``asked``: the question is only
    about those), how many candidates the search found and in what they differ
    (``differing``: what the agent saw vary among the results)."""
    noun = PLURALS.get(domain, "options")
    unsaid = ", ".join(asked)
    about = join([SLOT_WORDS.get(s, s) for s in asked])
    if not differing:
        return f"{said} Not said: {unsaid}. {count} {noun} match, more than I can tell apart, so I'll ask about the {about}."
    differ = join([slot_summary(s, v) for s, v in differing.items()])
    return pick(rng, (
        f"{said} Not said: {unsaid}. The {count} {noun} differ in {differ}, so I'll ask about the {about}.",
        f"{said} Not said: {unsaid}. {count} {noun} match, varying in {differ}: I'll ask before choosing.",
    ))


def needless_think(rng: random.Random, domain: str, count: int, slot: str, values: Sequence[str], said: str) -> str:
    """Why ask where the user turns out to have no preference: the same checkable reasons."""
    return clarify_think(rng, domain, count, {slot: values}, [slot], said)


def no_preference(rng: random.Random, slot: str) -> str:
    """The user's reply to a question they have no preference on (the agenda user's words)."""
    word = SLOT_WORDS.get(slot, slot)
    return pick(rng, (
        f"I don't mind about the {word}.", f"I have no preference for the {word}.", f"Any {word} is fine.",
        "Either is fine.", "I don't mind, any of those.", "Could you recommend one?", "Which one would you suggest?",
        "Any of them is fine, what do you recommend?",
    ))


def no_preference_think(rng: random.Random, domain: str, count: int, name: str, said: str) -> str:
    """After "I don't mind" (``said`` lists it as no preference): recommend one of the
    results already found, without searching again."""
    noun = PLURALS.get(domain, "options")
    return pick(rng, (
        f"{said} Nothing left to ask: all {count} {noun} I found fit, so no new search. I'll recommend {name}.",
        f"{said} Every one of the {count} results I have fits, so there is nothing to ask. I'll suggest {name}.",
    ))


def recommend_think(rng: random.Random, domain: str, count: int, name: str, guessed: bool = False, said: str | None = None) -> str:
    """Why recommend now; ``said``: what the user has said (a :func:`said_line`), every slot
    the results could differ in being settled."""
    noun = PLURALS.get(domain, "options")
    if guessed:
        return pick(rng, (
            f"{count} {noun} match. I'll go with the first one, {name}.",
            f"The search found {count} {noun}; {name} is listed first, so I'll recommend it.",
        ))
    said = f"{said} " if said else ""
    if count == 1:
        return f"{said}Exactly one {domain} matches: {name}. I'll recommend it."
    return pick(rng, (
        f"{said}The {count} {noun} fit all of it and nothing is left to ask. I'll suggest {name}.",
        f"{said}All {count} results satisfy what the user said; nothing to ask. {name} is a good choice to offer.",
    ))


def entity_detail(domain: str, attributes: Mapping[str, str]) -> str:
    a = attributes
    if domain == "restaurant":
        return f"{_article(a.get('pricerange', 'x'))} {a.get('pricerange', '')} {a.get('food', '')} restaurant in the {a.get('area', 'city')}".replace("  ", " ")
    if domain == "hotel":
        return f"a {a.get('stars', '?')}-star {a.get('type', 'hotel')} in the {a.get('area', 'city')} ({a.get('pricerange', 'unknown')} price range)"
    if domain == "attraction":
        return f"{attraction_phrase(a.get('type', 'attraction'))} in the {a.get('area', 'city')}"
    return ""


def recommendation(rng: random.Random, domain: str, attributes: Mapping[str, str], offer_booking: bool) -> str:
    if domain == "train":
        text = f"{attributes['trainID']} leaves {attributes['departure']} at {attributes['leaveAt']} and arrives in {attributes['destination']} at {attributes['arriveBy']}."
        return text + (pick(rng, (" Shall I book tickets?", " Would you like tickets?")) if offer_booking else "")
    name, detail = attributes["name"], entity_detail(domain, attributes)
    text = pick(rng, (f"I recommend {name}, {detail}.", f"How about {name}? It is {detail}.", f"{name} would be a good choice: {detail}."))
    return text + (pick(rng, (" Would you like me to book it?", " Shall I make a reservation?")) if offer_booking else "")


def no_match(rng: random.Random, domain: str, known: Mapping[str, str]) -> tuple[str, str]:
    """(think, response) after a search that found nothing."""
    what = describe(domain, known)
    return (
        f"Nothing matches {what}. I have to tell the user and ask what they could change.",
        pick(rng, (f"I'm sorry, I couldn't find {what}. Would you like to change one of your requirements?",
                   "Unfortunately nothing matches all of that. Could we change one of your requirements?")),
    )


def changed_request(rng: random.Random, domain: str, changed: Mapping[str, str]) -> str:
    what = join([constraint_phrase(domain, s, v) for s, v in changed.items()])
    return pick(rng, (f"How about {what} instead?", f"Okay, then {what}.", f"Let's try {what}."))


def book_think(rng: random.Random, name: str, values: Mapping[str, str]) -> str:
    said = join([f"{SLOT_WORDS.get(s, s)} {v}" for s, v in values.items()])
    return pick(rng, (
        f"The user wants to book {name} with {said}. They have given everything the booking needs, so I'll book it with their values.",
        f"Booking {name} with the values the user gave: {said}.",
    ))


def booking_values(values: Mapping[str, str], phrases: Mapping[str, str] | None = None) -> str:
    """"for 2 people on friday at 18:00": the booking as the user asked for it; ``phrases``
    replace values given by reference ("on the same day")."""
    phrases = phrases or {}
    parts = []
    for slot, value in values.items():
        if slot in phrases:
            parts.append(f"for {phrases[slot]}" if slot == "people" else f"on {phrases[slot]}")
        elif slot == "people":
            parts.append(f"for {_plural(value, 'person', 'people')}")
        elif slot == "day":
            parts.append(f"on {value}")
        elif slot == "time":
            parts.append(f"at {value}")
        elif slot == "stay":
            parts.append(f"for {_plural(value, 'night', 'nights')}")
    return " ".join(parts)


def booked(rng: random.Random, domain: str, name: str, reference: str, total: str | None = None, values: Mapping[str, str] | None = None) -> str:
    """The confirmation: what was booked, with the user's values, and the reference."""
    what = f" {booking_values(values)}" if values else ""
    if domain == "train":
        fee = f" The total fee is {total}, payable at the station." if total else ""
        return pick(rng, (
            f"Your tickets for {name}{what} are booked. The reference number is {reference}.{fee}",
            f"Booked {name}{what}! Reference number: {reference}.{fee}",
        ))
    return pick(rng, (
        f"Your booking at {name}{what} is confirmed. The reference number is {reference}.",
        f"I have booked {name}{what} for you. Your reference number is {reference}.",
        f"Done! {name} is booked{what}, reference {reference}.",
    ))


def unavailable(rng: random.Random, name: str, slot: str, value: str) -> tuple[str, str]:
    shown = {"day": f"on {value}", "time": f"at {value}", "stay": f"for {_plural(value, 'night', 'nights')}", "people": f"for {_plural(value, 'person', 'people')}"}[slot]
    return (
        f"The booking failed: {name} has no availability {shown}. I should tell the user and ask for another {SLOT_WORDS.get(slot, slot)}.",
        f"I'm sorry, {name} has no availability {shown}. Would you like to try another {SLOT_WORDS.get(slot, slot)}?",
    )


def reqt_think(rng: random.Random, name: str, reqt: Sequence[str]) -> str:
    asked = join([SLOT_WORDS.get(r, r) for r in reqt])
    return pick(rng, (f"The user wants the {asked} of {name}; the search results have them.", f"I can answer from the results I already have: {asked} of {name}."))


def reqt_answer(name: str, values: Mapping[str, str | None]) -> str:
    parts = []
    for slot, value in values.items():
        word = SLOT_WORDS.get(slot, slot)
        if value is None or value in ("", "?"):
            parts.append(f"I'm afraid I don't know the {word}")
        elif slot in ("internet", "parking"):
            thing = "free wifi" if slot == "internet" else "free parking"
            parts.append(f"it has {thing}" if value == "yes" else f"it does not offer {thing}")
        elif slot == "stars":
            parts.append(f"it has {_plural(value, 'star', 'stars')}")
        else:
            parts.append(f"the {word} is {value}")
    return f"For {name}: " + "; ".join(parts) + ". Is there anything else?"


_REQT_PREFIX, _REQT_SUFFIX = re.compile(r"For (?P<name>[^:]+): "), ". Is there anything else?"
_REQT_PART = re.compile(r"the (?P<word>[a-zA-Z ]+?) is (?P<value>.+)")


def parse_reqt_answer(text: str) -> tuple[str, dict[str, str]] | None:
    """What a :func:`reqt_answer`-shaped reply states: the venue's name and each ``the <slot>
    is <value>`` part by slot (parts in other shapes are skipped); None for another reply.
    Reads what a policy trained on these replies writes, so its claims can be checked.

    >>> parse_reqt_answer(reqt_answer("lucky inn", {"postcode": "cb49xw", "phone": "01223", "parking": "yes"}))
    ('lucky inn', {'postcode': 'cb49xw', 'phone': '01223'})
    >>> parse_reqt_answer("I recommend lucky inn.") is None
    True
    """
    head = _REQT_PREFIX.match(text.strip())
    if head is None or not text.strip().endswith(_REQT_SUFFIX):
        return None
    slots = {word: slot for slot, word in SLOT_WORDS.items()}
    stated = {}
    for part in text.strip()[head.end() : -len(_REQT_SUFFIX)].split("; "):
        claim = _REQT_PART.fullmatch(part)
        if claim is not None and claim["word"] in slots:
            stated[slots[claim["word"]]] = claim["value"]
    return head["name"], stated


def taxi_think(rng: random.Random, departure: str, destination: str, time_slot: str, time: str) -> str:
    when = _taxi_when(time_slot, time)
    return pick(rng, (f"A taxi from {departure} to {destination}, {when}: I have everything needed to book it.", f"Booking the taxi from {departure} to {destination}, {when}."))


def taxi_booked(rng: random.Random, car: str, phone: str, reference: str) -> str:
    return pick(rng, (
        f"Your taxi is booked: a {car} will pick you up. The contact number is {phone} and the reference is {reference}.",
        f"Done! Look out for a {car}; the driver's number is {phone}. Reference: {reference}.",
    ))


def taxi_clarify(rng: random.Random, first: str, second: str) -> tuple[str, str]:
    """(think, question) for "a taxi between the two places"."""
    think = pick(rng, (
        f"The two places are {first} and {second}, but the user has not said which way the taxi should go. "
        f"Booking it the wrong way round would send the taxi to the wrong pickup, so I'll ask.",
        f"'The two places' means {first} and {second}; either could be the pickup. I need the direction before booking.",
    ))
    ask = pick(rng, (
        f"Should the taxi pick you up at {first} and take you to {second}, or the other way round?",
        f"Where should the taxi pick you up: at {first} or at {second}?",
    ))
    return think, ask


# How the agent asks for each part of a taxi booking the user has not said. The agent does
# not know whether the user has a departure or an arrival time in mind, so it asks for either.
_TAXI_ASK: dict[str, tuple[str, ...]] = {
    "departure": ("where should the taxi pick you up", "where will you be leaving from"),
    "destination": ("where are you heading", "where would you like to go"),
    "time": ("what time would you like to leave, or is there a time you need to arrive by",
             "when would you like to leave, or do you need to arrive by a certain time"),
}
_TAXI_PART_WORDS = {"departure": "the pickup", "destination": "the destination", "time": "the time"}


def taxi_slot_question(rng: random.Random, missing: Sequence[str]) -> tuple[str, str]:
    """(think, question) for a taxi request that lacks ``missing`` (of ``departure``,
    ``destination``, ``time``): slot filling, one question for all of it."""
    parts = join([_TAXI_PART_WORDS[s] for s in missing])
    verb = "is" if len(missing) == 1 else "are"
    think = pick(rng, (
        f"The user wants a taxi but has not said {parts}. A taxi booking needs the pickup, the destination and a time, "
        f"and making one up would send the car to the wrong place or at the wrong time, so I'll ask.",
        f"To book the taxi I need the pickup, the destination and a time; {parts} {verb} still missing, so I'll ask before booking.",
    ))
    return think, capitalise(join([pick(rng, _TAXI_ASK[s]) for s in missing])) + "?"


def taxi_guess_think(first: str, second: str) -> str:
    return f"The user wants a taxi between the two places they mentioned; I'll book it from {first} to {second}."


def reference_clarify(rng: random.Random, slot: str, readings: Sequence[tuple[str, str]]) -> tuple[str, str]:
    """(think, question) for "the same day as my earlier booking" with several readings
    (``readings``: (domain, value))."""
    listed = join([f"the {domain} booking ({value})" for domain, value in readings])
    word = "day" if slot == "day" else "number of people"
    think = pick(rng, (
        f"The user refers to their earlier booking for the {word}, but there are {len(readings)} of them with different values: {listed}. "
        f"Guessing could book the wrong {word}, so I'll ask which one they mean.",
        f"'{REFERENCE_WORDS[slot]}' is ambiguous: {listed}. I need to know which booking they mean.",
    ))
    if slot == "day":
        options_text = join([f"the {domain} on {value}" for domain, value in readings], "or")
        ask = pick(rng, (f"Which booking do you mean: {options_text}?", f"Just to check, do you mean {options_text}?"))
    else:
        options_text = join([f"{value} as for the {domain}" for domain, value in readings], "or")
        ask = pick(rng, (f"How many people should I book for: {options_text}?", f"Do you mean {options_text}? How many people is it?"))
    return think, ask


def reference_guess_think(slot: str, domain: str, value: str) -> str:
    word = "day" if slot == "day" else "number of people"
    return f"The user wants the same {word} as their earlier booking; the most recent one was the {domain} booking, so I'll use {value}."


def reference_resolved_think(slot: str, domain: str, value: str) -> str:
    word = "day" if slot == "day" else "number of people"
    return f"The user means the same {word} as their {domain} booking, which is {value}."


REFERENCE_WORDS: Mapping[str, str] = {"day": "the same day", "people": "the same number of people"}


def closing(rng: random.Random) -> tuple[str, str]:
    return (
        "The user has everything they asked for; the conversation is over.",
        pick(rng, ("You're welcome. Have a great day!", "Thank you for using our service. Goodbye.", "Glad I could help. Enjoy your trip!")),
    )
