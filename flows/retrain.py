"""Prefect flow ``retrain``: run the DVC pipeline and record which versions produced what.

    record versions -> dvc repro (output streamed to the run log) -> collect results
      -> write record (reports/retrain/<time>-<run>.json, reports/retrain/history.jsonl)
      -> publish artifact (Markdown: versions, stage -> out -> md5, scores)

``dvc repro`` runs in the project directory with this interpreter's bin directory first on
PATH: the stages run ``python -m stages.<name>`` and must get the same environment. It is
retried only when another DVC process holds the repository lock; a stage that fails fails
the same way again, and fails the flow run with the tail of DVC's output; the stages that did
not finish get their last good outputs back (``catalog.repro.repro_keeping_outputs``), and the
run log and the failure say which.

Scheduled runs: ``askflow deploy`` creates the deployment (cron from params.yaml
``retrain``) and ``askflow ui --worker`` starts the server, the UI and a worker that
executes the runs; see the README. Run once by hand: ``python -m flows.retrain [targets]``.
"""

from __future__ import annotations

import collections
import json
import os
import shutil
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from pipelines.errors import AskflowError, ConfigError
from catalog.retrain import file_md5, file_sha256, git_version, read_lock
from pipelines.retrain import (
    DEFAULT_METRICS,
    HISTORY,
    RECORD_DIR,
    RetrainConfig,
    build_record,
    markdown_report,
    record_name,
    stage_outs,
    stages_run,
)
from catalog.io import read_json, write_json_atomic
from catalog.repro import repro_keeping_outputs

REPO = Path(__file__).resolve().parents[1]
ARTIFACT_KEY = "askflow-retrain"
TAIL_LINES = 30
# DVC's message when another dvc process (a manual `dvc repro`, an overlapping run) holds the lock.
_LOCKED = "Unable to acquire lock"


class ReproFailed(AskflowError):
    """``dvc repro`` exited non-zero; the message ends with the tail of its output."""

    def __init__(self, command: Sequence[str], root: Path, returncode: int, tail: Sequence[str]):
        self.returncode = returncode
        self.locked = any(_LOCKED in line for line in tail)
        super().__init__(
            f"`{' '.join(command)}` failed with exit status {returncode} in {root}; last lines of its output:\n"
            + "\n".join(tail)
        )


def _retry_when_locked(task: Any, task_run: Any, state: Any) -> bool:
    error = state.data if isinstance(state.data, BaseException) else None
    return isinstance(error, ReproFailed) and error.locked


def _retry_on_os_error(task: Any, task_run: Any, state: Any) -> bool:
    error = state.data if isinstance(state.data, BaseException) else None
    return isinstance(error, OSError)


_TASK = {"cache_policy": NO_CACHE, "persist_result": False}


# --- Tasks -----------------------------------------------------------------------------------


@task(name="record-versions", **_TASK)
def record_versions(root: Path) -> dict[str, Any]:
    """What the run starts from: git commit, params.yaml hash, dvc.lock's outs."""
    versions = {
        "git": git_version(root),
        "params_sha256": file_sha256(root / "params.yaml"),
        "outs": stage_outs(read_lock(root / "dvc.lock")),
    }
    git = versions["git"]
    get_run_logger().info(
        "project %s: commit %s%s, params.yaml sha256 %s",
        root, git["commit"] or f"none ({git.get('error')})", " (uncommitted changes)" if git["dirty"] else "",
        (versions["params_sha256"] or "missing")[:16],
    )
    return versions


