"""The τ-bench environment of one episode, and τ-bench's reward.

:class:`TauEnvironment` runs tool calls on the episode's :class:`TauDatabase` and keeps the
call log. Every answer is a string as τ-bench gives it; nothing raises out of a call: an
unknown tool, arguments of the wrong JSON type (checked against ``tools.json``), missing or
extra arguments and any failure inside a tool come back as ``"Error: ..."`` text, which is
what the agent sees. (τ-bench answers an unknown tool with "Unknown action <name>"; askflow
keeps its "Error:" prefix so that every failure reads the same.)

Reward (:func:`tau_reward`), as τ-bench computes it at the end of an episode: 1 iff the
database equals the database after replaying the task's ground-truth actions on a fresh copy
(``transfer_to_human_agents`` skipped) **and** every required output appears in some agent
reply (case-insensitive, commas removed from the reply); an unfinished episode scores 0. The
breakdown says which ground-truth actions the agent made with the same arguments and which
records differ from the expected database.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

from pipelines.env.taubench.data import TOOL_FUNCTIONS, TauAction, TauDomain, TauTask, is_type, json_type
from pipelines.env.taubench.database import TauDatabase, canonical_json

TERMINATE_TOOLS: tuple[str, ...] = ("transfer_to_human_agents",)
MAX_STEPS = 30  # τ-bench's max_num_steps: agent actions (tool calls and replies) per episode
ERROR_PREFIX = "Error:"


def is_error(output: str) -> bool:
    return output.startswith(ERROR_PREFIX)


@dataclass(frozen=True)
class TauCall:
    """One call as the environment saw it: the name and arguments given, and the answer."""

    name: str
    kwargs: Any
    output: str

    @property
    def error(self) -> str | None:
        return self.output if is_error(self.output) else None


def check_arguments(schema: Mapping[str, Any] | None, kwargs: Any) -> str | None:
    """Why the arguments do not fit the tool's JSON schema (types only: τ-bench's own checks,
    enums included, stay with the tools, which run them in τ-bench's order), or None."""
    if not isinstance(kwargs, Mapping):
        return f"Error: arguments must be an object, got {json_type(kwargs)}"
    if schema is None:
        return None
    properties = schema["function"]["parameters"].get("properties", {})
    for name, value in kwargs.items():
        spec = properties.get(name)
        if spec is None:
            continue  # the call itself reports an unexpected argument, as Python does in τ-bench
        problem = _type_problem(value, spec, name)
        if problem is not None:
            return f"Error: {problem}"
    return None


def _type_problem(value: Any, spec: Mapping[str, Any], path: str) -> str | None:
    expected = spec.get("type")
    if expected is None:
        return None
    if not is_type(value, expected):
        return f"argument {path!r} must be {expected}, got {json_type(value)}"
    if expected == "array" and isinstance(spec.get("items"), Mapping):
        for k, item in enumerate(value):
            problem = _type_problem(item, spec["items"], f"{path}[{k}]")
            if problem is not None:
                return problem
    if expected == "object":
        for key in spec.get("required", ()):
            if key not in value:
                return f"argument {path!r} lacks {key!r}"
        for key, sub in spec.get("properties", {}).items():
            if key in value:
                problem = _type_problem(value[key], sub, f"{path}.{key}")
                if problem is not None:
                    return problem
    return None


class TauEnvironment:
    """One episode's tools over its own database. :meth:`fork` copies the records touched so
    far and the call log, not the database."""

    def __init__(self, domain: TauDomain, database: TauDatabase | None = None, calls: Iterable[TauCall] = ()):
        self.domain = domain
        self.database = database if database is not None else TauDatabase(domain.base)
        self._calls: list[TauCall] = list(calls)
        self._tools = TOOL_FUNCTIONS[domain.name]

    @property
    def calls(self) -> tuple[TauCall, ...]:
        return tuple(self._calls)

    @property
    def transferred(self) -> bool:
        """Did the agent hand the user to a human (τ-bench ends the episode there)?"""
        return any(call.name in TERMINATE_TOOLS and call.error is None for call in self._calls)

    @property
    def error_count(self) -> int:
        return sum(1 for call in self._calls if call.error is not None)

    def fork(self) -> TauEnvironment:
        return TauEnvironment(self.domain, self.database.fork(), self._calls)

    def call(self, name: Any, kwargs: Any = None) -> str:
        """Run one tool call, record it, return its answer. Never raises."""
        kwargs = {} if kwargs is None else kwargs
        output = self._answer(name, kwargs)
        recorded = json.loads(json.dumps(kwargs, default=str)) if isinstance(kwargs, Mapping) else {}
        self._calls.append(TauCall(str(name), recorded, output))
        return output

    def _answer(self, name: Any, kwargs: Any) -> str:
        tool = self._tools.get(name) if isinstance(name, str) else None
        if tool is None:
            return f"Error: unknown tool {name!r} (tools: {', '.join(self._tools)})"
        problem = check_arguments(self.domain.schema(name), kwargs)
        if problem is not None:
            return problem
        try:
            output = tool(self.database, **kwargs)
        except Exception as e:  # noqa: BLE001 - τ-bench turns any failure of a tool into "Error: <e>"
            return f"Error: {e}"
        return output if isinstance(output, str) else json.dumps(output)


