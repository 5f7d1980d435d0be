"""A stage killed with SIGKILL mid-flow: the next run stops the temporary Prefect server it
left and marks its RUNNING flow run Crashed (issue 19, item 7). Real processes, a real
Prefect server and database."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import REPO

pytestmark = pytest.mark.slow

# A stage in miniature: the same entry into Prefect as stages/train.py, and a flow that
# runs until it is killed.
KILLED = """
import os, sys, time
from pathlib import Path
from flows.local_api import local_prefect_api
from prefect import flow

@flow(name="killed-stage")
def long_flow(marker: str) -> None:
    Path(marker).write_text("running")
    time.sleep(600)

with local_prefect_api(os.environ["PREFECT_HOME"]):
    long_flow(sys.argv[1])
"""

# The next run: it cleans up on entry, then reports what the database says.
NEXT = """
import json, os
from flows.local_api import local_prefect_api
from prefect.client.orchestration import get_client
from prefect.client.schemas.filters import FlowRunFilter, FlowFilter, FlowFilterName
from prefect.utilities.asyncutils import run_coro_as_sync

async def states():
    async with get_client() as client:
        runs = await client.read_flow_runs(flow_filter=FlowFilter(name=FlowFilterName(any_=["killed-stage"])))
        return [(r.state.type.value, r.state.name, r.tags) for r in runs]

with local_prefect_api(os.environ["PREFECT_HOME"]):
    print("STATES " + json.dumps(run_coro_as_sync(states())))
"""


def _env(home: Path) -> dict[str, str]:
    env = {**os.environ, "PREFECT_HOME": str(home), "PYTHONPATH": str(REPO), "PREFECT_SERVER_ANALYTICS_ENABLED": "false"}
    env.pop("PREFECT_API_URL", None)
    return env


def _alive(pid: int) -> bool:
    from pipelines.files import process_alive

    return process_alive(pid)


def _wait_for_flow(killed: subprocess.Popen, marker: Path, timeout_s: float = 240) -> None:
    """Until the stage in miniature's flow runs (it writes ``marker``); fails if it exits first."""
    deadline = time.monotonic() + timeout_s
    while not marker.exists():
        assert killed.poll() is None, killed.stdout.read().decode(errors="replace")[-3000:]
        assert time.monotonic() < deadline, "the flow did not start"
        time.sleep(0.5)


