"""Scheduled retraining: its settings, and the record of which versions produced what.

A retraining run (``flows/retrain.py``) runs ``dvc repro`` and then writes one record:
the project's git commit (and whether tracked files differed from it), the hash of
params.yaml, the md5 of every stage's outs as dvc.lock has them (data and models), and
the evaluation scores. Everything here is pure (the readers of git, params.yaml and dvc.lock
are :mod:`catalog.retrain`'s), so the record and its Markdown rendering can be tested
without running anything.

params.yaml ``retrain``::

    retrain:
      deployment: askflow-retrain            # Prefect deployment name
      schedule: {cron: "0 3 * * 1", timezone: UTC}
      work_pool: askflow                     # a process work pool; `askflow ui --worker` polls it
      targets: []                            # dvc repro targets; [] = the whole pipeline
      metrics: reports/eval.json             # scores embedded in the record, when present
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

from pipelines.config import from_params
from pipelines.errors import ConfigError

SECTION = "retrain"
DEFAULT_METRICS = "reports/eval.json"
RECORD_DIR = "reports/retrain"
HISTORY = "history.jsonl"

# Prefect's rule for deployment and work pool names (no slashes, no percent signs), kept
# stricter here so the names also work unquoted in a shell command.
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# --- Settings --------------------------------------------------------------------------------


@dataclass(frozen=True)
class RetrainConfig:
    """params.yaml ``retrain`` (the module's docstring), read by :func:`retrain_config`."""

    deployment: str
    work_pool: str
    schedule: Any  # {cron, timezone}: checked by retrain_config
    targets: tuple[str, ...] = ()
    metrics: str = DEFAULT_METRICS

    @property
    def cron(self) -> str:
        return self.schedule["cron"]

    @property
    def timezone(self) -> str:
        return self.schedule["timezone"]


def retrain_config(section: Mapping[str, Any], where: str = "params.yaml: retrain") -> RetrainConfig:
    """The ``retrain`` section, checked; ConfigError naming the field otherwise."""
    config = from_params(RetrainConfig, section, where)
    schedule = config.schedule
    if not isinstance(schedule, Mapping):
        raise ConfigError(f"{where}.schedule: expected a mapping such as {{cron: \"0 3 * * 1\", timezone: UTC}}, got {schedule!r}")
    unknown = sorted(set(schedule) - {"cron", "timezone"})
    if unknown:
        raise ConfigError(f"{where}.schedule: unknown key(s) {unknown}; allowed: ['cron', 'timezone']")
    if not all(target.strip() for target in config.targets):
        raise ConfigError(f"{where}.targets: expected a list of stage names, got {list(config.targets)!r}")
    if not config.metrics:
        raise ConfigError(f"{where}.metrics: expected a path, got {config.metrics!r}")
    return replace(
        config,
        deployment=_name(config.deployment, f"{where}.deployment"),
        work_pool=_name(config.work_pool, f"{where}.work_pool"),
        schedule={"cron": check_cron(schedule.get("cron"), f"{where}.schedule.cron"),
                  "timezone": check_timezone(schedule.get("timezone", "UTC"), f"{where}.schedule.timezone")},
    )


def check_cron(value: Any, where: str) -> str:
    """A five-field cron string the Prefect server accepts."""
    # Prefect's own validator, so that what passes here is what the server schedules.
    from prefect._internal.schemas.validators import validate_cron_string

    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a cron string such as \"0 3 * * 1\", got {value!r}")
    if len(value.split()) != 5:
        raise ConfigError(f"{where}: {value!r} is not a cron string: expected 5 fields (minute hour day month weekday)")
    try:
        return validate_cron_string(value.strip())
    except ValueError as error:
        raise ConfigError(f"{where}: {error}") from None


def check_timezone(value: Any, where: str) -> str:
    from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

    if not isinstance(value, str) or not value:
        raise ConfigError(f"{where}: expected an IANA time zone such as UTC or Europe/Berlin, got {value!r}")
    try:
        ZoneInfo(value)
    except (ZoneInfoNotFoundError, ValueError):
        raise ConfigError(f"{where}: unknown time zone {value!r} (expected an IANA name such as UTC or Europe/Berlin)") from None
    return value


def _name(value: Any, where: str) -> str:
    if not isinstance(value, str) or not _NAME.match(value):
        raise ConfigError(f"{where}: expected a name of letters, digits, '-', '_' or '.', got {value!r}")
    return value


# --- The record ------------------------------------------------------------------------------


