"""Time the SpeakER redundancy filter (MinHash + LSH near-duplicate removal) as the corpus grows.

    python benchmarks/dedup.py [--sizes 2500 25000 250000] [--threshold 0.8] [--dup-rate 0.2] [--phrasing narrow]

Generates synthetic SpeakER-like documents (one per dialogue: its clarification questions,
concatenated) from templates over MultiWOZ slots, values and phrasings, with a share of them
rewritten from an earlier document (verbatim copies, casing/punctuation changes, another
opening phrase, one slot value changed) so that a realistic 15-30% are near-duplicates.
``--phrasing narrow`` draws from a few phrasings only, the worst case for LSH (many pairs just
below the threshold). Generation is not timed. For each size it times ``near_duplicates`` and
prints seconds, documents/s, removed count and share, growth (the time ratio to the previous
size over the size ratio: 1.00 = linear) and the process's peak RSS so far (corpora included).
"""

from __future__ import annotations

import argparse
import random
import resource
import time
from dataclasses import dataclass

from pipelines.speaker.dedup import lsh_params, near_duplicates

AREAS = ("north", "south", "east", "west", "centre")
PRICES = ("cheap", "moderate", "expensive")
FOODS = (
    "italian", "chinese", "indian", "british", "european", "french", "thai", "japanese", "korean", "spanish",
    "turkish", "mediterranean", "vietnamese", "mexican", "lebanese", "portuguese", "gastropub", "seafood",
)
DAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
STATIONS = (
    "cambridge", "london kings cross", "london liverpool street", "ely", "norwich", "stevenage",
    "peterborough", "leicester", "birmingham new street", "bishops stortford", "broxbourne",
)
KINDS = {
    "restaurant": ("restaurant", "place to eat", "table"),
    "hotel": ("hotel", "guesthouse", "room", "place to stay"),
    "attraction": ("museum", "college", "park", "theatre", "cinema", "nightclub", "swimming pool", "church"),
    "train": ("train", "ticket"),
    "taxi": ("taxi", "car"),
}
NAME_HEADS = (
    "golden", "old", "royal", "little", "grand", "river", "city", "green", "red", "silver", "kings", "market",
    "garden", "bridge", "castle", "station", "park", "abbey", "meadow", "orchard", "lucky", "blue", "hidden",
    "cotton", "maple", "willow", "granta", "corn", "fen", "cherry",
)
NAME_TAILS = (
    "house", "inn", "lodge", "kitchen", "bistro", "arms", "court", "view", "rooms", "place", "gallery", "hall",
    "yard", "corner", "tavern", "pavilion", "star", "garden", "wok", "grill", "cafe", "hotel", "college", "museum",
)
SLOT_VALUES = {
    "area": AREAS, "price range": PRICES, "food": FOODS, "day": DAYS, "departure": STATIONS, "destination": STATIONS,
    "stars": ("two", "three", "four", "five"), "parking": ("free parking", "paid parking"),
    "internet": ("free wifi", "no wifi"),
}
DOMAIN_SLOTS = {
    "restaurant": ("area", "price range", "food", "day"),
    "hotel": ("area", "price range", "stars", "parking", "internet", "day"),
    "attraction": ("area",),
    "train": ("departure", "destination", "day"),
    "taxi": ("departure", "destination"),
}
SLOT_PHRASES = {
    "area": ("part of town", "area", "neighbourhood", "side of the city", "location"),
    "price range": ("price range", "budget", "price level", "kind of budget"),
    "food": ("cuisine", "type of food", "kind of food"),
    "day": ("day", "date", "day of the week"),
    "departure": ("departure station", "starting point", "station you leave from"),
    "destination": ("destination", "station you are going to", "final stop"),
    "stars": ("star rating", "number of stars", "rating"),
    "parking": ("parking option", "parking"),
    "internet": ("internet option", "wifi"),
}
OPENERS = (
    "", "just to clarify,", "before i book that,", "sorry,", "quick question:", "to make sure i get this right,",
    "i can help with that.", "great.", "sure!", "one more thing:", "thanks.", "got it.", "certainly.",
    "happy to help.", "okay,", "alright,", "just so i understand,", "to narrow it down,", "i see.", "no problem.",
)
CLOSERS = (
    "", "for you", "please", "so i can narrow it down", "for this booking", "before i continue", "if you do not mind",
    "so i book the right one", "to be sure", "today",
)
CONTEXTS = (
    "there are {k} {kind}s in the {area} that match.",
    "i found {k} options in the {area}, for example the {n1} and the {n2}.",
    "i have {kind}s at {t1}, {t2} and {t3} on {day}.",
    "both the {n1} and the {n2} are {price} and in the {area}.",
    "the {n1} has availability on {day} at {t1}.",
    "your {kind} request for {day} could match several places.",
)
QUESTIONS = (
    "would you prefer {a} or {b} for the {slot}?",
    "did you want the {kind} with {a} or with {b} as the {slot}?",
    "what {slot} would you like for your {kind}?",
    "when you say {a}, do you mean the {slot} {a} or {b}?",
    "which one did you mean, the {n1} or the {n2}?",
    "which {kind} did you have in mind, the {n1}, the {n2} or the {n3}?",
    "for how many people should i book the {kind} on {day}?",
    "what time would you like the {kind} on {day}, around {t1} or {t2}?",
    "is the {slot} {a} important to you, or is {b} also fine?",
    "do you need the {kind} for {people} people or just for yourself?",
    "do you have a preferred {slot} in mind for the {kind}?",
    "should i look for {a} {kind}s only, or would {b} work as well?",
    "can you tell me which {slot} you had in mind, {a} or {b}?",
    "would the {n1} on {day} at {t1} work for you, or shall i look for something else?",
    "is that {people} people on {day}, or did you mean a different day?",
)


