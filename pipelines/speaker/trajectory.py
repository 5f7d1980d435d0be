"""Synthesized dialogues as the agent sees them, and their replay.

A :class:`Trajectory` is a goal plus the chat an agent would have had: user utterances,
the agent's outputs written in SpeakRL's token format (``<think>`` then ``<clarify>``, a
``<tool_call>`` or a plain response, ``<end>`` last), and tool results as
``<tool_response>`` user messages, exactly as the episode runner builds an agent's history
(:class:`~pipelines.episodes.formats.SpeakRLFormat`). Each turn also records its *kind*
and, for an agent output at an ambiguity point, the point as it stood at that moment.

:class:`TrajectoryBuilder` writes a trajectory while running its tool calls in a
:class:`~pipelines.env.tools.ToolEnvironment`, so observations and booking references are
real. :func:`replay_trajectory` checks one from scratch, the way the runner would have
played it: every agent output must parse with the runner's parser; its tool calls run in
a fresh environment (same database, goal and seed), whose observations must equal the
recorded ones; the visible outputs (clarifications and responses) are what the goal
checker grades, numbered as the runner numbers turns.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipelines.env.checker import GoalResult, check_goal
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.episodes.formats import CLARIFY, END, RESPOND, TOOL_CALL, AgentAction, Malformed, SpeakRLFormat
from pipelines.records import Goal
from pipelines.speaker.ambiguity import AmbiguityPoint

USER, OBSERVATION = "user", "observation"
# Turn kinds: a user utterance, a tool result, or what an agent output does. ``end``: a
# response that ends the conversation.
TURN_KINDS: tuple[str, ...] = (USER, OBSERVATION, CLARIFY, TOOL_CALL, RESPOND, END)
AGENT_KINDS: tuple[str, ...] = (CLARIFY, TOOL_CALL, RESPOND, END)
ROLES: tuple[str, ...] = ("user", "assistant")

FORMAT = SpeakRLFormat()


@dataclass(frozen=True)
class ChatTurn:
    """One message. ``point``: the ambiguity point this agent output clarifies, or (in a
    negative trajectory) acts on without clarifying. ``needless``: a question the goal does
    not need (the user has no preference there): the dialogue shows it and what follows (the
    user's "I don't mind", the agent's recommendation), but it is never a training target.
    ``slot_filling``: a question for something the action needs that the user has not said
    yet (a taxi's pickup, destination or time): needed, and taught, but not an ambiguity
    (SpeakRL's taxonomy leaves slot filling out), so not one of the :attr:`Trajectory.clarifications`.
    ``shown``: a recommendation made before the user had said enough, which the user then
    corrects, a search that left out what the user had said and the recommendation from it,
    or a venue the user named looked up first among another kind of place that has nothing by
    that name: in the prompts that follow (the agent must recover from it), never a target."""

    role: str
    content: str
    kind: str
    point: AmbiguityPoint | None = None
    needless: bool = False
    slot_filling: bool = False
    shown: bool = False

    def __post_init__(self) -> None:
        if self.role not in ROLES:
            raise ValueError(f"unknown role {self.role!r}")
        if self.kind not in TURN_KINDS:
            raise ValueError(f"unknown turn kind {self.kind!r}")
        if (self.role == "assistant") != (self.kind in AGENT_KINDS):
            raise ValueError(f"a {self.role} turn cannot be of kind {self.kind!r}")
        if self.needless and (self.kind != CLARIFY or self.point is not None):
            raise ValueError("only a question at no ambiguity point can be needless")
        if self.slot_filling and (self.kind != CLARIFY or self.point is not None or self.needless):
            raise ValueError("only a needed question at no ambiguity point can be slot filling")
        if self.shown and (self.kind not in (RESPOND, TOOL_CALL) or self.point is not None):
            raise ValueError("only a response or a search at no ambiguity point can be shown and not taught")

    @property
    def message(self) -> dict[str, str]:
        return {"role": self.role, "content": self.content}

    @property
    def call(self) -> AgentAction | None:
        """The tool call of a tool-call turn; None for any other turn or an unparsable one."""
        if self.kind != TOOL_CALL:
            return None
        parsed = FORMAT.parse(self.content)
        return None if isinstance(parsed, Malformed) else next((a for a in parsed if a.kind == TOOL_CALL), None)


@dataclass(frozen=True)
class Trajectory:
    """A synthesized dialogue. ``env_seed`` seeds its tool environment (booking references);
    ``guessed`` is set on a negative: the point at which the agent acted on a guess."""

    dialogue_id: str
    goal: Goal
    env_seed: int
    turns: tuple[ChatTurn, ...]
    guessed: AmbiguityPoint | None = None

    def messages(self, end: int | None = None) -> list[dict[str, str]]:
        """The chat (without the system prompt) up to turn ``end`` (exclusive)."""
        return [t.message for t in self.turns[:end]]

    @property
    def clarifications(self) -> list[tuple[int, ChatTurn]]:
        """The clarifications the goal needs (needless questions left out: :attr:`needless_questions`;
        slot filling too: :attr:`slot_questions`)."""
        return [(i, t) for i, t in enumerate(self.turns) if t.kind == CLARIFY and not t.needless and not t.slot_filling]

    @property
    def slot_questions(self) -> list[tuple[int, ChatTurn]]:
        return [(i, t) for i, t in enumerate(self.turns) if t.slot_filling]

    @property
    def shown_outputs(self) -> list[tuple[int, ChatTurn]]:
        return [(i, t) for i, t in enumerate(self.turns) if t.shown]

    @property
    def needless_questions(self) -> list[tuple[int, ChatTurn]]:
        return [(i, t) for i, t in enumerate(self.turns) if t.needless]

    def decision(self, point: AmbiguityPoint) -> int | None:
        """Index of the first agent output at ``point`` (its key), or None."""
        return next((i for i, t in enumerate(self.turns) if t.point is not None and t.point.key == point.key), None)

    def turns_json(self) -> str:
        return json.dumps(
            [{"role": t.role, "kind": t.kind, "content": t.content, **({"point": t.point.as_dict()} if t.point else {}),
              **({"needless": True} if t.needless else {}), **({"slot_filling": True} if t.slot_filling else {}),
              **({"shown": True} if t.shown else {})}
             for t in self.turns],
            ensure_ascii=False,
        )


class TrajectoryBuilder:
    """Appends turns to a trajectory, running tool calls in its environment as they come."""

    def __init__(self, dialogue_id: str, goal: Goal, database: Database, env_seed: int):
        self.dialogue_id = dialogue_id
        self.goal = goal
        self.env_seed = env_seed
        self.environment = ToolEnvironment(database, goal, env_seed)
        self.turns: list[ChatTurn] = []

    def user(self, text: str) -> None:
        self.turns.append(ChatTurn("user", text, USER))

    def agent(self, think: str | None, *, clarify: str | None = None, respond: str | None = None, end: bool = False,
              point: AmbiguityPoint | None = None, needless: bool = False, slot_filling: bool = False,
              shown: bool = False) -> None:
        """A visible agent output: a clarification, or a response (``end``: the last one);
        ``needless``: a question the goal does not need; ``slot_filling``: a question for what
        the action needs; ``shown``: a premature recommendation, never taught (:class:`ChatTurn`)."""
        actions = [AgentAction.think(think)] if think else []
        if clarify is not None:
            actions.append(AgentAction.clarify(clarify))
            kind = CLARIFY
        else:
            actions.append(AgentAction.respond(respond or ""))
            kind = RESPOND
            if end:
                actions.append(AgentAction.end())
                kind = END
        text, _ = FORMAT.render(actions)
        self.turns.append(ChatTurn("assistant", text, kind, point, needless, slot_filling, shown))

    def call(self, think: str | None, name: str, arguments: Mapping[str, Any], point: AmbiguityPoint | None = None,
             shown: bool = False) -> dict[str, Any]:
        """A tool call: the agent output, then its observation. Returns the observation.
        ``shown``: a mistaken search, never taught (:class:`ChatTurn`)."""
        action = AgentAction.tool_call(name, arguments)
        text, _ = FORMAT.render(([AgentAction.think(think)] if think else []) + [action])
        self.turns.append(ChatTurn("assistant", text, TOOL_CALL, point, shown=shown))
        observation = self.environment.call(name, dict(arguments))
        self.turns.append(ChatTurn("user", FORMAT.observation_message(action, observation)["content"], OBSERVATION))
        return observation

    def raw_agent(self, content: str, kind: str, point: AmbiguityPoint | None = None, needless: bool = False,
                  slot_filling: bool = False, shown: bool = False) -> None:
        """An agent output already written (by an LLM); its tool call, if any, is run."""
        self.turns.append(ChatTurn("assistant", content, kind, point, needless, slot_filling, shown))
        if kind == TOOL_CALL:
            parsed = FORMAT.parse(content)
            assert not isinstance(parsed, Malformed), "raw_agent takes outputs that were rendered by the format"
            call = next(a for a in parsed if a.kind == TOOL_CALL)
            observation = self.environment.call(call.tool_name, dict(call.arguments or {}))
            self.turns.append(ChatTurn("user", FORMAT.observation_message(call, observation)["content"], OBSERVATION))

    def build(self, guessed: AmbiguityPoint | None = None) -> Trajectory:
        return Trajectory(self.dialogue_id, self.goal, self.env_seed, tuple(self.turns), guessed)


# --------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReplayOutcome:
    """``problem``: why the trajectory could not be played as written (a malformed output,
    an observation that differs, a misplaced turn); None when it played. ``result``: the
    goal checker's verdict when it played."""

    problem: str | None
    result: GoalResult | None = None
    n_tool_calls: int = 0

    @property
    def success(self) -> bool:
        return self.problem is None and self.result is not None and self.result.success

    @property
    def failure_reasons(self) -> tuple[str, ...]:
        if self.problem is not None:
            return (self.problem,)
        return self.result.reasons if self.result is not None else ()


def replay_trajectory(trajectory: Trajectory, database: Database) -> ReplayOutcome:
    """Play ``trajectory`` as the runner would (module docstring) and grade it."""
    environment = ToolEnvironment(database, trajectory.goal, trajectory.env_seed)
    visible: list[tuple[int, str]] = []
    exchange = 0
    expected_observation: str | None = None
    ended = False
    turns = trajectory.turns
    for index, turn in enumerate(turns):
        where = f"turn {index}"
        if ended:
            return ReplayOutcome(f"{where}: the conversation continues after <end>")
        if expected_observation is not None:
            if turn.kind != OBSERVATION:
                return ReplayOutcome(f"{where}: a tool call must be followed by its observation")
            if turn.content != expected_observation:
                return ReplayOutcome(f"{where}: the recorded observation differs from the environment's")
            expected_observation = None
            continue
        if turn.kind == OBSERVATION:
            return ReplayOutcome(f"{where}: an observation without a tool call")
        if turn.role == "user":
            continue
        parsed = FORMAT.parse(turn.content)
        if isinstance(parsed, Malformed):
            return ReplayOutcome(f"{where}: malformed agent output ({parsed.reason})")
        agent_turn = 2 * exchange + 1
        for action in parsed:
            if action.kind == TOOL_CALL:
                observation = environment.call(action.tool_name, dict(action.arguments or {}), turn=agent_turn)
                expected_observation = FORMAT.observation_message(action, observation)["content"]
            elif action.visible:
                visible.append((agent_turn, action.text))
        kinds = {a.kind for a in parsed}
        if END in kinds:
            ended = True
        elif kinds & {CLARIFY, RESPOND}:
            exchange += 1
    if expected_observation is not None:
        return ReplayOutcome("the trajectory ends with an unanswered tool call")
    if not ended:
        return ReplayOutcome("the agent never ends the conversation")
    result = check_goal(trajectory.goal, environment.state, visible)
    return ReplayOutcome(None, result, len(environment.state.calls))


def goal_json(goal: Goal) -> str:
    """A goal as JSON: {domain: {info, and whichever of fail_info, book, fail_book, reqt it has}}."""
    out: dict[str, Any] = {}
    for domain_goal in goal.domains:
        entry: dict[str, Any] = {"info": dict(domain_goal.info)}
        for name in ("fail_info", "book", "fail_book"):
            if getattr(domain_goal, name):
                entry[name] = dict(getattr(domain_goal, name))
        if domain_goal.reqt:
            entry["reqt"] = list(domain_goal.reqt)
        out[domain_goal.domain] = entry
    return json.dumps(out, ensure_ascii=False)


def system_message(task: str | None = None) -> dict[str, str]:
    """The system prompt an agent in the SpeakRL format gets (tools and output format)."""
    return {"role": "system", "content": FORMAT.system_prompt(task) if task else FORMAT.system_prompt()}


def visible_conversation(turns: Sequence[ChatTurn]) -> list[dict[str, str]]:
    """The dialogue as a reader follows it: user utterances, the agent's visible outputs,
    and each tool call with a short summary of its result (role ``tool``). Reasoning is left
    out. This is the conversation that Table 1's prompt substitutes."""
    out: list[dict[str, str]] = []
    pending: AgentAction | None = None
    for turn in turns:
        if turn.kind == USER:
            out.append({"role": "user", "content": turn.content})
            continue
        if turn.kind == OBSERVATION:
            if pending is not None:
                out.append({"role": "tool", "content": tool_summary(pending, turn.content)})
            pending = None
            continue
        parsed = FORMAT.parse(turn.content)
        if isinstance(parsed, Malformed):
            continue
        for action in parsed:
            if action.kind == TOOL_CALL:
                pending = action
            elif action.visible:
                out.append({"role": "assistant", "content": action.text})
    return out


def tool_summary(call: AgentAction, observation_content: str) -> str:
    """``query_hotel {"area": "north"} -> 7 results: a, b, c, d, e`` style one-liners: the
    facts an agent acts on, short enough for a training prompt."""
    body = observation_content.removeprefix("<tool_response>").removesuffix("</tool_response>").strip()
    try:
        observation = json.loads(body)
    except json.JSONDecodeError:
        observation = {}
    head = f"{call.tool_name} {call.arguments_json}"
    if "error" in observation:
        return f"{head} -> error: {observation['error']}"
    if "results" in observation:
        names = [r.get("trainID") and f"{r['trainID']} ({r.get('leaveAt')}-{r.get('arriveBy')})" or r.get("name", "?") for r in observation["results"]]
        return f"{head} -> {observation.get('count', len(names))} results" + (f": {', '.join(names)}" if names else "")
    details = ", ".join(f"{k} {v}" for k, v in observation.items())
    return f"{head} -> {details}"
