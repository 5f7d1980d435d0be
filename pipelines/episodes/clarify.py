"""What the runner hands a plug-in Clarifier (:mod:`pipelines.clarifier`) after a tool call:
:class:`ClarifyContext`, with the dialogue rendered from the episode's events, the same
whatever the agent's format: ``User: ...``, ``Agent: ...``,
``Agent: [TOOL_CALL: name(k=v, ...)]``, ``Tool[name]: ...`` (the Clarifier paper's
appendix 7.2 layout).
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Iterable


@dataclass(frozen=True)
class ClarifyContext:
    """One state at which the Clarifier is consulted: the rendered dialogue (ending with the
    tool call and its result), the questions it asked earlier in the episode, and the goal
    (only a goal-grounded offline Clarifier reads it; model Clarifiers never see it)."""

    episode_id: str
    seed: int
    step: int  # consultations so far in the episode
    history: str
    tool_name: str
    goal: Any = None
    asked: tuple[str, ...] = ()

    @property
    def call_seed(self) -> int:
        key = f"{self.episode_id}\x00{self.seed}\x00{self.step}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") >> 1


def _call_text(name: str, arguments: Any) -> str:
    args = arguments if isinstance(arguments, dict) else {}
    return f"[TOOL_CALL: {name}({', '.join(f'{k}={v}' for k, v in args.items())})]"


def history_lines(events: Iterable[Any]) -> list[str]:
    """The dialogue as text lines, from episode events (see the module docstring)."""
    lines = []
    for event in events:
        if event.kind == "user":
            lines.append(f"User: {event.text}")
        elif event.kind in ("respond", "clarify", "fallback") and event.actor in ("agent", "clarifier"):
            lines.append(f"Agent: {event.text}")
        elif event.kind == "tool_call":
            lines.append(f"Agent: {_call_text(event.tool_name, json.loads(event.arguments_json or '{}'))}")
        elif event.kind == "observation":
            observation = json.loads(event.observation_json or "{}")
            output = observation.get("error", observation.get("output", observation))
            lines.append(f"Tool[{event.tool_name}]: {output if isinstance(output, str) else json.dumps(output, ensure_ascii=False)}")
    return lines


def history_text(events: Iterable[Any]) -> str:
    return "\n".join(history_lines(events))