def test_next_run_stops_the_killed_runs_server_and_crashes_its_flow_run(tmp_path):
    home, marker = tmp_path / ".prefect", tmp_path / "running"
    killed = subprocess.Popen([sys.executable, "-c", KILLED, str(marker)], env=_env(home), cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    server_pid = None
    try:
        _wait_for_flow(killed, marker)
        (record_path,) = (home / "askflow-runs").glob("*.json")
        record = json.loads(record_path.read_text())
        assert record["pid"] == killed.pid
        server_pid = record["server_pid"]

        killed.send_signal(signal.SIGKILL)
        killed.wait(30)
        time.sleep(1)
        # What the issue saw: the server outlives its stage.
        assert _alive(server_pid), "expected the killed run's server to be left running"

        proc = subprocess.run([sys.executable, "-c", NEXT], env=_env(home), cwd=tmp_path, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
        assert not _alive(server_pid), "the next run must stop the leftover server"
        states = json.loads(proc.stdout.split("STATES ", 1)[1].splitlines()[0])
        assert [(t, name) for t, name, _ in states] == [("CRASHED", "Crashed")], states
        assert any(tag.startswith(f"askflow-owner:{killed.pid}-") for tag in states[0][2])
        assert not list((home / "askflow-runs").glob("*.json")), "records of finished runs are removed"
    finally:
        if killed.poll() is None:
            killed.kill()
        if server_pid and _alive(server_pid):
            os.kill(server_pid, signal.SIGKILL)  # this test's own leftover, if it failed


def test_a_record_of_a_live_run_is_left_alone(tmp_path):
    from flows.local_api import process_start, stale_records

    records = tmp_path / "askflow-runs"
    records.mkdir()
    (records / "live.json").write_text(json.dumps({"pid": os.getpid(), "start": process_start(os.getpid())}))
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (records / "dead.json").write_text(json.dumps({"pid": dead.pid, "start": 1}))
    # A live pid with another start time is a reused pid: its record is stale too.
    (records / "reused.json").write_text(json.dumps({"pid": os.getpid(), "start": -5}))
    (records / "torn.json").write_text('{"pid": ')
    assert sorted(p.name for p, _ in stale_records(tmp_path)) == ["dead.json", "reused.json", "torn.json"]


def test_a_training_stage_cleans_up_after_a_killed_one_and_leaves_nothing_behind(tiny_model_dir, tiny_data_dir, tmp_path):
    """`python -m stages.train sft` (its own temporary API, no PREFECT_API_URL) in a project
    where a killed run left a half-saved model and the previous model mid-swap."""
    import sqlite3
    import tempfile

    import yaml

    from pipelines.files import staging_path

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()

    def leftover(target: Path, suffix: str) -> Path:
        return target.with_name(staging_path(target, suffix).name.replace(f"-{os.getpid()}-", f"-{dead.pid}-"))

    models = tmp_path / "models"
    models.mkdir()
    previous = leftover(models / "sft", ".old")  # killed between the two renames of a swap
    previous.mkdir()
    (previous / "README.md").write_text("previous model")
    half = leftover(models / "sft", ".tmp")  # killed while saving
    half.mkdir()
    scratch = leftover(Path(tempfile.gettempdir()) / "askflow-train-sft", ".tmp")  # the trainer's
    scratch.mkdir()

    train = {"holdout": {"fraction": 0.2}, "sft": {
        "model": {"path": str(tiny_model_dir)},
        "data": {"sources": [{"path": str(tiny_data_dir / "speaker_sft.parquet")}], "compact_prompts": False,
                 "max_history_messages": 2},
        "optim": {"max_steps": 1, "batch_size": 4, "max_length": 320}, "eval": {"max_examples": 2, "max_new_tokens": 4},
    }}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"train": train}))
    env = {**_env(tmp_path / ".prefect"), "OMP_NUM_THREADS": "1"}
    proc = subprocess.run([sys.executable, "-m", "stages.train", "sft"], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sorted(p.name for p in models.iterdir()) == ["sft"]  # restored, then replaced by the new model
    assert (models / "sft" / "model.safetensors").exists()
    assert not scratch.exists()
    assert not list((tmp_path / ".prefect" / "askflow-runs").glob("*.json"))
    with sqlite3.connect(tmp_path / ".prefect" / "prefect.db") as db:
        assert db.execute("select state_type from flow_run").fetchall() == [("COMPLETED",)]


def test_with_make_runs_shared_server_a_killed_stage_is_crashed_by_the_next_and_the_server_goes_on(tmp_path, monkeypatch):
    """make run starts one Prefect server for every stage (flows.local_api.shared_prefect_api);
    a stage killed on it leaves a record without a server; the next stage marks its flow run
    Crashed on the same server, which keeps serving."""
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.local_api import shared_prefect_api

    home, marker = tmp_path / ".prefect", tmp_path / "running"
    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    monkeypatch.setenv("PREFECT_HOME", str(home))
    # as in make run's own process: no API configured (the session's test harness sets one)
    with temporary_settings(restore_defaults={PREFECT_API_URL}), shared_prefect_api(home) as shared:
        assert set(shared) == {"PREFECT_HOME", "PREFECT_API_URL", "ASKFLOW_SHARED_PREFECT_API"}
        (own,) = (home / "askflow-runs").glob("*.json")  # make run's own record, with its server
        server_pid = json.loads(own.read_text())["server_pid"]
        env = {**_env(home), **shared}
        killed = subprocess.Popen([sys.executable, "-c", KILLED, str(marker)], env=env, cwd=tmp_path,
                                  stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
        try:
            _wait_for_flow(killed, marker)
            record = json.loads((home / "askflow-runs" / f"{killed.pid}.json").read_text())
            assert record["server_pid"] is None  # the stage started no server of its own
            killed.send_signal(signal.SIGKILL)
            killed.wait(30)
            proc = subprocess.run([sys.executable, "-c", NEXT], env=env, cwd=tmp_path, capture_output=True, text=True, timeout=300)
            assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-3000:]
            states = json.loads(proc.stdout.split("STATES ", 1)[1].splitlines()[0])
            assert [(t, name) for t, name, _ in states] == [("CRASHED", "Crashed")], states
            assert any(tag.startswith(f"askflow-owner:{killed.pid}-") for tag in states[0][2])
            assert [p.name for p in (home / "askflow-runs").glob("*.json")] == [own.name]
            assert _alive(server_pid), "make run's server serves the next stages"
        finally:
            if killed.poll() is None:
                killed.kill()
    assert not _alive(server_pid) and not list((home / "askflow-runs").glob("*.json"))


def test_a_stages_own_server_leaves_another_server_of_the_process_running(prefect_api, tmp_path):
    """Prefect keeps one SubprocessASGIServer object per port, "none given" included: a stage's
    temporary API used to be that object when the process already had one (the test harness's),
    and stopping it stopped the other server too (every later flow run: connection refused)."""
    import httpx
    from prefect.settings import PREFECT_API_URL, temporary_settings

    from flows.local_api import local_prefect_api

    harness = PREFECT_API_URL.value()
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        with local_prefect_api(tmp_path / "home") as url:
            assert url and url != harness
    assert httpx.get(f"{harness}/health", timeout=10).status_code == 200
