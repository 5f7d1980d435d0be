"""JOSH harvest throughput (stage josh's library, Algorithm 1 on ToolWOZ).

    python benchmarks/josh.py [--goals 100] [--openai-goals 24] [--latency-ms 50] [--concurrency 16] [--hf DIR]

1. rules agent + agenda simulator: nodes/s and agent calls/s over the first train goals of an
   embedded corpus (beam 8, branching 2, 12 turns).
2. openai agent against the local fake OpenAI-compatible server, every reply delayed by
   ``--latency-ms``: nodes/s, LLM calls/s, and the ratio of harvest wall time to
   (total service time / concurrency), where the service time is requests x latency and
   the concurrency is the client's bound. 1.0 means the harvest kept the server as busy
   as the bound allows; the target is <= 1.25. (The fake model writes no ReAct, so the
   trees are of malformed turns: the load, not the outcome, is what is measured.)
3. with ``--hf DIR``: the same harvest with a local model (batched per round).
"""

from __future__ import annotations

import argparse
import asyncio
import time

from pipelines.env.tools import Database
from pipelines.env.toolwoz import ToolWozDatabase, toolwoz_tools
from pipelines.episodes.agents import OpenAIAgent
from pipelines.episodes.formats import get_format
from pipelines.josh.agent import RulesToolWozAgent
from pipelines.josh.beam import BeamConfig, harvest
from pipelines.josh.goals import harvest_goals, toolwoz_goals
from pipelines.llm import ClientConfig, LLMClient, SamplingParams
from pipelines.llm.testing.fake_server import FakeOpenAIServer
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.parse import parse_database, parse_dialogues
from pipelines.simulators.agenda import AgendaSimulator


def corpus(n_dialogues: int, seed: int):
    raw = generate_corpus(n_dialogues, seed=seed)
    dialogues = parse_dialogues(raw["data"], "embedded")
    splits = {d: split for split, ids in raw["splits"].items() for d in ids}
    entities, taxi = {}, {}
    for domain, records in raw["db"].items():
        rows, options = parse_database(domain, records, domain)
        if domain == "taxi":
            taxi = options
        else:
            entities[domain] = rows
    return dialogues, {d.dialogue_id: splits.get(d.dialogue_id, "train") for d in dialogues}, entities, taxi


def timed_harvest(goals, agent, simulator, database, config, concurrency):
    start = time.perf_counter()
    trees = asyncio.run(harvest(goals, agent, simulator, database, config, concurrency=concurrency))
    wall = time.perf_counter() - start
    return trees, wall


def report(label: str, trees, wall: float) -> None:
    nodes = sum(len(t.nodes) for t in trees)
    calls = sum(t.agent_calls for t in trees)
    reward = sum(t.reward for t in trees) / len(trees)
    print(f"{label}: {len(trees)} goals, {nodes} nodes, {calls} agent calls in {wall:.1f} s: "
          f"{nodes / wall:.1f} nodes/s, {calls / wall:.1f} agent calls/s, avg reward {reward:.3f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=600)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--goals", type=int, default=100)
    parser.add_argument("--openai-goals", type=int, default=24)
    parser.add_argument("--latency-ms", type=float, default=50.0)
    parser.add_argument("--concurrency", type=int, default=16, help="the client's bound on requests in flight")
    parser.add_argument("--trees", type=int, default=16, help="trees in play at once")
    parser.add_argument("--hf", default=None, help="a local model directory for the hf run")
    args = parser.parse_args()

    dialogues, splits, entities, taxi = corpus(args.dialogues, args.seed)
    database = ToolWozDatabase(entities)
    goals = harvest_goals(toolwoz_goals(dialogues, splits, database))
    simulator = AgendaSimulator(Database(entities, taxi))
    fmt = get_format("react", toolwoz_tools())
    config = BeamConfig()

    trees, wall = timed_harvest(goals[: args.goals], RulesToolWozAgent(database, fmt), simulator, database, config, args.trees)
    report("rules", trees, wall)

    latency = args.latency_ms / 1000
    with FakeOpenAIServer(latency_s=latency, keep_bodies=False) as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake", max_concurrency=args.concurrency, timeout_s=120))
        agent = OpenAIAgent(client, fmt, SamplingParams(temperature=1.0, max_tokens=64))
        openai_config = BeamConfig(max_turns=4)  # malformed turns only: a few rounds show the load
        trees, wall = timed_harvest(goals[: args.openai_goals], agent, simulator, database, openai_config, args.trees)
        report(f"openai (fake server, {args.latency_ms:.0f} ms/reply, concurrency {args.concurrency})", trees, wall)
        requests = server.stats.requests
        ideal = requests * latency / args.concurrency
        ratio = f"{wall:.2f} / {ideal:.2f} = {wall / ideal:.2f}" if ideal else "n/a (no latency)"
        print(f"openai: {requests} requests ({server.stats.max_in_flight} in flight at most), {requests / wall:.1f} LLM calls/s; "
              f"harvest wall / (service time / concurrency) = {ratio} (target <= 1.25)")

    if args.hf:
        from pipelines.episodes.agents import HFAgent
        from pipelines.llm.config import HFConfig
        from pipelines.llm.hf import HFBackend

        backend = HFBackend.from_config(HFConfig(args.hf, batch_size=64))
        agent = HFAgent(backend, fmt, SamplingParams(temperature=1.0, max_tokens=64))
        trees, wall = timed_harvest(goals[: args.openai_goals], agent, simulator, database, BeamConfig(max_turns=4), args.trees)
        report(f"hf ({args.hf})", trees, wall)


if __name__ == "__main__":
    main()
