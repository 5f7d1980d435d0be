"""Multi-turn GRPO's rollouts (pipelines/training/rollout.py): conversations/s one by one and
played together (``rollout.batch_size``: every conversation's next turn decoded as one
left-padded batch), and whether greedy conversations are identical both ways.

    python benchmarks/gpu_rollouts.py [--model models/smollm2] [--goals 32] [--batch-sizes 1,32] [--profile speakrl]

Plays ``--goals`` train goals with the profile's ``grpo.env`` (agenda user, its rollout
limits; ``max_turn_tokens: from_data`` is the job's generation limit), greedily, at each batch
size, and prints one line each: conversations/s, decode calls, policy tokens. The one-by-one
run is the path US-GRPO took before; the batched one is what a GRPO step of the GPU profile
plays. Without CUDA the figures are CPU figures and the output says so (defaults 4 goals,
batch sizes 1 and 4, 2 exchanges).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2")
    parser.add_argument("--profile", default=None, help="params.yaml gpu profile (default: gpu.profile)")
    parser.add_argument("--goals", type=int, default=None, help="train goals played (default: 32 on a GPU, 4 on a CPU)")
    parser.add_argument("--batch-sizes", default=None, help="comma-separated (default: 1,32 on a GPU, 1,4 on a CPU)")
    args = parser.parse_args()

    import torch

    from catalog.conversations import build_environment
    from catalog.io import read_params
    from flows.gpu import conversation_env, data_generation_limit, profile_params, with_limit
    from pipelines.gpu.hardware import describe
    from pipelines.training.modeling import load_tokenizer
    from pipelines.training.config import ModelSpec
    from pipelines.training.rollout import conversation_rows
    from transformers import AutoModelForCausalLM

    gpu = torch.cuda.is_available()
    machine = describe()
    print(f"gpu_rollouts: {machine['device']} ({'GPU' if gpu else 'CPU figures: no CUDA device here'})")
    _, sections = profile_params(read_params("gpu"), args.profile, smoke=False)
    sections = with_limit(sections, data_generation_limit(sections, Path(args.model))["tokens"])
    env = conversation_env(sections["grpo"], "grpo", "benchmark grpo")
    if env is None:
        raise SystemExit("gpu_rollouts: the profile's grpo section has no env (single-turn GRPO plays no conversations)")
    goals = args.goals or (32 if gpu else 4)
    rollout_config = dataclasses.replace(env.rollout, temperature=0.0, **({} if gpu else {"max_exchanges": 2}))
    env = dataclasses.replace(env, max_goals=goals, rollout=rollout_config)
    tokenizer = load_tokenizer(ModelSpec(path=args.model))
    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.bfloat16 if gpu else torch.float32).to("cuda" if gpu else "cpu")
    played = {}
    for size in [int(b) for b in (args.batch_sizes or ("1,32" if gpu else "1,4")).split(",")]:
        env_at = dataclasses.replace(env, rollout=dataclasses.replace(env.rollout, batch_size=size))
        rollout, _, dialogues, _ = build_environment(env_at, tokenizer)
        _, specs, _ = conversation_rows(rollout, dialogues, env.seed)
        started = time.perf_counter()
        played[size] = rollout.play(model, list(specs.values()))
        if gpu:
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        print(json.dumps({"batch_size": size, "conversations": len(played[size]), "seconds": round(seconds, 2),
                          "conversations_per_s": round(len(played[size]) / seconds, 3),
                          "decode_calls": rollout.stats.get("batches") or None,
                          "policy_tokens": sum(r.policy_tokens for r in played[size])}))
    sizes = sorted(played)
    same = all(a.completion_ids == b.completion_ids for a, b in zip(played[sizes[0]], played[sizes[-1]]))
    print(json.dumps({"greedy_identical": same, "between": [sizes[0], sizes[-1]]}))


if __name__ == "__main__":
    main()
