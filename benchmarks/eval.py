"""Evaluation throughput: batched vs one-at-a-time play of the same model.

    python benchmarks/eval.py [--model models/base] [--goals 20] [--seeds 5] [--history N] [--batch-size 128]

Plays ``goals`` x ``seeds`` held-out episodes (the test split of the embedded corpus,
agenda simulator, 20-turn limit, greedy decoding) twice with the same policy: batched (every
episode waiting for the agent in one ``generate`` call per round) and one episode at a time.
Prints dialogues per second for each, the speed-up, and whether both produced the same
transcripts (they should, under greedy decoding, up to floating-point ties in padded batches).
Run after ``dvc repro`` (it needs the corpus and the model).
"""

from __future__ import annotations

import argparse
import os
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from pipelines.env.tools import Database  # noqa: E402
from pipelines.episodes import RunnerConfig, get_format  # noqa: E402
from pipelines.evaluation.agent import PromptSpec  # noqa: E402
from pipelines.evaluation.play import EvalPlan, held_out_goals, play_policy  # noqa: E402
from pipelines.evaluation.policy import GenerationSpec, PolicySpec, load_policy  # noqa: E402
from pipelines.simulators.agenda import AgendaSimulator  # noqa: E402
from stages.multiwoz_dir import load_multiwoz  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/base")
    parser.add_argument("--source", default="data/raw/embedded_multiwoz")
    parser.add_argument("--goals", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=5)
    parser.add_argument("--history", type=int, default=None, help="max_history_messages of the prompt (default: what fits)")
    parser.add_argument("--max-new-tokens", type=int, default=96)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128, help="conversations per generate call (batched mode)")
    args = parser.parse_args()

    corpus = load_multiwoz(args.source)
    database = Database(corpus.entities, corpus.taxi_options)
    goals = held_out_goals(corpus.dialogues, "test", args.goals)
    spec = PolicySpec("bench", path=args.model, prompt=PromptSpec(max_history_messages=args.history))
    agent = load_policy(spec, get_format("speakrl"), GenerationSpec(max_new_tokens=args.max_new_tokens, batch_size=args.batch_size, threads=args.threads))
    runner = RunnerConfig(max_exchanges=20)
    seeds = tuple(range(args.seeds))
    print(f"model {args.model}: {len(goals)} goals x {len(seeds)} seeds = {len(goals) * len(seeds)} episodes per mode")

    results = {}
    for batched in (True, False):
        started = time.perf_counter()
        episodes = play_policy(agent, goals, AgendaSimulator(database), database, EvalPlan(seeds=seeds, runner=runner, batched=batched))
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
