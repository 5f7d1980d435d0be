"""Act-here decision points: where the user has said enough and asking would be needless.

Every clarification of a SpeakER dialogue is a point where asking is right; trained on
those alone, an always-ask policy scores best. An *act-here* point is an agent tool call
that directly answers a user message (a search or a booking with everything it needs, no
ambiguity point on it): the right output acts. These points go into the GRPO data (with
``ask_needed`` false, so the clarification reward penalises a question there) and into the
DPO data (chosen: the call; rejected: a needless question re-asking something the user has
just said).

A needless question re-asks a slot the call already fills, in words the verifiable judge
reads as that slot (:data:`pipelines.rewards.verifiable.SLOT_CUES`), so the rejected
output is the over-asking the metrics count.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping

from pipelines.env.tools import TOOLS
from pipelines.episodes.formats import TOOL_CALL, AgentAction, Malformed
from pipelines.speaker.trajectory import FORMAT, USER, Trajectory

#: How a needless question re-asks each slot (the user has just given it).
RE_ASK: Mapping[str, str] = {
    "area": "Which area of town would you like?",
    "pricerange": "What price range are you looking for?",
    "food": "What kind of food would you like?",
    "type": "What type of place are you looking for?",
    "stars": "How many stars should it have?",
    "internet": "Do you need internet?",
    "parking": "Do you need parking?",
    "people": "How many people will there be?",
    "day": "Which day would that be?",
    "time": "What time would you like?",
    "stay": "How many nights will you stay?",
    "departure": "Where will you be leaving from?",
    "destination": "What is your destination?",
    "leaveAt": "What time would you like to leave?",
    "arriveBy": "What time do you need to arrive by?",
}


@dataclass(frozen=True)
class ActPoint:
    """An agent tool call at ``index`` (``step`` among the agent outputs) answering the user
    message before it. ``known``: the slots the call fills (what the user has said);
    ``needless``: a question that re-asks one of them, in SpeakRL's tokens."""

    dialogue_id: str
    index: int
    step: int
    domain: str
    tool: str
    known: tuple[str, ...]
    needless: str


def act_points(trajectory: Trajectory, rng: random.Random, limit: int) -> list[ActPoint]:
    """Up to ``limit`` act-here points of a trajectory, drawn with ``rng`` (dialogue order)."""
    candidates: list[ActPoint] = []
    step = -1
    for index, turn in enumerate(trajectory.turns):
        if turn.role != "assistant":
            continue
        step += 1
        if turn.kind != TOOL_CALL or turn.point is not None or turn.shown or index == 0 or trajectory.turns[index - 1].kind != USER:
            continue  # a mistaken search (shown) is never a chosen action
        parsed = FORMAT.parse(turn.content)
        if isinstance(parsed, Malformed):
            continue
        call = next(a for a in parsed if a.kind == TOOL_CALL)
        spec = TOOLS.get(call.tool_name)
        known = tuple(slot for slot in (call.arguments or {}) if slot in RE_ASK)
        if spec is None or not known:
            continue
        slot = known[rng.randrange(len(known))]
        candidates.append(ActPoint(trajectory.dialogue_id, index, step, spec.domain, call.tool_name, known, _needless(spec.domain, slot)))
    if len(candidates) > limit:
        chosen = sorted(rng.sample(range(len(candidates)), limit))
        candidates = [candidates[i] for i in chosen]
    return candidates


def _needless(domain: str, slot: str) -> str:
    think = f"Before I search the {domain} options I want to double-check the {slot} with the user."
    text, _ = FORMAT.render([AgentAction.think(think), AgentAction.clarify(RE_ASK[slot])])
    return text


__all__ = ["ActPoint", "RE_ASK", "act_points"]