def stage_outs(lock: Mapping[str, Any] | None) -> dict[str, dict[str, str]]:
    """Stage -> out path -> md5 (``<hash>.dir`` for a directory), from a parsed dvc.lock."""
    stages = (lock or {}).get("stages") or {}
    outs: dict[str, dict[str, str]] = {}
    for stage, entry in stages.items():
        outs[stage] = {
            str(out["path"]): str(out.get("md5") or "")
            for out in (entry or {}).get("outs") or []
            if isinstance(out, Mapping) and "path" in out
        }
    return outs


_RUNNING = re.compile(r"^Running stage '([^']+)'")


def stages_run(lines: Iterable[str]) -> list[str]:
    """The stages ``dvc repro`` ran (not the ones it skipped as unchanged), in order."""
    return [m.group(1) for line in lines if (m := _RUNNING.match(line.strip()))]


def build_record(
    *,
    run: Mapping[str, Any],
    project: Path,
    command: Sequence[str],
    git: Mapping[str, Any],
    params_sha256: str | None,
    lock_md5: str | None,
    outs_before: Mapping[str, Mapping[str, str]],
    outs_after: Mapping[str, Mapping[str, str]],
    ran: Sequence[str],
    metrics_path: str,
    metrics: Any,
) -> dict[str, Any]:
    """One retraining run as a JSON-ready mapping. ``git`` is taken before ``dvc repro``
    (which rewrites dvc.lock, a tracked file): the code and params the run started from."""
    stages = {
        stage: {
            "outs": dict(outs),
            "changed": sorted(path for path, md5 in outs.items() if outs_before.get(stage, {}).get(path) != md5),
            "ran": stage in ran,
        }
        for stage, outs in outs_after.items()
    }
    return {
        "run": dict(run),
        "project": str(project),
        "command": list(command),
        "git": dict(git),
        "params": {"path": "params.yaml", "sha256": params_sha256},
        "dvc_lock": {"path": "dvc.lock", "md5": lock_md5},
        "stages": stages,
        "metrics": {"path": metrics_path, "values": metrics} if metrics is not None else None,
    }


def record_name(started: str, run_id: str | None) -> str:
    """A file stem that sorts by time: ``20250106T030000Z-1a2b3c4d``."""
    stamp = re.sub(r"[^0-9T]", "", started.split(".")[0].split("+")[0]) + "Z"
    return f"{stamp}-{(run_id or 'local')[:8]}"


def markdown_report(record: Mapping[str, Any], record_path: str | None = None) -> str:
    """The record as the Markdown of a Prefect artifact: versions, outs, scores."""
    git = record.get("git") or {}
    commit = git.get("commit")
    commit_text = f"`{commit[:12]}`" if commit else "not a git repository"
    if commit and git.get("dirty"):
        commit_text += f" + uncommitted changes ({', '.join(git.get('modified', [])[:5])})"
    params = (record.get("params") or {}).get("sha256")
    run = record.get("run") or {}
    stages = record.get("stages") or {}
    ran = [stage for stage, info in stages.items() if info.get("ran")]
    lines = [
        f"# Retraining run {run.get('name') or ''}".rstrip(),
        "",
        "| | |",
        "|---|---|",
        f"| git commit | {commit_text} |",
        f"| params.yaml | sha256 `{params[:16] if params else 'missing'}` |",
        f"| dvc.lock | md5 `{(record.get('dvc_lock') or {}).get('md5') or 'missing'}` |",
        f"| command | `{' '.join(record.get('command') or [])}` |",
        f"| stages run | {', '.join(ran) or 'none (all up to date)'} |",
    ]
    if record_path:
        lines.append(f"| record | `{record_path}` |")
    lines += ["", "## Outputs (dvc.lock)", "", "| stage | out | md5 | |", "|---|---|---|---|"]
    for stage, info in stages.items():
        for path, md5 in info.get("outs", {}).items():
            mark = "changed" if path in info.get("changed", ()) else ""
            lines.append(f"| {stage} | `{path}` | `{md5}` | {mark} |")
    metrics = record.get("metrics")
    if metrics is None:
        lines += ["", "## Scores", "", "No evaluation metrics yet."]
    else:
        lines += ["", f"## Scores (`{metrics['path']}`)", "", "| metric | value |", "|---|---|"]
        lines += [f"| {key} | {_cell(value)} |" for key, value in flatten(metrics["values"])]
    return "\n".join(lines) + "\n"


def flatten(value: Any, prefix: str = "") -> list[tuple[str, Any]]:
    """Dotted key -> leaf for nested mappings; no schema assumed, lists stay whole."""
    if isinstance(value, Mapping):
        items: list[tuple[str, Any]] = []
        for key, item in value.items():
            items += flatten(item, f"{prefix}.{key}" if prefix else str(key))
        return items
    return [(prefix or "value", value)]


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text.replace("|", "\\|").replace("\n", " ")
