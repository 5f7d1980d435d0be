"""askflow's own Cambridge-style database, in MultiWOZ's attribute schema.

The records have exactly the keys and value formats of the official ``<domain>_db.json``
files (restaurant, hotel, attraction, train, taxi, police, hospital), so the loader,
the tool environment and the goal checker cannot tell it from the real thing. Venue
names are composed from word lists; a few carry apostrophes or capitals on purpose,
because real MultiWOZ names do and code that matches names must cope.
"""

from __future__ import annotations

import random
from typing import Any

from pipelines.multiwoz.ontology import AREAS, DAYS, PRICERANGES, format_time

FOODS = (
    "african", "asian oriental", "british", "chinese", "european", "french", "gastropub", "indian",
    "international", "italian", "japanese", "korean", "lebanese", "mediterranean", "mexican",
    "modern european", "north american", "portuguese", "seafood", "spanish", "thai", "turkish", "vietnamese",
)
ATTRACTION_TYPES = (
    "architecture", "boat", "cinema", "college", "concerthall", "entertainment", "museum",
    "multiple sports", "nightclub", "park", "swimmingpool", "theatre",
)
HOTEL_TYPES = ("hotel", "guesthouse")
STATIONS = (
    "london kings cross", "london liverpool street", "stansted airport", "peterborough", "ely",
    "norwich", "kings lynn", "bishops stortford", "broxbourne", "stevenage", "leicester", "birmingham new street",
)
HOSPITAL_DEPARTMENTS = (
    "acute medical assessment unit", "cardiology", "childrens surgical and medicine", "clinical decisions unit",
    "emergency department", "gastroenterology", "haematology", "infectious diseases", "intermediate dependancy area",
    "neurology", "neurosciences", "oncology", "paediatric clinic", "plastic and vascular surgery plastic surgery",
    "respiratory medicine", "transplant unit", "trauma and orthopaedics", "urology",
)
TAXI_COLORS = ("black", "white", "red", "yellow", "blue", "grey")
TAXI_TYPES = ("toyota", "skoda", "bmw", "honda", "ford", "audi", "lexus", "volvo", "volkswagen", "tesla")

_ADJECTIVES = (
    "golden", "silver", "little", "old", "royal", "green", "red", "blue", "hidden", "grand", "jolly", "quiet",
    "bright", "crooked", "copper", "velvet", "amber", "ivy", "willow", "cedar", "lucky", "humble", "merry", "wild",
)
_NOUNS = (
    "lantern", "oak", "swan", "bridge", "garden", "lion", "anchor", "kettle", "fox", "orchard", "mill", "harbour",
    "meadow", "crown", "pantry", "compass", "heron", "spoon", "wheel", "barn", "tower", "gate", "river", "punt",
)
_PEOPLE = ("rosa", "ali", "mario", "chen", "maya", "tom", "lucia", "raj", "hana", "pierre", "nina", "omar")
_STREETS = (
    "regent street", "hills road", "mill road", "trumpington street", "king street", "bridge street", "station road",
    "newmarket road", "chesterton road", "huntingdon road", "castle street", "market hill", "jesus lane", "queens road",
)
_FOOD_NOUNS = {
    "italian": "trattoria", "chinese": "noodle bar", "indian": "curry house", "french": "brasserie", "thai": "kitchen",
    "japanese": "sushi bar", "british": "grill", "seafood": "fish house", "spanish": "tapas bar", "mexican": "cantina",
    "gastropub": "arms", "turkish": "meze", "lebanese": "grill house", "korean": "bbq", "vietnamese": "pho house",
}
_HOTEL_SUFFIX = {"hotel": ("hotel", "lodge hotel", "inn"), "guesthouse": ("guest house", "bed and breakfast", "house")}
_ATTRACTION_NAMES = {
    "architecture": ("church", "chapel", "hall"), "boat": ("punting", "boat hire", "river tours"),
    "cinema": ("cinema", "picture house"), "college": ("college",), "concerthall": ("concert hall",),
    "entertainment": ("fun centre", "playhouse"), "museum": ("museum", "gallery", "exhibition"),
    "multiple sports": ("sports centre", "leisure park"), "nightclub": ("club", "nightclub"), "park": ("park", "gardens"),
    "swimmingpool": ("pool", "lido"), "theatre": ("theatre", "arts theatre"),
}
_ROUTE_MINUTES = {
    "london kings cross": 51, "london liverpool street": 88, "stansted airport": 28, "peterborough": 50, "ely": 17,
    "norwich": 79, "kings lynn": 47, "bishops stortford": 38, "broxbourne": 60, "stevenage": 49, "leicester": 105,
    "birmingham new street": 163,
}


