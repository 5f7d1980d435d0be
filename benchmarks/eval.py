"""Evaluation throughput: batched vs one-at-a-time play of the same model.

    python benchmarks/eval.py [--model sft] [--goals 20] [--seeds 5] [--params params.yaml] [--no-episode-cache]

Plays ``goals`` x ``seeds`` held-out episodes of the ``evaluate`` stage's setup (params.yaml
``evaluate``: the corpus's test split, its agenda simulator settings, the runner's limits, greedy
decoding, and the model's own prompt settings) twice with the named model: batched (every
episode waiting for the agent in one batch per round) and one episode at a time. Prints
dialogues per second for each, the speed-up, and whether both produced the same
transcripts (they should: greedy rows in a batch compute what they compute alone).
``--no-episode-cache`` re-prefills every episode's whole prompt each round (the hf agent's
per-episode key/value cache off): run both ways to see what the cache buys.
Run after ``dvc repro`` (it needs the corpus and the model).
"""

from __future__ import annotations

import argparse
import dataclasses
import time

from flows.evaluate import build_simulator
from pipelines.env.tools import Database
from pipelines.episodes import get_format
from pipelines.evaluation.play import held_out_goals, play_policy
from pipelines.evaluation.policy import load_policy
from stages.evaluate import eval_config
from catalog.io import read_params
from catalog.multiwoz_dir import load_multiwoz


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="sft", help="a model of params.yaml evaluate.models (default: sft)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--goals", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--no-episode-cache", action="store_true", help="re-prefill whole prompts every round")
    args = parser.parse_args()

    config = eval_config(read_params("evaluate", args.params))
    specs = {spec.name: spec for spec in config.policy_specs()}
    if args.model not in specs:
        parser.error(f"--model: {args.model!r} is not in evaluate.models ({', '.join(specs)})")
    corpus = load_multiwoz(config.source, config.db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    goals = held_out_goals(corpus.dialogues, config.split, args.goals)
    agent = load_policy(specs[args.model], get_format(config.agent_format), config.generation)
    agent.inner.episode_cache = not args.no_episode_cache
    plan = dataclasses.replace(config.plan(), seeds=tuple(range(args.seeds)))
    print(f"model {args.model} ({specs[args.model].name_or_path}): {len(goals)} goals x {args.seeds} seeds = {len(goals) * args.seeds} episodes per mode, episode cache {'off' if args.no_episode_cache else 'on'}")

    results = {}
    for batched in (True, False):
        started = time.perf_counter()
        episodes = play_policy(agent, goals, build_simulator(config, database), database, dataclasses.replace(plan, batched=batched))
        elapsed = time.perf_counter() - started
        mode = "batched" if batched else "one-at-a-time"
        turns = sum(e.n_turns for e in episodes) / len(episodes)
        generated = sum(e.completion_tokens for e in episodes)
        print(f"{mode:>14}: {len(episodes) / elapsed:7.2f} dialogues/s  ({elapsed:6.1f} s, {turns:.1f} turns/dialogue, {generated / elapsed:7.0f} generated tokens/s)")
        results[mode] = (len(episodes) / elapsed, [e.transcript() for e in episodes])
    speedup = results["batched"][0] / results["one-at-a-time"][0]
    same = sum(a == b for a, b in zip(results["batched"][1], results["one-at-a-time"][1]))
    print(f"speed-up: {speedup:.1f}x; identical transcripts: {same}/{len(results['batched'][1])}")


if __name__ == "__main__":
    main()
