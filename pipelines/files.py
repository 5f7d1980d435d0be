"""File-system primitives shared by the stages and the library's savers: staging beside a
target, atomic directory swaps, the artifacts' permissions, and removing what a killed process left.

Artifacts get explicit modes, :data:`FILE_MODE` (0644) and :data:`DIR_MODE` (0755), whatever
the caller's umask: ``umask 000`` must not publish world-writable files into a repository
(and DVC's cache), nor ``umask 077`` files that nobody else can read.

Staging names carry the writer's process id and start time,
``.<target>.askflow-<pid>-<start>-<hex>.tmp`` (``.old`` for the previous version during a
swap), so that a later run can tell a leftover of a dead writer (kill -9, power loss) from
the work of a writer that is still running, and remove only the former; the start time keeps
a recycled process id from passing for the writer.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import uuid
from pathlib import Path

_MARK = "askflow"
#: The mode of every artifact file and directory written here (issue 28 item 6).
FILE_MODE = 0o644
DIR_MODE = 0o755


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
    """Give ``path`` (and, for a directory, everything under it) the artifact modes,
    :data:`FILE_MODE` and :data:`DIR_MODE`, whatever the umask: mkdtemp and mkstemp make 0700
    and 0600, and so does the safetensors writer, which a rename would otherwise publish."""
    path = Path(path)
    if path.is_dir():
        for parent, directories, files in os.walk(path):
            for name in files:
                os.chmod(os.path.join(parent, name), FILE_MODE)
            for name in directories:
                os.chmod(os.path.join(parent, name), DIR_MODE)
        path.chmod(DIR_MODE)
    else:
        path.chmod(FILE_MODE)


def make_directories(path: Path | str) -> None:
    """``path`` and its missing parents, each created with :data:`DIR_MODE` whatever the
    umask (``mkdir(mode=...)`` is masked, so the mode is set after); existing ones are left as they are."""
    path = Path(path)
    missing = []
    while not path.exists():
        missing.append(path)
        if path.parent == path:
            break
        path = path.parent
    for directory in reversed(missing):
        directory.mkdir(exist_ok=True)
        directory.chmod(DIR_MODE)


def staging_path(target: Path | str, suffix: str = ".tmp") -> Path:
    """A new hidden name beside ``target`` (same file system, for the rename), marked with
    this process's id."""
    target = Path(target)
    pid = os.getpid()
    return target.with_name(f".{target.name}.{_MARK}-{pid}-{process_start(pid) or 0}-{uuid.uuid4().hex[:12]}{suffix}")


def staging_directory(target: Path | str) -> Path:
    """A new empty directory beside ``target``, with mode :data:`DIR_MODE`."""
    target = Path(target)
    make_directories(target.parent)
    remove_stale_staging(target)
    staging = staging_path(target)
    staging.mkdir()
    staging.chmod(DIR_MODE)
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
    pattern = re.compile(rf"^\.{re.escape(target.name)}\.{_MARK}-(\d+)-(\d+)-[0-9a-f]+\.(tmp|old)$")
    try:
        entries = sorted(target.parent.iterdir())
    except OSError:
        return []
    handled = []
    for entry in entries:
        match = pattern.match(entry.name)
        if match is None or same_process(int(match.group(1)), int(match.group(2)) or None):
            continue
        if match.group(3) == "old" and not target.exists() and not target.is_symlink():
            os.replace(entry, target)
        elif entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
        else:
            entry.unlink(missing_ok=True)
        handled.append(entry)
    return handled


def remove_stale_temp_staging(directory: Path | str | None = None, prefix: str = "askflow-") -> list[Path]:
    """:func:`remove_stale_staging` for every target named ``<prefix>...`` in ``directory``
    (default: the system's temporary directory), e.g. the trainers' scratch directories
    ``/tmp/.askflow-train-sft.askflow-<pid>-<start>-<hex>.tmp`` that a killed training left."""
    import tempfile

    directory = Path(directory if directory is not None else tempfile.gettempdir())
    pattern = re.compile(rf"^\.({re.escape(prefix)}[\w.-]*?)\.{_MARK}-\d+-\d+-[0-9a-f]+\.(tmp|old)$")
    try:
        targets = sorted({m.group(1) for m in map(pattern.match, os.listdir(directory)) if m})
    except OSError:
        return []
    return [entry for target in targets for entry in remove_stale_staging(directory / target)]


def stop_process(process: subprocess.Popen, timeout_s: float = 10.0) -> None:
    """SIGTERM to a child process, SIGKILL when it has not ended ``timeout_s`` later; reaped."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


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
    fields = _proc_stat(pid)
    return fields is None or fields[0] != "Z"


def process_start(pid: int) -> int | None:
    """The process's start time (clock ticks since boot), or None when unknown."""
    fields = _proc_stat(pid)
    try:
        return int(fields[19]) if fields else None  # field 22 of stat; fields[0] is field 3
    except (IndexError, ValueError):
        return None


def same_process(pid: int, start: int | None) -> bool:
    """Whether ``pid`` is still the process that started at ``start`` (None: liveness alone)."""
    return process_alive(pid) and (start is None or process_start(pid) == start)


def _proc_stat(pid: int) -> list[str] | None:
    """Fields 3 onwards of /proc/<pid>/stat (after the command name), None when unreadable."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None  # gone, or no /proc: liveness alone decides


__all__ = [
    "DIR_MODE",
    "FILE_MODE",
    "current_umask",
    "make_directories",
    "ordinary_permissions",
    "process_alive",
    "process_start",
    "remove_stale_staging",
    "remove_stale_temp_staging",
    "replace_directory",
    "same_process",
    "staging_directory",
    "staging_path",
]
