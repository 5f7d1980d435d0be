"""The JOSH harvest fanned out over Prefect task runners (``josh.fan_out``): wall time and
speed-up over one worker of the same runner, for the thread pool, the process pool and a Dask
``LocalCluster`` of worker processes (prefect-dask), beside the in-process harvest.

    python benchmarks/fan_out.py [--goals 32] [--workers 1 2] [--runners thread process dask]
        [--beam 8] [--turns 12] [--chunk-size 4]

Each configuration runs the real ``josh`` stage (``python -m stages.josh``, the rules agent:
no model, so the harvest's own CPU is what is measured) in a temporary directory with its own
checkpoints, and reads the stage's ``reports/timings/josh.json`` there: ``harvest s`` is its
``wall_s`` (the harvest: with workers, the Prefect flow's start, the pool or cluster's start
and the fan-out), ``stage s`` the whole process (interpreter, corpus, Prefect server, the test
evaluation of one goal); the speed-up is of the harvest over one worker of the runner. Every
configuration's ``josh_trees.parquet`` is checked to be the in-process one, byte for byte in
content. The machine's core count bounds any speed-up; the load average is printed with each
row, since other processes' CPU shows in every figure.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pyarrow.parquet as pq
import yaml

ROOT = Path(__file__).resolve().parents[1]


def run_stage(params: dict, fan_out: dict | None) -> tuple[dict, object]:
    """Run stage josh with ``fan_out`` (None: in process) in a fresh directory; its timings
    and its trees table."""
    with tempfile.TemporaryDirectory(prefix="fan_out_") as tmp:
        work = Path(tmp)
        for name in ("data",):
            (work / name).symlink_to(ROOT / name)
        josh = {**params["josh"], "work_dir": str(work / "checkpoints"), "output": str(work / "josh"), "metrics": str(work / "josh.json")}
        josh["fan_out"] = fan_out or {**josh["fan_out"], "workers": 0}
        (work / "params.yaml").write_text(yaml.safe_dump({**params, "josh": josh}, sort_keys=False))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "stages.josh", "--params", str(work / "params.yaml")], cwd=work,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        process_s = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"error: stage josh failed with fan_out {fan_out}:\n{proc.stderr[-2000:]}")
        timings = {**json.loads((work / "reports" / "timings" / "josh.json").read_text()), "process_s": process_s}
        return timings, pq.read_table(work / "josh" / "josh_trees.parquet")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--goals", type=int, default=32)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runners", nargs="+", default=["thread", "process", "dask"], choices=["thread", "process", "dask"])
    parser.add_argument("--beam", type=int, default=8)
    parser.add_argument("--turns", type=int, default=12)
    parser.add_argument("--chunk-size", type=int, default=4)
    args = parser.parse_args()

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    params["josh"].update(max_goals=args.goals, agent={**params["josh"]["agent"], "backend": "rules"},
                          beam={**params["josh"]["beam"], "max_beam": args.beam, "max_turns": args.turns},
                          test={**params["josh"]["test"], "max_goals": 1, "seeds": [0]})
    print(f"JOSH harvest, rules agent: {args.goals} goals, beam {args.beam}, {args.turns} turns, chunks of {args.chunk_size} goals; "
          f"{os.cpu_count()} cores")
    reference, trees = run_stage(params, None)
    print(f"{'runner':<10}{'workers':>8}{'harvest s':>10}{'stage s':>9}{'nodes/s':>9}{'speed-up':>10}  load")
    print(f"{'in-process':<10}{'-':>8}{reference['wall_s']:>10.1f}{reference['process_s']:>9.1f}{reference['nodes_per_second']:>9.1f}{'':>10}  {os.getloadavg()[0]:.1f}")
    for runner in args.runners:
        one = None
        for workers in args.workers:
            timings, table = run_stage(params, {"workers": workers, "task_runner": runner, "chunk_size": args.chunk_size, "address": None})
            if not table.equals(trees):
                sys.exit(f"error: {runner} x {workers}: josh_trees differs from the in-process harvest")
            if workers == 1:
                one = timings["wall_s"]
            speed = f"{one / timings['wall_s']:.2f}x" if one else ""
            print(f"{runner:<10}{workers:>8}{timings['wall_s']:>10.1f}{timings['process_s']:>9.1f}{timings['nodes_per_second']:>9.1f}{speed:>10}  {os.getloadavg()[0]:.1f}")
    print("every configuration's trees equal the in-process harvest's")


if __name__ == "__main__":
    main()
