"""The episode artifacts: Arrow schemas, expectation suites, records -> tables.

``episodes``: one row per episode with its outcome (ended_by, the goal checker's success,
inform and per-domain results) and its counts. ``episode_events``: one row per event, the
complete record of what happened (see :mod:`pipelines.episodes.records`).

Clock readings (an episode's ``wall_seconds``, an event's ``latency_s``) stay on the records
and out of the tables: the tables are DVC outputs, hashed, and must be the same bytes for
the same inputs on any machine; the stages write their wall times to ``reports/timings/``.
"""

from __future__ import annotations

from typing import Iterable

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, Reference, between, in_set
from pipelines.episodes.records import ACTORS, ENDED_BY, EVENT_KINDS, Episode

DOMAIN_RESULT = pa.struct([
    ("domain", pa.string()),
    ("offered", pa.string()),  # name / trainID of the offered entity; a taxi's reference
    ("inform", pa.bool_()),  # null: the goal has no info constraints in this domain
    ("book", pa.bool_()),  # null: nothing to book
    ("request", pa.bool_()),  # null: nothing requested
    ("success", pa.bool_()),
    ("reasons", pa.list_(pa.string())),
])

_COUNTS = (
    "n_clarifications", "n_tool_calls", "n_tool_errors", "n_malformed", "n_agent_fallbacks",
    "simulator_retries", "simulator_fallbacks",
)


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


EPISODES = ArtifactSpec(
    name="episodes",
    min_rows=1,
    description="One row per played episode: who played it, how it ended, the goal checker's verdict and its counts.",
    schema=pa.schema([
        _required("episode_id", pa.string()),
        _required("dialogue_id", pa.string()),
        _required("agent", pa.string()),
        _required("agent_format", pa.string()),
        _required("simulator", pa.string()),
        _required("seed", pa.int64()),
        _required("n_turns", pa.int32()),
        _required("ended_by", pa.string()),
        _required("success", pa.bool_()),
        _required("inform", pa.bool_()),
        _required("domain_results", pa.list_(DOMAIN_RESULT)),
        _required("goal_domains", pa.list_(pa.string())),
        *(_required(name, pa.int32()) for name in _COUNTS),
        _required("prompt_tokens", pa.int64()),
        _required("completion_tokens", pa.int64()),
    ]),
    keys=("episode_id",),
    expectations=(
        in_set("ended_by", ENDED_BY),
        between("n_turns", 0, None),
        *(between(name, 0, None) for name in (*_COUNTS, "prompt_tokens", "completion_tokens")),
    ),
)

EPISODE_EVENTS = ArtifactSpec(
    name="episode_events",
    min_rows=1,
    description="One row per event of an episode, in order: utterances, think, clarifications, tool calls, "
    "observations, malformed outputs, fallbacks, the end.",
    schema=pa.schema([
        _required("episode_id", pa.string()),
        _required("event_index", pa.int32()),
        _required("turn", pa.int32()),
        _required("kind", pa.string()),
        _required("actor", pa.string()),
        ("text", pa.string()),
        ("detail", pa.string()),  # malformed: why; observation: the tool error; user: the simulator fault; end: ended_by
        ("tool_name", pa.string()),
        ("arguments_json", pa.string()),
        ("observation_json", pa.string()),
        ("retries", pa.int32()),
        ("prompt_tokens", pa.int32()),
        ("completion_tokens", pa.int32()),
    ]),
    keys=("episode_id", "event_index"),
    expectations=(
        in_set("kind", EVENT_KINDS),
        in_set("actor", ACTORS),
        between("event_index", 0, None),
        between("turn", 0, None),
        between("retries", 0, None),
        between("prompt_tokens", 0, None),
        between("completion_tokens", 0, None),
    ),
    references=(Reference("episode_id", "episodes", "episode_id"),),
)

SPECS: dict[str, ArtifactSpec] = {s.name: s for s in (EPISODES, EPISODE_EVENTS)}


def episode_tables(episodes: Iterable[Episode]) -> dict[str, pa.Table]:
    """``{"episodes": ..., "episode_events": ...}`` of the given episodes."""
    e_rows: dict[str, list] = {name: [] for name in EPISODES.schema.names}
    v_rows: dict[str, list] = {name: [] for name in EPISODE_EVENTS.schema.names}
    for episode in episodes:
        for name in e_rows:
            if name == "domain_results":
                e_rows[name].append([result.as_dict() for result in episode.domain_results])
            elif name == "goal_domains":
                e_rows[name].append(list(episode.goal_domains))
            else:
                e_rows[name].append(getattr(episode, name))
        for event in episode.events:
            for name in v_rows:
                v_rows[name].append(getattr(event, name))
    return {
        "episodes": pa.Table.from_pydict(e_rows, schema=EPISODES.schema),
        "episode_events": pa.Table.from_pydict(v_rows, schema=EPISODE_EVENTS.schema),
    }
