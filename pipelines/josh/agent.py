"""The offline ``rules`` agent for ToolWOZ: a stochastic policy over the ToolWOZ tools.

It is what JOSH needs on a laptop without a model: an agent that is sometimes right and
often not, so that branching the conversation genuinely changes the outcome. It is not
the oracle: it never sees the goal or the goal APIs, only the conversation. Each agent
turn it reads what the user said (a shallow slot tracker over database values and a few
cue words, like the agenda simulator's reader) and then draws, from the turn's own seed:

* ask (a clarification about a search parameter it does not know yet), with ``p_ask``;
* otherwise search, keeping each known argument with ``p_keep`` (partial searches return
  goal-violating results in ToolWOZ, Algorithm 2) and, with ``p_wrong``, swapping one
  value for another value of the database (a misheard constraint);
* book once the user wants to and a search result names a venue or train, dropping one
  booking argument with ``1 - p_keep`` and misstating the number of people with
  ``p_wrong``;
* after a tool result, tell the user what came back (the offer with its details, "no
  match", the booking reference or the failure).

Every draw comes from :attr:`AgentContext.step_seed`, which JOSH makes distinct on sibling
branches, so two children of one node take different actions while a re-run repeats
exactly.
"""

from __future__ import annotations

import json
import random
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipelines.config import rate
from pipelines.env.toolwoz import API_SPECS, TOOLWOZ_DOMAINS, ToolWozDatabase, book_api, search_api
from pipelines.episodes.agents import ActionAgent, AgentContext
from pipelines.episodes.formats import AgentAction, AgentFormat
from pipelines.multiwoz.ontology import DAYS, UNIQUE_ID, norm_value
from pipelines.simulators.understanding import words

# Cue words that move the conversation to a domain (matched as whole words on norm_value).
_DOMAIN_CUES: Mapping[str, tuple[str, ...]] = {
    "restaurant": ("restaurant", "food", "eat", "dine", "dinner", "lunch", "table"),
    "hotel": ("hotel", "guesthouse", "place to stay", "accommodation", "room", "lodging"),
    "attraction": ("attraction", "something to do", "to visit", "museum", "college", "entertainment", "sightseeing"),
    "train": ("train", "travel", "trip", "station"),
}
_WANTS_BOOKING = re.compile(r"\b(book|reserve|reservation|tickets?)\b")
_TIME = re.compile(r"(?<!\d)(\d{1,2}):(\d{2})(?!\d)")
_PEOPLE = re.compile(r"\b(\d+) (?:people|person|persons|guests|tickets|of us)\b|\bfor (\d+)\b(?! night)")
_STAY = re.compile(r"\b(\d+) nights?\b")
_STARS = re.compile(r"\b(\d) stars?\b")
_REQUESTABLE = ("address", "phone", "postcode", "entrance", "price", "duration", "arriveBy", "leaveAt")


@dataclass(frozen=True)
class RulesPolicy:
    """The agent's probabilities (see the module docstring)."""

    p_ask: float = 0.3
    p_keep: float = 0.8
    p_wrong: float = 0.1

    def __post_init__(self) -> None:
        for name in ("p_ask", "p_keep", "p_wrong"):
            rate(getattr(self, name), f"rules agent: {name}")


@dataclass
class _Domain:
    search: dict[str, str]
    book: dict[str, str]
    result: dict[str, str] | None = None  # the last search result
    wants_booking: bool = False


