#!/usr/bin/env python3
"""The entry script of an askflow GPU job (``run.py`` at the job's root): standard library only.

A job directory (written by ``askflow gpu pack``) holds ``manifest.json`` and ``files/``:
every file with its size and sha256, large ones possibly cut into parts
(``<name>.part000``, ...) of at most ``--split-mib`` MiB for a transfer channel with a size
limit. On the node this script, before anything else runs:

1. reassembles every split file from its parts, checking each part's and then the whole
   file's sha256 (a missing, short or corrupt part is an error naming it; nothing
   half-written is left: a file is written under a temporary name and renamed when whole);
2. unpacks the project's code (``git archive`` of the commit the manifest names), its inputs
   and the Python packages the node lacks into ``work/`` (again from a temporary directory,
   renamed when complete; an unpacked tree from an earlier run is reused when its hashes
   match);
3. runs ``python -m flows.gpu`` in the unpacked project with the vendored packages first on
   ``sys.path``, passing the arguments through (``--profile``, ``--smoke``, ``--out``).

It installs nothing and opens no network connection. Exit status: that of the run, or 2
with ``error: ...`` for a bad job. The same file is :mod:`pipelines.gpu.bootstrap` in the
project, where ``askflow gpu pack`` uses its hashing and splitting.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path
from typing import Any, Iterable, Sequence

FORMAT = "askflow-gpu-job/1"
MANIFEST = "manifest.json"
FILES = "files"
WORK = "work"
PART = ".part"
#: Archives unpacked on the node, and where: code and inputs into the project, vendor beside it.
ARCHIVES = {"code.tar.gz": "project", "inputs.tar.gz": "project", "vendor.tar.gz": "vendor"}


class JobError(Exception):
    """A job that cannot run: the message names the file and what is wrong with it."""


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def part_name(name: str, index: int) -> str:
    return f"{name}{PART}{index:03d}"


def split_file(path: Path, part_bytes: int) -> list[dict[str, Any]]:
    """Cut ``path`` into ``<name>.partNNN`` files of at most ``part_bytes`` beside it, remove
    the whole file, and return each part's ``{name, size, sha256}``."""
    if part_bytes < 1:
        raise JobError(f"{path}: part size must be at least 1 byte")
    parts = []
    with open(path, "rb") as source:
        index = 0
        while True:
            block = source.read(part_bytes)
            if not block:
                break
            name = part_name(path.name, index)
            (path.parent / name).write_bytes(block)
            parts.append({"name": name, "size": len(block), "sha256": hashlib.sha256(block).hexdigest()})
            index += 1
    path.unlink()
    return parts


def read_manifest(job: Path) -> dict[str, Any]:
    path = job / MANIFEST
    if not path.is_file():
        raise JobError(f"{path}: missing (not an askflow GPU job directory)")
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise JobError(f"{path}: not valid JSON ({error})") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT:
        raise JobError(f"{path}: field 'format': expected {FORMAT!r}, got {manifest.get('format') if isinstance(manifest, dict) else manifest!r}")
    if not isinstance(manifest.get("files"), dict) or not manifest["files"]:
        raise JobError(f"{path}: field 'files': expected a non-empty mapping of file name -> size and sha256")
    return manifest


def _check(path: Path, size: int, digest: str, what: str) -> None:
    if not path.is_file():
        raise JobError(f"{path}: missing ({what})")
    actual_size = path.stat().st_size
    if actual_size != size:
        raise JobError(f"{path}: {actual_size} bytes, the manifest says {size} ({what}: truncated or replaced)")
    actual = sha256_file(path)
    if actual != digest:
        raise JobError(f"{path}: sha256 {actual} does not match the manifest's {digest} ({what}: corrupt)")


def reassemble(job: Path, manifest: dict[str, Any]) -> None:
    """Every file of the manifest present and whole: split files joined from their parts
    (each part checked first), every file's sha256 checked. The parts stay (a rerun checks
    them again); a joined file is renamed into place only once complete and correct."""
    files = job / FILES
    for name, entry in sorted(manifest["files"].items()):
        target = files / name
        parts = entry.get("parts")
        if parts and not (target.is_file() and target.stat().st_size == entry["size"] and sha256_file(target) == entry["sha256"]):
            for part in parts:
                _check(files / part["name"], part["size"], part["sha256"], f"part of {name}")
            temporary = target.with_name(f".{target.name}.joining")
            with open(temporary, "wb") as out:
                for part in parts:
                    with open(files / part["name"], "rb") as source:
                        shutil.copyfileobj(source, out, 1 << 20)
            if sha256_file(temporary) != entry["sha256"]:
                temporary.unlink()
                raise JobError(f"{target}: the joined parts do not give the manifest's sha256 {entry['sha256']}")
            os.replace(temporary, target)
        _check(target, entry["size"], entry["sha256"], "job file")


