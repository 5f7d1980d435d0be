"""The dialogue runner: agent <-> user <-> tools, many episodes stepped together.

An episode alternates user turns and agent turns (MultiWOZ numbering: the user's turn of
exchange e is 2e, the agent's 2e+1). Within its turn the agent may take several steps:
each output is parsed by the agent's format; tool calls run in the episode's
:class:`ToolEnvironment` and their observations go back into the agent's history; the turn
ends with something visible (a clarification or a response), which the user simulator
then answers. Think content, tool calls and observations never reach the user.

The episode ends when the user ends it (``UserTurn.end``), the agent ends it (an ``end``
action; its last response counts as said, and a world's environment may end it too, as
τ-bench's transfer to a human does), after ``max_exchanges`` agent turns, or when the
world's action budget (``World.max_actions``: tool calls and visible replies; τ-bench's 30
steps) is spent.

The domain lives in a :class:`~pipelines.env.world.World`: it builds each episode's tool
environment from the spec's goal and grades the finished episode (MultiWOZ's goal checker,
τ-bench's reward). The runner itself is the same for every domain; a bare MultiWOZ
:class:`Database` where a world is expected means :class:`~pipelines.env.world.MultiWozWorld`.

Failures are data, not exceptions:

* a malformed output (or a failed backend call) is recorded, its reason goes back to the
  agent, and the agent tries again, up to ``malformed_retries`` times per turn;
* a turn whose retries run out, or that reaches ``max_steps`` accepted outputs without a
  visible reply, fails: the user hears the fixed ``apology`` (recorded as a fallback) and
  the dialogue goes on;
* a bad tool call gets an ``{"error": ...}`` observation, as the environment gives it.

Batching (:func:`play`): each round, the user turns of all episodes that wait for the
user are awaited concurrently, then every episode that waits for the agent goes into one
``agent.act`` call. Everything an episode does is a function of its spec's seed and of
the agent's outputs, so runs are deterministic for deterministic agents and simulators.

:class:`EpisodeState` is one episode in play; :meth:`EpisodeState.fork` copies it cheaply
(environment and simulator session forked, histories copied shallowly: the records in
them are immutable), so that JOSH can branch an episode and play the branches on.
"""

from __future__ import annotations

import asyncio
import copy
from collections import Counter
from dataclasses import dataclass, replace
from time import perf_counter
from typing import Any, Callable, Sequence

from pipelines.config import positive_int
from pipelines.env.tools import Database
from pipelines.env.world import EpisodeEnvironment, World, as_world
from pipelines.episodes.agents import Agent, AgentContext, AgentOutput
from pipelines.episodes.clarify import ClarifyContext, history_text
from pipelines.episodes.formats import (
    CLARIFY,
    DEFAULT_TASK_PROMPT,
    END,
    RESPOND,
    THINK,
    TOOL_CALL,
    AgentAction,
    AgentFormat,
    Malformed,
    Message,
    observation_json,
)
from pipelines.episodes.records import AGENT_END, AGENT_NO_OUTPUT, TURN_LIMIT, USER_END, Episode, EpisodeEvent
from pipelines.records import Dialogue, Goal, ToolCall
from pipelines.simulators.base import SimulatorSession, UserSimulator, UserTurn

DEFAULT_APOLOGY = "I'm sorry, something went wrong on my side. Could you say that again?"

# What an episode waits for.
WAITS_FOR_USER, WAITS_FOR_AGENT, DONE = "user", "agent", "done"


@dataclass(frozen=True)
class EpisodeSpec:
    """One episode to play: a goal, the seed of its environment and simulator session, and
    the dataset dialogue the goal comes from, when there is one. The goal is the world's
    kind (a MultiWOZ :class:`Goal`, a τ-bench ``TauTask``); every kind has ``dialogue_id``
    and ``domain_names``."""

    episode_id: str
    goal: Goal | Any
    seed: int = 0
    reference: Dialogue | None = None

    @classmethod
    def from_dialogue(cls, dialogue: Dialogue, seed: int = 0, episode_id: str | None = None) -> EpisodeSpec:
        return cls(episode_id or f"{dialogue.dialogue_id}#{seed}", dialogue.goal, seed, dialogue)


