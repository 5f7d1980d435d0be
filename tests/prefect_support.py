"""Real Prefect for the retraining tests (a pytest plugin: ``pytest_plugins = ["tests.prefect_support"]``).

Test modules use the fixtures only (importing from here first would keep pytest from
rewriting the asserts of this module). ``prefect_ui``: one ``askflow ui --worker`` for the session (server, UI and a worker, as a
user starts them) on a free port, serving a tiny project; stopped with a Ctrl-C (SIGINT)
at the end, which must stop every process it started. ``tiny_project``: a tiny askflow
project, as tests/test_dvc_pipeline.py builds one (a copy of the pipeline in a fresh git +
DVC repository), with a corpus small enough for a run of ``dvc repro corpus`` in seconds.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import psutil
import pytest

from tests.test_dvc_pipeline import pipeline_project

N_DIALOGUES = 30
TARGETS = ["corpus"]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_project(root: Path, **corpus: object) -> Path:
    """A fresh git + DVC copy of the pipeline; ``corpus`` overrides params.yaml ``corpus``."""

    def edit(params: dict) -> None:
        params["corpus"].update({"n_dialogues": N_DIALOGUES, **corpus})
        params["retrain"]["targets"] = TARGETS

    return pipeline_project(root, edit, files={".gitignore": ".prefect/\n"})


@pytest.fixture
def tiny_project(tmp_path) -> Path:
    """A fresh tiny project for one test."""
    return make_project(tmp_path / "project")


@pytest.fixture
def unused_port() -> int:
    return free_port()


@dataclass
class PrefectUI:
    root: Path
    port: int
    process: subprocess.Popen
    log: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def api_url(self) -> str:
        return f"{self.url}/api"

    def output(self) -> str:
        return self.log.read_text(errors="replace")


@pytest.fixture(scope="session")
def prefect_ui(tmp_path_factory) -> Iterator[PrefectUI]:
    root = make_project(tmp_path_factory.mktemp("retrain") / "project")
    port = free_port()
    log = root.parent / "askflow-ui.log"
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        "DVC_NO_ANALYTICS": "1",
        # Seconds rather than the defaults' 10 s (worker) and 60 s (scheduler): short tests.
        "PREFECT_WORKER_QUERY_SECONDS": "1",
        "PREFECT_SERVER_SERVICES_SCHEDULER_LOOP_SECONDS": "2",
    }
    env.pop("PREFECT_HOME", None)  # askflow ui's default: <root>/.prefect
    env.pop("PREFECT_API_URL", None)
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [sys.executable, "-m", "stages.cli", "ui", "--root", str(root), "--port", str(port), "--worker"],
            cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT,
        )
    ui = PrefectUI(root, port, process, log)
    try:
        _wait_for(lambda: "Ctrl-C stops." in ui.output(), process, 120, ui)
        _wait_for(lambda: "Worker 'ProcessWorker" in ui.output(), process, 60, ui)
        yield ui
    finally:
        children = _children(process)
        process.send_signal(signal.SIGINT)  # what Ctrl-C in its terminal sends it
        try:
            status = process.wait(60)
        except subprocess.TimeoutExpired:
            status = None
        left = [p for p in children if p.is_running() and p.status() != psutil.STATUS_ZOMBIE]
        for leftover in left:
            leftover.kill()
        if status is None:
            process.kill()
            process.wait()
    assert status == 0, f"askflow ui did not stop on SIGINT (status {status}):\n{ui.output()[-3000:]}"
    assert not left, f"askflow ui left processes running after SIGINT: {left}"


@pytest.fixture
def prefect_api_url(prefect_ui) -> Iterator[str]:
    """Flow runs and clients of this process use the session's server."""
    from prefect.logging.handlers import APILogWorker
    from prefect.settings import PREFECT_API_URL, temporary_settings

    with temporary_settings({PREFECT_API_URL: prefect_ui.api_url}):
        yield prefect_ui.api_url
        APILogWorker.drain_all(timeout=10)  # now, while this server is up: not at exit, when it is gone


def _children(process: subprocess.Popen) -> list[psutil.Process]:
    try:
        return psutil.Process(process.pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []


def _wait_for(condition, process: subprocess.Popen, timeout_s: float, ui: PrefectUI) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        if process.poll() is not None:
            raise AssertionError(f"askflow ui exited with status {process.returncode}:\n{ui.output()[-3000:]}")
        if time.monotonic() > deadline:
            raise AssertionError(f"askflow ui not ready after {timeout_s} s:\n{ui.output()[-3000:]}")
        time.sleep(0.3)
