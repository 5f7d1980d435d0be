"""The embedded corpus: goals and dialogues in the official MultiWOZ 2.4 layout.

``generate_corpus`` returns the three things an official release holds — ``data.json``
({dialogue_id: {goal, log}}), the database files and the split lists — as plain JSON
values. A stage writes them to disk and the one MultiWOZ loader reads them back, so the
embedded default and real MultiWOZ share one code path.

Goals are sampled the way MultiWOZ goals look: single- and multi-domain, ``info`` /
``book`` / ``reqt``, ``fail_info`` / ``fail_book`` backups, and cross-domain references
("the same day as the hotel booking", a taxi between two venues of the goal). Every goal
is satisfiable in the database by construction: each domain goal is built around a
target entity, and ``fail_info`` constraints are checked to match nothing.

Dialogues are rendered from the goal turn by turn, with the belief state (system-turn
``metadata``) and dialog acts a MultiWOZ annotator would have written. Each dialogue
draws from its own RNG seeded by (seed, index): output is deterministic and independent
of how many dialogues are generated.
"""

from __future__ import annotations

import copy
import random
import string
from dataclasses import dataclass, field
from typing import Any

from pipelines.config import positive_int
from pipelines.multiwoz.embedded_db import HOSPITAL_DEPARTMENTS, build_database
from pipelines.multiwoz.ontology import ACT_SLOT, DAYS, format_time, parse_time, values_match

# How often each goal shape occurs (MultiWOZ: ~30% single-domain, the rest 2-3 domains).
SINGLE_DOMAIN_WEIGHTS = {"restaurant": 0.28, "hotel": 0.22, "attraction": 0.14, "train": 0.24, "taxi": 0.08, "police": 0.02, "hospital": 0.02}
MULTI_DOMAIN_COMBOS: tuple[tuple[str, ...], ...] = (
    ("hotel", "train"), ("restaurant", "train"), ("attraction", "train"), ("restaurant", "hotel"),
    ("attraction", "restaurant"), ("attraction", "hotel"), ("hotel", "restaurant", "taxi"),
    ("attraction", "restaurant", "taxi"), ("attraction", "hotel", "taxi"), ("hotel", "attraction", "train"),
    ("restaurant", "attraction", "train"), ("hotel", "restaurant", "train"),
)
_BELIEF_TEMPLATE: dict[str, dict[str, Any]] = {
    "taxi": {"book": {"booked": []}, "semi": {"leaveAt": "", "destination": "", "departure": "", "arriveBy": ""}},
    "police": {"book": {"booked": []}, "semi": {}},
    "restaurant": {"book": {"booked": [], "people": "", "day": "", "time": ""}, "semi": {"food": "", "pricerange": "", "name": "", "area": ""}},
    "hospital": {"book": {"booked": []}, "semi": {"department": ""}},
    "hotel": {"book": {"booked": [], "people": "", "day": "", "stay": ""}, "semi": {"name": "", "area": "", "parking": "", "pricerange": "", "stars": "", "internet": "", "type": ""}},
    "attraction": {"book": {"booked": []}, "semi": {"type": "", "name": "", "area": ""}},
    "train": {"book": {"booked": [], "people": ""}, "semi": {"leaveAt": "", "destination": "", "day": "", "arriveBy": "", "departure": ""}},
}
_NOT_MENTIONED = "not mentioned"
_REQT_CHOICES = {
    "restaurant": ("address", "phone", "postcode", "food", "area", "pricerange"),
    "hotel": ("address", "phone", "postcode", "area", "pricerange", "internet", "parking", "stars", "type"),
    "attraction": ("address", "phone", "postcode", "entrance fee", "area", "type"),
    "train": ("duration", "price", "arriveBy", "trainID"),
}
_SLOT_WORDS = {
    "address": "address", "phone": "phone number", "postcode": "postcode", "food": "type of food", "area": "area",
    "pricerange": "price range", "internet": "internet", "parking": "parking", "stars": "star rating", "type": "type",
    "entrance fee": "entrance fee", "duration": "travel time", "price": "price", "arriveBy": "arrival time",
    "leaveAt": "departure time", "trainID": "train ID", "car type": "car type", "department": "department", "name": "name",
}


@dataclass
class DomainPlan:
    """One domain of a goal while it is being built and rendered."""

    domain: str
    target: dict[str, Any] | None
    info: dict[str, str]
    fail_info: dict[str, str] = field(default_factory=dict)
    book: dict[str, str] = field(default_factory=dict)
    fail_book: dict[str, str] = field(default_factory=dict)
    reqt: list[str] = field(default_factory=list)
    # Slots the user states by reference to another domain, with the phrase to use.
    references: dict[str, str] = field(default_factory=dict)

    def goal_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"info": dict(self.info), "reqt": list(self.reqt), "fail_info": dict(self.fail_info)}
        if self.book:
            out["book"] = {**self.book, "invalid": False}
            out["fail_book"] = dict(self.fail_book)
        return out

    @property
    def venue_name(self) -> str | None:
        return None if self.target is None else self.target.get("name")


