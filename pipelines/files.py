"""File-system primitives shared by the stages and the library's savers: staging beside a
target, atomic directory swaps, the user's umask, and removing what a killed process left.

Staging names carry the writer's process id, ``.<target>.askflow-<pid>-<hex>.tmp`` (``.old``
for the previous version during a swap), so that a later run can tell a leftover of a dead
writer (kill -9, power loss) from the work of a writer that is still running, and remove
only the former.
"""

from __future__ import annotations

import os
import re
import shutil
import uuid
from pathlib import Path

_MARK = "askflow"


def current_umask() -> int:
    """The process's umask, read without changing it where Linux allows (thread-safe)."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    except OSError:
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def ordinary_permissions(path: Path | str) -> None:
    """Give ``path`` (and, for a directory, everything under it) the permissions of newly
    created files under the user's umask: mkdtemp and mkstemp make 0700 and 0600, and so
    does the safetensors writer, which a rename would otherwise publish."""
    path = Path(path)
    mask = current_umask()
    if path.is_dir():
        for parent, directories, files in os.walk(path):
            for name in files:
                os.chmod(os.path.join(parent, name), 0o666 & ~mask)
            for name in directories:
                os.chmod(os.path.join(parent, name), 0o777 & ~mask)
        path.chmod(0o777 & ~mask)
    else:
        path.chmod(0o666 & ~mask)


def staging_path(target: Path | str, suffix: str = ".tmp") -> Path:
    """A new hidden name beside ``target`` (same file system, for the rename), marked with
    this process's id."""
    target = Path(target)
    return target.with_name(f".{target.name}.{_MARK}-{os.getpid()}-{uuid.uuid4().hex[:12]}{suffix}")


def staging_directory(target: Path | str) -> Path:
    """A new empty directory beside ``target``, created under the user's umask."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(target)
    staging = staging_path(target)
    staging.mkdir()
    return staging


def replace_directory(staging: Path | str, target: Path | str) -> None:
    """Swap a fully written ``staging`` directory in for ``target`` (a directory, or nothing)
    by renames only: readers see the old directory or the new one, never a half-written mix,
    and at no moment is the old one deleted before the new one is in place. A crash between
    the two renames leaves the old version under a ``.old`` name, which
    :func:`remove_stale_staging` puts back."""
    staging, target = Path(staging), Path(target)
    backup = None
    if target.exists():
        backup = staging_path(target, ".old")
        os.replace(target, backup)
    try:
        os.replace(staging, target)
    except BaseException:
        if backup is not None:
            os.replace(backup, target)
        raise
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)


def remove_stale_staging(target: Path | str) -> list[Path]:
    """Remove the staging files and directories of ``target`` left by writers that no longer
    run; a previous version left mid-swap is restored when ``target`` itself is missing.
    Returns what was removed or restored."""
    target = Path(target)
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.{_MARK}-(\d+)-[0-9a-f]+\.(tmp|old)$")
    try:
        entries = sorted(target.parent.iterdir())
    except OSError:
        return []
    handled = []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or process_alive(int(match.group(1))):
            continue
        if match.group(2) == "old" and not target.exists() and not target.is_symlink():
            os.replace(entry, target)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        handled.append(entry)
    return handled


def process_alive(pid: int) -> bool:
    """Whether a process with this id exists (a zombie counts as gone)."""
    if pid <= 0:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # another user's process
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return True
    return state != "Z"


__all__ = [
    "current_umask",
    "ordinary_permissions",
    "process_alive",
    "remove_stale_staging",
    "replace_directory",
    "staging_directory",
    "staging_path",
]
