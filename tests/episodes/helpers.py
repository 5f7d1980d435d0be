"""Scripted stand-ins for the tests: a user simulator that says what it is told and records
what it was shown, and an agent that plays given outputs."""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Callable, Sequence

from pipelines.episodes import AgentContext, AgentFormat, AgentOutput, SpeakRLFormat
from pipelines.records import Dialogue, Goal
from pipelines.simulators.base import UserTurn

Reply = UserTurn | str


@dataclass
class ScriptedSession:
    """Says ``replies`` in order (the first is the opening); ends with an empty END turn when
    they run out. ``shown`` collects every agent text it was given."""

    replies: list[Reply]
    shown: list[str] = field(default_factory=list)
    position: int = 0

    async def opening(self) -> UserTurn:
        return self._next()

    async def respond(self, agent_text: str) -> UserTurn:
        self.shown.append(agent_text)
        return self._next()

    def _next(self) -> UserTurn:
        if self.position >= len(self.replies):
            return UserTurn("", end=True)
        reply = self.replies[self.position]
        self.position += 1
        return reply if isinstance(reply, UserTurn) else UserTurn(reply)

    def fork(self) -> "ScriptedSession":
        return copy.deepcopy(self)


class ScriptedSimulator:
    """``script(goal, reference)`` gives a session's replies; every session is kept in
    ``sessions`` by seed so that tests can read what each user was shown."""

    def __init__(self, script: Callable[[Goal, Dialogue | None], Sequence[Reply]], name: str = "scripted"):
        self.script = script
        self.name = name
        self.sessions: dict[int, ScriptedSession] = {}

    def session(self, goal: Goal, seed: int, reference: Dialogue | None = None) -> ScriptedSession:
        session = ScriptedSession(list(self.script(goal, reference)))
        self.sessions[seed] = session
        return session


def talkative_user(n: int = 50) -> ScriptedSimulator:
    """A user who never ends the conversation by themselves (within ``n`` turns)."""
    return ScriptedSimulator(lambda goal, reference: [f"user line {i}" for i in range(n)])


def gold_user() -> ScriptedSimulator:
    """A user who says the reference dialogue's user turns, whatever the agent says."""
    return ScriptedSimulator(lambda goal, reference: [t.text for t in reference.turns if t.speaker == "user"], name="gold-user")


class ScriptedAgent:
    """``policy(context)`` gives each step's output: an AgentOutput, or a raw text. Every
    ``act`` call's contexts are kept in ``calls``."""

    def __init__(self, policy: Callable[[AgentContext], AgentOutput | str], fmt: AgentFormat | None = None, name: str = "scripted"):
        self.policy = policy
        self.format = fmt or SpeakRLFormat()
        self.name = name
        self.calls: list[list[AgentContext]] = []

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        self.calls.append(list(contexts))
        outputs = [self.policy(c) for c in contexts]
        return [o if isinstance(o, AgentOutput) else AgentOutput(o) for o in outputs]