def _matches(record: dict[str, Any], constraints: dict[str, str]) -> bool:
    return all(values_match(slot, value, record.get(slot)) for slot, value in constraints.items())


def _reference(rng: random.Random) -> str:
    return "".join(rng.choice(string.ascii_uppercase + string.digits) for _ in range(8))


def _quarter(minutes: int) -> int:
    return (minutes // 15) * 15


class GoalSampler:
    def __init__(self, db: dict[str, list[dict[str, Any]]], rng: random.Random):
        self.db = db
        self.rng = rng

    def sample(self) -> list[DomainPlan]:
        rng = self.rng
        if rng.random() < 0.3:
            domains: tuple[str, ...] = (rng.choices(list(SINGLE_DOMAIN_WEIGHTS), weights=list(SINGLE_DOMAIN_WEIGHTS.values()))[0],)
        else:
            domains = rng.choice(MULTI_DOMAIN_COMBOS)
        plans: list[DomainPlan] = []
        for domain in domains:
            plans.append(getattr(self, f"_{domain}")(plans))
        return plans

    # -- venue domains -------------------------------------------------------------
    def _venue(self, domain: str, plans: list[DomainPlan], slots: tuple[str, ...], sizes: tuple[int, ...], p_name: float) -> DomainPlan:
        rng = self.rng
        table = self.db[domain]
        references: dict[str, str] = {}
        pool = table
        attraction = next((p for p in plans if p.domain == "attraction" and p.target), None)
        if attraction is not None and domain != "attraction" and rng.random() < 0.4:
            same_area = [r for r in table if r["area"] == attraction.target["area"]]
            if same_area:
                pool = same_area
                references["area"] = "in the same area as the attraction"
        target = rng.choice(pool)
        if rng.random() < p_name and not references:
            info = {"name": target["name"]}
        else:
            chosen = rng.sample(slots, min(rng.choice(sizes), len(slots)))
            if "area" in references and "area" not in chosen:
                chosen.append("area")
            info = {slot: str(target[slot]) for slot in slots if slot in chosen}
        plan = DomainPlan(domain, target, info, references=references)
        if "name" not in info and rng.random() < 0.15:
            plan.fail_info = self._failing_variant(domain, info, slots)
        plan.reqt = rng.sample(_REQT_CHOICES[domain], rng.choice((0, 1, 1, 2, 2, 3)))
        plan.reqt = [r for r in plan.reqt if r not in info]
        return plan

    def _failing_variant(self, domain: str, info: dict[str, str], slots: tuple[str, ...]) -> dict[str, str]:
        """Constraints like ``info`` with one value changed so that nothing matches."""
        rng = self.rng
        table = self.db[domain]
        for slot in rng.sample(list(info), len(info)):
            values = sorted({str(r[slot]) for r in table} - {info[slot]})
            rng.shuffle(values)
            for value in values:
                candidate = {**info, slot: value}
                if not any(_matches(r, candidate) for r in table):
                    return candidate
        # Add a constraint nothing satisfies together with the others.
        for slot in slots:
            if slot in info:
                continue
            for value in sorted({str(r[slot]) for r in table}):
                candidate = {**info, slot: value}
                if not any(_matches(r, candidate) for r in table):
                    return candidate
        return {}

    def _booking(self, plan: DomainPlan, plans: list[DomainPlan], slots: tuple[str, ...]) -> None:
        rng = self.rng
        book: dict[str, str] = {}
        other = next((p for p in plans if p.book.get("people")), None)
        if other is not None and rng.random() < 0.5:
            book["people"] = other.book["people"]
            plan.references["people"] = f"the same group of people as the {other.domain} booking"
        else:
            book["people"] = str(rng.choice((1, 2, 2, 3, 4, 4, 5, 6, 7, 8)))
        other_day = next((p for p in plans if p.book.get("day")), None)
        if other_day is not None and rng.random() < 0.5:
            book["day"] = other_day.book["day"]
            plan.references["day"] = f"the same day as the {other_day.domain} booking"
        else:
            book["day"] = rng.choice(DAYS)
        if "time" in slots:
            book["time"] = format_time(rng.randrange(11 * 60, 21 * 60, 15))
        if "stay" in slots:
            book["stay"] = str(rng.choice((1, 2, 2, 3, 3, 4, 5)))
        plan.book = {slot: book[slot] for slot in slots}
        if rng.random() < 0.15:
            slot = rng.choice([s for s in slots if s != "people"])
            if slot == "day":
                plan.fail_book = {"day": rng.choice([d for d in DAYS if d != book["day"]])}
            elif slot == "time":
                plan.fail_book = {"time": format_time(parse_time(book["time"]) + rng.choice((-60, -30, 30, 60)))}
            else:
                plan.fail_book = {"stay": str(int(book["stay"]) + rng.choice((1, 2)))}
            plan.references.pop(slot, None)

    def _restaurant(self, plans: list[DomainPlan]) -> DomainPlan:
        plan = self._venue("restaurant", plans, ("food", "pricerange", "area"), (1, 2, 2, 3, 3), 0.15)
        if self.rng.random() < 0.65:
            self._booking(plan, plans, ("people", "day", "time"))
        return plan

    def _hotel(self, plans: list[DomainPlan]) -> DomainPlan:
        plan = self._venue("hotel", plans, ("type", "parking", "pricerange", "internet", "stars", "area"), (2, 2, 3, 3, 4), 0.15)
        if self.rng.random() < 0.65:
            self._booking(plan, plans, ("people", "day", "stay"))
        return plan

    def _attraction(self, plans: list[DomainPlan]) -> DomainPlan:
        plan = self._venue("attraction", plans, ("type", "area"), (1, 1, 2), 0.25)
        if not plan.reqt:
            plan.reqt = [self.rng.choice(_REQT_CHOICES["attraction"][:4])]
        return plan

    def _train(self, plans: list[DomainPlan]) -> DomainPlan:
        rng = self.rng
        references: dict[str, str] = {}
        booked_day = next((p for p in plans if p.book.get("day")), None)
        if booked_day is not None and rng.random() < 0.7:
            day = booked_day.book["day"]
            references["day"] = f"the same day as the {booked_day.domain} booking"
        else:
            day = rng.choice(DAYS)
        # Draw the route from the database itself, so any MultiWOZ-schema database works.
        on_day = [t for t in self.db["train"] if t["day"] == day] or self.db["train"]
        seed_train = rng.choice(on_day)
        day, departure, destination = seed_train["day"], seed_train["departure"], seed_train["destination"]
        if references.get("day") and day != booked_day.book["day"]:
            references.pop("day")
        route = [t for t in self.db["train"] if t["departure"] == departure and t["destination"] == destination and t["day"] == day]
        target = seed_train
        info = {"departure": departure, "destination": destination, "day": day}
        if rng.random() < 0.6:
            # The earliest train leaving at/after the constraint is the target.
            info["leaveAt"] = format_time(max(_quarter(parse_time(target["leaveAt"])), parse_time(target["leaveAt"]) - 45))
            candidates = [t for t in route if values_match("leaveAt", info["leaveAt"], t["leaveAt"])]
            target = min(candidates, key=lambda t: parse_time(t["leaveAt"]))
        else:
            arrive = parse_time(target["arriveBy"])
            rounded = _quarter(arrive) + (15 if arrive % 15 else 0)
            # Past midnight (real timetables write "24:08"): keep the timetable's own value.
            info["arriveBy"] = format_time(rounded) if rounded < 24 * 60 else target["arriveBy"]
            candidates = [t for t in route if values_match("arriveBy", info["arriveBy"], t["arriveBy"])]
            target = max(candidates, key=lambda t: parse_time(t["arriveBy"]))
        plan = DomainPlan("train", target, info, references=references)
        if rng.random() < 0.6:
            other = next((p for p in plans if p.book.get("people")), None)
            if other is not None and rng.random() < 0.5:
                plan.book = {"people": other.book["people"]}
                plan.references["people"] = f"the same group of people as the {other.domain} booking"
            else:
                plan.book = {"people": str(rng.choice((1, 1, 2, 3, 4, 5, 6, 8)))}
            plan.reqt = rng.sample(("duration", "price"), rng.choice((0, 0, 1)))
        else:
            plan.reqt = rng.sample(_REQT_CHOICES["train"], rng.choice((1, 2, 3)))
        return plan

    def _taxi(self, plans: list[DomainPlan]) -> DomainPlan:
        rng = self.rng
        venues = [p for p in plans if p.venue_name]
        references: dict[str, str] = {}
        if len(venues) >= 2:
            first, second = rng.sample(venues, 2)
            departure, destination = first.venue_name, second.venue_name
            references["departure"] = f"the {first.domain}"
            references["destination"] = f"the {second.domain}"
        else:
            pool = self.db["restaurant"] + self.db["hotel"] + self.db["attraction"]
            a, b = rng.sample(pool, 2)
            departure, destination = a["name"], b["name"]
            second = None
        info = {"departure": departure, "destination": destination}
        if second is not None and second.book.get("time") and rng.random() < 0.7:
            info["arriveBy"] = second.book["time"]
            references["arriveBy"] = "the time of the restaurant booking"
        elif rng.random() < 0.5:
            info["leaveAt"] = format_time(rng.randrange(7 * 60, 23 * 60, 15))
        else:
            info["arriveBy"] = format_time(rng.randrange(8 * 60, 23 * 60, 15))
        return DomainPlan("taxi", None, info, reqt=["car type", "phone"], references=references)

    def _police(self, plans: list[DomainPlan]) -> DomainPlan:
        return DomainPlan("police", self.db["police"][0], {}, reqt=self.rng.sample(("address", "phone", "postcode"), self.rng.choice((1, 2, 3))))

    def _hospital(self, plans: list[DomainPlan]) -> DomainPlan:
        target = self.rng.choice(self.db["hospital"])
        return DomainPlan("hospital", target, {"department": target["department"]}, reqt=["phone"])


# -- goal messages ------------------------------------------------------------------

def _em(value: str) -> str:
    return f"<span class='emphasis'>{value}</span>"


def goal_message(plans: list[DomainPlan]) -> list[str]:
    """The instructions shown to the (crowd-worker or simulated) user, MultiWOZ style."""
    lines: list[str] = []
    for i, plan in enumerate(plans):
        d = plan.domain
        opener = "You are looking for" if i == 0 else "You are also looking for"
        if d in ("restaurant", "hotel", "attraction"):
            if "name" in plan.info:
                lines.append(f"{opener} a particular {d}. Its name is called {_em(plan.info['name'])}")
            else:
                parts = [f"{opener} a {_em(d if d != 'attraction' else 'place to go')}"]
                for slot, value in plan.info.items():
                    if slot in plan.references:
                        parts.append(f"The {d} should be {_em(plan.references[slot])}")
                    else:
                        parts.append(f"The {d} should have {_SLOT_WORDS.get(slot, slot)} {_em(value)}")
                lines.append(". ".join(parts))
            if plan.fail_info:
                lines.append(f"Start by asking for {', '.join(_em(v) for v in plan.fail_info.values())}; if there is no such {d}, use the constraints above")
        elif d == "train":
            text = f"{opener} a {_em('train')}. The train should depart from {_em(plan.info['departure'])} and go to {_em(plan.info['destination'])}"
            day = plan.references.get("day") or plan.info["day"]
            text += f". The train should leave on {_em(day)}"
            if "leaveAt" in plan.info:
                text += f" and should leave after {_em(plan.info['leaveAt'])}"
            else:
                text += f" and should arrive by {_em(plan.info['arriveBy'])}"
            lines.append(text)
        elif d == "taxi":
            dep = plan.references.get("departure") or plan.info["departure"]
            dest = plan.references.get("destination") or plan.info["destination"]
            when = (f"arrive by {_em(plan.references.get('arriveBy') or plan.info['arriveBy'])}" if "arriveBy" in plan.info else f"leave after {_em(plan.info['leaveAt'])}")
            lines.append(f"{opener} a {_em('taxi')} to commute from {_em(dep)} to {_em(dest)}. The taxi should {when}")
        elif d == "police":
            lines.append(f"{opener} the {_em('Parkside Police Station')}")
        elif d == "hospital":
            lines.append(f"{opener} the {_em('Addenbrookes Hospital')}. The hospital should have the {_em(plan.info['department'])} department")
        if plan.book:
            words = {"people": "people", "day": "on", "time": "at", "stay": "nights"}
            bits = []
            for slot, value in plan.book.items():
                shown = plan.references.get(slot, value)
                bits.append(f"{_em(shown)} {words[slot]}" if slot in ("people", "stay") else f"{words[slot]} {_em(shown)}")
            lines.append("Once you find the " + d + " you want to book it for " + ", ".join(bits))
            if plan.fail_book:
                slot, value = next(iter(plan.fail_book.items()))
                lines.append(f"Try {_em(value)} first for the {_SLOT_WORDS.get(slot, slot)}; if the booking fails, use {_em(plan.book[slot])}")
            lines.append("Make sure you get the " + _em("reference number"))
        if plan.reqt:
            lines.append("Make sure you get " + ", ".join(_em(_SLOT_WORDS.get(r, r)) for r in plan.reqt))
    return lines


# -- dialogue rendering -------------------------------------------------------------

_USER_FIND = {
    "restaurant": ("I am looking for a {desc} restaurant{where}.", "Can you help me find a {desc} place to eat{where}?", "I'd like to find a restaurant{where}. Something {desc}, please."),
    "hotel": ("I need a place to stay{where}. {desc}", "I'm looking for a hotel{where}. {desc}", "Can you help me find accommodation{where}? {desc}"),
    "attraction": ("I'm looking for something to do{where}. {desc}", "Are there any attractions{where}? {desc}", "Can you recommend a place to visit{where}? {desc}"),
}
_USER_NAME = ("I'm looking for {name}.", "Can you give me some information about {name}?", "I need details on a place called {name}.")
_USER_BYE = ("That's all I need, thank you.", "Thanks, that is everything.", "Great, thank you for your help. Goodbye.", "No, that will be all. Thanks!")
_SYSTEM_BYE = ("You're welcome. Have a great day!", "Thank you for using our service. Goodbye.", "Glad I could help. Enjoy your trip!")


def _article(word: str) -> str:
    return "an" if word[:1] in "aeiou" else "a"


def _slot_phrase(domain: str, slot: str, value: str) -> str:
    if slot == "food":
        return f"{value} food"
    if slot == "pricerange":
        return f"in the {value} price range"
    if slot == "area":
        return f"in the {value}" if value != "centre" else "in the centre of town"
    if slot == "type":
        return f"a {value}" if domain != "attraction" else f"a {value} kind of place"
    if slot == "stars":
        return f"{value} stars"
    if slot == "parking":
        return "free parking" if value == "yes" else "no need for parking"
    if slot == "internet":
        return "free wifi" if value == "yes" else "no need for internet"
    return f"{_SLOT_WORDS.get(slot, slot)} {value}"


class _Renderer:
    """Writes one dialogue: the log with belief states and dialog acts."""

    def __init__(self, plans: list[DomainPlan], db: dict[str, list[dict[str, Any]]], rng: random.Random):
        self.plans = plans
        self.db = db
        self.rng = rng
        self.belief = copy.deepcopy(_BELIEF_TEMPLATE)
        for domain in self.belief.values():
            for slot in domain["semi"]:
                domain["semi"][slot] = _NOT_MENTIONED
        self.log: list[dict[str, Any]] = []

    # Every user turn is followed by exactly one system turn.
    def exchange(self, user: str, user_acts: dict[str, list[list[str]]], system: str, system_acts: dict[str, list[list[str]]]) -> None:
        self.log.append({"text": user, "metadata": {}, "dialog_act": user_acts, "span_info": []})
        self.log.append({"text": system, "metadata": copy.deepcopy(self.belief), "dialog_act": system_acts, "span_info": []})

    def set_semi(self, domain: str, values: dict[str, str]) -> None:
        for slot, value in values.items():
            if slot in self.belief[domain]["semi"]:
                self.belief[domain]["semi"][slot] = value

    def render(self) -> list[dict[str, Any]]:
        for plan in self.plans:
            getattr(self, f"_render_{plan.domain}" if plan.domain in ("train", "taxi", "police", "hospital") else "_render_venue")(plan)
        rng = self.rng
        self.exchange(rng.choice(_USER_BYE), {"general-thank": [["none", "none"]]}, rng.choice(_SYSTEM_BYE), {"general-bye": [["none", "none"]]})
        return self.log

    def _acts(self, domain: str, intent: str, values: dict[str, str]) -> dict[str, list[list[str]]]:
        return {f"{domain.capitalize()}-{intent}": [[ACT_SLOT.get(s, s.capitalize()), v] for s, v in values.items()]}

    def _describe(self, plan: DomainPlan, constraints: dict[str, str]) -> tuple[str, str]:
        where = ""
        bits = []
        for slot, value in constraints.items():
            if slot == "area":
                where = " " + (plan.references["area"] if "area" in plan.references and constraints is plan.info else _slot_phrase(plan.domain, slot, value))
            else:
                bits.append(_slot_phrase(plan.domain, slot, value))
        if plan.domain == "restaurant":
            return " ".join(b.replace(" food", "") if b.endswith(" food") else b for b in bits) or "nice", where
        return ("I'd like " + ", ".join(bits) + ".") if bits else "", where

    def _render_venue(self, plan: DomainPlan) -> None:
        rng, d, target = self.rng, plan.domain, plan.target
        name = target["name"]
        if "name" in plan.info:
            self.set_semi(d, {"name": name})
            user = rng.choice(_USER_NAME).format(name=name)
            facts = {k: str(target[k]) for k in ("area", "food", "pricerange", "type") if k in target and target[k] not in ("?", "")}
            system = f"{name} is " + (f"a {facts.get('pricerange', '')} {facts.get('food', '')} restaurant" if d == "restaurant" else f"a {facts.get('type', d)}") + f" in the {facts.get('area', 'city')}. What would you like to know?"
            self.exchange(user, self._acts(d, "Inform", {"name": name}), " ".join(system.split()), self._acts(d, "Inform", {"name": name, **facts}))
        else:
            if plan.fail_info:
                desc, where = self._describe(plan, plan.fail_info)
                self.set_semi(d, plan.fail_info)
                user = rng.choice(_USER_FIND[d]).format(desc=desc, where=where).strip()
                system = rng.choice((
                    "I'm sorry, there are no {d}s matching that. Would you like to try something else?",
                    "Unfortunately I don't have anything like that. Could we change one of your requirements?",
                )).format(d=d)
                self.exchange(user, self._acts(d, "Inform", plan.fail_info), system, self._acts(d, "NoOffer", plan.fail_info))
                for slot in plan.fail_info:
                    if slot not in plan.info:
                        self.belief[d]["semi"][slot] = _NOT_MENTIONED
                changed = {s: v for s, v in plan.info.items() if plan.fail_info.get(s) != v}
                self.set_semi(d, plan.info)
                text = "How about " + ", ".join(_slot_phrase(d, s, v) for s, v in changed.items()) + " instead?" if changed else "Any other option then?"
                self._offer(plan, text, self._acts(d, "Inform", changed))
            else:
                # Reveal constraints piecemeal: one or two first, the rest when the system asks.
                slots = list(plan.info)
                first = slots[: rng.choice((1, 2))] if len(slots) > 1 else slots
                rest = [s for s in slots if s not in first]
                desc, where = self._describe(plan, {s: plan.info[s] for s in first})
                self.set_semi(d, {s: plan.info[s] for s in first})
                user = rng.choice(_USER_FIND[d]).format(desc=desc, where=where).strip()
                if rest:
                    count = sum(1 for r in self.db[d] if _matches(r, {s: plan.info[s] for s in first}))
                    ask = rest[0]
                    system = f"I have {count} options for you. Do you have a preference for the {_SLOT_WORDS.get(ask, ask)}?"
                    self.exchange(user, self._acts(d, "Inform", {s: plan.info[s] for s in first}), system, {**self._acts(d, "Inform", {"Choice": str(count)}), **self._acts(d, "Request", {ask: "?"})})
                    self.set_semi(d, {s: plan.info[s] for s in rest})
                    phrases = [plan.references[s] if s in plan.references else _slot_phrase(d, s, plan.info[s]) for s in rest]
                    self._offer(plan, "Something " + ", ".join(phrases) + ", please.", self._acts(d, "Inform", {s: plan.info[s] for s in rest}))
                else:
                    self._offer(plan, user, self._acts(d, "Inform", {s: plan.info[s] for s in first}))
        if plan.book:
            self._book_venue(plan)
        else:
            self.set_semi(d, {"name": name})
            if plan.reqt:
                self._answer_requests(plan, lead=f"{name} sounds good. ")
            else:
                self.exchange(f"{name} sounds perfect, thanks.", self._acts(d, "Inform", {"name": name}), "Great. Is there anything else I can help you with?", {"general-reqmore": [["none", "none"]]})
        if plan.book and plan.reqt:
            self._answer_requests(plan, lead="")

    def _offer(self, plan: DomainPlan, user: str, user_acts: dict[str, list[list[str]]]) -> None:
        d, target, rng = plan.domain, plan.target, self.rng
        facts = {k: str(target[k]) for k in ("food", "area", "pricerange", "type", "stars") if k in target and str(target[k]) not in ("?", "")}
        detail = {
            "restaurant": f"{_article(facts.get('pricerange', ''))} {facts.get('pricerange')} {facts.get('food')} restaurant in the {facts.get('area')}",
            "hotel": f"a {facts.get('stars')} star {facts.get('type')} in the {facts.get('area')} ({facts.get('pricerange')})",
            "attraction": f"a {facts.get('type')} in the {facts.get('area')}",
        }[d]
        system = rng.choice(("I recommend {name}, {detail}.", "How about {name}? It is {detail}.", "{name} would be a good choice: {detail}.")).format(name=target["name"], detail=detail)
        if plan.book:
            system += " Would you like me to book it?"
        self.exchange(user, user_acts, system, self._acts(d, "Recommend", {"name": target["name"], **facts}))

    def _book_venue(self, plan: DomainPlan) -> None:
        d, rng, name = plan.domain, self.rng, plan.target["name"]
        self.set_semi(d, {"name": name})
        attempt = {**plan.book, **plan.fail_book}

        def ask(values: dict[str, str]) -> str:
            parts = []
            for slot, value in values.items():
                shown = plan.references.get(slot, value)
                parts.append({"people": f"for {shown} people" if shown.isdigit() else f"for {shown}", "day": f"on {shown}", "time": f"at {shown}", "stay": f"for {shown} nights"}[slot])
            return " ".join(parts)

        for slot, value in attempt.items():
            self.belief[d]["book"][slot] = value
        user = rng.choice(("Yes, please book it {req}.", "Could you make a reservation {req}?", "Please book {name} {req}.")).format(req=ask(attempt), name=name)
        user_acts = self._acts(d, "Inform", {"name": name, **attempt})
        if plan.fail_book:
            slot = next(iter(plan.fail_book))
            system = f"I'm sorry, {name} has no availability {ask({slot: plan.fail_book[slot]})}. Would you like to try a different {_SLOT_WORDS.get(slot, slot) if slot != 'stay' else 'length of stay'}?"
            self.exchange(user, user_acts, system, {"Booking-NoBook": [[ACT_SLOT[slot], plan.fail_book[slot]]]})
            self.belief[d]["book"][slot] = plan.book[slot]
            user = f"Okay, how about {ask({slot: plan.book[slot]})}?"
            user_acts = self._acts(d, "Inform", {slot: plan.book[slot]})
        reference = _reference(rng)
        self.belief[d]["book"]["booked"].append({"name": name, "reference": reference})
        system = rng.choice((
            "Booking was successful. Your reference number is : {ref}.",
            "I have booked {name} for you. The reference number is {ref}.",
            "You're all set at {name}. Reference number: {ref}.",
        )).format(ref=reference, name=name)
        self.exchange(user, user_acts, system, {"Booking-Book": [["Ref", reference], ["Name", name]]})

    def _answer_requests(self, plan: DomainPlan, lead: str) -> None:
        target, d = plan.target, plan.domain
        asked = " and ".join(f"the {_SLOT_WORDS.get(r, r)}" for r in plan.reqt)
        user = lead + self.rng.choice(("Can you give me {asked}?", "Could I get {asked}, please?", "What is {asked}?")).format(asked=asked)
        parts, acts = [], []
        for slot in plan.reqt:
            value = str(target.get(slot, "?"))
            if value in ("?", ""):
                parts.append(f"I'm afraid I don't know the {_SLOT_WORDS.get(slot, slot)}")
            else:
                parts.append(f"the {_SLOT_WORDS.get(slot, slot)} is {value}")
            acts.append([ACT_SLOT.get(slot, slot), value])
        system = "Sure, " + ", ".join(parts) + ". Anything else?"
        if d == "train":
            system = f"{target['trainID']}: " + system
            acts.append(["Id", target["trainID"]])
        self.exchange(user, {f"{d.capitalize()}-Request": [[ACT_SLOT.get(r, r), "?"] for r in plan.reqt]}, system, {f"{d.capitalize()}-Inform": acts})

    def _render_train(self, plan: DomainPlan) -> None:
        rng, info, target = self.rng, plan.info, plan.target
        self.set_semi("train", {"departure": info["departure"], "destination": info["destination"]})
        user = rng.choice(("I need a train from {departure} to {destination}.", "I'm looking for a train going to {destination} from {departure}.", "Can you find me a train to {destination}? I'll be leaving from {departure}."))
        user = user.format(**info)
        self.exchange(user, self._acts("train", "Inform", {"departure": info["departure"], "destination": info["destination"]}),
                      "What day would you like to travel, and when do you want to leave or arrive?", self._acts("train", "Request", {"day": "?", "leaveAt": "?"}))
        time_slot = "leaveAt" if "leaveAt" in info else "arriveBy"
        self.set_semi("train", {"day": info["day"], time_slot: info[time_slot]})
        day = plan.references.get("day", info["day"])
        when = f"leave after {info['leaveAt']}" if time_slot == "leaveAt" else f"arrive by {info['arriveBy']}"
        user = f"I'll travel on {day} and I want to {when}."
        system = f"{target['trainID']} leaves {target['departure']} at {target['leaveAt']} and arrives in {target['destination']} at {target['arriveBy']}."
        system += " Shall I book it?" if plan.book else " Does that work for you?"
        self.exchange(user, self._acts("train", "Inform", {"day": info["day"], time_slot: info[time_slot]}), system,
                      self._acts("train", "Inform", {"trainID": target["trainID"], "leaveAt": target["leaveAt"], "arriveBy": target["arriveBy"]}))
        if plan.book:
            people = plan.book["people"]
            self.belief["train"]["book"]["people"] = people
            reference = _reference(rng)
            self.belief["train"]["book"]["booked"].append({"trainID": target["trainID"], "reference": reference})
            fare = float(target["price"].split()[0]) * int(people)
            shown = plan.references.get("people", f"{people} people" if people != "1" else "just me")
            self.exchange(f"Yes, please book it for {shown}.", self._acts("train", "Inform", {"people": people}),
                          f"Booked! The total fee is {fare:.2f} GBP payable at the station. Reference number is : {reference}.",
                          {"Train-OfferBooked": [["Ref", reference], ["Ticket", f"{fare:.2f} GBP"], ["People", people]]})
        if plan.reqt:
            self._answer_requests(plan, lead="")

    def _render_taxi(self, plan: DomainPlan) -> None:
        rng, info = self.rng, plan.info
        self.set_semi("taxi", {"departure": info["departure"], "destination": info["destination"]})
        dep = info["departure"] if "departure" not in plan.references or rng.random() < 0.5 else plan.references["departure"]
        dest = info["destination"] if "destination" not in plan.references or rng.random() < 0.5 else plan.references["destination"]
        self.exchange(f"I also need a taxi from {dep} to {dest}.", self._acts("taxi", "Inform", {"departure": info["departure"], "destination": info["destination"]}),
                      "Sure. What time do you want to leave or arrive by?", self._acts("taxi", "Request", {"leaveAt": "?", "arriveBy": "?"}))
        slot = "leaveAt" if "leaveAt" in info else "arriveBy"
        self.set_semi("taxi", {slot: info[slot]})
        shown = plan.references.get(slot, info[slot])
        user = f"I want to leave after {shown}." if slot == "leaveAt" else f"I need to arrive by {shown}."
        car = f"{rng.choice(self.db['taxi'][0]['taxi_colors'])} {rng.choice(self.db['taxi'][0]['taxi_types'])}"
        phone = "07" + "".join(str(rng.randint(0, 9)) for _ in range(8))
        self.belief["taxi"]["book"]["booked"].append({"phone": phone, "type": car})
        self.exchange(user, self._acts("taxi", "Inform", {slot: info[slot]}),
                      f"Your taxi is booked: a {car} will pick you up. The contact number is {phone}.",
                      {"Taxi-Inform": [["Car", car], ["Phone", phone]]})

    def _render_police(self, plan: DomainPlan) -> None:
        target = plan.target
        self.exchange("I need to find the nearest police station.", {"Police-Inform": [["none", "none"]]},
                      f"The nearest is {target['name']}. How can I help?", {"Police-Inform": [["Name", target["name"]]]})
        self._answer_requests(plan, lead="")

    def _render_hospital(self, plan: DomainPlan) -> None:
        dept = plan.info["department"]
        self.set_semi("hospital", {"department": dept})
        self.exchange(f"I am looking for a hospital with a {dept} department.", self._acts("hospital", "Inform", {"department": dept}),
                      f"Addenbrookes Hospital has a {dept} department.", self._acts("hospital", "Inform", {"department": dept}))
        self._answer_requests(plan, lead="")


def _dialogue_id(index: int, n_domains: int) -> str:
    prefix = "SNG" if n_domains == 1 else "MUL" if index % 3 else "PMUL"
    return f"{prefix}{index:05d}.json"


def generate_dialogue(index: int, seed: int, db: dict[str, list[dict[str, Any]]]) -> tuple[str, dict[str, Any]]:
    """One dialogue in data.json form; depends only on (index, seed, db)."""
    rng = random.Random(f"askflow-dialogue:{seed}:{index}")
    plans = GoalSampler(db, rng).sample()
    # Domains in the order the user pursues them, then the empty ones (as MultiWOZ lists all).
    goal: dict[str, Any] = {plan.domain: plan.goal_dict() for plan in plans}
    for domain in ("taxi", "police", "restaurant", "hospital", "hotel", "attraction", "train"):
        goal.setdefault(domain, {})
    goal["message"] = goal_message(plans)
    log = _Renderer(plans, db, rng).render()
    return _dialogue_id(index, len(plans)), {"goal": goal, "log": log}


def split_sizes(n_dialogues: int, val_fraction: float, test_fraction: float) -> tuple[int, int]:
    """How many of ``n_dialogues`` the corpus puts in val and in test.

    >>> split_sizes(2500, 0.1, 0.1)
    (250, 250)
    """
    return int(round(n_dialogues * val_fraction)), int(round(n_dialogues * test_fraction))


def generate_corpus(
    n_dialogues: int,
    seed: int = 0,
    val_fraction: float = 0.1,
    test_fraction: float = 0.1,
    db: dict[str, list[dict[str, Any]]] | None = None,
) -> dict[str, Any]:
    """The complete embedded corpus in the official layout.

    ``db`` replaces askflow's own database with any MultiWOZ-schema database (e.g. the real
    one), so embedded-style goals and dialogues can be grounded in it.
    Returns {"data": data.json contents, "db": {domain: records}, "splits": {"test": ids, "val": ids}}.
    """
    positive_int(n_dialogues, "n_dialogues")
    db = build_database(seed) if db is None else db
    data: dict[str, Any] = {}
    for index in range(n_dialogues):
        dialogue_id, dialogue = generate_dialogue(index, seed, db)
        data[dialogue_id] = dialogue
    ids = sorted(data)
    rng = random.Random(f"askflow-splits:{seed}")
    rng.shuffle(ids)
    n_val, n_test = split_sizes(n_dialogues, val_fraction, test_fraction)
    return {"data": data, "db": db, "splits": {"test": sorted(ids[:n_test]), "val": sorted(ids[n_test:n_test + n_val])}}


__all__ = ["generate_corpus", "generate_dialogue", "goal_message", "GoalSampler", "DomainPlan", "HOSPITAL_DEPARTMENTS"]
