"""Continuous batching against the runner's rounds: the same goals, the same model, the
sequential decode steps, wall time and whether the transcripts are the same.

    python benchmarks/continuous.py [--model sft] [--goals 40] [--section evaluate] [--threads 2]
        [--draft TOKENS NGRAM] [--out reports/continuous_cpu.json]

Plays ``--goals`` test goals with the settings of ``params.yaml``'s ``--section`` (default:
the CPU ``evaluate`` stage's; its ``models`` entry ``--model``, after ``make run``) twice:
batched in rounds (:func:`pipelines.evaluation.play.play_policy`: every round decodes until
its longest reply ends) and with continuous batching
(:func:`pipelines.evaluation.continuous.play_policy_continuous`: a reply that ends frees its row
for the next ready prompt). Prints per way the sequential decode steps (what a GPU pays for:
``benchmarks/eval_host.py``), prefill calls, slot shrinks, wall seconds and dialogues/s, and
how many transcripts are identical (greedy: all must be). ``--draft`` adds a third way:
continuous batching whose steps verify prompt-lookup drafts of at most TOKENS ids
(:class:`~pipelines.episodes.continuous.SlotDecoder` ``draft``), with the drafted and confirmed
ids. ``--out`` writes them without the timings (those are this machine's, and a report is
compared across machines).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def compare(section: dict, model: str, goals: int, threads: int | None = None, draft: tuple[int, int] | None = None) -> dict:
    """Both ways over the same goals (module docstring)."""
    import torch

    from flows.gpu import agenda_world
    from pipelines.config import from_params
    from pipelines.episodes import get_format
    from pipelines.evaluation.continuous import play_policy_continuous
    from pipelines.episodes.decoding import decode_stats
    from pipelines.evaluation.config import EvalConfig
    from pipelines.evaluation.play import play_policy
    from pipelines.evaluation.policy import load_policy
    from pipelines.evaluation.speed import stats_since

    models = section.get("models", {})
    if model not in models:
        raise SystemExit(f"continuous: no model {model!r} in the section (it has {sorted(models)})")
    params = {**{k: v for k, v in section.items() if k not in ("output", "continuous")}, "max_goals": goals,
              "seeds": section.get("seeds", [0])[:1], "models": {model: models[model]}}
    config = from_params(EvalConfig, params, "benchmarks/continuous")
    if config.generation.temperature != 0.0:
        raise SystemExit("continuous: greedy decoding only (the section samples)")
    database, chosen, simulator = agenda_world(config, "benchmarks/continuous")
    agent = load_policy(config.policy_specs()[0], get_format(config.agent_format), config.generation)
    if threads is not None:
        torch.set_num_threads(threads)
    ways = [("rounds", play_policy), ("continuous", play_policy_continuous)]
    if draft is not None:
        ways.append(("continuous_drafted", lambda *a: play_policy_continuous(*a, draft=draft)))
    runs, played = {}, {}
    for way, play in ways:
        before = decode_stats()
        started = time.perf_counter()
        played[way] = play(agent, chosen, simulator, database, config.plan())
        wall = time.perf_counter() - started
        stats = stats_since(before)
        runs[way] = {"steps": stats.get("steps", 0), "prefill_calls": stats.get("calls", 0), "slot_shrinks": stats.get("shrinks", 0),
                     **({"drafted_ids": stats.get("drafted", 0), "confirmed_ids": stats.get("draft_accepted", 0)} if way.endswith("drafted") else {}),
                     "wall_s": round(wall, 2), "dialogues_per_s": round(len(played[way]) / wall, 3)}
    same = min(sum(a.transcript() == b.transcript() for a, b in zip(played["rounds"], played[way])) for way in runs if way != "rounds")
    row = {"model": model, "goals": len(chosen), "max_exchanges": config.max_exchanges,
           "max_new_tokens": config.generation.max_new_tokens, "batch_size": config.generation.batch_size,
           "dtype": config.generation.dtype, "identical_transcripts": same, "runs": runs,
           "steps_saved": round(1 - runs["continuous"]["steps"] / runs["rounds"]["steps"], 3) if runs["rounds"]["steps"] else None}
    if draft is not None:
        row["draft"] = {"tokens": draft[0], "ngram": draft[1]}
        row["drafted_steps_saved"] = round(1 - runs["continuous_drafted"]["steps"] / runs["rounds"]["steps"], 3) if runs["rounds"]["steps"] else None
    return row


def main(argv: list[str] | None = None) -> int:
    import yaml

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sft")
    parser.add_argument("--goals", type=int, default=40)
    parser.add_argument("--section", default="evaluate", help="a params.yaml section of evaluation settings")
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--draft", type=int, nargs=2, metavar=("TOKENS", "NGRAM"))
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    section = yaml.safe_load(args.params.read_text(encoding="utf-8")).get(args.section)
    if not isinstance(section, dict):
        print(f"continuous: {args.params} has no section {args.section!r}", file=sys.stderr)
        return 2
    row = compare(section, args.model, args.goals, args.threads, tuple(args.draft) if args.draft else None)
    print(json.dumps(row), flush=True)
    if args.out is not None:
        report = {**row, "runs": {way: {k: v for k, v in run.items() if k not in ("wall_s", "dialogues_per_s")} for way, run in row["runs"].items()}}
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    return 0 if row["identical_transcripts"] == row["goals"] else 1


if __name__ == "__main__":
    sys.exit(main())
