"""``dvc repro`` less the stages whose inputs outside the repository this machine lacks.

τ-bench (params.yaml ``clarifier.data.taubench``) is read in place from ``../shared``, which
not every machine has. There ``make run`` and the retrain flow reproduce every other stage
and say which they left out and why, instead of failing on a missing dependency.

    python -m catalog.repro [dvc repro options]   # what `make run` runs

At the end it prints a summary: the total wall time, each stage that ran with its wall time
(each stage prints ``[stage <name>] start`` / ``done in ...`` itself, see ``stages.entry``),
the stages left out, and the headline rows of every results table under ``reports/`` with the
report's path. The times are printed only, never written into a report.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any, Callable, Sequence

from pipelines.errors import ConfigError


def plan(root: Path) -> tuple[list[str], dict[str, str]]:
    """Every stage that can run here, and stage -> why it cannot: a dependency outside the
    repository that does not exist, or an upstream stage with one."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # an edge goes from a stage to the stage it depends on
        why: dict[str, str] = {}
        for stage in graph:
            missing = [dep.def_path for dep in stage.deps if not dep.is_in_repo and not dep.exists]
            if missing:
                why[_name(stage, root)] = f"{', '.join(missing)} does not exist"
                for downstream in nx.ancestors(graph, stage):
                    why.setdefault(_name(downstream, root), f"it needs {_name(stage, root)}")
        runnable = sorted(n for n in (_name(s, root) for s in repo.index.stages) if n not in why)
    return runnable, dict(sorted(why.items()))


def _name(stage, root: Path) -> str:
    """The stage's name for ``dvc repro`` run in ``root`` (DVC's own is relative to the cwd)."""
    dvcfile = os.path.relpath(stage.path, root)
    return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"


def targets_here(root: Path, warn: Callable[[str], None]) -> list[str]:
    """``dvc repro``'s targets for "the whole pipeline" here: none (everything) when every stage
    can run, else the runnable ones; ``warn`` gets one line per stage left out."""
    runnable, skipped = plan(root)
    for stage, reason in skipped.items():
        warn(f"leaving out {stage}: {reason}")
    if skipped and not runnable:
        raise ConfigError(f"{root}: no stage can run here ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})")
    return runnable if skipped else []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root = Path.cwd()
    started = time.monotonic()
    from flows.local_api import clean_up_killed_runs
    from stages.entry import RUN_LOG_ENV

    clean_up_killed_runs()  # a killed stage's Prefect server and /tmp staging, before anything starts
    chosen: list[str] = []
    left_out: list[str] = []
    if all(a.startswith("-") for a in argv):  # no targets given: the whole pipeline that can run
        try:
            chosen = targets_here(root, lambda line: (left_out.append(line), print(line, file=sys.stderr)))
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    bin_dir = str(Path(sys.executable).parent)
    with tempfile.TemporaryDirectory(prefix="askflow-run-") as tmp:
        log = Path(tmp) / "stages.jsonl"  # one line per stage that ran (stages.entry)
        env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", RUN_LOG_ENV: str(log)}
        returncode = subprocess.run([sys.executable, "-m", "dvc", "repro", *argv, *chosen], cwd=root, env=env).returncode
        runs = read_run_log(log)
    print(summary(root, runs, left_out, time.monotonic() - started, returncode), flush=True)
    return returncode


# --- The summary at the end ----------------------------------------------------------------

#: The results tables, in the order the summary shows them; any other ``reports/*.md`` follows.
REPORTS = ("reports/eval.md", "reports/clarifier_eval.md", "reports/josh_eval.md", "reports/l2a.md", "reports/pir_eval.md")
MAX_ROWS = 8  # body rows of a table shown
MAX_WIDTH = 110  # columns are shown while a row fits in this many characters


def read_run_log(path: Path) -> list[dict[str, Any]]:
    """The stages' lines (stage, status, wall_s), in the order they ran; none when no stage ran."""
    if not path.is_file():
        return []
    runs = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            runs.append(json.loads(line))
        except json.JSONDecodeError:  # a stage killed mid-write: the summary goes on without it
            continue
    return runs


def first_table(markdown: str) -> tuple[str | None, list[list[str]]]:
    """The report's title (its first ``# `` line) and its first markdown table as rows of
    cells (the header first, the ``|---|`` line left out)."""
    title = next((line[2:].strip() for line in markdown.splitlines() if line.startswith("# ")), None)
    rows: list[list[str]] = []
    for line in markdown.splitlines():
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(set(c) <= set("-: ") for c in cells):
                rows.append(cells)
        elif rows:
            break
    return title, rows


def table_lines(rows: list[list[str]], max_rows: int = MAX_ROWS, max_width: int = MAX_WIDTH) -> list[str]:
    """``rows`` aligned, with as many leading columns as fit ``max_width`` (the rest named
    by count) and at most ``max_rows`` body rows."""
    shown_rows = rows[: max_rows + 1]
    n_columns = max(len(r) for r in shown_rows)
    widths = [max(len(r[i]) if i < len(r) else 0 for r in shown_rows) for i in range(n_columns)]
    keep = 1
    while keep < n_columns and sum(widths[: keep + 1]) + 2 * keep <= max_width:
        keep += 1
    lines = ["  ".join((r[i] if i < len(r) else "").ljust(widths[i]) for i in range(keep)).rstrip() for r in shown_rows]
    notes = []
    if keep < n_columns:
        notes.append(f"{n_columns - keep} more column(s)")
    if len(rows) > len(shown_rows):
        notes.append(f"{len(rows) - len(shown_rows)} more row(s)")
    if notes:
        lines.append(f"({', '.join(notes)} in the report)")
    return lines


def report_paths(root: Path) -> list[str]:
    others = sorted(str(p.relative_to(root)) for p in (root / "reports").glob("*.md") if str(p.relative_to(root)) not in REPORTS)
    return [r for r in REPORTS if (root / r).is_file()] + others


def summary(root: Path, runs: Sequence[dict[str, Any]], left_out: Sequence[str], wall_s: float, returncode: int) -> str:
    """What ``make run`` prints at the end: the total time, the stages that ran (with their
    wall time) or that nothing did, the stages left out, and each report's headline rows."""
    from pipelines.progress import format_duration

    outcome = "done" if returncode == 0 else f"failed (exit {returncode})"
    lines = ["", f"== make run: {outcome} in {format_duration(wall_s)} =="]
    if runs:
        ran = ", ".join(f"{r['stage']} {format_duration(r['wall_s'])}" + ("" if r.get("status") == "done" else " (failed)") for r in runs)
        lines += textwrap.wrap(f"{len(runs)} stage(s) ran: {ran}", MAX_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    elif returncode == 0:
        lines.append("no stage ran: every output was up to date")
    lines += left_out
    reports = report_paths(root)
    if reports:
        lines.append("results (`dvc metrics show` lists every number):")
    for path in reports:
        title, rows = first_table((root / path).read_text(encoding="utf-8"))
        lines.append(f"- {path}" + (f": {title}" if title else ""))
        lines += [f"    {line}" for line in table_lines(rows)] if rows else []
    return "\n".join(lines)


if __name__ == "__main__":
    raise SystemExit(main())