def _safe_members(archive: tarfile.TarFile, source: Path) -> Iterable[tarfile.TarInfo]:
    for member in archive.getmembers():
        name = Path(member.name)
        if name.is_absolute() or ".." in name.parts or not (member.isfile() or member.isdir()):
            raise JobError(f"{source}: member {member.name!r} is not a plain file inside the archive")
        yield member


def unpack(job: Path, manifest: dict[str, Any]) -> dict[str, Path]:
    """The code, inputs and vendored packages unpacked under ``work/`` (reused when the
    archives' hashes are those it was unpacked from); returns ``{"project", "vendor"}``."""
    work = job / WORK
    stamp = hashlib.sha256(json.dumps({n: manifest["files"][n]["sha256"] for n in ARCHIVES if n in manifest["files"]},
                                      sort_keys=True).encode()).hexdigest()
    places = {"project": work / "project", "vendor": work / "vendor"}
    marker = work / ".unpacked"
    if marker.is_file() and marker.read_text() == stamp and all(p.is_dir() for p in places.values()):
        return places
    temporary = work.with_name(f".{WORK}.unpacking")
    shutil.rmtree(temporary, ignore_errors=True)
    for name, place in ARCHIVES.items():
        (temporary / place).mkdir(parents=True, exist_ok=True)
        if name not in manifest["files"]:
            continue
        source = job / FILES / name
        with tarfile.open(source, "r:gz") as archive:
            archive.extractall(temporary / place, members=list(_safe_members(archive, source)))
    (temporary / ".unpacked").write_text(stamp)
    shutil.rmtree(work, ignore_errors=True)
    os.replace(temporary, work)
    return places


def check_code(job: Path, manifest: dict[str, Any]) -> None:
    """The code archive is ``git archive`` of the commit the manifest names: the sha256 of its
    uncompressed tar is the manifest's ``code_tar_sha256`` (what ``askflow gpu import``
    recomputes from that commit)."""
    import gzip

    path = job / FILES / "code.tar.gz"
    digest = hashlib.sha256()
    with gzip.open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    if digest.hexdigest() != manifest.get("code_tar_sha256"):
        raise JobError(f"{path}: its code hashes to {digest.hexdigest()[:16]}, not the manifest's code_tar_sha256 "
                       f"{str(manifest.get('code_tar_sha256'))[:16]} of commit {manifest.get('commit')}")


def prepare(job: Path) -> tuple[dict[str, Any], dict[str, Path]]:
    """Check and unpack ``job``; its manifest and where the project and the vendored packages are."""
    manifest = read_manifest(job)
    reassemble(job, manifest)
    check_code(job, manifest)
    return manifest, unpack(job, manifest)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="run.py", description="Check, unpack and run an askflow GPU job (offline).")
    parser.add_argument("--job", type=Path, default=Path(__file__).resolve().parent, help="job directory (default: this script's)")
    parser.add_argument("--check-only", action="store_true", help="check and unpack, run nothing")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: JOB/results)")
    args, passed = parser.parse_known_args(argv)
    job = args.job.resolve()
    if args.out is not None:  # the job runs in the unpacked project: a relative path is the caller's
        passed = [*passed, "--out", str(args.out.resolve())]
    try:
        manifest, places = prepare(job)
    except (JobError, tarfile.TarError, OSError, EOFError) as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    print(f"askflow gpu job: {len(manifest['files'])} files checked (sha256), askflow {manifest.get('commit', '?')[:12]}", flush=True)
    if args.check_only:
        return 0
    env = dict(os.environ)
    # The vendored packages first: they are the versions the job was packed with, for the
    # node's Python; on another Python (a smoke run where it was packed) the installed ones.
    python = f"{sys.version_info.major}.{sys.version_info.minor}"
    vendor = [str(places["vendor"])]
    if manifest.get("vendor", {}).get("python") != python:
        print(f"note: the job's packages are for Python {manifest.get('vendor', {}).get('python')}, this is {python}: "
              "using the packages installed here", flush=True)
        vendor = []
    env["PYTHONPATH"] = os.pathsep.join([*vendor, str(places["project"]), *filter(None, [env.get("PYTHONPATH")])])
    env.setdefault("HF_HUB_OFFLINE", "1")
    env.setdefault("HF_DATASETS_OFFLINE", "1")
    env.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    command = [sys.executable, "-m", "flows.gpu", "--job", str(job), *passed]
    return subprocess.call(command, cwd=places["project"], env=env)


if __name__ == "__main__":
    sys.exit(main())
