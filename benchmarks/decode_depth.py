"""What an evaluation's speed is made of, from its committed episodes (no model, no GPU).

    python benchmarks/decode_depth.py [EVALUATE_DIR] [--parts 1 2 3 6 12] [--target 5]

EVALUATE_DIR holds ``episodes.parquet``, ``episode_events.parquet`` and ``evaluate.json`` as
an evaluation writes them (default: the partial H100 run of 2026-11-26 under reports/gpu/).
For each model it prints the agent calls and tokens, the sequential decode steps of the
batched runner with the goals split into each of ``--parts`` processes
(:func:`pipelines.evaluation.speed.lockstep_steps`), the floor under any batching (the
longest dialogue), the measured wall time per sequential step, what that step cost predicts
for each split, and the step cost that ``--target`` dialogues/s needs.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ROOT / "reports" / "gpu" / "2026-11-26_nvidia-h100-80gb-hbm3_speakrl_partial" / "evaluate"


def depth_table(directory: Path, parts: list[int], target: float) -> list[dict]:
    """One row per model (module docstring)."""
    import pyarrow.parquet as pq

    from pipelines.evaluation.speed import agent_calls, lockstep_steps, longest_dialogue_steps

    episodes = pq.read_table(directory / "episodes.parquet", columns=["episode_id", "agent"]).to_pylist()
    calls = agent_calls(pq.read_table(directory / "episode_events.parquet").to_pylist())
    report = directory / "evaluate.json"
    speed = json.loads(report.read_text())["speed"] if report.is_file() else {}
    rows = []
    for agent in dict.fromkeys(e["agent"] for e in episodes):
        order = [e["episode_id"] for e in episodes if e["agent"] == agent]
        mine = {e: calls.get(e, []) for e in order}
        steps = {n: lockstep_steps(mine, order, n) for n in parts}
        row = {"model": agent, "dialogues": len(order), "calls": sum(map(len, mine.values())),
               "tokens": sum(map(sum, mine.values())), "steps": steps, "longest_dialogue": longest_dialogue_steps(mine)}
        wall = (speed.get(agent) or {}).get("wall_s")
        if wall:
            per_step = wall / steps[1]
            row.update(wall_s=wall, ms_per_step=round(1000 * per_step, 2),
                       predicted_dialogues_per_s={n: round(len(order) / (s * per_step), 2) for n, s in steps.items()},
                       ms_per_step_for_target={n: round(1000 * len(order) / target / s, 2) for n, s in steps.items()})
        rows.append(row)
    return rows


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--parts", type=int, nargs="+", default=[1, 2, 3, 6, 12])
    parser.add_argument("--target", type=float, default=5.0, help="dialogues/s")
    args = parser.parse_args()
    if 1 not in args.parts:
        args.parts.insert(0, 1)
    for row in depth_table(args.directory, args.parts, args.target):
        print(json.dumps(row))
    return 0


if __name__ == "__main__":
    sys.exit(main())
