"""Are two pipeline runs from two fresh clones the same bytes? (issue 11, section 3)

    python benchmarks/reproducibility.py [STAGE ...] [--repo .] [--rev HEAD] [--keep]

Clones the repository (committed state at ``--rev``) twice into temporary directories, runs
``dvc repro [STAGE ...]`` in each (every stage when none is named; upstream stages run too),
and compares the output hashes that each clone's ``dvc.lock`` records, stage by stage.
Prints one line per stage (``match`` / ``DIFFER`` with the differing outputs) and the
seconds each run took; exits 1 when any stage differs. ``dvc.lock`` hashes metrics files
too, ``cache: false`` or not: a timing in a declared metrics file makes its stage differ.

The runs are sequential, never in parallel: on a shared machine two at once would only
measure the load. Run from the repository root with the project's venv first on PATH.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml


def clone(repo: Path, rev: str, target: Path) -> None:
    subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", str(repo), str(target)], check=True)
    subprocess.run(["git", "checkout", "--quiet", rev], cwd=target, check=True)


def repro(project: Path, stages: list[str]) -> tuple[float, list[str]]:
    """Runs ``dvc repro`` in a clone: (seconds it took, stages that ran). Outputs already in
    the lock file are not in the clone's cache, so every named stage (and its upstream) runs."""
    env = dict(os.environ, PYTHONPATH=str(project))
    env.pop("VIRTUAL_ENV", None)
    started = time.perf_counter()
    result = subprocess.run(["dvc", "repro", *stages], cwd=project, env=env, capture_output=True, text=True)
    if result.returncode != 0:
        sys.stderr.write(result.stdout[-4000:] + result.stderr[-4000:])
        raise SystemExit(f"dvc repro failed in {project} (exit {result.returncode})")
    ran = re.findall(r"^Running stage '([^']+)'", result.stdout, flags=re.MULTILINE)
    return time.perf_counter() - started, ran


def out_hashes(project: Path) -> dict[str, dict[str, str]]:
    """stage -> {output path: md5} from the clone's dvc.lock (metrics files included)."""
    lock = yaml.safe_load((project / "dvc.lock").read_text())
    hashes = {}
    for stage, entry in (lock.get("stages") or {}).items():
        hashes[stage] = {out["path"]: out.get("md5", "") for out in entry.get("outs", []) if "md5" in out}
    return hashes


def compare(a: dict[str, dict[str, str]], b: dict[str, dict[str, str]], stages: list[str]) -> dict[str, list[str]]:
    """stage -> the outputs whose hashes differ (empty: the stage matches).

    >>> compare({"s": {"x": "1", "y": "2"}}, {"s": {"x": "1", "y": "3"}}, ["s"])
    {'s': ['y']}
    """
    result = {}
    for stage in stages:
        left, right = a.get(stage, {}), b.get(stage, {})
        result[stage] = sorted(path for path in set(left) | set(right) if left.get(path) != right.get(path))
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="stages to reproduce (default: all)")
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--keep", action="store_true", help="keep the clones (their paths are printed)")
    args = parser.parse_args()
    repo = args.repo.resolve()
    rev = subprocess.run(["git", "rev-parse", args.rev], cwd=repo, check=True, capture_output=True, text=True).stdout.strip()

    root = Path(tempfile.mkdtemp(prefix="askflow-repro-"))
    hashes, seconds, runs = [], [], []
    for name in ("a", "b"):
        project = root / name
        clone(repo, rev, project)
        took, ran = repro(project, args.stages)
        seconds.append(took)
        runs.append(ran)
        hashes.append(out_hashes(project))
    # Only the stages that ran in both clones: the others keep the committed lock entries.
    ran = [stage for stage in runs[0] if stage in runs[1]]
    differ = compare(hashes[0], hashes[1], ran)

    print(f"revision {rev[:12]}; dvc repro {' '.join(args.stages) or '(all)'}: {seconds[0]:.0f} s and {seconds[1]:.0f} s")
    for stage in ran:
        outs = hashes[0].get(stage, {})
        status = "match" if not differ[stage] else "DIFFER " + ", ".join(differ[stage])
        print(f"  {stage:<12} {len(outs)} outputs  {status}")
    if args.keep:
        print(f"clones kept in {root}")
    else:
        import shutil

        shutil.rmtree(root, ignore_errors=True)
    return 1 if any(differ.values()) else 0


if __name__ == "__main__":
    sys.exit(main())
