"""Are two pipeline runs from two fresh clones the same bytes? (issue 11, section 3)

    python benchmarks/reproducibility.py [STAGE ...] [--repo .] [--rev HEAD] [--keep]
    python benchmarks/reproducibility.py --isa [--steps 30] [--pinned-only] [--out FILE]

Clones the repository (committed state at ``--rev``) twice into temporary directories, runs
``dvc repro [STAGE ...]`` in each (every stage when none is named; upstream stages run too),
and compares the output hashes that each clone's ``dvc.lock`` records, stage by stage.
Prints one line per stage (``match`` / ``DIFFER`` with the differing outputs) and the
seconds each run took; exits 1 when any stage differs. ``dvc.lock`` hashes metrics files
too, ``cache: false`` or not: a timing in a declared metrics file makes its stage differ.

The runs are sequential, never in parallel: on a shared machine two at once would only
measure the load. Run from the repository root with the project's venv first on PATH.

``--isa`` asks the cross-machine question on one machine (issue 28): the ``bootstrap``
stage's training (``--steps`` steps, after ``make run`` built the corpus) under math-kernel
settings that stand for other x86 machines: this one as it is, twice; an AVX2-only machine
(ATen, oneDNN and MKL capped at AVX2); and a portable pin (ATen's generic kernels, oneDNN at
SSE4.1, MKL's conditional numerical reproducibility ``COMPATIBLE,STRICT``) on this machine
and on the AVX2 stand-in. One line each: the model's md5 and the seconds it took.
``--pinned-only``: the portable pin on this machine alone (a digest to compare with another
machine's, at the stage's full length where ``--steps`` says it). ``--out``: the runs as JSON,
with the machine's description and the commit (``reports/reproducibility/`` holds those the
README quotes).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipelines.kernels import PORTABLE_KERNELS  # noqa: E402


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


#: Math-kernel settings, read when torch loads its libraries (so they are set in a fresh process).
#: An AVX2-only x86 machine, simulated here: ATen's, oneDNN's and MKL's kernels capped at AVX2.
AVX2_MACHINE = {"ATEN_CPU_CAPABILITY": "avx2", "ONEDNN_MAX_CPU_ISA": "AVX2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "MKL_CBWR": "AVX2"}
#: The portable pin (params.yaml ``kernels: portable``): pipelines.kernels.PORTABLE_KERNELS.
PORTABLE = dict(PORTABLE_KERNELS)
KERNEL_VARIABLES = (*AVX2_MACHINE, *PORTABLE)
ISA_RUNS = (
    ("this machine", {}),
    ("this machine, again", {}),
    ("AVX2 machine", AVX2_MACHINE),
    ("portable pin", PORTABLE),
    ("portable pin on the AVX2 machine", {**AVX2_MACHINE, **PORTABLE, "MKL_ENABLE_INSTRUCTIONS": "AVX2"}),
)


@dataclass(frozen=True)
class BootstrapRun:
    """One bootstrap training in a fresh process: the model file's md5, the stage's training
    seconds (``train_s`` of its timings) and the whole process's seconds."""

    md5: str
    train_s: float
    wall_s: float


def small_params(params: dict, steps: int, windows: int = 8, prompts: int = 2, max_new_tokens: int = 8) -> dict:
    """params.yaml ``bootstrap`` cut to ``steps`` training steps and a token evaluation.

    >>> p = small_params({"train": {"steps": 400, "warmup_steps": 40}, "eval": {"windows": 128}}, 30)
    >>> p["train"], p["eval"]
    ({'steps': 30, 'warmup_steps': 3}, {'windows': 8, 'prompts': 2, 'max_new_tokens': 8})
    """
    params = {**params, "train": dict(params["train"]), "eval": dict(params["eval"])}
    params["train"].update(steps=steps, warmup_steps=min(params["train"]["warmup_steps"], steps // 10))
    params["eval"].update(windows=windows, prompts=prompts, max_new_tokens=max_new_tokens)
    return params


def run_bootstrap(repo: Path, params: dict, settings: dict[str, str], workdir: Path, kernels: str = "default",
                  threads: int = 1) -> BootstrapRun:
    """``python -m stages.bootstrap`` of ``repo`` in a fresh process in ``workdir`` (its own
    params.yaml, model and metrics there; relative paths in ``params`` resolve against
    ``workdir``), under the math-kernel ``settings`` and none of the caller's; ``kernels`` and
    ``threads`` are the params.yaml switches (``portable`` sets the pin over ``settings``)."""
    import hashlib
    import json

    workdir.mkdir(parents=True, exist_ok=True)
    params = {**params, "output": str(workdir / "model"), "metrics": str(workdir / "metrics.json")}
    (workdir / "params.yaml").write_text(yaml.safe_dump({"kernels": kernels, "threads": threads, "bootstrap": params}))
    env = {key: value for key, value in os.environ.items() if key not in KERNEL_VARIABLES}
    env.update(settings, PYTHONPATH=str(repo), OMP_WAIT_POLICY="PASSIVE")
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "stages.bootstrap"], cwd=workdir, env=env, capture_output=True, text=True)
    took = time.perf_counter() - started
    if result.returncode != 0:
        raise RuntimeError(f"bootstrap failed in {workdir} under {settings or '(defaults)'}: {result.stderr[-2000:]}")
    md5 = hashlib.md5((workdir / "model" / "model.safetensors").read_bytes()).hexdigest()
    timings = json.loads((workdir / "reports" / "timings" / "bootstrap.json").read_text())
    return BootstrapRun(md5=md5, train_s=timings["train_s"], wall_s=round(took, 2))