@dataclass(frozen=True)
class RunnerConfig:
    """``max_exchanges``: agent turns per episode; ``max_steps``: accepted agent outputs per
    turn (tool calls included); ``malformed_retries``: extra outputs a turn may spend on
    malformed ones; ``task_prompt``: the task part of the system prompt (the format adds the
    tools and output instructions); ``apology``: what the user hears from a failed turn."""

    max_exchanges: int = 20
    max_steps: int = 6
    malformed_retries: int = 2
    task_prompt: str = DEFAULT_TASK_PROMPT
    apology: str = DEFAULT_APOLOGY

    def __post_init__(self) -> None:
        for name, minimum in (("max_exchanges", 1), ("max_steps", 1), ("malformed_retries", 0)):
            positive_int(getattr(self, name), name, minimum=minimum)
        if not self.apology.strip():
            raise ValueError("apology must not be empty")


class EpisodeState:
    """One episode in play. Create it with :meth:`start`; :func:`play` drives it, or step it
    by hand: :meth:`hear_user` while :attr:`phase` is ``"user"``, :meth:`take` an agent
    output for :meth:`context` while it is ``"agent"``, :meth:`finish` for the record."""

    def __init__(
        self,
        spec: EpisodeSpec,
        *,
        agent_name: str,
        fmt: AgentFormat,
        simulator_name: str,
        environment: EpisodeEnvironment,
        session: SimulatorSession,
        config: RunnerConfig,
        world: World | None = None,
    ):
        self.spec = spec
        self.agent_name = agent_name
        self.format = fmt
        self.simulator_name = simulator_name
        self.environment = environment
        self.session = session
        self.config = config
        self.world = world  # grades the episode (finish); None: it can be played, not graded
        self.n_actions = 0  # tool calls and visible replies, against world.max_actions
        self.messages: list[Message] = [{"role": "system", "content": fmt.system_prompt(config.task_prompt)}]
        self.events: list[EpisodeEvent] = []
        self.calls: list[tuple[int, ToolCall]] = []
        self.visible_texts: list[tuple[int, str]] = []  # what the user was shown, for the checker
        self.phase = WAITS_FOR_USER
        self.ended_by: str | None = None
        self.exchange = 0
        self.step = 0
        self.attempt = 0
        self.agent_text: str | None = None  # what the user answers next; None before the opening
        # The Clarifier (play(clarifier=...)): consulted after an output with a tool call that
        # did not end the turn; its questions, for the budget and "do not repeat".
        self.clarify_due = False
        self.clarifier_calls = 0
        self.clarifier_questions: list[str] = []
        self.started = perf_counter()

    @classmethod
    def start(
        cls, spec: EpisodeSpec, agent: Agent, simulator: UserSimulator, world: World | Database, config: RunnerConfig
    ) -> EpisodeState:
        world = as_world(world)
        return cls(
            spec,
            agent_name=agent.name,
            fmt=agent.format,
            simulator_name=simulator.name,
            environment=world.environment(spec.goal, spec.seed),
            session=simulator.session(spec.goal, spec.seed, spec.reference),
            config=config,
            world=world,
        )

    def fork(self) -> EpisodeState:
        """An independent copy: later steps on either do not affect the other."""
        twin = copy.copy(self)
        twin.environment = self.environment.fork()
        twin.session = self.session.fork()
        # Messages, events and calls are never modified once appended, so copying the lists
        # is enough.
        twin.messages = list(self.messages)
        twin.events = list(self.events)
        twin.calls = list(self.calls)
        twin.visible_texts = list(self.visible_texts)
        twin.clarifier_questions = list(self.clarifier_questions)
        return twin

    @property
    def turn(self) -> int:
        """The agent's dialogue turn in the current exchange."""
        return 2 * self.exchange + 1

    # -- the user's side -----------------------------------------------------------------

    async def hear_user(self) -> None:
        """Get the user's opening turn or reply to the agent's last visible text."""
        if self.phase != WAITS_FOR_USER:
            raise RuntimeError(f"episode {self.spec.episode_id!r} does not wait for the user (phase {self.phase!r})")
        started = perf_counter()
        if self.agent_text is None:
            user_turn = await self.session.opening()
        else:
            user_turn = await self.session.respond(self.agent_text)
        self._record_user(user_turn, perf_counter() - started)
        self.messages.append({"role": "user", "content": user_turn.text})
        if user_turn.end:
            self._end(USER_END, "user", self.turn - 1)
        else:
            self.phase = WAITS_FOR_AGENT

    def _record_user(self, user_turn: UserTurn, latency: float) -> None:
        self._record(
            "fallback" if user_turn.fallback else "user",
            "user",
            self.turn - 1,
            text=user_turn.text,
            detail=user_turn.failure,
            retries=user_turn.retries,
            latency_s=latency,
        )

    # -- the agent's side ----------------------------------------------------------------

    def context(self) -> AgentContext:
        if self.phase != WAITS_FOR_AGENT:
            raise RuntimeError(f"episode {self.spec.episode_id!r} does not wait for the agent (phase {self.phase!r})")
        return AgentContext(
            episode_id=self.spec.episode_id,
            seed=self.spec.seed,
            exchange=self.exchange,
            turn=self.turn,
            step=self.step,
            attempt=self.attempt,
            messages=tuple(self.messages),
            tools=self.format.tools,
            calls=tuple(self.calls),
            reference=self.spec.reference,
        )

    def take(self, output: AgentOutput) -> None:
        """Apply one agent output: record it, run its tool calls, and move on."""
        if self.phase != WAITS_FOR_AGENT:
            raise RuntimeError(f"episode {self.spec.episode_id!r} does not wait for the agent (phase {self.phase!r})")
        cost: dict[str, Any] = {
            "latency_s": output.latency_s,
            "prompt_tokens": output.prompt_tokens,
            "completion_tokens": output.completion_tokens,
        }
        if output.error is not None:
            self._reject(Malformed(f"{AGENT_NO_OUTPUT}{output.error})", ""), output, cost)
            return
        parsed = self.format.parse(output.text, output.tool_calls)
        if isinstance(parsed, Malformed):
            if output.truncated:
                # Cut by the generation limit: reported as such (the limit is too low for the
                # turn), not as malformed text; the agent is told and tries again all the same.
                parsed = Malformed(f"truncated at the generation limit ({output.completion_tokens} tokens): {parsed.reason}", parsed.raw)
            self._reject(parsed, output, cost, kind="truncated" if output.truncated else "malformed")
            return
        actions = self._with_call_ids(parsed)
        self.messages.append(self.format.assistant_message(output.text, output.tool_calls, actions))
        stopped_by = None
        for action in actions:
            if action.kind != END:  # recorded last, as the episode's end
                self._apply(action, cost)
                cost = {}  # the output's cost goes on its first event only
                stopped_by = self._world_stop()
                if stopped_by is not None:
                    break  # what the output says after the stop is never carried out
        self.step += 1

        kinds = {a.kind for a in actions}
        self.clarify_due = stopped_by is None and TOOL_CALL in kinds and not kinds & {CLARIFY, RESPOND, END}
        if stopped_by == AGENT_END:
            self._end(AGENT_END, "environment", self.turn, **cost)
        elif stopped_by == TURN_LIMIT:
            self._end(TURN_LIMIT, "runner", self.turn, **cost)
        elif END in kinds:
            self._end(AGENT_END, "agent", self.turn, **cost)
        elif kinds & {CLARIFY, RESPOND}:
            self._next_exchange(next(a.text for a in actions if a.visible))
        elif self.step >= self.config.max_steps:
            self._fail_turn(f"no reply to the user after {self.step} steps")

    # -- the Clarifier's side ------------------------------------------------------------

    def clarify_context(self) -> ClarifyContext:
        """The state the Clarifier sees: the dialogue so far (ending with the tool result)."""
        last_call = next(e for e in reversed(self.events) if e.kind == TOOL_CALL)
        return ClarifyContext(
            self.spec.episode_id, self.spec.seed, self.clarifier_calls, history_text(self.events),
            last_call.tool_name or "", self.spec.goal, tuple(self.clarifier_questions),
        )

    def take_clarification(self, decision: Any) -> None:
        """Apply the Clarifier's decision: recorded as its "think" event; a question becomes
        the agent's turn, shown to the user (in the agent's history as the agent's own
        message), and the user answers it next. It is not one of the world's agent actions."""
        if self.phase != WAITS_FOR_AGENT:
            raise RuntimeError(f"episode {self.spec.episode_id!r} does not wait for the agent (phase {self.phase!r})")
        self.clarify_due = False
        self.clarifier_calls += 1
        outcome = "malformed" if decision.malformed else ("ask" if decision.asks else "no_need")
        self._record(THINK, "clarifier", self.turn, text=decision.reasoning or None, detail=outcome)
        if not decision.asks:
            return
        question = decision.question
        self.clarifier_questions.append(question)
        self._record(CLARIFY, "clarifier", self.turn, text=question)
        self.visible_texts.append((self.turn, question))
        action = AgentAction.clarify(question) if self.format.name == "speakrl" else AgentAction.respond(question)
        text, tool_calls = self.format.render((action,))
        self.messages.append(self.format.assistant_message(text, tool_calls, (action,)))
        self._next_exchange(question)

    def _world_stop(self) -> str | None:
        """Does the world end the episode here? Its environment may (AGENT_END: the agent
        handed over, e.g. τ-bench's transfer), or its action budget may be spent (TURN_LIMIT)."""
        if self.world is None:
            return None
        if self.world.ended(self.environment):
            return AGENT_END
        limit = self.world.max_actions
        if limit is not None and self.n_actions >= limit:
            return TURN_LIMIT
        return None

    def _with_call_ids(self, actions: Sequence[AgentAction]) -> tuple[AgentAction, ...]:
        """Function calling answers every call by its id; outputs without ids get ones unique
        in the episode."""
        numbered = []
        for k, action in enumerate(actions):
            if action.kind == TOOL_CALL and action.call_id is None:
                action = replace(action, call_id=f"call_{self.turn}_{self.step}_{k}")
            numbered.append(action)
        return tuple(numbered)

    def _apply(self, action: AgentAction, cost: dict[str, Any]) -> None:
        turn = self.turn
        if action.kind == TOOL_CALL or action.visible:
            self.n_actions += 1
        if action.kind == TOOL_CALL:
            self._record(TOOL_CALL, "agent", turn, tool_name=action.tool_name, arguments_json=action.arguments_json, **cost)
            started = perf_counter()
            observation = self.environment.call(action.tool_name, dict(action.arguments or {}), turn=turn)
            error = observation.get("error")
            self._record(
                "observation",
                "environment",
                turn,
                tool_name=action.tool_name,
                observation_json=observation_json(observation),
                detail=None if error is None else str(error),
                latency_s=perf_counter() - started,
            )
            self.calls.append((turn, ToolCall(action.tool_name, action.arguments or {}, observation)))
            self.messages.append(self.format.observation_message(action, observation))
        else:
            self._record(action.kind, "agent", turn, text=action.text, **cost)
            if action.visible:
                self.visible_texts.append((turn, action.text))

    def _reject(self, malformed: Malformed, output: AgentOutput, cost: dict[str, Any], kind: str = "malformed") -> None:
        self._record(kind, "agent", self.turn, text=malformed.raw, detail=malformed.reason, **cost)
        if output.error is None:
            # The agent sees its output and why it failed; after a backend failure there is
            # nothing to show, and the request is simply made again.
            self.messages.append(self.format.assistant_message(output.text, output.tool_calls, None))
            self.messages.append(self.format.feedback_message(malformed))
        self.attempt += 1
        if self.attempt > self.config.malformed_retries:
            self._fail_turn(f"{self.attempt} malformed or truncated outputs in this turn")

    def _fail_turn(self, reason: str) -> None:
        apology = self.config.apology
        self._record("fallback", "agent", self.turn, text=apology, detail=reason)
        self.visible_texts.append((self.turn, apology))
        # The agent's history shows what the user heard, in the agent's own format.
        actions = (AgentAction.respond(apology),)
        text, tool_calls = self.format.render(actions)
        self.messages.append(self.format.assistant_message(text, tool_calls, actions))
        self._next_exchange(apology)

    def _next_exchange(self, shown: str) -> None:
        self.agent_text = shown
        if self.exchange + 1 >= self.config.max_exchanges:
            self._end(TURN_LIMIT, "runner", self.turn)
            return
        self.exchange += 1
        self.step = self.attempt = 0
        self.phase = WAITS_FOR_USER

    def stop(self) -> None:
        """End the episode from outside, as a limit (a rollout's token budget is spent)."""
        if self.phase == DONE:
            raise RuntimeError(f"episode {self.spec.episode_id!r} is already over")
        self._end(TURN_LIMIT, "runner", self.turn)

    # -- bookkeeping ---------------------------------------------------------------------

    def _end(self, ended_by: str, actor: str, turn: int, **cost: Any) -> None:
        self._record(END, actor, turn, detail=ended_by, **cost)
        self.ended_by = ended_by
        self.phase = DONE

    def _record(self, kind: str, actor: str, turn: int, **fields: Any) -> None:
        self.events.append(EpisodeEvent(self.spec.episode_id, len(self.events), turn, kind, actor, **fields))

    def finish(self) -> Episode:
        """The episode's record, graded by its world. Only for finished episodes."""
        if self.phase != DONE or self.ended_by is None:
            raise RuntimeError(f"episode {self.spec.episode_id!r} is not over (phase {self.phase!r})")
        if self.world is None:
            raise RuntimeError(f"episode {self.spec.episode_id!r} has no world to grade it (EpisodeState(world=...))")
        events = tuple(self.events)
        # Finished: the user or the agent (or its environment) ended it; a limit is not an end.
        finished = self.ended_by in (USER_END, AGENT_END)
        agent_events = [e for e in events if e.actor == "agent"]
        user_events = [e for e in events if e.actor == "user"]
        return Episode(
            episode_id=self.spec.episode_id,
            dialogue_id=self.spec.goal.dialogue_id,
            agent=self.agent_name,
            agent_format=self.format.name,
            simulator=self.simulator_name,
            seed=self.spec.seed,
            n_turns=sum(1 for e in events if e.is_utterance),
            ended_by=self.ended_by,
            result=self.world.grade(self.spec.goal, self.environment, self.visible_texts, finished,
                                    [(e.turn, e.text) for e in user_events if e.text]),
            goal_domains=self.spec.goal.domain_names,
            n_clarifications=sum(1 for e in agent_events if e.kind == CLARIFY),
            n_tool_calls=len(self.calls),
            n_tool_errors=sum(1 for _, call in self.calls if (call.observation or {}).get("error") is not None),
            n_malformed=sum(1 for e in agent_events if e.kind == "malformed"),
            n_agent_fallbacks=sum(1 for e in agent_events if e.kind == "fallback"),
            simulator_retries=sum(e.retries or 0 for e in user_events),
            simulator_fallbacks=sum(1 for e in user_events if e.kind == "fallback"),
            prompt_tokens=sum(e.prompt_tokens or 0 for e in events),
            completion_tokens=sum(e.completion_tokens or 0 for e in events),
            wall_seconds=perf_counter() - self.started,
            events=events,
        )


