"""`make run` (python -m stages.run) after a stage fails, is interrupted or terminated: the
outputs of the stages that did not finish are the last good ones again (DVC deleted them
before running the stage), cached ones from DVC's cache and uncached ones (metrics) from a
copy taken before the run; the stages that finished keep their new outputs."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from tests.test_dvc_pipeline import _run

DVC_YAML = """\
stages:
  first:
    cmd: python stage.py first
    deps: [stage.py]
    params: [first]
    outs: [first.txt]
  made:
    cmd: python stage.py made
    deps: [stage.py, first.txt]
    params: [made]
    outs: [data/made.txt, data/tables]
    metrics:
      - reports/made.json:
          cache: false
  after:
    cmd: python stage.py after
    deps: [data/made.txt]
    outs: [after.txt]
"""
# A stage that writes part of its outputs and fails (ASKFLOW_TEST_FAIL=<stage>), or hangs after
# starting (ASKFLOW_TEST_HANG=<stage>: writes started.flag, then sleeps).
STAGE_PY = """\
import json, os, sys, time
from pathlib import Path

import yaml

name = sys.argv[1]
version = yaml.safe_load(open("params.yaml"))[name]["version"]
if name == os.environ.get("ASKFLOW_TEST_HANG"):
    Path("started.flag").write_text("x")
    time.sleep(120)
if name == "first":
    Path("first.txt").write_text(f"first v{version}")
elif name == "made":
    Path("data/tables").mkdir(parents=True, exist_ok=True)
    Path("reports").mkdir(exist_ok=True)
    Path("data/made.txt").write_text(f"made v{version}")
    Path("reports/made.json").write_text(json.dumps({"version": version, "partial": True}))
    if name == os.environ.get("ASKFLOW_TEST_FAIL"):
        sys.exit("error: the LLM server is down")
    (Path("data/tables") / "a.parquet").write_bytes(b"table a v%d" % version)
    (Path("data/tables") / "b.parquet").write_bytes(b"table b v%d" % version)
    Path("reports/made.json").write_text(json.dumps({"version": version}))
else:
    Path("after.txt").write_text(Path("data/made.txt").read_text() + " after")
"""
OUTS = ["first.txt", "data/made.txt", "data/tables/a.parquet", "data/tables/b.parquet", "reports/made.json", "after.txt"]
MADE = ["data/made.txt", "data/tables/a.parquet", "data/tables/b.parquet", "reports/made.json"]


def _project(root: Path) -> Path:
    root.mkdir()
    (root / "dvc.yaml").write_text(DVC_YAML)
    (root / "stage.py").write_text(STAGE_PY)
    _set_versions(root, 1)
    _run(["git", "init", "-q"], root)
    _run([sys.executable, "-m", "dvc", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "init"], root)
    _run([sys.executable, "-m", "stages.run"], root)  # the good run: outs cached, dvc.lock written
    return root


def _set_versions(root: Path, version: int) -> None:
    (root / "params.yaml").write_text(yaml.safe_dump({s: {"version": version} for s in ("first", "made", "after")}))


def _outputs(root: Path) -> dict[str, bytes | None]:
    return {p: (root / p).read_bytes() if (root / p).exists() else None for p in OUTS}


@pytest.mark.parametrize("cache", ["kept", "cleared"])
def test_a_failed_stage_leaves_its_last_good_outputs(tmp_path, monkeypatch, cache):
    project = _project(tmp_path / "project")
    good = _outputs(project)
    assert good["reports/made.json"] == b'{"version": 1}' and None not in good.values()
    if cache == "cleared":  # cached outs not in DVC's cache (e.g. pulled elsewhere): cannot come back
        _run([sys.executable, "-m", "dvc", "cache", "dir", str(tmp_path / "other-cache")], project)
    _set_versions(project, 2)  # every stage out of date; `made` then meets an outage
    monkeypatch.setenv("ASKFLOW_TEST_FAIL", "made")

    proc = _run([sys.executable, "-m", "stages.run"], project, check=False)
    assert proc.returncode != 0, proc.stdout + proc.stderr
    now = _outputs(project)
    assert now["first.txt"] == b"first v2"  # finished before the failure: its new output stays
    assert now["after.txt"] == good["after.txt"]  # never started: untouched
    if cache == "kept":
        assert {p: now[p] for p in MADE} == {p: good[p] for p in MADE}
        assert "restored the last good outputs of made: data/made.txt, data/tables, reports/made.json" in proc.stderr
    else:
        assert now["reports/made.json"] == good["reports/made.json"]  # uncached: from the copy
        assert "restored the last good outputs of made: reports/made.json" in proc.stderr
        assert ("could not restore the previous outputs of made: data/made.txt (not in DVC's cache), "
                "data/tables (not in DVC's cache)") in proc.stderr
    assert "restored the last good outputs of made" in proc.stdout  # in the summary at the end too
    assert "restored the last good outputs of first" not in proc.stderr

    # The outage over: the next run reproduces what is still out of date.
    monkeypatch.delenv("ASKFLOW_TEST_FAIL")
    _run([sys.executable, "-m", "stages.run"], project)
    assert _outputs(project)["reports/made.json"] == b'{"version": 2}'
    assert _outputs(project)["after.txt"] == b"made v2 after"


def test_a_good_run_says_nothing_and_a_first_run_that_fails_has_nothing_to_restore(tmp_path, monkeypatch):
    project = _project(tmp_path / "project")
    again = _run([sys.executable, "-m", "stages.run"], project)
    assert "restored" not in again.stderr + again.stdout and "restore" not in again.stderr

    monkeypatch.setenv("ASKFLOW_TEST_FAIL", "made")
    fresh = tmp_path / "fresh"
    fresh.mkdir()
    for name in ("dvc.yaml", "stage.py", "params.yaml"):
        (fresh / name).write_bytes((project / name).read_bytes())
    _run(["git", "init", "-q"], fresh)
    _run([sys.executable, "-m", "dvc", "init", "-q"], fresh)
    proc = _run([sys.executable, "-m", "stages.run"], fresh, check=False)
    assert proc.returncode != 0 and "error: the LLM server is down" in proc.stderr
    assert "no outputs to restore: the stages that did not finish had none, or left theirs as they were" in proc.stderr
    assert (fresh / "first.txt").read_text() == "first v1"


def test_a_terminated_run_leaves_the_last_good_outputs(tmp_path, monkeypatch):
    project = _project(tmp_path / "project")
    good = _outputs(project)
    _set_versions(project, 2)
    monkeypatch.setenv("ASKFLOW_TEST_HANG", "made")
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}", "DVC_NO_ANALYTICS": "1"}
    process = subprocess.Popen([sys.executable, "-m", "stages.run"], cwd=project, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not (project / "started.flag").exists():
        assert process.poll() is None and time.monotonic() < deadline, process.communicate()
        time.sleep(0.2)
    assert not (project / "data" / "made.txt").exists()  # DVC deleted the outs before running the stage
    process.send_signal(signal.SIGTERM)
    stdout, stderr = process.communicate(timeout=120)
    assert process.returncode == 128 + signal.SIGTERM, stdout + stderr
    now = _outputs(project)
    assert {p: now[p] for p in MADE} == {p: good[p] for p in MADE} and now["first.txt"] == b"first v2"
    assert "restored the last good outputs of made: data/made.txt, data/tables, reports/made.json" in stderr