class SlotReader:
    """Reads user turns into per-domain search and booking values. Values are found by
    the database's own spellings, so the reader knows what exists, not what the goal is."""

    def __init__(self, database: ToolWozDatabase):
        self.values: dict[str, list[tuple[str, str]]] = {}
        for domain in TOOLWOZ_DOMAINS:
            pairs: set[tuple[str, str]] = set()
            for row in database.rows(domain):
                for slot in search_api(domain).parameter_names:
                    if slot in ("leaveAt", "arriveBy", "stars", "parking", "internet"):
                        continue  # read by pattern below, not by value
                    value = row.entity.get(slot)
                    if value and len(words(value)) > 2:
                        pairs.add((slot, words(value)))
            # Longest first: "london kings cross" before "london".
            self.values[domain] = sorted(pairs, key=lambda p: (-len(p[1]), p))

    def read(self, messages: Sequence[Mapping[str, Any]]) -> tuple[str | None, dict[str, _Domain]]:
        """(the domain the user talks about now, what is known per domain)."""
        domains = {d: _Domain({}, {}) for d in TOOLWOZ_DOMAINS}
        active: str | None = None
        for message in messages:
            content = str(message.get("content") or "")
            if message.get("role") != "user" or content.startswith("APIRETURN"):
                if message.get("role") == "user" and active is not None:
                    _read_observation(content, domains[active])
                continue
            text = f" {words(content)} "
            cued = [d for d, cues in _DOMAIN_CUES.items() if any(f" {c} " in text or f" {c}s " in text for c in cues)]
            if not cued:
                # "I need bridge boat hire": a venue named without its domain.
                cued = [d for d in TOOLWOZ_DOMAINS if any(s == "name" and f" {v} " in text for s, v in self.values[d])]
            if cued:
                active = min(cued, key=lambda d: min((text.find(f" {c}") for c in _DOMAIN_CUES[d] if f" {c}" in text), default=len(text)))
            if active is None:
                continue
            self._read_values(text, norm_value(content), active, domains[active])
        return active, domains

    def _read_values(self, text: str, raw: str, domain: str, known: _Domain) -> None:
        for slot, value in self.values[domain]:
            if f" {value} " not in text:
                continue
            if domain == "train" and slot in ("departure", "destination"):
                if f" from {value} " in text:
                    known.search["departure"] = value
                elif f" to {value} " in text:
                    known.search["destination"] = value
                continue
            known.search[slot] = value
        for day in DAYS:
            if f" {day} " in text:
                (known.search if domain == "train" else known.book)["day"] = day
        for hours, minutes in _TIME.findall(raw):
            value = f"{int(hours):02d}:{minutes}"
            before = raw[: raw.find(f"{hours}:{minutes}")]
            if domain == "train":
                slot = "arriveBy" if re.search(r"\b(arriv\w*|by)\s*$", before) else "leaveAt"
                known.search[slot] = value
            elif domain == "restaurant":
                known.book["time"] = value
        if domain in ("hotel", "train", "restaurant"):
            for match in _PEOPLE.finditer(text):
                known.book["people"] = match.group(1) or match.group(2)
        if domain == "hotel":
            for match in _STAY.finditer(text):
                known.book["stay"] = match.group(1)
            for match in _STARS.finditer(text):
                known.search["stars"] = match.group(1)
            for slot, names in (("parking", ("parking",)), ("internet", ("wifi", "internet"))):
                if any(f" {w} " in text for w in names) and not any(f"no need for {w}" in text for w in names):
                    known.search[slot] = "yes"
        if _WANTS_BOOKING.search(text):
            known.wants_booking = True


def _read_observation(content: str, known: _Domain) -> None:
    try:
        observation = json.loads(content[len("APIRETURN"):].strip())
    except ValueError:
        return
    results = observation.get("results") if isinstance(observation, Mapping) else None
    if isinstance(results, list) and results and isinstance(results[0], Mapping):
        known.result = {str(k): str(v) for k, v in results[0].items()}


