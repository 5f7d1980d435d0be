"""make run's warm stage processes (stages/warm.py): a stage command handed to a fork of one
process with the libraries imported gives what the command gives alone: the same output
files, lines and exit status; signals reach the fork; a command that is killed takes its fork
with it; a command whose environment differs runs by itself."""

from __future__ import annotations

import hashlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from stages.warm import SERVER_ENV, read_log, running_server

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
PARAMS = "corpus:\n  n_dialogues: {n}\n  seed: 3\n  output: out/corpus\n"


def _digest(directory: Path) -> dict[str, str]:
    return {p.relative_to(directory).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(directory.rglob("*")) if p.is_file()}


def _stage(cwd: Path, env: dict[str, str], *args: str, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "stages.corpus", *args], cwd=cwd, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, **kwargs)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """A warm server in a project directory whose params.yaml the test writes."""
    project = tmp_path_factory.mktemp("project")
    (project / "params.yaml").write_text(PARAMS.format(n=60))
    sockets = tmp_path_factory.mktemp("warm")
    env = {k: v for k, v in os.environ.items() if k != SERVER_ENV}
    with running_server(sockets, env, cwd=project) as warm_env:
        deadline = time.monotonic() + 120
        while not Path(warm_env[SERVER_ENV]).exists():  # the libraries are being imported
            assert time.monotonic() < deadline, (sockets / "warm.out").read_text()
            time.sleep(0.2)
        yield project, env, {**env, **warm_env}, sockets


def _forks(sockets: Path) -> list[dict]:
    return [entry for entry in read_log(sockets) if "warm" in entry]


def test_a_stage_in_a_fork_writes_what_it_writes_alone(server):
    project, env, warm_env, sockets = server
    (project / "params.yaml").write_text(PARAMS.format(n=60))
    alone = _stage(project, env)
    out_alone, err_alone = alone.communicate(timeout=300)
    assert alone.returncode == 0, err_alone
    files_alone = _digest(project / "out")
    for path in (project / "out").rglob("*"):
        if path.is_file():
            path.unlink()

    warm = _stage(project, {**warm_env, "DVC_STAGE": "corpus"})
    out_warm, err_warm = warm.communicate(timeout=300)
    assert warm.returncode == 0, err_warm
    assert _forks(sockets)[-1] == {"stage": "corpus", "warm": True}
    assert _digest(project / "out") == files_alone and files_alone
    # the same lines (the stage's own name comes from DVC_STAGE, its time differs)
    assert out_warm.splitlines()[1:-1] == out_alone.splitlines()[1:-1]
    assert "[stage corpus] start" in out_warm and "[stage corpus] done in" in out_warm


def test_an_error_in_a_fork_exits_as_it_does_alone(server):
    project, env, warm_env, sockets = server
    (project / "params.yaml").write_text(PARAMS.format(n=60) + "  colour: blue\n")
    alone = _stage(project, env)
    warm = _stage(project, warm_env)
    _, err_alone = alone.communicate(timeout=300)
    _, err_warm = warm.communicate(timeout=300)
    assert _forks(sockets)[-1]["warm"] is True
    assert alone.returncode == warm.returncode == 1
    assert "error: params.yaml corpus: unknown key(s) ['colour']" in err_warm
    assert err_warm.splitlines()[-1] == err_alone.splitlines()[-1]


def test_a_command_with_another_environment_runs_by_itself(server):
    project, _, warm_env, sockets = server
    (project / "params.yaml").write_text(PARAMS.format(n=60))
    proc = _stage(project, {**warm_env, "ASKFLOW_SOMETHING_ELSE": "1"})
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err
    assert _forks(sockets)[-1]["warm"] is False
    assert "ASKFLOW_SOMETHING_ELSE" in _forks(sockets)[-1]["refused"]


def _worker_of(sockets: Path, before: int) -> psutil.Process:
    """The fork that runs the latest stage command (the server's grandchild)."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        if len(_forks(sockets)) > before:
            server = next(p for p in psutil.Process().children() if "stages.warm" in " ".join(p.cmdline()))
            workers = [g for s in server.children() for g in s.children()]
            if workers:
                return workers[0]
        time.sleep(0.1)
    raise AssertionError("no fork started")


@pytest.mark.parametrize("how", ["SIGTERM to the command", "SIGKILL to the command"])
def test_signals_reach_the_fork_and_a_killed_command_takes_it_along(server, how):
    project, _, warm_env, sockets = server
    (project / "params.yaml").write_text(PARAMS.format(n=200_000))  # minutes of work
    before = len(_forks(sockets))
    proc = _stage(project, warm_env)
    worker = _worker_of(sockets, before)
    time.sleep(1.0)
    proc.send_signal(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGKILL)
    proc.communicate(timeout=60)
    assert proc.returncode == -(signal.SIGTERM if how.startswith("SIGTERM") else signal.SIGKILL)
    worker.wait(timeout=30)  # gone, not left running the stage
    assert not worker.is_running()


def test_make_runs_summary_says_which_stages_ran_in_a_fork():
    from stages.run import warm_lines

    log = [{"ready": True, "preloaded": ["torch"]}, {"stage": "corpus", "warm": True},
           {"stage": "train_sft", "warm": False, "refused": "environment differs in ['PATH']"}]
    assert warm_lines(log, 3) == [
        "warm starts: 1 of 3 stage(s) ran in a fork of one process with the libraries imported; 1 started before it was ready",
        "  train_sft ran by itself: environment differs in ['PATH']",
    ]
    assert warm_lines([{"ready": True, "preloaded": []}], 2) == []


# The first stage waits until the server listens (it imports the libraries first); corpus
# runs after it, as a DVC stage command.
WARM_DVC_YAML = """\
stages:
  ready:
    cmd: python -c "import os, pathlib, time; p = pathlib.Path(os.environ['ASKFLOW_WARM_STAGES']); [time.sleep(0.2) for _ in range(600) if not p.exists()]; open('ready.txt', 'w').write('')"
    outs: [ready.txt]
  corpus:
    cmd: python -m stages.corpus
    deps: [ready.txt]
    params: [corpus]
    outs: [out/corpus]
"""


def test_make_run_hands_its_stage_commands_to_the_warm_server(tmp_path):
    """Through ``python -m stages.run`` (make run), as DVC starts it: the stage's command runs
    in a fork (the server's environment is the one DVC gives its commands) and its outputs are
    the ones the stage writes alone."""
    from tests.test_dvc_pipeline import _run
    from tests.test_repro import _committed_project

    project = _committed_project(tmp_path / "project", {"dvc.yaml": WARM_DVC_YAML, "params.yaml": PARAMS.format(n=40)})
    proc = _run([sys.executable, "-m", "stages.run"], project)
    # (the waiting stage is no askflow stage: it writes no line to make run's run log)
    assert "warm starts: 1 of 1 stage(s) ran in a fork of one process with the libraries imported\n" in proc.stdout, proc.stdout
    assert "ran by itself" not in proc.stdout
    warm_files = _digest(project / "out")
    alone = subprocess.run([sys.executable, "-m", "stages.corpus"], cwd=project, capture_output=True, text=True,
                           env={k: v for k, v in os.environ.items() if k != SERVER_ENV})
    assert alone.returncode == 0, alone.stderr
    assert _digest(project / "out") == warm_files and warm_files
