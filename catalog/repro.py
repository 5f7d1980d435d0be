"""``dvc repro`` of the whole pipeline, every stage of ``dvc.yaml``: the DVC side of ``make run``
(whose entry point, :mod:`stages.run`, adds the stages' shared Prefect server and run log).

Every stage's inputs are in the repository (issue 30: τ-bench and the real MultiWOZ val
dialogues and database are vendored under ``vendor/``), so no stage is left out on a machine
without ``../shared``; :func:`outside_dependencies` lists any dependency that is not
(``tests/test_vendored_data.py`` checks there is none). A dependency that is missing fails
the run with DVC's message naming it.

    python -m stages.run [dvc repro options]   # what `make run` runs

Without dvc repro options it runs the out-of-date stages side by side, ``--jobs N`` at a time
(default: one per CPU core; every stage computes on ``threads`` CPU threads, params.yaml, 1 by
default), each as ``dvc repro --single-item <stage>`` once every stage it depends on has
finished, the longest remaining chain first (:func:`schedule`). DVC releases its repository
lock while a stage's command runs (``--wait-for-lock``: the next one waits for it), so DVC
itself checks, runs and records each stage, and ``dvc.lock`` is what a serial ``dvc repro``
writes. Each line a stage prints is prefixed with its name. With options (targets,
``--force``, ...) or ``--jobs 1`` it is one ``dvc repro`` with them.

At the end it prints a summary: the total wall time, each stage that ran with its wall time
(each stage prints ``[stage <name>] start`` / ``done in ...`` itself, see ``stages.entry``),
and the headline rows of every results table under ``reports/`` with the
report's path. The times are printed only, never written into a report.

A stage that fails, or a run stopped with Ctrl-C or SIGTERM, leaves the last good outputs:
DVC deletes a stage's outs before running it, and :func:`repro_keeping_outputs` (also what
the retrain flow runs) puts back those of every stage that did not finish, and says so
(``restored the last good outputs of <stage>: <paths>``, or which could not be). The exit
status stays the failure's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
from pathlib import Path
from typing import Any, Callable, Sequence



def outside_dependencies(root: Path) -> dict[str, list[str]]:
    """Stage -> its dependencies outside the repository (params interpolated), for every stage
    that has one: none in askflow's own pipeline, which needs nothing beside the project."""
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        found = {_name(stage, root): [dep.def_path for dep in stage.deps if not dep.is_in_repo] for stage in repo.index.stages}
    return {stage: deps for stage, deps in sorted(found.items()) if deps}


def _name(stage, root: Path) -> str:
    """The stage's name for ``dvc repro`` run in ``root`` (DVC's own is relative to the cwd)."""
    dvcfile = os.path.relpath(stage.path, root)
    return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"


# --- dvc repro that keeps the last good outputs ------------------------------------------------
#
# DVC deletes a stage's outs just before it runs the stage's command, so a stage that fails or
# is killed leaves nothing where its last good outputs were. Before the run every stage's outs
# are hashed (DVC's own hashes, kept in its state database, which `dvc repro` then reuses) and
# the outs that DVC does not cache (`cache: false`: metrics, plots, reports) are copied aside.
# After a failed, interrupted or terminated run, every out the run changed whose stage did not
# finish (the out is not what dvc.lock now records for it) is put back: a cached one with
# `dvc checkout` from DVC's cache (dvc.lock keeps the failed stage's last good hashes), an
# uncached one from its copy. A stage that finished keeps its new outputs, one that never
# started was not touched.


@dataclasses.dataclass
class _Out:
    stage: str
    path: str  # relative to the project root
    cached: bool
    hash: str | None  # DVC's hash of what was there before the run; None: nothing was
    good: bool  # what was there is what dvc.lock records: the output of the stage's last good run
    copy: Path | None = None  # where an uncached out was copied before the run


@dataclasses.dataclass
class ReproResult:
    returncode: int
    restored: dict[str, list[str]]  # stage -> outs put back as they were before the run
    lost: dict[str, list[str]]  # stage -> "<out> (why)" for each out the run changed that could not be put back
    notes: list[str]  # what was said about them, one line each


