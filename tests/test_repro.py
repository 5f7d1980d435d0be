"""`make run` (python -m stages.run) on a real DVC project: every stage runs, none is left
out (issue 30: the inputs are in the repository); a dependency that is missing fails the run
with DVC's message naming it."""

from __future__ import annotations

import json
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


def _committed_project(root: Path, files: dict[str, str]) -> Path:
    """``files`` (name -> text) committed in a fresh git + DVC repository at ``root``."""
    root.mkdir()
    for name, text in files.items():
        (root / name).write_text(text)
    _run(["git", "init", "-q"], root)
    _run([sys.executable, "-m", "dvc", "init", "-q"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "init"], root)
    return root


def _project(root: Path, data: Path) -> Path:
    return _committed_project(root, {"dvc.yaml": DVC_YAML.format(data=data)})


def test_make_run_runs_every_stage_and_lists_dependencies_outside_the_project(tmp_path):
    data = tmp_path / "shared" / "data.txt"
    data.parent.mkdir()
    data.write_text("shared")
    project = _project(tmp_path / "project", data)
    assert outside_dependencies(project) == {"outside": [str(data)]}
    proc = _run([sys.executable, "-m", "stages.run"], project)
    assert (project / "local.txt").read_text() == "x" and (project / "after.txt").read_text() == "shared"
    assert "leaving out" not in proc.stderr
    # An up-to-date pipeline runs nothing again; given targets are passed to dvc as they are.
    again = _run([sys.executable, "-m", "stages.run"], project)
    assert "Running stage" not in again.stdout
    forced = _run([sys.executable, "-m", "stages.run", "--force", "local"], project)
    assert "Running stage 'local'" in forced.stdout


def test_make_run_with_a_missing_dependency_fails_naming_it(tmp_path):
    """No stage is quietly left out any more: the run fails and DVC names the missing file."""
    data = tmp_path / "absent" / "data.txt"
    project = _project(tmp_path / "project", data)
    proc = _run([sys.executable, "-m", "stages.run"], project, check=False)
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
    before = {p: p.read_bytes() for p in (project / "reports").iterdir() if p.is_file()}

    proc = _run([sys.executable, "-m", "stages.run"], project)
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
    assert {p: p.read_bytes() for p in (project / "reports").iterdir() if p.is_file()} == before  # no time written into a report
    # The stage's wall time goes to reports/timings/stages.json, the next run's scheduling order.
    seconds = json.loads((project / "reports" / "timings" / "stages.json").read_text())
    assert set(seconds) == {"made"} and seconds["made"] >= 0

    again = _run([sys.executable, "-m", "stages.run"], project)
    assert "[stage" not in again.stdout and "no stage ran: every output was up to date" in again.stdout


SIDE_BY_SIDE_YAML = """\
stages:
  left:
    cmd: python meet.py left right
    outs: [left.txt]
  right:
    cmd: python meet.py right left
    outs: [right.txt]
  both:
    cmd: python -c "open('both.txt', 'w').write(open('left.txt').read() + open('right.txt').read())"
    deps: [left.txt, right.txt]
    outs: [both.txt]
"""
# Each of left and right waits (up to 30 s) until the other has started: they finish only when
# they run side by side, and `both` must wait for both of them.
MEET_PY = """\
import sys, time
from pathlib import Path

me, other = sys.argv[1:]
Path(f"{me}.started").write_text("")
deadline = time.monotonic() + 30
while not Path(f"{other}.started").exists():
    if time.monotonic() > deadline:
        sys.exit(f"error: {other} never started beside {me}")
    time.sleep(0.1)
Path(f"{me}.txt").write_text(me)
"""


def _meeting_project(project: Path) -> Path:
    return _committed_project(project, {"dvc.yaml": SIDE_BY_SIDE_YAML, "meet.py": MEET_PY})


def test_make_run_runs_independent_stages_side_by_side_and_waits_for_dependencies(tmp_path):
    project = _meeting_project(tmp_path / "project")
    proc = _run([sys.executable, "-m", "stages.run", "--jobs", "2"], project)
    assert (project / "both.txt").read_text() == "leftright", proc.stdout + proc.stderr
    assert "left | Running stage 'left'" in proc.stdout and "both | Running stage 'both'" in proc.stdout
    # dvc.lock records every stage, as a serial dvc repro does: nothing is out of date.
    status = _run([sys.executable, "-m", "dvc", "status"], project)
    assert "up to date" in status.stdout, status.stdout
    assert "no stage ran" in _run([sys.executable, "-m", "stages.run", "--jobs", "2"], project).stdout

    # One at a time (one dvc repro), left waits for a right that never starts: the run fails
    # naming it, and `both` never runs.
    serial = _meeting_project(tmp_path / "serial")
    bad = _run([sys.executable, "-m", "stages.run", "--jobs", "1"], serial, check=False)
    assert bad.returncode != 0 and "never started beside" in bad.stdout + bad.stderr
    assert not (serial / "both.txt").exists()


def test_make_run_refuses_a_bad_jobs_value(tmp_path):
    proc = _run([sys.executable, "-m", "stages.run", "--jobs", "0"], tmp_path, check=False)
    assert proc.returncode == 1 and "--jobs: expected an integer >= 1, got '0'" in proc.stderr


def test_the_scheduling_order_knows_every_stage_of_the_project_on_a_fresh_clone(tmp_path):
    """On a fresh clone no stage has run: the longest remaining chain goes first by the
    committed measurement of each stage (catalog/stage_seconds.json), which must name every
    stage that dvc.yaml has, and this machine's own latest times win once it has run them."""
    from catalog.repro import LAST_SECONDS, MEASURED_SECONDS, _estimate, record_seconds, stage_graph

    needs, _ = stage_graph(Path(__file__).resolve().parents[1])
    measured = json.loads(MEASURED_SECONDS.read_text(encoding="utf-8"))
    assert sorted(set(needs) - set(measured)) == [], "add these stages to catalog/stage_seconds.json"
    assert sorted(set(measured) - set(needs)) == [], "stages no longer in dvc.yaml"

    estimate = _estimate(tmp_path)
    assert estimate("train_sft") == measured["train_sft"] and estimate("no_such_stage") == 60.0
    record_seconds(tmp_path, [{"stage": "train_sft", "status": "done", "wall_s": 12.34},
                              {"stage": "evaluate", "status": "failed", "wall_s": 1.0}])
    assert json.loads((tmp_path / LAST_SECONDS).read_text()) == {"train_sft": 12.3}
    estimate = _estimate(tmp_path)
    assert estimate("train_sft") == 12.3 and estimate("evaluate") == measured["evaluate"]
