"""`make run` (python -m catalog.repro) on a real DVC project: every stage runs, none is left
out (issue 30: the inputs are in the repository); a dependency that is missing fails the run
with DVC's message naming it."""

from __future__ import annotations

import re
import sys
from pathlib import Path

from catalog.repro import outside_dependencies
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


def test_make_run_runs_every_stage_and_lists_dependencies_outside_the_project(tmp_path):
    data = tmp_path / "shared" / "data.txt"
    data.parent.mkdir()
    data.write_text("shared")
    project = _project(tmp_path / "project", data)
    assert outside_dependencies(project) == {"outside": [str(data)]}
    proc = _run([sys.executable, "-m", "catalog.repro"], project)
    assert (project / "local.txt").read_text() == "x" and (project / "after.txt").read_text() == "shared"
    assert "leaving out" not in proc.stderr
    # An up-to-date pipeline runs nothing again; given targets are passed to dvc as they are.
    again = _run([sys.executable, "-m", "catalog.repro"], project)
    assert "Running stage" not in again.stdout
    forced = _run([sys.executable, "-m", "catalog.repro", "--force", "local"], project)
    assert "Running stage 'local'" in forced.stdout


def test_make_run_with_a_missing_dependency_fails_naming_it(tmp_path):
    """No stage is quietly left out any more: the run fails and DVC names the missing file."""
    data = tmp_path / "absent" / "data.txt"
    project = _project(tmp_path / "project", data)
    proc = _run([sys.executable, "-m", "catalog.repro"], project, check=False)
    assert proc.returncode != 0 and "leaving out" not in proc.stderr
    assert str(data) in proc.stdout + proc.stderr and not (project / "after.txt").exists()


SUMMARY_YAML = """\
stages:
  made:
    cmd: python made.py
    deps: [made.py]
    outs: [made.txt]
"""
MADE_PY = """\
from pathlib import Path

from stages.entry import main_wrapper

main_wrapper(lambda: Path("made.txt").write_text("x"))()
"""

EVAL_MD = """\
# Simulated collaborative evaluation

Avg@5 over 100 goals.

| Method | Success (%) | Turns |
|---|---|---|
| base | 0.0 [0.0, 0.0] | 9.62 [9.46, 9.79] |
| sft | 3.0 [1.0, 5.0] | 6.93 [6.61, 7.26] |

## Success per domain (%)

| Method | hotel |
|---|---|
| base | 0.3 |
"""


def test_make_run_prints_each_stage_with_its_time_and_a_summary_at_the_end(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "dvc.yaml").write_text(SUMMARY_YAML)
    (project / "made.py").write_text(MADE_PY)  # a stage with the stages' entry point
    (project / "reports").mkdir()
    (project / "reports" / "eval.md").write_text(EVAL_MD)
    wide = "| " + " | ".join(f"column {i:02d} of a wide table" for i in range(8)) + " |"
    (project / "reports" / "other.md").write_text(f"# Other\n\n{wide}\n|{'---|' * 8}\n{wide}\n")
    _run(["git", "init", "-q"], project)
    _run([sys.executable, "-m", "dvc", "init", "-q"], project)
    _run(["git", "add", "-A"], project)
    _run(["git", "commit", "-q", "-m", "init"], project)
    before = {p: p.read_bytes() for p in (project / "reports").iterdir()}

    proc = _run([sys.executable, "-m", "catalog.repro"], project)
    out = proc.stdout
    assert "[stage made] start" in out and re.search(r"\[stage made\] done in \d+\.\d s", out), out
    summary = out[out.index("== make run: done in "):].splitlines()
    assert re.fullmatch(r"== make run: done in \d+(\.\d)? s ==", summary[0]), summary
    assert re.fullmatch(r"1 stage\(s\) ran: made \d+\.\d s", summary[1]), summary
    assert summary[3:7] == [
        "- reports/eval.md: Simulated collaborative evaluation",  # the results tables first, in their order
        "    Method  Success (%)     Turns",
        "    base    0.0 [0.0, 0.0]  9.62 [9.46, 9.79]",
        "    sft     3.0 [1.0, 5.0]  6.93 [6.61, 7.26]",
    ]
    assert summary[7] == "- reports/other.md: Other" and summary[-1] == "    (4 more column(s) in the report)", summary
    assert {p: p.read_bytes() for p in (project / "reports").iterdir()} == before  # no time written into a report

    again = _run([sys.executable, "-m", "catalog.repro"], project)
    assert "[stage" not in again.stdout and "no stage ran: every output was up to date" in again.stdout
