"""The GPU job smoke-run on the node image's package versions, on this CPU, before a lease.

    python benchmarks/gpu_node_dryrun.py [--venv /tmp/askflow-node] [--job /tmp/askflow-node-job] [--profile NAME]

``make test`` smoke-runs the packed job with this project's own environment (transformers,
peft, torch as ``make`` installs them). The node is a bare CUDA image with other versions
(``NODE_IMAGE``: read off the H100 node, ``../shared/notes/gpu-run-2026-11-26.md``) and only
the job's vendored packages on top. This script makes a virtual environment with the image's
versions (torch: this machine's CPU build stands in for the image's CUDA one), packs the job
from the committed tree for its Python (``askflow gpu pack --python``), and runs
``run.py --smoke`` with it in a fresh folder, with nothing else installed: what breaks on the
node's versions (an API that moved, a default that changed) breaks here, not in a lease.
It prints each stage's status and wall time, the versions, and exits non-zero where a stage
failed. Needs the package registry once (the venv is reused).
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The bare image's packages (the H100 node of 2026-11-26; the H200 kind lists the same).
#: torch is the CPU stand-in: the image's 2.11.0+cu130 needs CUDA.
NODE_IMAGE = {"torch": "2.13.0", "transformers": "5.17.0", "peft": "0.21.0", "accelerate": "1.15.0",
              "numpy": None, "pyarrow": None, "pandas": None}


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, text=True, **kwargs)


def node_venv(venv: Path) -> Path:
    """The venv with the image's versions (made once); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        _run([sys.executable, "-m", "venv", str(venv)])
        pins = [name if version is None else f"{name}=={version}" for name, version in NODE_IMAGE.items()]
        _run([str(python), "-m", "pip", "install", "-q", *pins])
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/askflow-node"))
    parser.add_argument("--job", type=Path, default=Path("/tmp/askflow-node-job"))
    parser.add_argument("--profile", default=None, help="params.yaml gpu profile (default: gpu.profile)")
    args = parser.parse_args()

    python = node_venv(args.venv)
    versions = json.loads(_run([str(python), "-c", "import json, sys, importlib.metadata as m; print(json.dumps("
                                "{'python': sys.version.split()[0], **{n: m.version(n) for n in sys.argv[1:]}}))",
                                *NODE_IMAGE], capture_output=True).stdout)
    print("gpu_node_dryrun: node image stand-in:", ", ".join(f"{k} {v}" for k, v in versions.items()))
    shutil.rmtree(args.job, ignore_errors=True)
    node_python = versions["python"].rsplit(".", 1)[0]
    _run([sys.executable, "-m", "stages.cli", "gpu", "pack", str(args.job), "--split-mib", "40", "--python", node_python], cwd=ROOT)
    folder = args.job.parent / f"{args.job.name}-node"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    job = folder / "job"
    shutil.copytree(args.job, job)
    command = [str(python), str(job / "run.py"), "--smoke"] + (["--profile", args.profile] if args.profile else [])
    started = time.perf_counter()
    done = subprocess.run(command, cwd=folder, text=True, capture_output=True)
    wall_s = time.perf_counter() - started
    summary_path = job / "results" / "job.json"
    if not summary_path.is_file():
        print(done.stdout[-4000:], done.stderr[-4000:], sep="\n")
        print(f"gpu_node_dryrun: the job wrote no job.json (exit {done.returncode})")
        return 1
    summary = json.loads(summary_path.read_text())
    for name, stage in summary["stages"].items():
        print(f"  {name:<14} {stage['status']:<12} {stage['wall_s'] if stage['wall_s'] is not None else '-':>8} s"
              + (f"  {stage['error']}" if stage["error"] else ""))
    print(f"gpu_node_dryrun: smoke job {summary['profile']} on the node's versions: exit {done.returncode}, "
          f"{wall_s:.1f} s wall (this CPU), finished {summary['finished']}")
    if done.returncode != 0:
        print(done.stdout[-3000:])
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