@task(name="dvc-repro", retries=2, retry_delay_seconds=30, retry_condition_fn=_retry_when_locked, **_TASK)
def dvc_repro(root: Path, targets: Sequence[str]) -> list[str]:
    """Run ``dvc repro [targets]``, each output line to the run log; its output lines."""
    logger = get_run_logger()
    bin_dir = str(Path(sys.executable).parent)
    dvc = shutil.which("dvc", path=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
    if dvc is None:
        raise ConfigError(f"dvc not found on PATH (looked in {bin_dir} first); install askflow into this environment")
    command = ["dvc", "repro", *targets]
    logger.info("running `%s` in %s", " ".join(command), root)
    lines: list[str] = []
    tail: collections.deque[str] = collections.deque(maxlen=TAIL_LINES)
    started = time.monotonic()

    def on_line(line: str) -> None:
        logger.info("%s", line)
        lines.append(line)
        tail.append(line)

    # A stage that fails leaves its last good outputs: put back from DVC's cache and a copy.
    result = repro_keeping_outputs(root, list(targets), env={"PYTHONUNBUFFERED": "1"}, on_line=on_line, say=logger.warning)
    if result.returncode != 0:
        raise ReproFailed(command, root, result.returncode, [*tail, *result.notes])
    logger.info("`%s` finished in %.1f s", " ".join(command), time.monotonic() - started)
    return lines


@task(name="collect-results", **_TASK)
def collect_results(root: Path, metrics_path: str) -> dict[str, Any]:
    """dvc.lock's outs after the run, and the evaluation scores when the project has them."""
    metrics_file = root / metrics_path
    metrics = None
    if metrics_file.is_file():
        metrics = read_json(metrics_file)  # DataError naming the file when it is not strict JSON
    else:
        get_run_logger().info("no %s yet: the record has no scores", metrics_path)
    return {"outs": stage_outs(read_lock(root / "dvc.lock")), "lock_md5": file_md5(root / "dvc.lock"), "metrics": metrics}


@task(name="write-record", retries=2, retry_delay_seconds=2, retry_condition_fn=_retry_on_os_error, **_TASK)
def write_record(root: Path, record: dict[str, Any]) -> Path:
    """``reports/retrain/<name>.json`` and one more line in ``history.jsonl``."""
    directory = root / RECORD_DIR
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{record_name(record['run']['started'], record['run']['id'])}.json"
    write_json_atomic(path, record)
    # Appended whole in one write: concurrent runs interleave lines, never parts of lines.
    with open(directory / HISTORY, "a", encoding="utf-8") as history:
        history.write(json.dumps(record, ensure_ascii=False, sort_keys=True) + "\n")
    get_run_logger().info("record -> %s", path.relative_to(root))
    return path


# No retries of its own: Prefect's client already retries a refused or failed API request.
@task(name="publish-artifact", **_TASK)
def publish_artifact(record: dict[str, Any], record_path: str) -> None:
    create_markdown_artifact(
        markdown_report(record, record_path), key=ARTIFACT_KEY,
        description="askflow retraining: versions, dvc.lock outs and scores",
    )


# --- Flow ------------------------------------------------------------------------------------


@flow(name="retrain")
def retrain(project_dir: str | None = None, targets: list[str] | None = None, metrics: str = DEFAULT_METRICS) -> dict[str, Any]:
    """Run ``dvc repro`` (``targets``: stage names; none = the whole pipeline) in
    ``project_dir`` (default: this repository) and record which data and params versions
    produced which models and scores."""
    from prefect.runtime import deployment, flow_run

    root = Path(project_dir or REPO).resolve()
    if not (root / "dvc.yaml").is_file():
        raise ConfigError(f"{root}: no dvc.yaml; project_dir must be an askflow project directory")
    started = datetime.now(timezone.utc)
    before = record_versions(root)
    lines = dvc_repro(root, list(targets or []))  # none: the whole pipeline
    after = collect_results(root, metrics)
    finished = datetime.now(timezone.utc)
    run = {
        "id": flow_run.id, "name": flow_run.name, "flow": "retrain", "deployment_id": deployment.id,
        "started": started.isoformat(timespec="seconds"), "finished": finished.isoformat(timespec="seconds"),
        "duration_s": round((finished - started).total_seconds(), 1),
    }
    record = build_record(
        run=run, project=root, command=["dvc", "repro", *(targets or [])], git=before["git"],
        params_sha256=before["params_sha256"], lock_md5=after["lock_md5"], outs_before=before["outs"],
        outs_after=after["outs"], ran=stages_run(lines), metrics_path=metrics, metrics=after["metrics"],
    )
    path = write_record(root, record)
    publish_artifact(record, str(path.relative_to(root)))
    return record


def deployment_parameters(root: Path, config: RetrainConfig) -> dict[str, Any]:
    """The flow parameters a scheduled run gets."""
    return {"project_dir": str(root), "targets": list(config.targets), "metrics": config.metrics}


if __name__ == "__main__":
    retrain(targets=sys.argv[1:])
