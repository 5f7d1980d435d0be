"""Training throughput of the GPU profile's recipe (flows/gpu.py): SFT tokens/s and MFU per
batch size, and GRPO steps/s with the share of time spent generating (the profile's GRPO:
multi-turn, whole conversations, where its section has an ``env``).

    python benchmarks/gpu_train.py [--model models/smollm2] [--batch-sizes 16,32,64] [--steps 30]
                                   [--grpo-steps 5] [--profile speakrl]

It trains the profile's SFT section for ``--steps`` steps at each batch size (full fine-tuning,
bf16, length-grouped batches on a GPU; the same settings on a CPU run in float32) and then
GRPO from the last SFT model, and prints one line per run. Targets on one H100 (issue 25):
SFT at least 100,000 trained tokens/s. On a machine without CUDA the figures are CPU figures
and the output says so; there the defaults are tiny (2 steps, batch 2). Run it in the project
(after ``make run``), or on the node in ``JOB/work/project`` with ``JOB/work/vendor`` on
PYTHONPATH.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2", help="the starting model directory")
    parser.add_argument("--profile", default=None, help="params.yaml gpu profile (default: gpu.profile)")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated SFT batch sizes (default: 16,32,64 on a GPU, 2 on a CPU)")
    parser.add_argument("--steps", type=int, default=None, help="SFT steps per batch size (default: 30 on a GPU, 2 on a CPU)")
    parser.add_argument("--grpo-steps", type=int, default=None, help="GRPO steps (default: 5 on a GPU, 1 on a CPU; 0 skips)")
    parser.add_argument("--rows", type=int, default=None, help="SFT rows read (default: all on a GPU, 64 on a CPU)")
    args = parser.parse_args()

    import torch

    from catalog.io import read_params
    from flows.gpu import conversation_env, data_generation_limit, deep_merge, profile_params, train, train_config, with_limit
    from pipelines.gpu.hardware import describe

    gpu = torch.cuda.is_available()
    machine = describe()
    where = f"{machine['device']} ({'GPU' if gpu else 'CPU figures: no CUDA device here'})"
    print(f"gpu_train: {where}; torch {machine['versions']['torch']}, transformers {machine['versions']['transformers']}, trl {machine['versions']['trl']}")
    _, sections = profile_params(read_params("gpu"), args.profile, smoke=not gpu)
    sections = with_limit(sections, data_generation_limit(sections, Path(args.model))["tokens"])  # as the job does
    batch_sizes = [int(b) for b in (args.batch_sizes or ("16,32,64" if gpu else "2")).split(",")]
    steps = args.steps or (30 if gpu else 2)
    grpo_steps = args.grpo_steps if args.grpo_steps is not None else (5 if gpu else 1)
    rows = args.rows if args.rows is not None else (None if gpu else 64)
    quiet = {"eval": {"max_examples": 1, "before": False, "generate": False}}
    with tempfile.TemporaryDirectory(prefix="askflow-bench-") as scratch:
        last = None
        for batch in batch_sizes:
            section = deep_merge(sections["sft"], {**quiet, "epochs": None, "optim": {"max_steps": steps, "batch_size": batch, "logging_steps": max(1, steps // 3)}})
            if rows is not None:
                section["data"] = deep_merge(section["data"], {"sources": [{**section["data"]["sources"][0], "max_rows": rows}]})
            out = Path(scratch) / f"sft_{batch}"
            out.mkdir()
            config = train_config("sft", section, model_path=args.model, output_dir=out, where="benchmark sft")
            report = train(config, sampler=section.get("sampler"))
            figures = report["throughput"]
            print(json.dumps({"run": "sft", "device": machine["device"], "batch_size": batch, "steps": report["train"]["steps"],
                              "max_length": config.optim.max_length, "tokens_per_s": figures["tokens_per_s"], "mfu": figures["mfu"],
                              "steps_per_s": figures["steps_per_s"], "train_s": figures["train_s"]}))
            last = out / "model"
        if grpo_steps and last is not None:
            section = deep_merge(sections["grpo"], {**quiet, "optim": {"max_steps": grpo_steps}})
            out = Path(scratch) / "grpo"
            out.mkdir()
            config = train_config("grpo", section, model_path=str(last), output_dir=out, where="benchmark grpo")
            report = train(config, env=conversation_env(section, "grpo", "benchmark grpo"))  # multi-turn where it has an env
            figures = report["throughput"]
            print(json.dumps({"run": "grpo", "device": machine["device"], "steps": report["train"]["steps"],
                              "batch_size": config.optim.batch_size, "num_generations": config.resolved_objective().num_generations,
                              "steps_per_s": figures["steps_per_s"], "generate_share": figures["generate_share"],
                              "tokens_per_s": figures["tokens_per_s"], "train_s": figures["train_s"]}))


if __name__ == "__main__":
    main()
