"""Goals as simulated users read them: instruction text, and the order domains are pursued in.

A MultiWOZ goal carries the crowd-worker instructions (``message``) with HTML emphasis
tags; they are what an LLM user is shown, tags stripped. A goal without a message (some
releases, or goals made by hand) is rendered from its fields instead, in the same style.
"""

from __future__ import annotations

import html
import re

from pipelines.multiwoz.ontology import is_dont_care
from pipelines.records import Dialogue, DomainGoal, Goal
from pipelines.simulators.phrasing import SLOT_WORDS, describe, join_words, slot_phrase

_TAG = re.compile(r"<[^>]*>")
_SPACES = re.compile(r"\s+")

# Words by which a goal message introduces each domain, for the pursuit order.
_DOMAIN_CUES: dict[str, tuple[str, ...]] = {
    "restaurant": ("restaurant", "place to dine", "place to eat", "somewhere to eat"),
    "hotel": ("hotel", "place to stay", "guesthouse", "guest house"),
    "attraction": ("attraction", "place to go", "places to go", "something to do"),
    "train": ("train",),
    "taxi": ("taxi",),
    "police": ("police",),
    "hospital": ("hospital",),
}


def strip_markup(text: str) -> str:
    """Goal-message text without HTML tags or entities, on one line."""
    return _SPACES.sub(" ", html.unescape(_TAG.sub("", text))).strip()


def goal_instructions(goal: Goal) -> tuple[str, ...]:
    """The goal as instruction sentences: the message without markup when there is one,
    else a rendering of the goal's fields."""
    lines = tuple(line for line in (strip_markup(m) for m in goal.message) if line)
    return lines or render_goal(goal)


def render_goal(goal: Goal) -> tuple[str, ...]:
    """Instruction sentences for a goal without a message, domain by domain in pursuit order."""
    lines: list[str] = []
    for index, domain_goal in enumerate(pursuit_order(goal)):
        lines.extend(_render_domain(domain_goal, also=index > 0))
    return tuple(lines)


def _constraints(values) -> dict[str, str]:
    return {slot: value for slot, value in values.items() if not is_dont_care(value)}


def _render_domain(goal: DomainGoal, also: bool) -> list[str]:
    d = goal.domain
    opener = "You are also looking for" if also else "You are looking for"
    info = _constraints(goal.info)
    lines = [f"{opener} {describe(d, info, also=True)}." if info else f"{opener} {describe(d, {})}."]
    fail_info = _constraints(goal.fail_info)
    if fail_info:
        lines.append(f"Start by asking for {describe(d, fail_info, also=True)}; if there is none, use the constraints above.")
    book = _constraints(goal.book)
    if book:
        lines.append(f"Once you find it, book it {' '.join(slot_phrase(d, s, v) for s, v in book.items())}.")
        fail_book = _constraints(goal.fail_book)
        if fail_book:
            first = " ".join(slot_phrase(d, s, v) for s, v in fail_book.items())
            lines.append(f"Try booking {first} first; if the booking fails, use the values above.")
        lines.append("Make sure you get the reference number.")
    if goal.reqt:
        lines.append(f"Make sure you get the {join_words([SLOT_WORDS.get(r, r) for r in goal.reqt])}.")
    return lines


def pursuit_order(goal: Goal) -> tuple[DomainGoal, ...]:
    """The domains in the order the user pursues them.

    The official data stores goal domains alphabetically; the order the user was told to
    follow is the order in which the message introduces them. Domains the message does not
    mention (or a goal without a message) keep the goal's own order, after the others.
    """
    lines = [strip_markup(m).lower() for m in goal.message]

    def first_mention(domain: str) -> int:
        # Whole words: "constraints" does not mention a train.
        cue = re.compile(r"\b(?:" + "|".join(map(re.escape, _DOMAIN_CUES.get(domain, (domain,)))) + r")s?\b")
        return next((i for i, line in enumerate(lines) if cue.search(line)), len(lines))

    ranked = sorted(enumerate(goal.domains), key=lambda item: (first_mention(item[1].domain), item[0]))
    return tuple(domain_goal for _, domain_goal in ranked)


def reference_order(goal: Goal, dialogue: Dialogue) -> tuple[DomainGoal, ...]:
    """The domains in the order the reference dialogue's user took them up: the first turn
    whose dialog acts name the domain or whose belief state holds a value for it. Real users
    do not always follow the message's order, and a replay of their dialogue only makes
    sense to a user who does what they did. Domains the dialogue never shows follow in
    :func:`pursuit_order`."""
    first: dict[str, int] = {}
    for turn in dialogue.turns:
        seen = {act.domain for act in turn.dialog_acts or ()}
        seen |= {b.domain for b in turn.belief_state or () if any(not is_dont_care(v) for v in b.semi.values()) or b.booked}
        for domain in seen:
            first.setdefault(domain, turn.index)
    ordered = pursuit_order(goal)
    ranked = sorted(enumerate(ordered), key=lambda item: (first.get(item[1].domain, len(dialogue.turns)), item[0]))
    return tuple(domain_goal for _, domain_goal in ranked)