async def play(
    states: Sequence[EpisodeState], agent: Agent, clarifier: Any = None, clarify_budget: int | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> list[Episode]:
    """Play ``states`` to their end in rounds (see the module docstring); their records, in order.

    ``clarifier`` (:class:`pipelines.clarifier.Clarifier`): consulted, batched, after every
    agent output with a tool call that did not end the turn, until the episode has asked
    ``clarify_budget`` questions (None: no limit). ``progress(done, total)`` is called
    after every round, the last time with ``(total, total)``: ``done`` counts a finished
    episode as 1 and one still playing as the share of its ``max_exchanges`` turns it has had
    (batched episodes mostly end together: finished ones alone say nothing until the end)."""
    for state in states:
        if state.format.name != agent.format.name:
            raise ValueError(
                f"episode {state.spec.episode_id!r} was started for format {state.format.name!r}, "
                f"the agent writes {agent.format.name!r}"
            )
    reported = -1.0

    def report() -> None:
        nonlocal reported
        done = round(sum(1.0 if s.phase == DONE else min(1.0, s.exchange / s.config.max_exchanges) for s in states), 2)
        if progress is not None and done != reported:
            reported = done
            progress(int(done) if done == int(done) else done, len(states))

    while True:
        users = [s for s in states if s.phase == WAITS_FOR_USER]
        await asyncio.gather(*(s.hear_user() for s in users))
        waiting = [s for s in states if s.phase == WAITS_FOR_AGENT]
        if not waiting:
            break
        outputs = await agent.act([s.context() for s in waiting])
        if len(outputs) != len(waiting):
            raise RuntimeError(f"agent {agent.name!r} returned {len(outputs)} outputs for {len(waiting)} contexts")
        for state, output in zip(waiting, outputs):
            state.take(output)
        if clarifier is not None:
            due = [s for s in waiting if s.clarify_due and s.phase == WAITS_FOR_AGENT
                   and (clarify_budget is None or len(s.clarifier_questions) < clarify_budget)]
            if due:
                decisions = await clarifier.decide([s.clarify_context() for s in due])
                if len(decisions) != len(due):
                    raise RuntimeError(f"clarifier {clarifier.name!r} returned {len(decisions)} decisions for {len(due)} states")
                for state, decision in zip(due, decisions):
                    state.take_clarification(decision)
        report()
    report()
    return [s.finish() for s in states]


async def run_episodes(
    specs: Sequence[EpisodeSpec],
    agent: Agent,
    simulator: UserSimulator,
    world: World | Database,
    config: RunnerConfig = RunnerConfig(),
    clarifier: Any = None,
    clarify_budget: int | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> list[Episode]:
    """Play every spec with ``agent`` and ``simulator`` in ``world`` (a MultiWOZ
    :class:`Database` means :class:`~pipelines.env.world.MultiWozWorld`), stepped together,
    with an optional Clarifier and progress callback (:func:`play`); records in order."""
    counts = Counter(spec.episode_id for spec in specs)
    duplicates = sorted(i for i, n in counts.items() if n > 1)
    if duplicates:
        raise ValueError(f"episode ids must be unique; repeated: {', '.join(duplicates[:5])}")
    states = [EpisodeState.start(spec, agent, simulator, world, config) for spec in specs]
    return await play(states, agent, clarifier, clarify_budget, progress)


def run_episodes_sync(
    specs: Sequence[EpisodeSpec],
    agent: Agent,
    simulator: UserSimulator,
    world: World | Database,
    config: RunnerConfig = RunnerConfig(),
    clarifier: Any = None,
    clarify_budget: int | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> list[Episode]:
    """:func:`run_episodes` for synchronous callers (not from inside a running event loop)."""
    return asyncio.run(run_episodes(specs, agent, simulator, world, config, clarifier, clarify_budget, progress))
