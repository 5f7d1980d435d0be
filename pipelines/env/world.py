"""Worlds: where episodes are played. A world builds each episode's tool environment from its
goal and grades the finished episode; the dialogue runner knows nothing else about a domain.

* :class:`MultiWozWorld`: the SpeakRL tools over a MultiWOZ-schema database, graded by the
  goal checker (MultiWOZ's Inform and Success). Goals are :class:`~pipelines.records.Goal`.
* :class:`TauBenchWorld`: τ-bench's retail or airline tools over the domain's database,
  graded by τ-bench's reward. Goals are :class:`~pipelines.env.taubench.TauTask`.

A goal of any world has ``dialogue_id`` and ``domain_names`` (what the episode tables record).
An environment answers ``call(name, arguments, turn=...)`` with an observation dict (with an
``"error"`` key when the call failed) and ``fork()``s cheaply. A world also says whether the
environment ended the episode (τ-bench's transfer to a human) and how many agent actions an
episode may take (τ-bench: 30; None: no limit beyond the runner's own).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Protocol

from pipelines.env.checker import DomainResult, GoalResult, check_goal
from pipelines.env.taubench.data import TauDomain, TauTask
from pipelines.env.taubench.database import TauDatabase
from pipelines.env.taubench.env import MAX_STEPS, TauEnvironment, TauReward, expected_database, is_error, tau_reward
from pipelines.env.tools import Database, ToolEnvironment


class EpisodeEnvironment(Protocol):
    def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, turn: int | None = None) -> dict[str, Any]: ...

    def fork(self) -> EpisodeEnvironment: ...


class World(Protocol):
    name: str
    max_actions: int | None  # agent actions (tool calls and visible replies) per episode

    def environment(self, goal: Any, seed: int) -> EpisodeEnvironment: ...

    def ended(self, environment: EpisodeEnvironment) -> bool: ...

    def grade(self, goal: Any, environment: EpisodeEnvironment, visible_texts: Iterable[tuple[int, str]], finished: bool,
              user_texts: Iterable[tuple[int, str]] = ()) -> GoalResult: ...


class MultiWozWorld:
    """The MultiWOZ world (what the runner always played before worlds existed)."""

    name = "multiwoz"
    max_actions = None

    def __init__(self, database: Database):
        self.database = database

    def environment(self, goal: Any, seed: int) -> ToolEnvironment:
        return ToolEnvironment(self.database, goal, seed)

    def ended(self, environment: EpisodeEnvironment) -> bool:
        return False

    def grade(self, goal: Any, environment: EpisodeEnvironment, visible_texts: Iterable[tuple[int, str]], finished: bool,
              user_texts: Iterable[tuple[int, str]] = ()) -> GoalResult:
        # MultiWOZ grades what was booked and said, however the dialogue ended; the user's
        # turns tell which yes/no answers answered a question of theirs.
        return check_goal(goal, environment.state, list(visible_texts), None, user_texts)


def as_world(world_or_database: World | Database) -> World:
    """A world; a bare :class:`Database` (the runner's argument before worlds) is MultiWOZ's."""
    return MultiWozWorld(world_or_database) if isinstance(world_or_database, Database) else world_or_database


def tau_observation(output: str) -> dict[str, Any]:
    """A τ-bench answer as an observation: ``{"error": text}`` for an ``Error: ...`` string,
    else ``{"output": value}`` with JSON answers decoded (so the agent reads them once
    encoded, not as JSON inside a JSON string).

    >>> tau_observation("Error: order not found"), tau_observation('{"a": 1}'), tau_observation("sara_doe_496")
    ({'error': 'Error: order not found'}, {'output': {'a': 1}}, {'output': 'sara_doe_496'})
    """
    if is_error(output):
        return {"error": output}
    if output[:1] in "{[":
        try:
            return {"output": json.loads(output)}
        except json.JSONDecodeError:
            pass
    return {"output": output}


class TauEpisodeEnvironment:
    """A :class:`TauEnvironment` behind the runner's observation-dict interface."""

    def __init__(self, tau: TauEnvironment):
        self.tau = tau

    def call(self, name: str, arguments: Mapping[str, Any] | None = None, *, turn: int | None = None) -> dict[str, Any]:
        return tau_observation(self.tau.call(name, arguments))

    def fork(self) -> TauEpisodeEnvironment:
        return TauEpisodeEnvironment(self.tau.fork())


@dataclass(frozen=True)
class TauGoalResult(GoalResult):
    """τ-bench's verdict in the checker's shape: one domain result whose ``book`` is "the
    database equals the ground truth's" and ``inform`` "every required output was said"
    (None: none required); success is τ-bench's reward, which also needs a finished episode."""

    reward: TauReward | None = None

    @property
    def success(self) -> bool:
        return self.reward is not None and self.reward.success


class TauBenchWorld:
    """One τ-bench domain (retail or airline)."""

    max_actions = MAX_STEPS

    def __init__(self, domain: TauDomain, max_actions: int | None = MAX_STEPS):
        self.domain = domain
        self.name = f"taubench_{domain.name}"
        self.max_actions = max_actions
        # task id -> the database after its ground truth: replayed once, read by every episode
        self._expected: dict[str, TauDatabase] = {}

    def environment(self, goal: Any, seed: int) -> TauEpisodeEnvironment:
        # τ-bench's tools are deterministic: the seed changes nothing here.
        return TauEpisodeEnvironment(TauEnvironment(self.domain))

    def ended(self, environment: EpisodeEnvironment) -> bool:
        return isinstance(environment, TauEpisodeEnvironment) and environment.tau.transferred

    def grade(self, goal: Any, environment: EpisodeEnvironment, visible_texts: Iterable[tuple[int, str]], finished: bool,
              user_texts: Iterable[tuple[int, str]] = ()) -> TauGoalResult:
        if not isinstance(goal, TauTask) or not isinstance(environment, TauEpisodeEnvironment):
            raise TypeError(f"the {self.name} world grades TauTask goals in its own environments, got {type(goal).__name__}")
        expected = self._expected.get(goal.task_id)
        if expected is None:
            expected = self._expected[goal.task_id] = expected_database(self.domain, goal)
        reward = tau_reward(environment.tau, goal, [text for _, text in visible_texts], finished, expected)
        result = DomainResult(
            domain=self.domain.name,
            offered=None,
            inform=reward.outputs_ok,
            book=reward.database_ok,
            request=None,
            reasons=reward.reasons(),
        )
        return TauGoalResult(goal.task_id, (result,), reward=reward)
