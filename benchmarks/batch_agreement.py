"""Do greedy transcripts depend on the batch? A model plays test goals batched and one dialogue
at a time, in each dtype and decoding path asked for, and the transcripts are compared.

    python benchmarks/batch_agreement.py [--model models/smollm2 | --gguf FILE] [--goals 8]
        [--exchanges 3] [--max-new-tokens 80] [--runs bfloat16:eager,bfloat16:static,float32:eager]
        [--out reports/batch_agreement_cpu.json]

The GPU profile's ``evaluate`` settings (``flows.gpu.profile_evaluation``) with these counts,
batched as the profile batches (continuous batching where ``evaluate.continuous``; the reports
below were made in rounds);
``eager``: the growing cache (``cuda_graphs: false``), ``static``: the fixed-shape steps the GPU
replays as CUDA graphs (run eagerly without CUDA). Greedy decoding must give the same dialogues
either way (issue 25); bf16 rounds every op's output, so a batch's other shapes can tip a
near-tied token. Prints one JSON line per run with the first differing utterance of each
differing goal, and writes them all to ``--out`` after each run (no timings there: they live
in the lines). A run may name a matrix-product setting third (``dtype:path:setting``, CUDA
only, restored after the run): ``exact-reduction`` keeps cuBLAS's split-K partial sums of bf16
products in float32 (``allow_bf16_reduced_precision_reduction = False``; PyTorch allows bf16
ones by default), ``tf32`` lets float32 products run on TF32 tensor cores. ``--gguf``: the
model is that GGUF converted (``pipelines.llm.gguf.convert``) into a temporary folder, as the
GPU job's ``convert`` stage does: on a lease, the job's reassembled GGUF.
On the 2-core CPU of 2026-11-30 (SmolLM2-135M-Instruct zero-shot): bf16 eager 4/8 identical,
bf16 static 2/8, float32 eager 8/8. On one H200 of 2026-11-30 (12 goals, static steps replayed
as CUDA graphs; ``reports/gpu/2026-11-30_nvidia-h200_batch_agreement/``): bf16 4/12,
bf16 exact-reduction 4/12, float32 12/12, float32 tf32 10/12.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


#: ``dtype:path:setting``'s settings: the ``torch.backends.cuda.matmul`` flag each sets.
SETTINGS = {"exact-reduction": ("allow_bf16_reduced_precision_reduction", False), "tf32": ("allow_tf32", True)}


@contextlib.contextmanager
def matmul_setting(setting: str | None):
    """``setting`` (:data:`SETTINGS`) while the block runs, the flag's old value after."""
    import torch

    if setting is None:
        yield
        return
    flag, value = SETTINGS[setting]
    old = getattr(torch.backends.cuda.matmul, flag)
    setattr(torch.backends.cuda.matmul, flag, value)
    try:
        yield
    finally:
        setattr(torch.backends.cuda.matmul, flag, old)


def agreement(model: str, dtype: str, path: str, goals: int, exchanges: int, max_new_tokens: int,
              setting: str | None = None) -> dict:
    """One run: the goals batched, then one at a time; the transcripts compared."""
    from catalog.io import read_params
    from flows.gpu import play_timed, profile_evaluation, transcript_differences

    overrides = {"max_goals": goals, "seeds": [0], "max_exchanges": exchanges, "workers": 1,
                 "generation": {"max_new_tokens": max_new_tokens, "batch_size": goals, "dtype": dtype, "cuda_graphs": path == "static"}}
    world = profile_evaluation(read_params("gpu"), model, None, overrides, "batch_agreement")
    plan = world.config.plan()
    with matmul_setting(setting):
        batched, batched_s, _ = play_timed(world.agent, world.goals, world.simulator, world.database, plan, world.continuous)
        single, single_s, _ = play_timed(world.agent, world.goals, world.simulator, world.database,
                                         dataclasses.replace(plan, batched=False), world.continuous)
    differences = transcript_differences(batched, single)
    return {"dtype": dtype, "path": path, **({"setting": setting} if setting else {}), "goals": len(single),
            "identical": len(single) - len(differences), "differences": differences,
            "seconds": {"batched": round(batched_s, 1), "one_at_a_time": round(single_s, 1)}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2")
    parser.add_argument("--gguf", type=Path, default=None, help="convert this GGUF and play it (instead of --model)")
    parser.add_argument("--goals", type=int, default=8)
    parser.add_argument("--exchanges", type=int, default=3)
    parser.add_argument("--max-new-tokens", type=int, default=80)
    parser.add_argument("--runs", default="bfloat16:eager,bfloat16:static,float32:eager",
                        help="dtype:path[:setting], path eager (growing cache) or static (the GPU's fixed-shape steps), "
                             f"setting one of {', '.join(SETTINGS)}")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default=None, help="write the runs here as JSON (without their timings)")
    args = parser.parse_args()

    import torch

    from pipelines.gpu.hardware import describe

    torch.set_num_threads(args.threads)
    machine = describe()
    plans = []
    for entry in args.runs.split(","):
        dtype, path, setting = (entry.split(":") + [None])[:3]
        if path not in ("eager", "static"):
            parser.error(f"--runs: {entry!r}: the path must be eager or static")
        if setting is not None and setting not in SETTINGS:
            parser.error(f"--runs: {entry!r}: the setting must be one of {', '.join(SETTINGS)}")
        plans.append((dtype, path, setting))
    with tempfile.TemporaryDirectory(prefix="batch-agreement-") as scratch:
        model = args.model
        if args.gguf:  # converted as the job's convert stage does
            from flows.gpu import gguf_checkpoint

            model = str(Path(scratch) / "model")
            gguf_checkpoint(args.gguf, Path(model))
        runs = []
        for dtype, path, setting in plans:
            started = time.perf_counter()
            run = agreement(model, dtype, path, args.goals, args.exchanges, args.max_new_tokens, setting)
            print(json.dumps({**run, "device": machine["device"], "wall_s": round(time.perf_counter() - started, 1)}), flush=True)
            runs.append(run)
            if args.out:  # after each run: a lease cut short keeps the runs it finished
                write_report(Path(args.out), {
                    "model": args.gguf.name if args.gguf else args.model, "device": machine["device"], "goals": args.goals,
                    "exchanges": args.exchanges, "max_new_tokens": args.max_new_tokens, "greedy": True,
                    "runs": [{key: value for key, value in done.items() if key != "seconds"} for done in runs]})


def write_report(out: Path, report: dict) -> None:
    temporary = out.with_name(f".{out.name}.tmp")
    temporary.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    temporary.replace(out)


if __name__ == "__main__":
    main()
