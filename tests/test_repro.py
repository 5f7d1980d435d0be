"""`make run` (python -m catalog.repro) on a real DVC project: stages whose data outside the
repository is absent, and the stages after them, are left out and named; the rest run."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from tests.test_dvc_pipeline import _run

DVC_YAML = """\
stages:
  local:
    cmd: python -c "open('local.txt', 'w').write('x')"
    outs: [local.txt]
  outside:
    cmd: python -c "open('outside.txt', 'w').write(open('{data}').read())"
    deps: ['{data}']
    outs: [outside.txt]
  after:
    cmd: python -c "open('after.txt', 'w').write(open('outside.txt').read())"
    deps: [outside.txt]
    outs: [after.txt]
"""


def _project(root: Path, data: Path) -> Path:
    root.mkdir()
    (root / "dvc.yaml").write_text(DVC_YAML.format(data=data))
    _run(["git", "init", "-q"], root)
    _run([sys.executable, "-m", "dvc", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "init"], root)
    return root


@pytest.mark.parametrize("present", [False, True])
def test_make_run_leaves_out_the_stages_whose_outside_data_is_absent(tmp_path, present):
    data = tmp_path / "shared" / "data.txt"
    if present:
        data.parent.mkdir()
        data.write_text("shared")
    project = _project(tmp_path / "project", data)
    proc = _run([sys.executable, "-m", "catalog.repro"], project)
    assert (project / "local.txt").read_text() == "x"
    if present:
        assert (project / "after.txt").read_text() == "shared" and "leaving out" not in proc.stderr
    else:
        assert not (project / "outside.txt").exists() and not (project / "after.txt").exists()
        assert f"leaving out outside: {data} does not exist" in proc.stderr
        assert "leaving out after: it needs outside" in proc.stderr
    # An up-to-date pipeline runs nothing again; given targets are passed to dvc as they are.
    again = _run([sys.executable, "-m", "catalog.repro"], project)
    assert "Running stage" not in again.stdout
    forced = _run([sys.executable, "-m", "catalog.repro", "--force", "local"], project)
    assert "Running stage 'local'" in forced.stdout and "leaving out" not in forced.stderr


def test_make_run_with_no_stage_that_can_run_says_so_and_fails(tmp_path):
    data = tmp_path / "absent" / "data.txt"
    project = _project(tmp_path / "project", data)
    (project / "dvc.yaml").write_text(f"stages:\n  outside:\n    cmd: cat '{data}'\n    deps: ['{data}']\n")
    proc = _run([sys.executable, "-m", "catalog.repro"], project, check=False)
    assert proc.returncode == 1 and f"error: {project}: no stage can run here (outside: {data} does not exist)" in proc.stderr
