"""The ``josh`` stage for real: `dvc repro josh` in a temporary git repository (tables,
metrics, a second run that does nothing, `askflow sql` over the trees), and a run killed
mid-harvest that resumes from its checkpoints to the same tables."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from tests.test_dvc_pipeline import _run, pipeline_project, tiny_bootstrap

pytestmark = pytest.mark.slow

N_DIALOGUES = 60


def small_josh(params: dict, **josh: object) -> None:
    params["corpus"]["n_dialogues"] = N_DIALOGUES
    # rules: the template harvester, fast and deterministic (the default, hf, is the model M).
    # model_path stays: dvc.yaml declares it a dependency of stage josh whatever the backend, so
    # `dvc repro josh` builds it (a token bootstrap run here).
    tiny_bootstrap(params)
    params["josh"].update({"max_goals": 5, "beam": {"max_beam": 4, "branching_factor": 2, "max_turns": 6},
                           "agent": {"backend": "rules", "model_path": params["josh"]["agent"]["model_path"]},
                           "test": {"max_goals": 20, "seeds": [0]}, **josh})


def test_dvc_repro_josh_writes_tables_and_metrics_and_a_second_run_does_nothing(tmp_path):
    project = pipeline_project(tmp_path / "project", small_josh)
    first = _run([sys.executable, "-m", "dvc", "repro", "josh"], project)
    assert "Running stage 'josh'" in first.stdout
    out = project / "data" / "processed" / "josh"
    trees = pq.read_table(out / "josh_trees.parquet")
    metrics = json.loads((project / "reports" / "josh.json").read_text())
    assert metrics["goals"] == 5 and metrics["nodes"] == trees.num_rows
    assert set(trees.column("split").to_pylist()) == {"train"}  # test goals are never harvested
    assert metrics["golden_paths"] == len(set(pq.read_table(out / "josh_sft.parquet").column("dialogue_id").to_pylist()))
    kto = pq.read_table(out / "josh_kto.parquet")
    assert sum(kto.column("label").to_pylist()) == metrics["kto_rows"]["desirable"] > 0
    assert json.loads((project / "reports" / "timings" / "josh.json").read_text())["goals_harvested"] == 5
    evaluation = pq.read_table(out / "josh_eval.parquet").to_pylist()
    assert len(evaluation) == metrics["test"]["episodes"] > 0
    assert metrics["test"]["avg_reward"] == sum(r["reward"] for r in evaluation) / len(evaluation)

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    second = _run([sys.executable, "-m", "dvc", "repro", "josh"], project)
    assert "Running stage" not in second.stdout, second.stdout
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.parquet")} == mtimes

    sql = _run([sys.executable, "-m", "stages.cli", "sql", "--format", "json",
                "select count(*) as n from josh_trees where label = 'root'"], project)
    assert json.loads(sql.stdout) == [{"n": 5}]


def _stage(project: Path, params: str = "params.yaml") -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(project)}
    return subprocess.Popen([sys.executable, "-m", "stages.josh", "--params", params], cwd=project, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_a_killed_harvest_resumes_to_the_same_tables(tmp_path):
    n_goals = 20
    project = pipeline_project(tmp_path / "project", lambda p: small_josh(p, max_goals=n_goals, concurrency=1))
    _run([sys.executable, "-m", "dvc", "repro", "corpus"], project)
    params = yaml.safe_load((project / "params.yaml").read_text())
    # An uninterrupted reference run with its own checkpoints and outputs.
    params["josh"].update(work_dir="data/cache/josh_reference", output="data/reference", metrics="reports/josh_reference.json")
    (project / "reference.yaml").write_text(yaml.safe_dump(params))
    reference = _stage(project, "reference.yaml")
    assert reference.wait(timeout=600) == 0, reference.communicate()

    # Killed (SIGKILL: no cleanup) once some trees are checkpointed, then run again.
    proc = _stage(project)
    checkpoints = project / "data" / "cache" / "josh"
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline and len(list(checkpoints.glob("*/*.json"))) < 3:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    saved = len(list(checkpoints.glob("*/*.json")))
    assert 3 <= saved < n_goals, "the run ended before it could be killed mid-harvest"
    assert not (project / "data" / "processed" / "josh" / "josh_trees.parquet").exists()

    resumed = _stage(project)
    stdout, stderr = resumed.communicate(timeout=600)
    assert resumed.returncode == 0, stderr
    assert f"{saved} already harvested" in stdout
    for name in ("josh_trees", "josh_sft", "josh_kto", "josh_eval"):
        assert pq.read_table(project / "data" / "processed" / "josh" / f"{name}.parquet").equals(
            pq.read_table(project / "data" / "reference" / f"{name}.parquet")), name
    metrics = json.loads((project / "reports" / "josh.json").read_text())
    assert metrics == json.loads((project / "reports" / "josh_reference.json").read_text()) and metrics["goals"] == n_goals
