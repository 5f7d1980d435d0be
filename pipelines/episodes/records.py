"""What an episode leaves behind: one :class:`Episode` with its :class:`EpisodeEvent` rows.

Events are the complete record, in order: every utterance, think segment, clarification,
tool call (arguments as JSON) and observation (JSON), malformed output, fallback and the
end, each with its dialogue turn (MultiWOZ numbering: user turns even, agent turns odd).
An agent output's token counts and latency sit on the first event it produced (its other
events carry None), so sums over events are totals; a user event's latency is the
simulator's.
"""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.env.checker import DomainResult, GoalResult

USER_END, AGENT_END, TURN_LIMIT = "user_end", "agent_end", "turn_limit"
ENDED_BY: tuple[str, ...] = (USER_END, AGENT_END, TURN_LIMIT)
#: How a malformed event's detail begins when the agent's backend failed (no output at all):
#: the runner writes it, the scores and the JOSH tree count such failures by it.
AGENT_NO_OUTPUT = "the agent produced no output ("

EVENT_KINDS: tuple[str, ...] = (
    "user",  # a user turn (text: what the user said, END_CONVERSATION removed)
    "think",  # hidden reasoning (<think>, PLAN, content next to tool calls)
    "clarify",  # a clarification question, shown to the user
    "respond",  # a plain response, shown to the user
    "tool_call",  # tool_name + arguments_json
    "observation",  # the tool's answer: observation_json; detail holds its error, if any
    "malformed",  # text: the raw output (empty when the backend failed); detail: why
    "truncated",  # an output cut by the generation limit before its end (not counted as malformed); text, detail as malformed
    "fallback",  # a fixed stand-in after retries ran out: the agent's apology, the simulator's fallback turn
    "end",  # who ended the episode (actor); detail: ended_by
)
# Who produced an event: the runner only ends episodes at the turn limit.
# "clarifier": the plug-in Clarifier (pipelines.clarifier) consulted after a tool call: its
# decision is a "think" event (detail: the final output), its question a "clarify" one.
ACTORS: tuple[str, ...] = ("user", "agent", "environment", "runner", "clarifier")
# Events that are an utterance of the dialogue (one dialogue turn each).
UTTERANCE_KINDS: tuple[str, ...] = ("user", "clarify", "respond", "fallback")


@dataclass(frozen=True)
class EpisodeEvent:
    episode_id: str
    event_index: int
    turn: int
    kind: str
    actor: str
    text: str | None = None
    detail: str | None = None
    tool_name: str | None = None
    arguments_json: str | None = None
    observation_json: str | None = None
    retries: int | None = None  # simulator retries spent before a user turn
    latency_s: float | None = None
    prompt_tokens: int | None = None
    completion_tokens: int | None = None

    @property
    def is_utterance(self) -> bool:
        return self.kind in UTTERANCE_KINDS


@dataclass(frozen=True)
class Episode:
    """One played episode, graded by its world (MultiWOZ: the goal checker; τ-bench: its
    reward) on its final environment state and the agent's visible texts (no dialog acts:
    an agent produces none).

    ``n_turns`` counts utterances, user and agent, as MultiWOZ counts turns.
    ``n_agent_fallbacks``: turns the agent failed (malformed retries or the step limit ran
    out) and the user heard the fixed apology."""

    episode_id: str
    dialogue_id: str
    agent: str
    agent_format: str
    simulator: str
    seed: int
    n_turns: int
    ended_by: str
    result: GoalResult
    goal_domains: tuple[str, ...]
    n_clarifications: int
    n_tool_calls: int
    n_tool_errors: int
    n_malformed: int
    n_agent_fallbacks: int
    simulator_retries: int
    simulator_fallbacks: int
    prompt_tokens: int
    completion_tokens: int
    wall_seconds: float
    events: tuple[EpisodeEvent, ...]

    @property
    def success(self) -> bool:
        return self.result.success

    @property
    def inform(self) -> bool:
        return self.result.inform

    @property
    def standard_success(self) -> bool | None:
        """The standard evaluator's Success (:mod:`pipelines.env.standard`); None when the world has no such grade."""
        return self.result.standard_success

    @property
    def standard_inform(self) -> bool | None:
        return self.result.standard_inform

    @property
    def n_truncated(self) -> int:
        """Outputs cut by the generation limit before their end (``truncated`` events): a
        limit too low for the policy's turns, not malformed text (``n_malformed``)."""
        return sum(1 for e in self.events if e.kind == "truncated")

    @property
    def domain_results(self) -> tuple[DomainResult, ...]:
        return self.result.domains

    def transcript(self) -> list[tuple[str, str]]:
        """``(actor, text)`` of every utterance, in order."""
        return [(e.actor, e.text or "") for e in self.events if e.is_utterance]