class RulesToolWozAgent(ActionAgent):
    """The ``rules`` backend of JOSH (see the module docstring). ``fmt`` must carry the
    ToolWOZ tools; any of the three formats works (it renders through the format)."""

    def __init__(self, database: ToolWozDatabase, fmt: AgentFormat, policy: RulesPolicy = RulesPolicy(), *, name: str = "rules"):
        self.reader = SlotReader(database)
        self.format = fmt
        self.policy = policy
        self.name = name

    def actions(self, context: AgentContext) -> list[AgentAction]:
        rng = random.Random(context.step_seed)
        active, domains = self.reader.read(context.messages)
        last = context.messages[-1] if context.messages else {}
        in_turn = [call for turn, call in context.calls if turn == context.turn]
        if in_turn and last.get("role") != "assistant":
            return [AgentAction.think("I will tell the user what the api returned."), self._report(in_turn[-1])]
        if active is None:
            return [self._ask("Hello! Are you looking for a restaurant, a hotel, an attraction or a train?")]
        known = domains[active]
        uid = UNIQUE_ID[active]
        bookable = bool(book_api(active).parameters)
        if bookable and known.wants_booking and known.result and uid in known.result:
            args = dict(known.book)
            args[uid] = known.result[uid]
            args = self._perturb(args, rng)
            if "people" in args and rng.random() < self.policy.p_wrong:
                args["people"] = str(int(args["people"]) + 1) if args["people"].isdigit() else "2"
            return [AgentAction.think(f"The user wants to book; I will call {book_api(active).name}."),
                    AgentAction.tool_call(book_api(active).name, args)]
        missing = [s for s in search_api(active).parameter_names if s not in known.search and s != "name"]
        if missing and rng.random() < self.policy.p_ask:
            slot = rng.choice(missing)
            return [AgentAction.think(f"I do not know the {slot} yet; I will ask."), self._ask(_QUESTIONS.get(slot, f"What {slot} would you like?"))]
        args = self._perturb(dict(known.search), rng)
        if rng.random() < self.policy.p_wrong:
            args = self._mislead(active, args, rng)
        return [AgentAction.think("I will search with what I know so far."), AgentAction.tool_call(search_api(active).name, args)]

    def _ask(self, question: str) -> AgentAction:
        # ReAct (JOSH's format) has no separate clarify command: a question is a SPEAK.
        return AgentAction.respond(question) if self.format.name == "react" else AgentAction.clarify(question)

    def _perturb(self, args: dict[str, str], rng: random.Random) -> dict[str, str]:
        """Each argument kept with ``p_keep`` (partial calls; a booking may lose its venue too)."""
        return {slot: value for slot, value in args.items() if rng.random() < self.policy.p_keep}

    def _mislead(self, domain: str, args: dict[str, str], rng: random.Random) -> dict[str, str]:
        """One argument replaced by another database value of the same slot."""
        if not args:
            return args
        slot = rng.choice(sorted(args))
        others = [v for s, v in self.reader.values[domain] if s == slot and v != args[slot]]
        if others:
            args = {**args, slot: rng.choice(others)}
        return args

    def _report(self, call: Any) -> AgentAction:
        observation = call.observation or {}
        spec = API_SPECS.get(call.name)
        if "error" in observation or spec is None:
            return AgentAction.respond("Sorry, I could not look that up. Could you tell me again what you need?")
        if spec.intent == "book":
            if observation.get("success"):
                reference = (observation.get("return") or {}).get("reference", "")
                return AgentAction.respond(f"Your booking is confirmed. The reference number is {reference}.")
            return AgentAction.respond("Sorry, that booking failed. Would you like to try a different day, time or number of people?")
        results = observation.get("results") or []
        if not results:
            return AgentAction.respond("Sorry, there are no matches for that. Could you change one of your requirements?")
        item = results[0]
        return AgentAction.respond(_offer(spec.domain, item))


_QUESTIONS: Mapping[str, str] = {
    "food": "What type of food would you like?",
    "pricerange": "What price range are you looking for?",
    "area": "Which area of town would you prefer?",
    "type": "What type of place are you looking for?",
    "stars": "How many stars should it have?",
    "parking": "Do you need free parking?",
    "internet": "Do you need free wifi?",
    "day": "What day will you travel?",
    "departure": "Where will you be departing from?",
    "destination": "Where are you travelling to?",
    "leaveAt": "What time would you like to leave?",
    "arriveBy": "What time do you need to arrive by?",
}


def _offer(domain: str, item: Mapping[str, Any]) -> str:
    if domain == "train":
        parts = [f"{item.get('trainID')} leaves {item.get('departure')} at {item.get('leaveAt')} on {item.get('day')}",
                 f"arrives in {item.get('destination')} at {item.get('arriveBy')}"]
        if item.get("price"):
            parts.append(f"costs {item['price']}")
        return f"I found train {', '.join(parts)}. Shall I book it?"
    details = [f"{slot} {item[slot]}" for slot in ("area", "pricerange", "food", "type", "stars") if item.get(slot)]
    contact = [f"the {slot} is {item[slot]}" for slot in ("address", "postcode", "phone") if item.get(slot)]
    if item.get("entrance"):
        contact.append(f"the entrance fee is {item['entrance']}")
    question = "Would you like to book it?" if domain != "attraction" else "Can I help with anything else?"
    return f"I found {item.get('name')} ({', '.join(details)}); {', '.join(contact)}. {question}"
