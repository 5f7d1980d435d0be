"""Failure protection for user simulators (PIR, appendix A.2).

An LLM user can fail: the call fails for good (timeouts, server errors), the reply is
empty, or the model forgets its role and answers as the agent. PIR answers such a turn
with a neutral reply so that the episode goes on; here the fault is first retried a
bounded number of times, and the fallback turn that follows is *recorded*: ``UserTurn``
carries ``fallback=True``, the fault's reason and the retries spent, so the runner can
count fallbacks per episode and filter or weight such episodes.

Each attempt runs on a fork of the session, so a failed attempt leaves no trace, and a
session that supports it (the LLM sessions) is asked with a different ``attempt``, which
changes its request seed: a cached bad reply is not simply served again.

The fallback text comes from a *shadow* session when one is given (the agenda simulator
for the same goal and seed, fed every agent utterance so that its reply fits the
conversation), else from PIR's neutral replies, picked by the session's seed.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
import random
import re
from typing import Protocol, runtime_checkable

from pipelines.errors import AskflowError
from pipelines.records import Dialogue, Goal
from pipelines.simulators.agenda import SimulatorSpec
from pipelines.simulators.base import SimulatorSession, UserSimulator, UserTurn

logger = logging.getLogger(__name__)

# PIR appendix A.2: the replies its user simulator falls back to.
FALLBACK_REPLIES: tuple[str, ...] = (
    "I don't have a specific intent right now. Please proceed based on your best judgment.",
    "I'm not sure about that. You can decide what's best.",
    "I don't have more information to add. Just carry on.",
    "I don't really have an answer for that. Can you try to solve it with what you have?",
    "That's not something I can answer. Please continue with the task.",
)

# A user turn that starts like the other side's (or the narrator's) line.
_ROLE_CONFUSED = re.compile(r"^\W*(?:assistant|agent|system|travel agent|clerk)\W*:", re.I)


class SimulatorFault(AskflowError):
    """A simulator could not produce a turn; ``reason`` is short and countable
    ("llm_timeout", "empty_advice"), ``detail`` says what happened."""

    def __init__(self, reason: str, detail: str = ""):
        self.reason = reason
        self.detail = detail
        super().__init__(f"{reason}: {detail}" if detail else reason)


@runtime_checkable
class RetryableSession(Protocol):
    """A session that can write a turn anew (``attempt`` > 0 changes its seeds) and can be
    told that a fallback turn was said in its name."""

    async def opening(self, *, attempt: int = 0) -> UserTurn: ...

    async def respond(self, agent_text: str, *, attempt: int = 0) -> UserTurn: ...

    def record_fallback(self, agent_text: str | None, turn: UserTurn) -> None: ...

    def fork(self) -> RetryableSession: ...


def turn_fault(turn: object) -> str | None:
    """Why ``turn`` cannot be shown to the agent, or None when it can."""
    if not isinstance(turn, UserTurn):
        return f"not_a_turn: got {type(turn).__name__}"
    text = turn.text.strip() if isinstance(turn.text, str) else ""
    if not text and not turn.end:  # hanging up without words is fine; silence is not
        return "empty"
    if _ROLE_CONFUSED.match(text):
        return f"role_confused: {text[:60]!r}"
    return None


def _describe(exc: BaseException) -> str:
    if isinstance(exc, SimulatorFault):
        return str(exc)
    if isinstance(exc, TimeoutError):
        return "timeout: the turn took longer than turn_timeout_s"
    return f"exception: {type(exc).__name__}: {exc}"


class ProtectedSession:
    """A session whose faults become retries and, after ``config.max_retries``, a recorded
    fallback (``config``: the simulator section's protection settings)."""

    def __init__(self, inner: SimulatorSession, config: SimulatorSpec, shadow: SimulatorSession | None, rng: random.Random):
        self._inner = inner
        self._config = config
        self._shadow = shadow
        self._rng = rng

    async def opening(self) -> UserTurn:
        return await self._turn(None)

    async def respond(self, agent_text: str) -> UserTurn:
        return await self._turn(agent_text)

    def fork(self) -> ProtectedSession:
        rng = random.Random()
        rng.setstate(self._rng.getstate())
        shadow = self._shadow.fork() if self._shadow is not None else None
        return ProtectedSession(self._inner.fork(), self._config, shadow, rng)

    async def _turn(self, agent_text: str | None) -> UserTurn:
        shadow_turn = await self._shadow_turn(agent_text)
        reason = None
        for attempt in range(self._config.max_retries + 1):
            candidate = self._inner.fork()
            try:
                turn = await self._attempt(candidate, agent_text, attempt)
                fault = turn_fault(turn)
            except Exception as exc:  # noqa: BLE001 - every simulator fault is retried, then recorded
                fault = _describe(exc)
                logger.debug("user simulator fault (attempt %d)", attempt, exc_info=True)
            if fault is None:
                self._inner = candidate
                return dataclasses.replace(turn, retries=attempt, failure=reason)
            reason = fault
            logger.info("user simulator fault on attempt %d/%d: %s", attempt + 1, self._config.max_retries + 1, fault)
        return self._fallback(agent_text, shadow_turn, reason)

    async def _attempt(self, session: SimulatorSession, agent_text: str | None, attempt: int) -> UserTurn:
        if isinstance(session, RetryableSession):
            call = session.opening(attempt=attempt) if agent_text is None else session.respond(agent_text, attempt=attempt)
        else:
            call = session.opening() if agent_text is None else session.respond(agent_text)
        if self._config.turn_timeout_s is None:
            return await call
        async with asyncio.timeout(self._config.turn_timeout_s):
            return await call

    async def _shadow_turn(self, agent_text: str | None) -> UserTurn | None:
        """The shadow's reply to the same agent turn; it hears every turn to stay in step.
        A shadow that fails is dropped (it is a convenience, not a requirement)."""
        if self._shadow is None:
            return None
        try:
            turn = await (self._shadow.opening() if agent_text is None else self._shadow.respond(agent_text))
        except Exception:  # noqa: BLE001
            logger.warning("fallback simulator failed; neutral replies are used from now on", exc_info=True)
            self._shadow = None
            return None
        return turn if turn_fault(turn) is None else None

    def _fallback(self, agent_text: str | None, shadow_turn: UserTurn | None, reason: str | None) -> UserTurn:
        retries = self._config.max_retries
        # The shadow's turn is taken whole: when it ends the conversation (every sub-goal
        # done, or given up on the agent), the fallback ends it too.
        if shadow_turn is not None:
            turn = UserTurn(shadow_turn.text, end=shadow_turn.end, acts=shadow_turn.acts, retries=retries, fallback=True, failure=reason)
        else:
            turn = UserTurn(self._rng.choice(FALLBACK_REPLIES), retries=retries, fallback=True, failure=reason)
        logger.warning("user simulator fell back after %d retries: %s", retries, reason)
        if isinstance(self._inner, RetryableSession):
            self._inner.record_fallback(agent_text, turn)
        return turn


class ProtectedSimulator:
    """Wraps ``inner`` so that every session is a :class:`ProtectedSession`; ``fallback``
    (typically the agenda simulator) provides the shadow sessions."""

    def __init__(self, inner: UserSimulator, config: SimulatorSpec = SimulatorSpec(), fallback: UserSimulator | None = None):
        self.inner = inner
        self.config = config
        self.fallback = fallback
        self.name = inner.name

    def session(self, goal: Goal, seed: int, reference: Dialogue | None = None) -> ProtectedSession:
        shadow = self.fallback.session(goal, seed, reference) if self.fallback is not None else None
        # Its own RNG, so that the neutral replies do not depend on how the inner session draws.
        return ProtectedSession(self.inner.session(goal, seed, reference), self.config, shadow, random.Random(f"fallback:{seed}"))