def isa_check(repo: Path, steps: int, pinned_only: bool = False, out: Path | None = None) -> int:
    """The bootstrap training under each of :data:`ISA_RUNS` (``pinned_only``: the portable pin
    on this machine alone), written to ``out`` where given; exit 1 when the portable runs differ."""
    import json
    import shutil

    from benchmarks.kernel_fingerprint import machine

    document = yaml.safe_load((repo / "params.yaml").read_text())
    params, threads = document["bootstrap"], document.get("threads", 1)
    if not (repo / params["source"]).is_dir():
        raise SystemExit(f"{params['source']} does not exist: run `dvc repro corpus` (or make run) first")
    params = small_params({**params, "source": str(repo / params["source"])}, steps)
    root = Path(tempfile.mkdtemp(prefix="askflow-isa-"))
    runs: dict[str, BootstrapRun] = {}
    try:
        for index, (name, settings) in enumerate(ISA_RUNS):
            if pinned_only and name != "portable pin":
                continue
            runs[name] = run = run_bootstrap(repo, params, settings, root / f"run{index}", threads=threads)
            print(f"  {name:<34} model {run.md5[:12]}  train {run.train_s:6.1f} s  process {run.wall_s:6.1f} s  "
                  f"{' '.join(f'{k}={v}' for k, v in settings.items()) or '(defaults)'}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if out is not None:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=repo, capture_output=True, text=True).stdout.strip()
        settings = dict(ISA_RUNS)
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(json.dumps({"stage": "bootstrap", "steps": steps, "threads": threads, "commit": commit, "machine": machine(),
                                   "runs": {name: {"model_md5": run.md5, "train_s": run.train_s, "wall_s": run.wall_s,
                                                   "settings": settings[name]} for name, run in runs.items()}}, indent=1) + "\n")
    if pinned_only:
        print(f"bootstrap, {steps} steps, {threads} thread(s), portable pin: model {runs['portable pin'].md5}")
        return 0
    portable = {runs["portable pin"].md5, runs["portable pin on the AVX2 machine"].md5}
    same = runs["this machine"].md5 == runs["this machine, again"].md5
    unpinned = (runs["this machine"].train_s + runs["this machine, again"].train_s) / 2
    print(f"bootstrap, {steps} steps, {threads} thread(s): this machine twice {'same' if same else 'DIFFERENT'}; "
          f"AVX2 machine {'same as' if runs['AVX2 machine'].md5 == runs['this machine'].md5 else 'differs from'} this one; "
          f"portable pin {'same' if len(portable) == 1 else 'DIFFERENT'} on both; "
          f"training time with the pin / without: {runs['portable pin'].train_s / unpinned:.2f}x on this machine, "
          f"{runs['portable pin on the AVX2 machine'].train_s / runs['AVX2 machine'].train_s:.2f}x on the AVX2 one")
    return 0 if len(portable) == 1 else 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("stages", nargs="*", help="stages to reproduce (default: all)")
    parser.add_argument("--repo", type=Path, default=Path("."))
    parser.add_argument("--rev", default="HEAD")
    parser.add_argument("--keep", action="store_true", help="keep the clones (their paths are printed)")
    parser.add_argument("--isa", action="store_true", help="bootstrap training under math-kernel settings of other machines")
    parser.add_argument("--steps", type=int, default=30, help="with --isa: training steps")
    parser.add_argument("--pinned-only", action="store_true", help="with --isa: the portable pin on this machine only")
    parser.add_argument("--out", type=Path, help="with --isa: write the runs as JSON")
    args = parser.parse_args()
    repo = args.repo.resolve()
    if args.isa:
        return isa_check(repo, args.steps, args.pinned_only, args.out)
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
