"""Contrast points: the situation of a clarification, with the asked slot already stated.

Trained on clarifications alone, a small policy copies the question without reading the
dialogue: on the first GPU run, SmolLM2 asked "which part of town?" right after the user
had said "in the centre". A *contrast* is the near-identical situation in which asking is
wrong: at an underspecification question of a kept dialogue, the same conversation up to
the user's request, but the request also states the point's discriminating slots (with the
goal's values); the agent searches with them and, nothing being left to ask, recommends.
Its two outputs (the search, the recommendation) are SFT rows next to the dialogue's own.

The prefix is re-run in a fresh environment with the dialogue's seed, so the contrast's
observations are the environment's; a contrast whose search finds nothing, or whose
request is not a plain search request, is skipped.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping

from pipelines.env.replay import QUERY_TOOLS
from pipelines.env.tools import TOOLS, Database, entity_view, name_key
from pipelines.episodes.formats import CLARIFY, TOOL_CALL
from pipelines.records import Dialogue
from pipelines.speaker import phrasing as say
from pipelines.speaker.ambiguity import SEARCH, SEARCH_DOMAINS, UNDERSPECIFICATION, VENUE_DOMAINS, candidate_values, constraints, seed_view
from pipelines.speaker.trajectory import OBSERVATION, USER, ChatTurn, Trajectory, TrajectoryBuilder

#: Slots a user says they do not mind, up front (as :class:`~pipelines.speaker.writer.DialogueWriter` does).
_INDIFFERENT = ("area", "pricerange", "food", "type", "stars")


@dataclass(frozen=True)
class Contrast:
    """The turns that replace the positive's from ``start`` (the user's request before the
    question at ``question``): the request stating ``stated``, the search, its observation,
    the recommendation."""

    dialogue_id: str
    domain: str
    start: int
    question: int
    stated: Mapping[str, str]
    turns: tuple[ChatTurn, ...]


def contrasts(trajectory: Trajectory, dialogue: Dialogue, database: Database, seed: int, limit: int) -> list[Contrast]:
    """Up to ``limit`` contrasts of a kept trajectory, one per underspecification point
    (the first question there), in dialogue order."""
    out: list[Contrast] = []
    seen: set[tuple[str, str, str]] = set()
    for index, turn in enumerate(trajectory.turns):
        if len(out) >= limit:
            break
        point = turn.point
        if turn.kind != CLARIFY or turn.needless or point is None or point.type != UNDERSPECIFICATION or point.action != SEARCH:
            continue
        if point.key in seen:
            continue
        seen.add(point.key)
        contrast = _contrast(trajectory, dialogue, database, seed, index)
        if contrast is not None:
            out.append(contrast)
    return out


def _contrast(trajectory: Trajectory, dialogue: Dialogue, database: Database, seed: int, question: int) -> Contrast | None:
    turns = trajectory.turns
    point = turns[question].point
    domain = point.domain
    call, request = question - 2, question - 3
    if request < 0 or domain not in SEARCH_DOMAINS or turns[call].kind != TOOL_CALL or turns[request].kind != USER:
        return None
    goal = dialogue.goal.get(domain)
    info = constraints(goal.info) if goal else {}
    stated = {**dict(point.known), **{s: point.goal_values[s] for s in point.slots if s in point.goal_values}}
    if not info:
        return None
    rng = random.Random(f"speaker-contrast:{seed}:{trajectory.dialogue_id}:{question}")
    builder = TrajectoryBuilder(trajectory.dialogue_id, trajectory.goal, database, trajectory.env_seed)
    for turn in turns[:request]:
        if turn.kind == USER:
            builder.user(turn.content)
        elif turn.kind != OBSERVATION:
            builder.raw_agent(turn.content, turn.kind, turn.point, turn.needless, turn.slot_filling, turn.shown)
    if [t.content for t in builder.turns] != [t.content for t in turns[:request]]:
        return None  # the prefix does not replay to the same observations
    found = database.search(domain, stated)
    if not found:
        return None
    indifferent = _indifferent(domain, stated, found)
    ack = next((a for a in say.ACKS if turns[request].content.startswith(a)), None)
    text = say.find_request(rng, domain, stated)
    text = f"{ack} {text}" if ack else text
    builder.user(f"{text} {say.dont_mind(rng, indifferent)}".strip() if indifferent else text)
    spec = TOOLS[QUERY_TOOLS[domain]]
    arguments = {s: v for s, v in stated.items() if spec.param(s) is not None}
    observation = builder.call(say.search_think(rng, domain, stated), QUERY_TOOLS[domain], arguments)
    results = builder.environment.state.queries[-1].results
    if not observation.get("count") or not results:
        return None
    entity = results[0]
    chosen = seed_view(dialogue).chosen.get(domain)
    if chosen:
        entity = next((e for e in results if name_key(e.name) == name_key(chosen)), entity)
    heard = [t.content for t in builder.turns if t.kind == USER]
    said = say.said_line(say.said_pairs(heard, stated), [indifferent] if indifferent else [])
    name = (entity.get("trainID") or entity.name) if domain == "train" else entity.name
    think = say.recommend_think(rng, domain, observation["count"], name, said=said)
    attributes = {**entity_view(entity), "name": entity.name}
    builder.agent(think, respond=say.recommendation(rng, domain, attributes, bool(constraints(goal.book))))
    return Contrast(trajectory.dialogue_id, domain, request, question, stated, tuple(builder.turns[request:]))


def _indifferent(domain: str, stated: Mapping[str, str], found) -> str | None:
    """The slot the user says up front they do not mind: one the matches still differ in."""
    if domain not in VENUE_DOMAINS or len(found) < 2:
        return None
    return next((s for s in _INDIFFERENT if s not in stated and len(candidate_values(s, found)) > 1), None)


def contrast_messages(trajectory: Trajectory, contrast: Contrast) -> list[tuple[list[dict[str, str]], ChatTurn]]:
    """(prompt messages, agent turn) for each agent output of a contrast."""
    prefix = trajectory.messages(contrast.start)
    out = []
    for index, turn in enumerate(contrast.turns):
        if turn.role == "assistant":
            out.append((prefix + [t.message for t in contrast.turns[:index]], turn))
    return out


__all__ = ["Contrast", "contrast_messages", "contrasts"]
