"""Issue 29: the committed classification of every real val dialogue's gold replay
(``reports/gold_replay_causes.jsonl``, written by ``benchmarks/gold_replay_causes.py --out``)
is what the code gives now, its counts per cause are pinned, and every verdict carries its
evidence; the standard grading mode on small hand-made cases."""

from __future__ import annotations

import json

import pytest

from catalog.io import read_params
from pipelines.episodes.causes import CAUSES
from tests.conftest import REAL_DB, REAL_VAL_DIR, REPO

COMMITTED = REPO / "reports" / "gold_replay_causes.jsonl"
# Failing dialogues per cause on the 999 vendored val dialogues (params.yaml gold_replay's
# simulator settings). A change here is a change of the checker, the causes or the replay:
# regenerate the report (module docstring of benchmarks/gold_replay_causes.py) and say why.
PINNED = {
    "simulator_ended_early": 1,
    "db_mismatch": 1,
    "annotation_error": 3,
    "human_failure": 111,
}


@pytest.fixture(scope="module")
def rows():
    from tests.benchmark_support import load_benchmark

    module = load_benchmark("gold_replay_causes")
    settings = read_params("gold_replay", REPO / "params.yaml")
    rows = module.verdicts(REAL_VAL_DIR, REAL_DB, settings["simulator"], int(settings.get("max_exchanges", 20)))
    return rows, module.cause_counts(rows)


def test_counts_per_cause_are_pinned(rows):
    rows, counts = rows
    assert len(rows) == 999
    assert counts == PINNED
    assert set(counts) <= set(CAUSES)
    # Acceptance of issue 29: failures that are not the human dialogues' at most 5 (0.5 %).
    assert sum(counts.values()) - counts.get("human_failure", 0) <= 5


def test_the_committed_report_is_what_the_code_gives(rows):
    rows, _ = rows
    committed = [json.loads(line) for line in COMMITTED.read_text(encoding="utf-8").splitlines()]
    assert [(r["dialogue_id"], r["cause"], r["strict"], r["standard"]) for r in committed] == \
           [(r["dialogue_id"], r["cause"], r["strict"], r["standard"]) for r in rows]
    assert committed == json.loads(json.dumps(rows))


def test_every_verdict_carries_its_evidence(rows):
    rows, _ = rows
    for row in rows:
        if row["cause"] is None:
            assert row["strict"]["success"] and not row["evidence"]
            continue
        assert row["evidence"], row["dialogue_id"]
        for item in row["evidence"]:
            assert item["missing"] or item["turn"] is not None, (row["dialogue_id"], item)
            assert item["turn"] is None or isinstance(item["text"], str)
        if row["cause"] == "human_failure":
            settling = [e for e in row["evidence"] if e["cause"] == "human_failure"]
            assert settling and all(e["missing"] or e["turn"] is not None for e in settling), row["dialogue_id"]


def test_standard_mode_is_near_the_evaluators_human_reference_figures(rows):
    """The standard evaluator gives the human references Inform 93.7, Success 90.9 on the
    test set; askflow's standard mode on the val dialogues replayed is measured here (not
    fitted to it): inform within 2 points, success reported as it is."""
    rows, _ = rows
    inform = sum(r["standard"]["inform"] for r in rows) / len(rows)
    success = sum(r["standard"]["success"] for r in rows) / len(rows)
    assert abs(inform - 0.937) <= 0.02, inform
    assert success <= inform
    assert sum(r["strict"]["success"] for r in rows) / len(rows) < success  # strict asks for more
