"""The GPU job smoke-run on the node image's package versions, on this CPU, before a lease.

    python benchmarks/gpu_node_dryrun.py [--venv /tmp/askflow-node312] [--job /tmp/askflow-node-job] [--profile NAME] [--python PATH]

``make test`` smoke-runs the packed job with this project's own environment (transformers,
peft, torch as ``make`` installs them). The node is a bare CUDA image with other versions
(``NODE_IMAGE``: read off the H100 node, ``../shared/notes/gpu-run-2026-11-26.md``, and the
device library's list for the H200 kind) and only the job's vendored packages on top. This
script makes a virtual environment with the node's Python (3.12, where this machine has it)
and the image's versions (torch 2.11.0, the image's own CUDA build, run on this CPU), packs
the job from the committed tree for that Python (``askflow gpu pack --python``: wheels, as
for a lease), and runs
``run.py --smoke`` with it in a fresh folder, with nothing else installed: what breaks on the
node's versions (an API that moved, a default that changed) breaks here, not in a lease.
It prints each stage's status and wall time, the versions, and exits non-zero where a stage
failed. Needs the package registry once (the venv is reused).

JOSH's profile (``--profile josh``): a smoke harvest by the untrained model finds no golden
path, so its SFT and KTO stages are "not trained" and the job alone never reaches TRL's KTO
trainer. The script then trains both, with the node's versions and the profile's smoke
sections, on a hand-built harvest (``tests.test_josh.hand_built_tree``: one golden path, its
failed siblings), starting from the model the job converted: ``flows.gpu.trained_on_harvest``
as ``run_josh_round`` calls it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

#: The bare image's packages, as the device library lists the H200 kind's (2026-11, Python
#: 3.12.3; the H100 node of 2026-11-26 had the same torch, transformers, peft, accelerate).
#: PyPI's torch 2.11.0 is the image's CUDA build, and it runs on a CPU too (about 4 GB with
#: its nvidia packages); pyarrow and pandas at the registry's newest.
NODE_IMAGE = {"torch": "2.11.0", "transformers": "5.17.0", "peft": "0.21.0", "accelerate": "1.15.0",
              "numpy": "2.5.2", "tokenizers": "0.23.2", "safetensors": "0.8.0", "huggingface_hub": "1.33.0",
              "pyarrow": None, "pandas": None}
#: The node's Python: the job then vendors wheels for it (the path a lease takes), not a copy
#: of this environment's packages.
NODE_PYTHON = "3.12"


def _run(command: list[str], **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(command, check=True, text=True, **kwargs)


def node_venv(venv: Path, interpreter: str) -> Path:
    """The venv with the image's versions (made once, with ``interpreter``); its python."""
    python = venv / "bin" / "python"
    if not python.exists():
        _run([interpreter, "-m", "venv", str(venv)])
        pins = [name if version is None else f"{name}=={version}" for name, version in NODE_IMAGE.items()]
        _run([str(python), "-m", "pip", "install", "-q", *pins])
    return python


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--venv", type=Path, default=Path("/tmp/askflow-node312"))
    parser.add_argument("--job", type=Path, default=Path("/tmp/askflow-node-job"))
    parser.add_argument("--profile", default=None, help="params.yaml gpu profile (default: gpu.profile)")
    parser.add_argument("--python", default=shutil.which(f"python{NODE_PYTHON}") or sys.executable,
                        help=f"the interpreter the venv is made with (default: python{NODE_PYTHON}, the node's, where found)")
    args = parser.parse_args()

    python = node_venv(args.venv, args.python)
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
    if "harvest" in summary["stages"]:
        return trainers_on_a_harvest(python, job, summary) or done.returncode
    return done.returncode


#: Runs in the node's environment (cwd: the unpacked project): SFT then KTO from the converted
#: model on the hand-built harvest in argv[1], with the josh profile's smoke sections.
_TRAIN_ON_HARVEST = """
import json, sys, time
from pathlib import Path
from flows.gpu import parse_section, profile_params, read_params, trained_on_harvest
harvest, models = Path(sys.argv[1]), Path(sys.argv[2])
_, sections = profile_params(read_params("gpu"), "josh", True)
start, done = models / "start", {}
for method in ("sft", "kto"):
    section = dict(sections[method])
    section["data"] = {**section["data"], "sources": [{**s, "path": str(harvest / Path(s["path"]).name)} for s in section["data"]["sources"]]}
    stage_dir = models / f"dryrun_josh_{method}"
    stage_dir.mkdir(parents=True, exist_ok=True)
    began = time.perf_counter()
    report = trained_on_harvest(method, section, start, stage_dir, f"dryrun {method}")
    done[method] = {"steps": report["train"]["steps"], "wall_s": round(time.perf_counter() - began, 1)}
    start = stage_dir / "model"
print(json.dumps(done))
"""


def trainers_on_a_harvest(python: Path, job: Path, summary: dict) -> int:
    """SFT and KTO of JOSH's round on a hand-built harvest, on the node's versions (module
    docstring); 0 when both trained."""
    import pyarrow.parquet as pq

    sys.path.insert(0, str(ROOT))
    from pipelines.josh.tables import josh_tables
    from tests.test_josh import hand_built_tree

    if summary["stages"]["convert"]["status"] != "ok":
        print("gpu_node_dryrun: no converted model to train JOSH's SFT / KTO from")
        return 1
    harvest = job / "dryrun_harvest"
    harvest.mkdir(exist_ok=True)
    for name, table in josh_tables([hand_built_tree()]).items():
        pq.write_table(table, harvest / f"{name}.parquet")
    project = job / "work" / "project"
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(job / "work" / "vendor"), str(project)]), HF_HUB_OFFLINE="1")
    done = subprocess.run([str(python), "-c", _TRAIN_ON_HARVEST, str(harvest), str(job / "work" / "models")],
                          cwd=project, env=env, text=True, capture_output=True)
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-4000:], sep="\n")
        print(f"gpu_node_dryrun: JOSH's SFT / KTO on a hand-built harvest failed on the node's versions (exit {done.returncode})")
        return done.returncode
    trained = json.loads(done.stdout.strip().splitlines()[-1])
    print("gpu_node_dryrun: JOSH's round on a hand-built harvest, node's versions: "
          + ", ".join(f"{m} ok ({r['steps']} steps, {r['wall_s']} s)" for m, r in trained.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