def _postcode(rng: random.Random) -> str:
    return f"cb{rng.randint(1, 5)}{rng.randint(1, 9)}{rng.choice('abdefghjlnpqrstuwxyz')}{rng.choice('abdefghjlnpqrstuwxyz')}"


def _phone(rng: random.Random) -> str:
    return "01223" + "".join(str(rng.randint(0, 9)) for _ in range(6))


def _location(rng: random.Random) -> list[float]:
    return [round(52.18 + rng.random() * 0.06, 6), round(0.09 + rng.random() * 0.12, 6)]


class _Names:
    """Unique venue names across all domains (a taxi may go from any venue to any other)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def make(self, candidates) -> str:
        for _ in range(200):
            name = candidates()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError("name space exhausted")  # pragma: no cover - word lists are large enough


def _restaurant_name(rng: random.Random, food: str) -> str:
    noun = _FOOD_NOUNS.get(food, "restaurant")
    pattern = rng.random()
    if pattern < 0.35:
        return f"the {rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)}"
    if pattern < 0.55:
        return f"{rng.choice(_PEOPLE)}'s {noun}"
    if pattern < 0.8:
        return f"{rng.choice(_NOUNS)} {noun}"
    return f"{rng.choice(_ADJECTIVES)} {rng.choice(_NOUNS)} {noun}"


def build_database(seed: int, n_restaurants: int = 110, n_hotels: int = 33, n_attractions: int = 79) -> dict[str, list[dict[str, Any]]]:
    """The raw database, one list of MultiWOZ-format records per domain."""
    rng = random.Random(f"askflow-db:{seed}")
    names = _Names(rng)
    db: dict[str, list[dict[str, Any]]] = {}

    restaurants = []
    for i in range(n_restaurants):
        # Cover every (area, pricerange) pair several times so that goals have real choices.
        area = AREAS[i % len(AREAS)]
        pricerange = PRICERANGES[(i // len(AREAS)) % len(PRICERANGES)]
        food = rng.choice(FOODS)
        name = names.make(lambda: _restaurant_name(rng, food))
        if i == 7:  # real MultiWOZ has names with capitals; so does ours
            name = name.title()
        record = {
            "address": f"{rng.randint(1, 120)} {rng.choice(_STREETS)}",
            "area": area,
            "food": food,
            "id": str(19000 + i),
            "introduction": f"{name} serves {food} food in a friendly setting",
            "location": _location(rng),
            "name": name,
            "phone": _phone(rng),
            "postcode": _postcode(rng),
            "pricerange": pricerange,
            "type": "restaurant",
        }
        if rng.random() < 0.3:
            record["signature"] = f"{rng.choice(_ADJECTIVES)} {rng.choice(('stew', 'curry', 'risotto', 'platter', 'noodles'))}"
        restaurants.append(record)
    db["restaurant"] = restaurants

    hotels = []
    for i in range(n_hotels):
        kind = HOTEL_TYPES[0] if i % 3 == 0 else HOTEL_TYPES[1]
        pricerange = PRICERANGES[i % 3] if kind == "guesthouse" else PRICERANGES[(i // 3) % 3]
        base = {"cheap": 40, "moderate": 70, "expensive": 110}[pricerange] + rng.randint(0, 20)
        name = names.make(lambda: f"{rng.choice(_NOUNS + _ADJECTIVES)} {rng.choice(_HOTEL_SUFFIX[kind])}")
        hotels.append({
            "address": f"{rng.randint(1, 200)} {rng.choice(_STREETS)}",
            "area": AREAS[i % len(AREAS)],
            "internet": "yes" if rng.random() < 0.8 else "no",
            "parking": "yes" if rng.random() < 0.7 else "no",
            "id": str(i),
            "location": _location(rng),
            "name": name,
            "phone": _phone(rng),
            "postcode": _postcode(rng),
            "price": {"double": str(base + 25), "family": str(base + 50), "single": str(base)},
            "pricerange": pricerange,
            "stars": str(rng.choice((0, 2, 3, 4, 4, 4, 5)) if kind == "hotel" else rng.choice((0, 3, 4, 4))),
            "takesbookings": "yes",
            "type": kind,
        })
    db["hotel"] = hotels

    attractions = []
    for i in range(n_attractions):
        kind = ATTRACTION_TYPES[i % len(ATTRACTION_TYPES)]
        area = rng.choice(AREAS) if kind not in ("college", "architecture") else rng.choice(("centre", "centre", "west", "east"))
        if kind == "college":
            name = names.make(lambda: f"saint {rng.choice(_PEOPLE)}'s college" if rng.random() < 0.5 else f"{rng.choice(_NOUNS)} college")
        else:
            name = names.make(lambda: f"{rng.choice(_ADJECTIVES + _NOUNS)} {rng.choice(_ATTRACTION_NAMES[kind])}")
        fee_roll = rng.random()
        fee = "free" if fee_roll < 0.45 else "?" if fee_roll < 0.6 else f"{rng.choice((2, 3, 4, 5, 6))} pounds"
        attractions.append({
            "address": f"{rng.choice(_STREETS)}",
            "area": area,
            "entrance fee": fee,
            "id": str(i + 1),
            "location": _location(rng),
            "name": name,
            "openhours": "?" if rng.random() < 0.5 else "it opens daily from 10:00 a.m. to 5:00 p.m.",
            "phone": _phone(rng),
            "postcode": _postcode(rng),
            "pricerange": "free" if fee == "free" else "?" if fee == "?" else "moderate",
            "type": kind,
        })
    db["attraction"] = attractions

    trains = []
    serial = 1000
    for station in STATIONS:
        minutes = _ROUTE_MINUTES[station]
        price = round(4.4 + minutes * 0.17, 2)
        for departure, destination in (("cambridge", station), (station, "cambridge")):
            offset = rng.randint(0, 59)
            for day in DAYS:
                fare = price * (0.8 if day in ("saturday", "sunday") else 1.0)
                for hour in range(5, 24, 2):
                    leave = hour * 60 + offset
                    serial += rng.randint(1, 7)
                    trains.append({
                        "arriveBy": format_time(leave + minutes),
                        "day": day,
                        "departure": departure,
                        "destination": destination,
                        "duration": f"{minutes} minutes",
                        "leaveAt": format_time(leave),
                        "price": f"{fare:.2f} pounds",
                        "trainID": f"TR{serial % 10000:04d}",
                    })
    # trainIDs must be unique: the booking target is named by it.
    seen: set[str] = set()
    for record in trains:
        while record["trainID"] in seen:
            serial += 1
            record["trainID"] = f"TR{serial % 10000:04d}"
        seen.add(record["trainID"])
    db["train"] = trains

    db["taxi"] = [{"taxi_colors": list(TAXI_COLORS), "taxi_types": list(TAXI_TYPES), "taxi_phone": ["^[0-9]{10}$"]}]
    db["police"] = [{"name": "Parkside Police Station", "address": "Parkside, Cambridge", "id": 0, "phone": "01223358966", "postcode": "cb11jg"}]
    db["hospital"] = [
        {"department": dept, "id": i, "phone": "01223" + f"{217000 + i * 37:06d}"} for i, dept in enumerate(HOSPITAL_DEPARTMENTS)
    ]
    return db
