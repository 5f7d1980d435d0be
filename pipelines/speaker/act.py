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

Every search right after the user corrected a recommendation, or reminded the agent of what
its last search left out, is an act-here point too, beyond ``limit``: there the rejected
output is the same search without one constraint the user had said before (the H100 run's
SFT model searched again without a slot its previous search of the domain had 74 times in
186, ``benchmarks/failures.py``), so the DPO pair prefers carrying everything said over.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Mapping

from pipelines.env.tools import TOOLS
from pipelines.episodes.formats import RESPOND, AgentAction
from pipelines.speaker import phrasing as say
from pipelines.speaker.trajectory import FORMAT, USER, Trajectory

#: What an act-here pair rejects: a question re-asking what the user said, or a search that
#: leaves out what they said.
NEEDLESS_QUESTION = "needless_question"
DROPPED_SLOT = "dropped_slot"

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
    ``rejected``: the output the pair prefers the call to, in SpeakRL's tokens, of
    ``rejected_kind``: a question that re-asks one of ``known`` (:data:`NEEDLESS_QUESTION`), or
    the search without one of them (:data:`DROPPED_SLOT`)."""

    dialogue_id: str
    index: int
    step: int
    domain: str
    tool: str
    known: tuple[str, ...]
    rejected: str
    rejected_kind: str = NEEDLESS_QUESTION


def act_points(trajectory: Trajectory, rng: random.Random, limit: int) -> list[ActPoint]:
    """Up to ``limit`` act-here points of a trajectory, drawn with ``rng``, and every search
    after a correction or a reminder (:data:`DROPPED_SLOT`); in dialogue order."""
    candidates: list[ActPoint] = []
    carried: list[ActPoint] = []
    step = -1
    last: dict[str, AgentAction] = {}  # the previous search of each tool, shown or taught
    for index, turn in enumerate(trajectory.turns):
        if turn.role != "assistant":
            continue
        step += 1
        call = turn.call
        previous = last.get(call.tool_name) if call is not None else None
        if call is not None:
            last[call.tool_name] = call
        if call is None or turn.point is not None or turn.shown or index == 0 or trajectory.turns[index - 1].kind != USER:
            continue  # a mistaken search (shown) is never a chosen action
        spec = TOOLS.get(call.tool_name)
        known = tuple(slot for slot in (call.arguments or {}) if slot in RE_ASK)
        if spec is None or not known:
            continue
        if previous is not None and _after_correction(trajectory, index):
            dropped = _dropped(spec.domain, call, previous, rng)
            if dropped is not None:
                carried.append(ActPoint(trajectory.dialogue_id, index, step, spec.domain, call.tool_name, known, dropped, DROPPED_SLOT))
                continue
        slot = known[rng.randrange(len(known))]
        candidates.append(ActPoint(trajectory.dialogue_id, index, step, spec.domain, call.tool_name, known, _needless(spec.domain, slot)))
    if len(candidates) > limit:
        chosen = sorted(rng.sample(range(len(candidates)), limit))
        candidates = [candidates[i] for i in chosen]
    return sorted(candidates + carried, key=lambda p: p.index)


def _after_correction(trajectory: Trajectory, index: int) -> bool:
    """Whether the user message before ``index`` answers a recommendation made too early (a
    shown response: the user corrected it, or reminded the agent of what its search dropped)."""
    before = trajectory.turns[index - 2] if index >= 2 else None
    return before is not None and before.shown and before.kind == RESPOND


def _dropped(domain: str, call: AgentAction, previous: AgentAction, rng: random.Random) -> str | None:
    """``call`` without one slot the previous search of its tool had, reasoned as a search on
    what the user just added alone; None where the previous search had none of its slots."""
    arguments, before = dict(call.arguments or {}), dict(previous.arguments or {})
    droppable = [slot for slot in arguments if slot in before]
    if not droppable:
        return None
    slot = droppable[rng.randrange(len(droppable))]
    added = {s: str(v) for s, v in arguments.items() if s not in before} or {slot: str(arguments[slot])}
    partial = {s: v for s, v in arguments.items() if s != slot}
    text, _ = FORMAT.render([AgentAction.think(say.requery_think(rng, domain, added)), AgentAction.tool_call(call.tool_name, partial)])
    return text


def _needless(domain: str, slot: str) -> str:
    think = f"Before I search the {domain} options I want to double-check the {slot} with the user."
    text, _ = FORMAT.render([AgentAction.think(think), AgentAction.clarify(RE_ASK[slot])])
    return text


__all__ = ["DROPPED_SLOT", "NEEDLESS_QUESTION", "ActPoint", "RE_ASK", "act_points"]