def _stage_outs(repo, root: Path):
    """(stage name, DVC output) for every out of every stage with a command, as dvc.lock has it."""
    for stage in repo.index.stages:
        if not getattr(stage, "cmd", None):  # `dvc add`/import stages: repro does not delete them
            continue
        for out in stage.outs:
            if not out.persist:  # `persist: true`: DVC keeps it, the stage updates it in place
                yield _name(stage, root), out


def _hash(out) -> str | None:
    if not out.exists:
        return None
    return out.get_hash().value


def snapshot_outputs(root: Path, store: Path) -> list[_Out]:
    """Every stage's outs as they are before a run; the uncached ones copied into ``store``."""
    from dvc.repo import Repo

    outs = []
    with Repo(str(root)) as repo:
        for stage, out in _stage_outs(repo, root):
            path = os.path.relpath(out.fs_path, root)
            current = _hash(out)
            entry = _Out(stage, path, bool(out.use_cache), current, current is not None and current == out.hash_info.value)
            if current is not None and not entry.cached:
                entry.copy = store / str(len(outs))
                _copy(root / path, entry.copy)
            outs.append(entry)
    return outs


def _copy(source: Path, target: Path) -> None:
    if source.is_dir():
        shutil.copytree(source, target, symlinks=True)
    else:
        shutil.copy2(source, target)


def _remove(path: Path) -> None:
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()


