"""Throughput of the dialogue machinery.

    python benchmarks/runner.py [--episodes 1000] [--requests 96] [--no-serve]

1. Episodes per second for the agenda simulator + replay agent over the embedded corpus
   (gold dialogues, SpeakRL format, goal checker included), stepped together by the runner.
2. Requests per second through the LLM client at concurrency 1, 4 and 16 against the local
   fake OpenAI-compatible server and a real `transformers serve` (see benchmarks/llm_client.py).
"""

from __future__ import annotations

import argparse
import time

from llm_client import run_targets  # benchmarks/ is on sys.path when run as a script

from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, ReplayAgent, get_format, run_episodes_sync
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.parse import parse_database, parse_dialogues
from pipelines.simulators.agenda import AgendaSimulator


def episodes_per_second(n: int, seed: int) -> tuple[float, float]:
    corpus = generate_corpus(n, seed=seed)
    dialogues = parse_dialogues(corpus["data"], "embedded")
    entities, taxi = {}, {}
    for domain, records in corpus["db"].items():
        rows, options = parse_database(domain, records, domain)
        if domain == "taxi":
            taxi = options
        else:
            entities[domain] = rows
    database = Database(entities, taxi)
    specs = [EpisodeSpec.from_dialogue(d, seed=0) for d in dialogues]
    start = time.perf_counter()
    episodes = run_episodes_sync(specs, ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)
    elapsed = time.perf_counter() - start
    return n / elapsed, sum(e.success for e in episodes) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--episodes", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--requests", type=int, default=96)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0])
    parser.add_argument("--no-serve", action="store_true")
    args = parser.parse_args()

    rate, success = episodes_per_second(args.episodes, args.seed)
    print(f"agenda simulator + replay agent: {args.episodes} episodes, {rate:.1f} episodes/s, success {success:.4f}")

    print()
    run_targets(args)


if __name__ == "__main__":
    main()
