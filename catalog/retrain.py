"""What a scheduled retraining run reads to record its versions (:mod:`pipelines.retrain`
builds the record from them): git's HEAD, the hashes of params.yaml and dvc.lock, dvc.lock's
stages."""

from __future__ import annotations

import hashlib
import subprocess
from pathlib import Path
from typing import Any

import yaml

from pipelines.errors import ConfigError


def git_version(root: Path) -> dict[str, Any]:
    """HEAD's commit and whether tracked files differ from it. A project outside git (or
    without git installed) still retrains: commit None, with the reason."""
    try:
        head = _git(root, "rev-parse", "HEAD")
        status = _git(root, "status", "--porcelain", "--untracked-files=no")
    except (OSError, subprocess.SubprocessError) as error:  # no git, not a repository, no commit, timeout
        reason = error.stderr.strip() if isinstance(error, subprocess.CalledProcessError) else str(error)
        return {"commit": None, "dirty": None, "modified": [], "error": reason.splitlines()[0] if reason else "git failed"}
    modified = [line[3:] for line in status.splitlines() if line.strip()]
    return {"commit": head.strip(), "dirty": bool(modified), "modified": modified[:50]}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True, timeout=60).stdout


def file_sha256(path: Path) -> str | None:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None


def file_md5(path: Path) -> str | None:
    return hashlib.md5(path.read_bytes()).hexdigest() if path.is_file() else None


def read_lock(path: Path) -> dict[str, Any]:
    """dvc.lock, parsed; empty before the first ``dvc repro``."""
    if not path.is_file():
        return {}
    try:
        lock = yaml.safe_load(path.read_text(encoding="utf-8"))
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if lock is not None and not isinstance(lock, dict):
        raise ConfigError(f"{path}: expected a mapping with 'stages'")
    return lock or {}