def restore_outputs(root: Path, before: Sequence[_Out]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """Put back the outs a failed run changed (see above): stage -> restored paths, and stage
    -> "<path> (why)" for those that could not be: not what dvc.lock records (no good run made
    them), or not in DVC's cache. Holds DVC's repository lock (``dvc.lock.LockError`` when
    another DVC process has it: that process's run is changing the outs, nothing is touched)."""
    from dvc.exceptions import DvcException
    from dvc.repo import Repo, lock_repo

    by_path = {b.path: b for b in before}
    restored: dict[str, list[str]] = {}
    lost: dict[str, list[str]] = {}
    to_checkout: list[tuple[_Out, Any]] = []  # (before, the out now)
    with Repo(str(root)) as repo, lock_repo(repo):
        for stage, out in _stage_outs(repo, root):  # dvc.lock as the run left it
            path = os.path.relpath(out.fs_path, root)
            old = by_path.get(path)
            if old is None or old.hash is None:  # nothing was there before the run
                continue
            now = _hash(out)
            if now == old.hash or (now is not None and now == out.hash_info.value):
                continue  # untouched (never started), or the stage finished and dvc.lock records its new outs
            if old.copy is not None:  # uncached: its copy
                _remove(root / path)
                (root / path).parent.mkdir(parents=True, exist_ok=True)
                _copy(old.copy, root / path)
                restored.setdefault(stage, []).append(path)
            elif old.good and out.hash_info.value == old.hash:  # cached, and dvc.lock still has it
                to_checkout.append((old, out))
            else:
                lost.setdefault(stage, []).append(f"{path} (not as dvc.lock records it: no good run made it)")
        if to_checkout:
            try:
                # By stage, its dvc.yaml's absolute path: an out's path fails when it is gone, and
                # a relative one would be taken from this process's working directory.
                stages = sorted({f"{out.stage.path}:{out.stage.name}" for _, out in to_checkout})
                repo.checkout(targets=stages, force=True)
            except DvcException:  # e.g. not in the cache: found out below
                pass
            for old, out in to_checkout:  # what is there now, whatever checkout said
                if _hash(out) == old.hash:
                    restored.setdefault(old.stage, []).append(old.path)
                else:
                    lost.setdefault(old.stage, []).append(f"{old.path} (not in DVC's cache)")
    return restored, lost


def stage_environment(env: dict[str, str] | None = None) -> dict[str, str]:
    """The environment dvc and the stage commands it starts get from :func:`repro_keeping_outputs`:
    this process's, this interpreter's bin directory first on PATH, then ``env``."""
    bin_dir = str(Path(sys.executable).parent)
    return {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", **(env or {})}


def repro_keeping_outputs(
    root: Path,
    args: Sequence[str],
    *,
    env: dict[str, str] | None = None,
    on_line: Callable[[str], None] | None = None,
    say: Callable[[str], None] | None = None,
    jobs: int = 1,
) -> ReproResult:
    """``dvc repro *args`` in ``root``, this interpreter's bin directory first on PATH; after a
    failure (a stage failed, the run was interrupted with Ctrl-C or terminated with SIGTERM)
    the outs of the stages that did not finish are put back as they were before the run, and
    ``say`` (default: stderr) gets one line per stage saying which. ``on_line``: dvc's output
    (stdout and stderr) line by line instead of to this process's own. ``jobs`` > 1 and no
    ``args``: the out-of-date stages side by side (:func:`_run_side_by_side`)."""
    from dvc.lock import LockError

    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    full_env = stage_environment(env)
    with tempfile.TemporaryDirectory(prefix="askflow-good-outs-") as store:
        try:
            before = snapshot_outputs(root, Path(store))
        except Exception as error:  # noqa: BLE001 - dvc repro says what is wrong with the project
            say(f"warning: the outputs before the run could not be recorded ({error}); a failed stage's are not restored")
            before = []
        if jobs > 1 and not args:
            returncode, stopped_by = _run_side_by_side(root, jobs, full_env, on_line)
        else:
            returncode, stopped_by = _run_dvc(root, ["repro", *args], full_env, on_line)
        if returncode == 0:
            return ReproResult(0, {}, {}, [])
        if stopped_by is not None:
            returncode = 128 + stopped_by
        try:
            restored, lost = restore_outputs(root, before)
        except LockError:
            restored, lost = {}, {}
            notes = ["nothing restored: another DVC process holds the repository lock and is changing the outputs"]
        else:
            notes = [f"restored the last good outputs of {stage}: {', '.join(sorted(paths))}" for stage, paths in restored.items()]
            notes += [f"could not restore the previous outputs of {stage}: {', '.join(sorted(paths))}" for stage, paths in lost.items()]
            if not notes:
                notes.append("no outputs to restore: the stages that did not finish had none, or left theirs as they were")
    for line in notes:
        say(line)
    return ReproResult(returncode, restored, lost, notes)


def _run_dvc(root: Path, args: Sequence[str], env: dict[str, str], on_line: Callable[[str], None] | None) -> tuple[int, int | None]:
    """Run dvc; on Ctrl-C (the whole process group gets SIGINT: the stage stops, dvc fails it)
    or SIGTERM (passed on to dvc and the stage it runs) wait for dvc to finish failing. The
    exit status, and the signal that stopped the run, if one did."""
    stopped_by: list[int] = []
    pipe = {"stdout": subprocess.PIPE, "stderr": subprocess.STDOUT, "text": True, "errors": "replace", "bufsize": 1} if on_line else {}
    process = subprocess.Popen([sys.executable, "-m", "dvc", *args], cwd=root, env=env, stdin=subprocess.DEVNULL if on_line else None, **pipe)

    def terminate(signum, _frame):
        stopped_by.append(signum)
        _terminate_tree(process.pid)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if in_main else None
    try:
        while True:
            try:
                if on_line:
                    assert process.stdout is not None
                    for raw in process.stdout:
                        if raw.rstrip():
                            on_line(raw.rstrip())
                process.wait()
                break
            except KeyboardInterrupt:  # dvc and its stage got the SIGINT too: wait for them
                stopped_by.append(signal.SIGINT)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
    return process.returncode, (stopped_by[0] if stopped_by else None)


def _terminate_tree(pid: int) -> None:
    """SIGTERM to dvc's children (the stage's command and what it started), then to dvc."""
    import psutil

    try:
        parent = psutil.Process(pid)
        children = parent.children(recursive=True)
    except psutil.NoSuchProcess:
        return
    for process in [*reversed(children), parent]:
        try:
            process.terminate()
        except psutil.NoSuchProcess:
            pass


# --- Stages side by side ----------------------------------------------------------------------


def stage_graph(root: Path) -> tuple[dict[str, set[str]], set[str]]:
    """Stage -> the stages it depends on (every stage with a command, by its ``dvc repro``
    name), and the stages that are out of date now (``dvc status``) with every stage that
    depends on one of them: those a run may have to reproduce."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edge (a, b): a depends on b
        names = {stage: _name(stage, root) for stage in graph.nodes if getattr(stage, "cmd", None)}
        needs = {names[s]: {names[d] for d in graph.successors(s) if d in names} for s in names}
        status = repo.status()
        changed = [s for s in names if s.addressing in status or names[s] in status]
        stale = {names[u] for s in changed for u in nx.ancestors(graph, s) | {s} if u in names}
    return needs, stale


def schedule(needs: dict[str, set[str]], todo: set[str], done: set[str], running: set[str],
             estimate: Callable[[str], float]) -> list[str]:
    """The stages of ``todo`` that may start now (every stage they depend on is ``done``, or
    neither to do nor ``running``: up to date), the one with the longest chain of remaining
    work after it first: it decides when the run ends.

    >>> needs = {"a": set(), "b": {"a"}, "c": set(), "d": {"b"}}
    >>> schedule(needs, {"a", "b", "c", "d"}, set(), set(), lambda s: 1.0)
    ['a', 'c']
    >>> schedule(needs, {"b", "c", "d"}, {"a"}, {"c"}, lambda s: 1.0)
    ['b']
    """
    users: dict[str, set[str]] = {s: set() for s in needs}
    for stage, deps in needs.items():
        for dep in deps:
            users.setdefault(dep, set()).add(stage)
    chain: dict[str, float] = {}

    def length(stage: str) -> float:
        if stage not in chain:
            chain[stage] = estimate(stage) + max((length(u) for u in users.get(stage, ()) if u in todo), default=0.0)
        return chain[stage]

    waiting = todo | running  # a stage in neither needs no run: up to date
    ready = [s for s in todo - running - done if all(d in done or d not in waiting for d in needs.get(s, ()))]
    return sorted(ready, key=lambda s: (-length(s), s))


#: Each stage's wall time in a ``make run`` of the default profile on a fresh clone (2 cores),
#: for the scheduling order on a machine that has not run the stages yet.
MEASURED_SECONDS = Path(__file__).with_name("stage_seconds.json")
#: This machine's own: each stage's wall time in the latest ``make run`` that ran it.
LAST_SECONDS = Path("reports") / "timings" / "stages.json"


def _estimate(root: Path) -> Callable[[str], float]:
    """A stage's expected wall time, for the scheduling order only: this machine's last run
    of it (:data:`LAST_SECONDS`), else the committed measurement (:data:`MEASURED_SECONDS`),
    else a minute."""
    known = {**_seconds(MEASURED_SECONDS), **_seconds(root / LAST_SECONDS)}
    return lambda stage: known.get(stage, 60.0)


def _seconds(path: Path) -> dict[str, float]:
    try:
        table = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    if not isinstance(table, dict):
        return {}
    return {str(k): float(v) for k, v in table.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def record_seconds(root: Path, runs: Sequence[dict[str, Any]]) -> None:
    """Adds the wall time of each stage that finished in this run to :data:`LAST_SECONDS`
    (outside every hashed output: reports/timings/ is in no stage's outs)."""
    finished = {r["stage"]: float(r["wall_s"]) for r in runs
                if r.get("status") == "done" and isinstance(r.get("wall_s"), (int, float)) and r.get("stage")}
    if not finished:
        return
    from catalog.io import write_json_atomic

    path = root / LAST_SECONDS
    path.parent.mkdir(parents=True, exist_ok=True)
    table = {**_seconds(path), **{stage: round(seconds, 1) for stage, seconds in finished.items()}}
    write_json_atomic(path, dict(sorted(table.items())))


#: What each ``dvc repro`` says after it changed dvc.lock: once per stage side by side is noise.
DVC_HINTS = frozenset({"To track the changes with git, run:", "git add dvc.lock", "To enable auto staging, run:",
                       "dvc config core.autostage true", "Use `dvc push` to send your updates to remote storage."})


def _run_side_by_side(root: Path, jobs: int, env: dict[str, str],
                      on_line: Callable[[str], None] | None) -> tuple[int, int | None]:
    """Every out-of-date stage (and what depends on it) as ``dvc --wait-for-lock repro
    --single-item <stage>``, at most ``jobs`` at once, each once the stages it depends on have
    finished. After a failure no new stage starts; the running ones finish (their outputs
    are good). Ctrl-C or SIGTERM stops them all. The first failure's exit status, and the
    signal that stopped the run, if one did."""
    try:
        needs, todo = stage_graph(root)
    except Exception:  # noqa: BLE001 - a broken project: dvc repro says what is wrong with it
        return _run_dvc(root, ["repro"], env, on_line)

    def emitter(stream):  # a stage's stdout to ours, its stderr to ours (or both to on_line)
        return on_line or (lambda line: print(line, file=stream, flush=True))

    estimate = _estimate(root)
    lock = threading.Lock()
    running: dict[str, subprocess.Popen] = {}
    done: set[str] = set()
    failed: list[tuple[str, int]] = []
    stopped_by: list[int] = []
    finished = threading.Event()

    def pump(stage: str, pipe, emit) -> None:
        for raw in pipe:
            if raw.rstrip() and raw.strip() not in DVC_HINTS:
                with lock:
                    emit(f"{stage} | {raw.rstrip()}")

    def watch(stage: str, process: subprocess.Popen) -> None:
        readers = [threading.Thread(target=pump, args=(stage, pipe, emitter(stream)), daemon=True)
                   for pipe, stream in ((process.stdout, sys.stdout), (process.stderr, sys.stderr))]
        for reader in readers:
            reader.start()
        for reader in readers:
            reader.join()
        process.wait()
        with lock:
            del running[stage]
            if process.returncode == 0:
                done.add(stage)
            else:
                failed.append((stage, process.returncode))
        finished.set()

    def terminate(signum, _frame):
        stopped_by.append(signum)
        for process in list(running.values()):
            _terminate_tree(process.pid)

    in_main = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGTERM, terminate) if in_main else None
    threads: list[threading.Thread] = []
    try:
        while True:
            try:
                with lock:
                    if not failed and not stopped_by:
                        for stage in schedule(needs, todo, done, set(running), estimate)[: jobs - len(running)]:
                            process = subprocess.Popen(
                                [sys.executable, "-m", "dvc", "--wait-for-lock", "repro", "--single-item", stage],
                                cwd=root, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True, errors="replace", bufsize=1)
                            running[stage] = process
                            todo.discard(stage)
                            thread = threading.Thread(target=watch, args=(stage, process), daemon=True)
                            thread.start()
                            threads.append(thread)
                    if not running and (failed or stopped_by or not todo
                                        or not schedule(needs, todo, done, set(), estimate)):
                        break
                finished.wait(timeout=1.0)
                finished.clear()
            except KeyboardInterrupt:  # the stages got the SIGINT too: wait for them to fail
                stopped_by.append(signal.SIGINT)
    finally:
        if in_main:
            signal.signal(signal.SIGTERM, previous)
        for thread in threads:
            thread.join()
    if failed:
        return failed[0][1], (stopped_by[0] if stopped_by else None)
    return (1 if stopped_by else 0), (stopped_by[0] if stopped_by else None)


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


def summary(root: Path, runs: Sequence[dict[str, Any]], notes: Sequence[str], wall_s: float, returncode: int) -> str:
    """What ``make run`` prints at the end: the total time, the stages that ran (with their
    wall time) or that nothing did, ``notes`` (outputs restored after a failure), and each
    report's headline rows."""
    from pipelines.progress import format_duration

    outcome = "done" if returncode == 0 else f"failed (exit {returncode})"
    lines = ["", f"== make run: {outcome} in {format_duration(wall_s)} =="]
    if runs:
        ran = ", ".join(f"{r['stage']} {format_duration(r['wall_s'])}" + ("" if r.get("status") == "done" else " (failed)") for r in runs)
        lines += textwrap.wrap(f"{len(runs)} stage(s) ran: {ran}", MAX_WIDTH, subsequent_indent="  ", break_on_hyphens=False)
    elif returncode == 0:
        lines.append("no stage ran: every output was up to date")
    lines += notes
    lines += results_lines(root)
    return "\n".join(lines)


def results_lines(root: Path, reports: Sequence[str] | None = None) -> list[str]:
    """The summary's results part: each report's title and headline rows (also the README's
    "What the run produces" block, ``catalog/readme.py``); ``reports``: these markdown reports
    (paths under ``root``) instead of the default run's."""
    reports = report_paths(root) if reports is None else list(reports)
    lines = ["results (`dvc metrics show` lists every number):"] if reports else []
    for path in reports:
        title, rows = first_table((root / path).read_text(encoding="utf-8"))
        lines.append(f"- {path}" + (f": {title}" if title else ""))
        lines += [f"    {line}" for line in table_lines(rows)] if rows else []
    return lines
