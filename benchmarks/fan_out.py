"""A stage's work fanned out over Prefect task runners (``josh.fan_out``, ``speaker.fan_out``):
wall time and speed-up over one worker of the same runner, for the thread pool, the process
pool and a Dask ``LocalCluster`` of worker processes (prefect-dask), beside the in-process run.

    python benchmarks/fan_out.py [--stage josh|speaker] [--workers 1 2] [--runners thread process dask]
        [--goals 32] [--beam 8] [--turns 12] [--chunk-size 4]

Each configuration runs the real stage (``python -m stages.josh`` with the rules agent, no
model, over ``--goals`` train goals; or ``python -m stages.speaker``, the rules synthesizer
over every seed of params.yaml's corpus) in a temporary directory with its own outputs and
checkpoints, and reads the stage's ``reports/timings/<stage>.json`` there: ``work s`` is the
fanned-out part (josh: ``wall_s``, the harvest; speaker: ``synthesis_s``, synthesis and
tables), which with workers includes the Prefect flow's start and the pool or cluster's start;
``stage s`` is the whole process (interpreter, corpus, Prefect server). The speed-up is of
``work s`` over one worker of the runner. Every configuration's table (``josh_trees`` /
``speaker_sft``) is checked to be the in-process one. The machine's core count bounds any
speed-up; the load average is printed with each row, since other processes' CPU shows in
every figure.
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
# per stage: output keys (-> names in the run's directory), the table compared, the timed key
STAGES = {
    "josh": ({"work_dir": "checkpoints", "output": "out", "metrics": "josh.json"}, "out/josh_trees.parquet", "wall_s"),
    "speaker": ({"output": "out", "metrics": "speaker.json", "cache_dir": "cache"}, "out/speaker_sft.parquet", "synthesis_s"),
}


def run_stage(stage: str, params: dict, fan_out: dict | None) -> tuple[dict, object]:
    """Run ``stage`` with ``fan_out`` (None: in process) in a fresh directory: its timings
    (plus ``process_s``) and its compared table."""
    outputs, table, _ = STAGES[stage]
    with tempfile.TemporaryDirectory(prefix="fan_out_") as tmp:
        work = Path(tmp)
        (work / "data").symlink_to(ROOT / "data")
        section = {**params[stage], **{key: str(work / name) for key, name in outputs.items()}}
        section["fan_out"] = fan_out or {**(section.get("fan_out") or {}), "workers": 0}
        (work / "params.yaml").write_text(yaml.safe_dump({**params, stage: section}, sort_keys=False))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", f"stages.{stage}", "--params", str(work / "params.yaml")], cwd=work,
                              env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True)
        process_s = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"error: stage {stage} failed with fan_out {fan_out}:\n{proc.stderr[-2000:]}")
        timings = {**json.loads((work / "reports" / "timings" / f"{stage}.json").read_text()), "process_s": process_s}
        return timings, pq.read_table(work / table)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stage", choices=sorted(STAGES), default="josh")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--runners", nargs="+", default=["thread", "process", "dask"], choices=["thread", "process", "dask"])
    parser.add_argument("--goals", type=int, default=32, help="josh: train goals harvested")
    parser.add_argument("--beam", type=int, default=8, help="josh: max_beam")
    parser.add_argument("--turns", type=int, default=12, help="josh: max_turns")
    parser.add_argument("--chunk-size", type=int, default=4, help="goals / seeds per task")
    args = parser.parse_args()

    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    if args.stage == "josh":
        params["josh"].update(max_goals=args.goals, agent={**params["josh"]["agent"], "backend": "rules"},
                              beam={**params["josh"]["beam"], "max_beam": args.beam, "max_turns": args.turns},
                              test={**params["josh"]["test"], "max_goals": 1, "seeds": [0]})
        print(f"JOSH harvest, rules agent: {args.goals} goals, beam {args.beam}, {args.turns} turns, chunks of {args.chunk_size} goals; "
              f"{os.cpu_count()} cores")
    else:
        params["speaker"]["synthesizer"] = {"backend": "rules"}
        print(f"SpeakER synthesis, rules synthesizer: {params['speaker']['source']}, chunks of {args.chunk_size} seeds; {os.cpu_count()} cores")
    timed = STAGES[args.stage][2]
    reference, expected = run_stage(args.stage, params, None)
    print(f"{'runner':<10}{'workers':>8}{'work s':>9}{'stage s':>9}{'speed-up':>10}  load")
    print(f"{'in-process':<10}{'-':>8}{reference[timed]:>9.1f}{reference['process_s']:>9.1f}{'':>10}  {os.getloadavg()[0]:.1f}")
    for runner in args.runners:
        one = None
        for workers in args.workers:
            timings, table = run_stage(args.stage, params, {"workers": workers, "task_runner": runner, "chunk_size": args.chunk_size, "address": None})
            if not table.equals(expected):
                sys.exit(f"error: {runner} x {workers}: the table differs from the in-process run's")
            if workers == 1:
                one = timings[timed]
            speed = f"{one / timings[timed]:.2f}x" if one else ""
            print(f"{runner:<10}{workers:>8}{timings[timed]:>9.1f}{timings['process_s']:>9.1f}{speed:>10}  {os.getloadavg()[0]:.1f}")
    print("every configuration's table equals the in-process run's")


if __name__ == "__main__":
    main()
