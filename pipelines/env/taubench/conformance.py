"""Do askflow's tools do what τ-bench's own tools did? Checked against ``ground_truth_replay.json``.

For every task, its ground-truth calls are replayed, in order, on a fresh database; each
output must equal τ-bench's (JSON outputs compared as data, anything else as text) and the
records that differ from the initial database afterwards must be exactly τ-bench's
``changed_records``, as data.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from pipelines.env.taubench.data import TauDomain, TauTask
from pipelines.env.taubench.env import TauEnvironment
from pipelines.errors import DataError


def _as_data(text: str) -> Any:
    """A JSON object or list decoded; anything else (a user id, an error, a number from
    ``calculate``) stays text, so that "1200.0" and "1200" differ as they do in τ-bench."""
    if text[:1] in "{[":
        try:
            return json.loads(text)
        except json.JSONDecodeError:
            return text
    return text


def same_output(ours: str, theirs: str) -> bool:
    return _as_data(ours) == _as_data(theirs)


@dataclass
class ConformanceReport:
    domain: str
    tasks: int = 0
    tasks_conforming: int = 0
    calls: int = 0
    calls_matching: int = 0
    error_calls: int = 0  # ground-truth calls whose τ-bench output is an "Error: ..." string
    records: int = 0  # changed records τ-bench lists, summed over tasks
    records_matching: int = 0
    failures: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.tasks == self.tasks_conforming and not self.failures

    def as_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in ("domain", "tasks", "tasks_conforming", "calls", "calls_matching",
                                              "error_calls", "records", "records_matching")} | {"failures": self.failures[:20]}


def check_conformance(domain: TauDomain, replays: Sequence[Mapping[str, Any]], source: str = "ground_truth_replay.json") -> ConformanceReport:
    """Replay every record's calls and compare; the tasks must be loaded for every split named."""
    tasks: dict[tuple[str, int], TauTask] = {(t.split, t.index): t for t in domain.all_tasks()}
    report = ConformanceReport(domain.name)
    for n, record in enumerate(replays):
        where = f"replay {n}"
        if not isinstance(record, Mapping) or not isinstance(record.get("calls"), list):
            raise DataError(source, "a replay record must be an object with a 'calls' list", where, "calls")
        key = (record.get("split"), record.get("task_index"))
        task = tasks.get(key)
        if task is None:
            raise DataError(source, f"no loaded task {key[0]}/{key[1]}", where, "task_index")
        report.tasks += 1
        conforming = True
        # The replay must be the task's own actions, or it would test nothing about the task.
        if [(c.get("name"), c.get("kwargs")) for c in record["calls"]] != [(a.name, a.kwargs) for a in task.actions]:
            report.failures.append(f"{task.task_id}: the replay's calls are not the task's actions")
            conforming = False
        env = TauEnvironment(domain)
        for k, call in enumerate(record["calls"]):
            report.calls += 1
            theirs = call.get("output")
            if not isinstance(theirs, str):
                raise DataError(source, "a call's output must be a string", where, f"calls[{k}].output")
            if theirs.startswith("Error:"):
                report.error_calls += 1
            ours = env.call(call["name"], call.get("kwargs"))
            if same_output(ours, theirs):
                report.calls_matching += 1
            else:
                conforming = False
                report.failures.append(f"{task.task_id} call {k} {call['name']}: ours {ours[:200]!r} != theirs {theirs[:200]!r}")
        expected = record.get("changed_records") or {}
        actual = env.database.changed_records()
        for table, records in expected.items():
            for rkey, value in records.items():
                report.records += 1
                if actual.get(table, {}).get(rkey) == value:
                    report.records_matching += 1
                else:
                    conforming = False
                    report.failures.append(f"{task.task_id} record {table}/{rkey} differs")
        extra = [f"{t}/{k}" for t, rs in actual.items() for k in rs if k not in expected.get(t, {})]
        if extra:
            conforming = False
            report.failures.append(f"{task.task_id}: records changed that τ-bench leaves alone: {', '.join(extra[:5])}")
        report.tasks_conforming += conforming
    return report
