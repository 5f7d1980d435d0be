"""The contract between user simulators and the dialogue runner.

A simulator plays one user with a hidden ``Goal``. The runner opens a session per
episode, asks it for the opening turn, then hands it every *visible* agent utterance
(a clarification question or a plain response; never think content, tool calls or
observations) and gets the user's reply. Sessions are async because LLM simulators call
a server; rule-based ones simply return at once. ``fork`` copies a session so that an
episode can branch (JOSH).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

from pipelines.records import DialogAct, Dialogue, Goal

# What a user says to end the conversation (JOSH/SpeakRL convention). The runner strips it
# from the text and ends the episode after the user turn that carries it.
END_CONVERSATION = "END_CONVERSATION"


@dataclass(frozen=True)
class UserTurn:
    text: str  # what the user says, END_CONVERSATION removed
    end: bool = False  # the user ends the conversation with this turn
    acts: tuple[DialogAct, ...] = ()  # what the simulator meant, when it knows (agenda simulator)
    # Failure protection (PIR appendix A.2): retries spent on simulator faults before this
    # turn, and whether the turn is the recorded fallback after the retries ran out.
    retries: int = 0
    fallback: bool = False
    failure: str | None = None  # the last fault's reason when retries > 0 or fallback


class SimulatorSession(Protocol):
    """One user in one episode."""

    async def opening(self) -> UserTurn:
        """The user's first turn."""
        ...

    async def respond(self, agent_text: str) -> UserTurn:
        """The user's reply to the agent's visible utterance."""
        ...

    def fork(self) -> "SimulatorSession":
        """An independent copy of the session in its current state."""
        ...


class UserSimulator(Protocol):
    name: str

    def session(self, goal: Goal, seed: int, reference: Dialogue | None = None) -> SimulatorSession:
        """A new session for ``goal``. ``reference`` is the dataset dialogue the goal comes
        from, when there is one (the guide simulator is grounded in it)."""
        ...
