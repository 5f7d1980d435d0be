"""Why a policy fails its goals: a small evaluation, broken down by success component.

    python benchmarks/eval_components.py models/sft [models/base ...] [--goals 20] [--seeds 1] [--params params.yaml]

Plays ``goals`` x ``seeds`` held-out episodes of the ``evaluate`` stage's setup (the corpus's
test split, its agenda simulator, the runner's limits, greedy decoding, the prompt settings of
params.yaml ``evaluate.prompt``) with each model directory, batched, and prints for each: the
success count, malformed outputs and tool errors per dialogue, and per goal domain how many
domain goals had an entity offered, an offer that fits (inform), a booking with the goal's
values (book) and the requested attributes given (request). A policy that does not read the
conversation shows up in the last line: few distinct tool calls (name + arguments), the same
ones whatever the goal. Run after ``dvc repro`` (it needs the corpus and the models).
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import time

from flows.evaluate import build_simulator
from pipelines.env.tools import Database
from pipelines.episodes import get_format
from pipelines.evaluation.play import held_out_goals, play_policy
from pipelines.evaluation.policy import PolicySpec, load_policy
from stages.evaluate import eval_config
from catalog.io import read_params
from catalog.multiwoz_dir import load_multiwoz

COMPONENTS = ("inform", "book", "request")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+", help="model directories (Hugging Face format or LoRA adapter)")
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--goals", type=int, default=20)
    parser.add_argument("--seeds", type=int, default=1)
    args = parser.parse_args()

    config = eval_config(read_params("evaluate", args.params))
    corpus = load_multiwoz(config.source, config.db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    goals = held_out_goals(corpus.dialogues, config.split, args.goals)
    plan = dataclasses.replace(config.plan(), seeds=tuple(range(args.seeds)))
    for path in args.models:
        agent = load_policy(PolicySpec(name=path, path=path, prompt=config.prompt), get_format(config.agent_format), config.generation)
        started = time.perf_counter()
        episodes = play_policy(agent, goals, build_simulator(config, database), database, plan)
        n = len(episodes)
        print(
            f"{path}: success {sum(e.result.success for e in episodes)}/{n}, "
            f"malformed/dialogue {sum(e.n_malformed for e in episodes) / n:.2f}, "
            f"tool errors/dialogue {sum(e.n_tool_errors for e in episodes) / n:.2f}, "
            f"turns {sum(e.n_turns for e in episodes) / n:.1f} ({time.perf_counter() - started:.0f} s)"
        )
        domains: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        for episode in episodes:
            for result in episode.result.domains:
                counts = domains[result.domain]
                counts["goals"] += 1
                counts["offered"] += result.offered is not None
                # None: the component does not apply to this domain goal (it passes).
                for name in COMPONENTS:
                    counts[name] += getattr(result, name) is not False
                counts["success"] += result.success
        for domain, counts in sorted(domains.items()):
            print(f"  {domain:<10} " + ", ".join(f"{key} {counts[key]}" for key in ("goals", "offered", *COMPONENTS, "success")))
        calls = collections.Counter((e.tool_name, e.arguments_json) for episode in episodes for e in episode.events if e.kind == "tool_call")
        top = "; ".join(f"{n}x {name} {arguments}" for (name, arguments), n in calls.most_common(3))
        print(f"  distinct tool calls: {len(calls)} of {sum(calls.values())}; most made: {top}")


if __name__ == "__main__":
    main()