def replay(domain: TauDomain, actions: Sequence[TauAction], skip_terminal: bool = False) -> TauEnvironment:
    """A fresh environment after ``actions``, in order (τ-bench's reward skips the transfer)."""
    env = TauEnvironment(domain)
    for action in actions:
        if skip_terminal and action.name in TERMINATE_TOOLS:
            continue
        env.call(action.name, action.kwargs)
    return env


def output_found(output: str, replies: Iterable[str]) -> bool:
    """τ-bench's test: the output, lower-cased, inside a reply lower-cased without commas.

    >>> output_found("1,234.5", ["It comes to 1234.5 dollars"]), output_found("1234.5", ["It's 1,234.5"])
    (False, True)
    """
    wanted = output.lower()
    return any(wanted in reply.lower().replace(",", "") for reply in replies)


@dataclass(frozen=True)
class TauReward:
    """τ-bench's verdict on an episode, with the breakdown.

    ``database_ok``: the database equals the ground-truth database (τ-bench's ``r_actions``);
    ``outputs``: each required output and whether a reply carried it (``r_outputs`` is None
    when the task requires none); ``actions_matched``: per ground-truth action, whether the
    agent made that call with equal arguments; ``mismatched_records``: ``table/key`` of every
    record that differs from the expected database."""

    reward: float
    finished: bool
    database_ok: bool
    outputs: tuple[tuple[str, bool], ...]
    actions_matched: tuple[bool, ...]
    mismatched_records: tuple[str, ...]

    @property
    def outputs_ok(self) -> bool | None:
        return None if not self.outputs else all(found for _, found in self.outputs)

    @property
    def success(self) -> bool:
        return self.reward == 1.0

    @property
    def n_actions_matched(self) -> int:
        return sum(self.actions_matched)

    def reasons(self) -> tuple[str, ...]:
        reasons = []
        if not self.finished:
            reasons.append("the episode did not finish (no stop from the user, no transfer)")
        if not self.database_ok:
            reasons.append(f"database differs from the ground truth at {', '.join(self.mismatched_records[:5])}")
            reasons.append(f"{self.n_actions_matched} of {len(self.actions_matched)} ground-truth actions made with equal arguments")
        reasons.extend(f"required output {o!r} never said" for o, found in self.outputs if not found)
        return tuple(reasons)

    def as_dict(self) -> dict[str, Any]:
        return {
            "reward": self.reward,
            "finished": self.finished,
            "database_ok": self.database_ok,
            "outputs_ok": self.outputs_ok,
            "outputs": [{"output": o, "found": f} for o, f in self.outputs],
            "actions_matched": list(self.actions_matched),
            "mismatched_records": list(self.mismatched_records),
        }


def _same_call(action: TauAction, call: TauCall) -> bool:
    return call.name == action.name and canonical_json(call.kwargs) == canonical_json(action.kwargs)


def mismatched_records(database: TauDatabase, expected: TauDatabase) -> tuple[str, ...]:
    mine, theirs = database.changed_records(exact=True), expected.changed_records(exact=True)
    keys = {(t, k) for side in (mine, theirs) for t, records in side.items() for k in records}
    return tuple(
        f"{table}/{key}"
        for table, key in sorted(keys)
        if canonical_json(mine.get(table, {}).get(key)) != canonical_json(theirs.get(table, {}).get(key))
    )


def expected_database(domain: TauDomain, task: TauTask) -> TauDatabase:
    """The database after the task's ground-truth actions on a fresh copy (the transfer skipped)."""
    return replay(domain, task.actions, skip_terminal=True).database


def tau_reward(
    env: TauEnvironment, task: TauTask, replies: Sequence[str], finished: bool = True, expected: TauDatabase | None = None
) -> TauReward:
    """Score an episode's final environment and the agent's replies against ``task``;
    ``expected``: the task's :func:`expected_database`, when the caller keeps it."""
    expected = expected if expected is not None else expected_database(env.domain, task)
    database_ok = env.database.fingerprint() == expected.fingerprint()
    outputs = tuple((output, output_found(output, replies)) for output in task.outputs)
    matched = tuple(any(_same_call(action, call) for call in env.calls) for action in task.actions)
    ok = finished and database_ok and all(found for _, found in outputs)
    return TauReward(
        1.0 if ok else 0.0,
        finished,
        database_ok,
        outputs,
        matched,
        () if database_ok else mismatched_records(env.database, expected),
    )
