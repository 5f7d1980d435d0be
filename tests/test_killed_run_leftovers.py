"""Issue 28 item 8: a killed training stage's Prefect server and its staging directory in the
temporary directory are cleaned up by the next run of any stage and at `make run` start
(``python -m stages.run``), not only by the next training run. Real processes: a stand-in
server whose command line is a Prefect API server's, a dead owner, real stage subprocesses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from flows.local_api import RECORDS, SERVER_MODULE
from pipelines.files import process_start, staging_path
from tests.conftest import REPO


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _leftovers(tmp_path: Path) -> tuple[subprocess.Popen, Path, Path, dict[str, str]]:
    """A Prefect 'server' whose owner is dead, its run record, and a killed trainer's staging
    directory under a private TMPDIR; returns them and the environment the next run gets."""
    home, tmp = tmp_path / "prefect", tmp_path / "tmp"
    (home / RECORDS).mkdir(parents=True)
    tmp.mkdir()
    server = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", SERVER_MODULE])
    owner = _dead_pid()
    (home / RECORDS / f"{owner}.json").write_text(json.dumps(
        {"pid": owner, "start": None, "server_pid": server.pid, "server_start": process_start(server.pid), "port": 1}))
    target = tmp / "askflow-train-sft"
    staging = staging_path(target).with_name(staging_path(target).name.replace(f"-{os.getpid()}-", f"-{owner}-"))
    (staging / "checkpoint-1").mkdir(parents=True)
    (staging / "checkpoint-1" / "optimizer.pt").write_bytes(b"x" * 1024)
    live = staging_path(tmp / "askflow-train-grpo")  # this process's: a run still going, kept
    live.mkdir()
    env = {**os.environ, "PREFECT_HOME": str(home), "TMPDIR": str(tmp),
           "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    return server, staging, live, env


@pytest.mark.parametrize("command", [["-m", "stages.corpus"], ["-m", "stages.run", "--dry"]], ids=["any_stage", "make_run"])
def test_the_next_run_of_any_stage_cleans_up_a_killed_training(tmp_path, command):
    server, staging, live, env = _leftovers(tmp_path)
    try:
        assert server.poll() is None
        # In an empty directory the command itself fails (no params.yaml, no DVC project):
        # the cleanup comes first, whatever the stage then does.
        work = tmp_path / "work"
        work.mkdir()
        subprocess.run([sys.executable, *command], cwd=work, env=env, capture_output=True, text=True, timeout=300)
        deadline = time.monotonic() + 15
        while server.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert server.poll() is not None, "the killed run's Prefect server is still running"
        assert not staging.exists(), "the killed run's staging directory is still in TMPDIR"
        assert live.exists(), "a live writer's staging directory must be kept"
    finally:
        if server.poll() is None:
            server.kill()
        server.wait()