@dataclass(frozen=True)
class Phrasing:
    openers: tuple[str, ...]
    closers: tuple[str, ...]
    contexts: tuple[str, ...]
    questions: tuple[str, ...]


PHRASINGS = {
    "varied": Phrasing(OPENERS, CLOSERS, CONTEXTS, QUESTIONS),
    # A synthesizer stuck in a few phrasings: every document has many others just below the
    # threshold (same words, other slot values), the worst case for LSH.
    "narrow": Phrasing(OPENERS[:4], CLOSERS[:2], (), QUESTIONS[:5]),
}


def _name(rng: random.Random) -> str:
    return f"{rng.choice(NAME_HEADS)} {rng.choice(NAME_TAILS)}"


def _time(rng: random.Random) -> str:
    return f"{rng.randrange(6, 23):02d}:{rng.randrange(0, 60, 5):02d}"


def clarification_question(rng: random.Random, phrasing: Phrasing) -> str:
    """One clarification turn: [opener] [context sentence] question [closer]."""
    domain = rng.choice(tuple(DOMAIN_SLOTS))
    slot = rng.choice(DOMAIN_SLOTS[domain])
    a, b = rng.sample(SLOT_VALUES[slot], 2)
    fill = dict(
        kind=rng.choice(KINDS[domain]), slot=rng.choice(SLOT_PHRASES[slot]), a=a, b=b, area=rng.choice(AREAS),
        price=rng.choice(PRICES), day=rng.choice(DAYS), n1=_name(rng), n2=_name(rng), n3=_name(rng),
        t1=_time(rng), t2=_time(rng), t3=_time(rng), k=rng.randrange(2, 40), people=rng.randrange(2, 9),
    )
    question = rng.choice(phrasing.questions).format(**fill)
    closer = rng.choice(phrasing.closers)
    if closer:
        question = f"{question[:-1]} {closer}?"
    context = rng.choice(phrasing.contexts).format(**fill) if phrasing.contexts and rng.random() < 0.5 else ""
    return " ".join(part for part in (rng.choice(phrasing.openers), context, question) if part)


def fresh_document(rng: random.Random, phrasing: Phrasing) -> str:
    n_questions = rng.choices((1, 2, 3), weights=(0.4, 0.4, 0.2))[0]
    return " ".join(clarification_question(rng, phrasing) for _ in range(n_questions))


def rewrite(document: str, rng: random.Random, phrasing: Phrasing) -> str:
    """A variant of ``document`` the way a synthesizer repeats itself: verbatim, with other
    casing/punctuation, with another opener, or with one word (say, a slot value) changed.
    The last two may or may not stay above a given similarity threshold."""
    kind = rng.random()
    if kind < 0.25:
        return document
    if kind < 0.5:
        return document.replace("?", " ?").replace(",", "").capitalize()
    if kind < 0.75:
        first, _, rest = document.partition("?")
        words = first.split(" ")
        return " ".join([rng.choice(phrasing.openers), *words[2:]]).strip() + "?" + rest
    words = document.split(" ")
    words[rng.randrange(len(words))] = rng.choice(AREAS + PRICES + DAYS + FOODS)
    return " ".join(words)


def synthetic_corpus(n: int, dup_rate: float, seed: int, phrasing: Phrasing = PHRASINGS["varied"]) -> list[str]:
    """``n`` documents; each one is, with probability ``dup_rate``, a rewrite of an earlier one."""
    rng = random.Random(seed)
    documents: list[str] = []
    for _ in range(n):
        if documents and rng.random() < dup_rate:
            documents.append(rewrite(rng.choice(documents), rng, phrasing))
        else:
            documents.append(fresh_document(rng, phrasing))
    return documents


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", type=int, nargs="+", default=[2_500, 25_000, 250_000])
    parser.add_argument("--threshold", type=float, default=0.8)
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--num-perm", type=int, default=64)
    parser.add_argument("--dup-rate", type=float, default=0.2, help="share of documents generated as rewrites")
    parser.add_argument("--phrasing", choices=sorted(PHRASINGS), default="varied")
    parser.add_argument("--seed", type=int, default=13)
    args = parser.parse_args()

    bands, rows = lsh_params(args.threshold, args.num_perm)
    print(
        f"threshold {args.threshold}, {args.ngram}-grams, {args.num_perm} permutations -> {bands} bands x {rows} rows, "
        f"{args.phrasing} phrasing"
    )
    print(f"{'documents':>10} {'seconds':>8} {'docs/s':>9} {'removed':>8} {'removed %':>9} {'growth':>7} {'peak RSS MiB':>13}")
    previous: tuple[int, float] | None = None
    for n in args.sizes:
        documents = synthetic_corpus(n, args.dup_rate, args.seed, PHRASINGS[args.phrasing])
        t0 = time.perf_counter()
        result = near_duplicates(documents, args.threshold, ngram=args.ngram, num_perm=args.num_perm, seed=args.seed)
        seconds = time.perf_counter() - t0
        growth = f"{(seconds / previous[1]) / (n / previous[0]):.2f}" if previous else "-"
        rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
        print(
            f"{n:>10} {seconds:>8.2f} {n / seconds:>9.0f} {result.n_removed:>8} "
            f"{100 * result.n_removed / n:>9.1f} {growth:>7} {rss:>13.0f}"
        )
        previous = (n, seconds)


if __name__ == "__main__":
    main()
