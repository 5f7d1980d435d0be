"""Do greedy transcripts depend on the batch? A model plays test goals batched and one dialogue
at a time, in each dtype and decoding path asked for, and the transcripts are compared.

    python benchmarks/batch_agreement.py [--model models/smollm2] [--goals 8] [--exchanges 3]
        [--max-new-tokens 80] [--runs bfloat16:eager,bfloat16:static,float32:eager]
        [--out reports/batch_agreement_cpu.json]

The GPU profile's ``evaluate`` settings (``flows.gpu.profile_evaluation``) with these counts;
``eager``: the growing cache (``cuda_graphs: false``), ``static``: the fixed-shape steps the GPU
replays as CUDA graphs (run eagerly without CUDA). Greedy decoding must give the same dialogues
either way (issue 25); bf16 rounds every op's output, so a batch's other shapes can tip a
near-tied token. Prints one JSON line per run with the first differing utterance of each
differing goal, and writes them all to ``--out`` (no timings there: they live in the lines).
On the 2-core CPU of 2026-11-30 (SmolLM2-135M-Instruct zero-shot): bf16 eager 4/8 identical,
bf16 static 2/8, float32 eager 8/8.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def agreement(model: str, dtype: str, path: str, goals: int, exchanges: int, max_new_tokens: int) -> dict:
    """One run: the goals batched, then one at a time; the transcripts compared."""
    from catalog.io import read_params
    from flows.gpu import play_timed, profile_evaluation, transcript_differences

    overrides = {"max_goals": goals, "seeds": [0], "max_exchanges": exchanges, "workers": 1,
                 "generation": {"max_new_tokens": max_new_tokens, "batch_size": goals, "dtype": dtype, "cuda_graphs": path == "static"}}
    setting = profile_evaluation(read_params("gpu"), model, None, overrides, "batch_agreement")
    plan = setting.config.plan()
    batched, batched_s, _ = play_timed(setting.agent, setting.goals, setting.simulator, setting.database, plan)
    single, single_s, _ = play_timed(setting.agent, setting.goals, setting.simulator, setting.database,
                                     dataclasses.replace(plan, batched=False))
    differences = transcript_differences(batched, single)
    return {"dtype": dtype, "path": path, "goals": len(single), "identical": len(single) - len(differences),
            "differences": differences, "seconds": {"batched": round(batched_s, 1), "one_at_a_time": round(single_s, 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2")
    parser.add_argument("--goals", type=int, default=8)
    parser.add_argument("--exchanges", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--runs", default="bfloat16:eager,bfloat16:static,float32:eager",
                        help="dtype:path pairs, path eager (growing cache) or static (the GPU's fixed-shape steps)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the runs here as JSON (without their timings)")
    args = parser.parse_args()

    import torch

    from pipelines.gpu.hardware import describe

    torch.set_num_threads(args.threads)
    machine = describe()
    runs = []
    for pair in args.runs.split(","):
        dtype, _, path = pair.partition(":")
        if path not in ("eager", "static"):
            parser.error(f"--runs: {pair!r}: the path must be eager or static")
        started = time.perf_counter()
        run = agreement(args.model, dtype, path, args.goals, args.exchanges, args.max_new_tokens)
        print(json.dumps({**run, "device": machine["device"], "wall_s": round(time.perf_counter() - started, 1)}), flush=True)
        runs.append(run)
    if args.out:
        report = {"model": args.model, "device": machine["device"], "goals": args.goals, "exchanges": args.exchanges,
                  "max_new_tokens": args.max_new_tokens, "greedy": True,
                  "runs": [{key: value for key, value in run.items() if key != "seconds"} for run in runs]}
        out = Path(args.out)
        temporary = out.with_name(f".{out.name}.tmp")
        temporary.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
        temporary.replace(out)


if __name__ == "__main__":
    main()
