"""Evaluation speed of the GPU profile (flows/gpu.py): dialogues/s of one model over the
held-out goals, batched, and whether greedy transcripts are identical to the unbatched path.

    python benchmarks/gpu_eval.py [--model models/smollm2] [--goals 100] [--check 8] [--profile speakrl]

Plays ``--goals`` test goals with the profile's ``evaluate`` settings (one seed, batched: with
``evaluate.continuous`` continuous batching (``attention: auto``: the attention timed faster
here, the timing printed; with ``continuous.draft``, its steps verifying prompt-lookup drafts),
then without the drafts, with the slot step's other attention and in
the runner's rounds for comparison, else in rounds: one ``generate`` per round for every open
dialogue) and prints ``dialogues_per_s``; then the same
goals split between ``evaluate.workers`` processes (the job's way) and its transcripts against
the one-process run; with ``generation.cuda_graphs`` the same goals decoded eagerly (the
growing cache, batches compacted) and their transcripts against the graphed run; then plays
the first ``--check`` goals one at a time (with continuous batching: in one slot of the same
decoder, and in rounds) and compares every turn's text with the batched run (greedy decoding:
they must be equal). Each run prints its sequential decode steps and the
wall time per step (``decode``: the number that CUDA graphs exist to cut; 26-27 ms for
SmolLM2 on the H100 of 2026-11-26 without them). Target on one H100 for the SFT model
(issue 25): at least 5 dialogues/s. Without CUDA the figures are CPU figures and the output
says so (defaults 4 goals, 2 checked, 2 exchanges).
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
    parser.add_argument("--profile", default=None)
    parser.add_argument("--goals", type=int, default=None)
    parser.add_argument("--check", type=int, default=None, help="goals also played unbatched and compared")
    parser.add_argument("--workers", type=int, default=None, help="processes for the sharded run (default: the profile's evaluate.workers)")
    args = parser.parse_args()

    import torch

    from catalog.io import read_params
    from flows.gpu import _shard_pool, play_sharded, play_timed, profile_evaluation
    from pipelines.episodes import get_format
    from pipelines.episodes.continuous import ATTENTIONS
    from pipelines.evaluation.policy import load_policy
    from pipelines.evaluation.speed import decode_summary
    from pipelines.gpu.hardware import describe

    gpu = torch.cuda.is_available()
    machine = describe()
    print(f"gpu_eval: {machine['device']} ({'GPU' if gpu else 'CPU figures: no CUDA device here'})")
    overrides = {"max_goals": args.goals or (100 if gpu else 4), "seeds": [0]}
    if args.workers is not None:
        overrides["workers"] = args.workers
    setting = profile_evaluation(read_params("gpu"), args.model, args.profile, overrides, "benchmark evaluate", smoke=not gpu)
    config, goals, simulator, database, agent = setting.config, setting.goals, setting.simulator, setting.database, setting.agent
    plan = config.plan()

    def timed(agent: object, generation: object, continuous: str | None = setting.continuous,
              draft: tuple[int, int] | None = setting.draft) -> tuple[list, float, dict]:
        played, wall_s, stats = play_timed(agent, goals, simulator, database, plan, continuous, draft if continuous else None)
        return played, wall_s, decode_summary([stats], wall_s, generation.cuda_graphs)

    batched, wall_s, decoded = timed(agent, config.generation)
    turns = sum(len(e.events) for e in batched)
    print(json.dumps({"run": "batched", "device": machine["device"], "goals": len(goals), "max_exchanges": config.max_exchanges,
                      "batch_size": config.generation.batch_size, "max_new_tokens": config.generation.max_new_tokens,
                      "continuous": setting.continuous, "draft": setting.draft, **({"attention_timing": setting.attention_timing} if setting.attention_timing else {}),
                      "wall_s": round(wall_s, 2), "dialogues_per_s": round(len(batched) / wall_s, 3),
                      "events": turns, "decode": decoded}))
    by_id = {e.episode_id: e for e in batched}
    if setting.continuous and setting.draft:
        # One id per step: the same transcripts (up to a wider step's rounding), more steps.
        played, plain_s, decoded = timed(agent, config.generation, draft=None)
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in played)
        print(json.dumps({"run": f"batched, continuous, {setting.continuous} attention, no drafts", "goals": len(goals),
                          "wall_s": round(plain_s, 2), "dialogues_per_s": round(len(played) / plain_s, 3), "decode": decoded,
                          "identical_transcripts": f"{same}/{len(played)}"}))
    if setting.continuous:
        # The slot step's other attention: the same transcripts (up to rounding), another step time.
        other = next(name for name in ATTENTIONS if name != setting.continuous)
        played, other_s, decoded = timed(agent, config.generation, continuous=other)
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in played)
        print(json.dumps({"run": f"batched, continuous, {other} attention", "goals": len(goals), "wall_s": round(other_s, 2),
                          "dialogues_per_s": round(len(played) / other_s, 3), "decode": decoded,
                          "identical_transcripts": f"{same}/{len(played)}"}))
        # The runner's rounds: the same transcripts, more steps.
        played, rounds_s, decoded = timed(agent, config.generation, continuous=None)
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in played)
        print(json.dumps({"run": "batched in rounds", "goals": len(goals), "wall_s": round(rounds_s, 2),
                          "dialogues_per_s": round(len(played) / rounds_s, 3), "decode": decoded,
                          "identical_transcripts": f"{same}/{len(played)}"}))
    if config.generation.cuda_graphs:
        eager = dataclasses.replace(config.generation, cuda_graphs=False)
        played, eager_s, decoded = timed(load_policy(config.policy_specs()[0], get_format(config.agent_format), eager), eager, None)
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in played)
        print(json.dumps({"run": "batched, eager", "goals": len(goals), "wall_s": round(eager_s, 2),
                          "dialogues_per_s": round(len(played) / eager_s, 3), "decode": decoded,
                          "identical_transcripts": f"{same}/{len(played)}"}))
    if config.workers > 1:
        # The profile's way: the goals split between processes, each with its own model copy
        # (model loading included in the time).
        pool = _shard_pool(config.workers)
        try:
            started = time.perf_counter()
            sharded, decoded = play_sharded(pool, config, config.policy_specs()[0], goals)
            sharded_s = time.perf_counter() - started
        finally:
            pool.shutdown()
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in sharded)
        print(json.dumps({"run": "sharded", "workers": config.workers, "goals": len(goals), "wall_s": round(sharded_s, 2),
                          "dialogues_per_s": round(len(sharded) / sharded_s, 3),
                          "decode": decode_summary(decoded, sharded_s, config.generation.cuda_graphs),
                          "identical_transcripts": f"{same}/{len(sharded)}"}))
    check = args.check if args.check is not None else (8 if gpu else 2)
    ways = [setting.continuous, None] if setting.continuous else [None]  # one slot of the same decoder; rounds
    for way in ways if check else []:
        single, single_s, _ = play_timed(agent, goals[:check], simulator, database, dataclasses.replace(plan, batched=False), way)
        same = sum(e.transcript() == by_id[e.episode_id].transcript() for e in single)
        print(json.dumps({"run": "unbatched" + (f", one slot, {way} attention" if way else ", rounds"), "goals": check,
                          "wall_s": round(single_s, 2), "dialogues_per_s": round(check / single_s, 3),
                          "identical_transcripts": f"{same}/{check}"}))


if __name__ == "__main__":
    main()
