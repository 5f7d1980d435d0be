"""Did the agent have what it quoted? A venue's attributes, as an evaluated policy stated them,
checked against the tool results of its episode and against the prompt it saw (no model).

A policy that tells the user a phone number, postcode or address can only be right when a
tool result holding it is in its prompt; a compact prompt (:func:`pipelines.evaluation.agent.policy_view`)
drops older history to fit its budget and cuts the second and later search results to a few
fields. :func:`claims` rebuilds, from an episode's events, the messages the runner gave the
agent before each reply, applies a prompt setting to them, and checks every attribute the
reply states in SpeakER's answer shape (``For <venue>: the <slot> is <value>; ...``,
:func:`pipelines.speaker.phrasing.parse_reqt_answer`, the shape the SpeakER SFT rows teach)
against that venue's record in the episode's search results: right or wrong, and whether the
record's value was in the prompt. Another setting than the one evaluated gives the
counterfactual prompt of the same history: would the value have been there.

The agent's outputs are re-rendered in its format from the recorded actions (the raw text is
not recorded); a prompt's length can differ from what the agent saw by the spacing of a tool
call's JSON, so the view is the setting's, up to a few tokens at its budget's edge.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipelines.episodes.formats import CLARIFY, END, RESPOND, THINK, TOOL_CALL, AgentAction, AgentFormat, Malformed
from pipelines.episodes.records import AGENT_NO_OUTPUT
#: What a claim is counted as: right or wrong, with the record's value in the prompt or not.
OUTCOMES: tuple[str, ...] = ("right_in_prompt", "right_not_in_prompt", "wrong_in_prompt", "wrong_not_in_prompt", "no_record")


@dataclass(frozen=True)
class Claim:
    """One attribute a reply stated: ``said`` for the ``slot`` of ``venue``; ``truth`` is the
    venue's value in the episode's search results so far (None: no such record or slot)."""

    episode_id: str
    turn: int
    venue: str
    slot: str
    said: str
    truth: str | None
    in_prompt: bool

    @property
    def outcome(self) -> str:
        if self.truth is None:
            return "no_record"
        right = _norm(self.said) == _norm(self.truth)
        return f"{'right' if right else 'wrong'}_{'in_prompt' if self.in_prompt else 'not_in_prompt'}"


def _norm(value: str) -> str:
    return " ".join(str(value).lower().split())


def replies(events: Sequence[Mapping[str, Any]], fmt: AgentFormat) -> Iterable[tuple[int, list[dict[str, Any]], str]]:
    """(turn, the runner's messages before the reply, the reply's text) for every plain
    response of the agent in one episode's ``events`` (dicts with the columns of
    ``episode_events.parquet``, in order): the runner's message list rebuilt as it grew."""
    messages: list[dict[str, Any]] = []
    pending: list[AgentAction] = []

    def flush() -> None:
        if pending:
            messages.append({"role": "assistant", "content": fmt.render(tuple(pending))[0]})
            pending.clear()

    for event in events:
        kind, actor, text = event["kind"], event["actor"], event.get("text") or ""
        if kind == "user" or (kind == "fallback" and actor == "user"):
            flush()
            messages.append({"role": "user", "content": text})
        elif actor == "clarifier":
            if kind == CLARIFY:  # the Clarifier's question, in the agent's history as its own message
                flush()
                messages.append({"role": "assistant", "content": fmt.render((AgentAction(CLARIFY if fmt.name == "speakrl" else RESPOND, text),))[0]})
        elif actor == "agent" and kind in (THINK, CLARIFY, RESPOND, TOOL_CALL, END):
            if kind == THINK and pending:
                flush()  # a new output starts with its reasoning
            if kind == RESPOND:
                yield event["turn"], list(messages), text
            arguments = json.loads(event["arguments_json"]) if kind == TOOL_CALL else None
            pending.append(AgentAction(kind, text if kind != TOOL_CALL else "", event.get("tool_name") if kind == TOOL_CALL else None, arguments))
            if kind == TOOL_CALL:
                flush()
        elif kind == "observation":
            call = AgentAction(TOOL_CALL, tool_name=event.get("tool_name") or "tool", arguments={})
            messages.append(fmt.observation_message(call, json.loads(event["observation_json"])))
        elif kind in ("malformed", "truncated"):
            pending.clear()
            if text or not str(event.get("detail") or "").startswith(AGENT_NO_OUTPUT):  # after a backend failure: nothing shown
                messages.append({"role": "assistant", "content": text})
                messages.append(fmt.feedback_message(Malformed(event.get("detail") or "", text)))
        elif kind == "fallback" and actor == "agent":
            pending.clear()
            messages.append({"role": "assistant", "content": fmt.render((AgentAction(RESPOND, text),))[0]})


def claims(
    episode_id: str,
    events: Sequence[Mapping[str, Any]],
    fmt: AgentFormat,
    view: Callable[[list[dict[str, Any]]], list[dict[str, Any]]],
) -> list[Claim]:
    """Every attribute the agent's replies in one episode state (module docstring); ``view``
    turns the runner's messages into the prompt the policy sees."""
    from pipelines.speaker.phrasing import parse_reqt_answer

    found: list[Claim] = []
    # Every search result with the turn it came back in, parsed once.
    results = [(e["turn"], r) for e in events if e["kind"] == "observation"
               for r in _results(json.loads(e["observation_json"]))]
    for turn, messages, text in replies(events, fmt):
        parsed = parse_reqt_answer(text)
        if parsed is None:
            continue
        venue, stated = parsed
        record = _record(results, turn, venue)
        seen = "\n".join(str(m.get("content") or "") for m in view(messages))
        for slot, said in stated.items():
            truth = None if record is None or record.get(slot) in (None, "", "?") else str(record[slot])
            found.append(Claim(episode_id, turn, venue, slot, said, truth, truth is not None and truth in seen))
    return found


def _results(observation: Any) -> list[dict[str, Any]]:
    results = observation.get("results") if isinstance(observation, dict) else None
    return [r for r in results if isinstance(r, dict)] if isinstance(results, list) else []


def _record(results: Sequence[tuple[int, Mapping[str, Any]]], turn: int, venue: str) -> Mapping[str, Any] | None:
    """The latest search result named ``venue`` (or with that train id) up to ``turn``."""
    names = venue.lower()
    return next((r for t, r in reversed(results) if t <= turn and names in (str(r.get("name", "")).lower(), str(r.get("trainID", "")).lower())),
                None)


def grounding_table(found: Iterable[Claim], slots: Sequence[str] | None = None) -> dict[str, int]:
    """Claims by :data:`OUTCOMES` (only ``slots``' when given), with their total."""
    counts = Counter(c.outcome for c in found if slots is None or c.slot in slots)
    return {"claims": sum(counts.values()), **{o: counts.get(o, 0) for o in OUTCOMES}}


__all__ = ["Claim", "OUTCOMES", "claims", "grounding_table", "replies"]
