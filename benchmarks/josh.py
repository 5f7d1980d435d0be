"""JOSH harvest throughput (stage josh's library, Algorithm 1 on ToolWOZ).

    python benchmarks/josh.py [--goals 100] [--latency-ms 50 200 500 1000] [--concurrency 16 64]
                              [--spread 0.5] [--repeats 1] [--in-process] [--hf DIR] [--no-rules]

1. rules agent + agenda simulator: nodes/s and agent calls/s over the first train goals of an
   embedded corpus (beam 8, branching 2, 12 turns).
2. openai agent against the fake OpenAI-compatible server **in a process of its own** (as a
   real server is: its CPU is not the client's), every reply delayed by a latency drawn
   evenly from ``latency x (1 +- spread)`` (a model's replies take unequal times), for every
   ``--latency-ms`` x ``--concurrency`` (the client's bound on requests in flight; as many
   trees in play, and as many goals, unless ``--trees`` / ``--openai-goals`` say otherwise).
   Per configuration: LLM calls/s; the client's CPU seconds per request (this process: the
   harvest, the runner, the simulator and the HTTP client) and the server's; and the ratio
   of harvest wall time to (service time / concurrency), the service time being the delays
   the server slept, added up: 1.0 means the harvest kept the server as busy as the bound
   allows; the target is <= 1.25. (The fake model writes no ReAct, so the trees are of
   malformed turns: the load, not the outcome, is measured.)
   Then the same requests again, all at once, through the client alone
   (``LLMClient.complete_many``, no harvest between them): the floor this machine allows. A
   harvest ratio near the floor's means the client's per-request cost, not the harvest's
   scheduling, is the limit; ``core share`` is the CPU the client needs to keep the bound
   busy (concurrency x CPU per request / latency, in cores).
   ``--repeats``: runs per configuration; the verdict takes the medians.
   ``--in-process``: the server in this process instead (how this benchmark measured before).
3. with ``--hf DIR``: the same harvest with a local model (batched per round).

The load average is printed with each configuration: on a shared machine the other
processes' CPU shows in every figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from contextlib import contextmanager
from typing import Any, Iterator, Sequence

from pipelines.env.tools import Database
from pipelines.env.toolwoz import ToolWozDatabase, toolwoz_tools
from pipelines.episodes.agents import AgentContext, AgentOutput, OpenAIAgent
from pipelines.episodes.formats import get_format
from pipelines.josh.agent import RulesToolWozAgent
from pipelines.josh.beam import BeamConfig, harvest
from pipelines.josh.goals import harvest_goals, toolwoz_goals
from pipelines.llm import ClientConfig, CompletionRequest, LLMClient, SamplingParams
from pipelines.llm.testing.fake_server import FakeOpenAIServer, FakeServerProcess
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.parse import parse_database, parse_dialogues
from pipelines.simulators.agenda import AgendaSimulator

TARGET = 1.25
SAMPLING = SamplingParams(temperature=1.0, max_tokens=64)


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


def timed_harvest(goals, agent, simulator, database, config, concurrency, after=None):
    async def run():
        try:
            return await harvest(goals, agent, simulator, database, config, concurrency=concurrency)
        finally:
            if after is not None:
                await after()

    start = time.perf_counter()
    trees = asyncio.run(run())
    wall = time.perf_counter() - start
    return trees, wall


def report(label: str, trees, wall: float) -> None:
    nodes = sum(len(t.nodes) for t in trees)
    calls = sum(t.agent_calls for t in trees)
    reward = sum(t.reward for t in trees) / len(trees)
    print(f"{label}: {len(trees)} goals, {nodes} nodes, {calls} agent calls in {wall:.1f} s: "
          f"{nodes / wall:.1f} nodes/s, {calls / wall:.1f} agent calls/s, avg reward {reward:.3f}", flush=True)


class RecordingAgent(OpenAIAgent):
    """The openai agent, keeping every context it was asked about (for the client-alone replay)."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.contexts: list[AgentContext] = []

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        self.contexts.extend(contexts)
        return await super().act(contexts)


class Server:
    """The fake server in its own process, or (``in_process``) in a thread of this one."""

    def __init__(self, latency_s: float, spread: float, in_process: bool):
        self.in_process = in_process
        if in_process:
            self.server: Any = FakeOpenAIServer(latency_s=latency_s, latency_spread=spread, keep_bodies=False)
        else:
            self.server = FakeServerProcess(latency_s=latency_s, latency_spread=spread)

    def __enter__(self) -> "Server":
        self.server.start()
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.server.stop()

    @property
    def base_url(self) -> str:
        return self.server.base_url

    def stats(self) -> dict[str, Any]:
        if self.in_process:
            s = self.server.stats
            return {"requests": s.requests, "service_s": s.service_s, "max_in_flight": s.max_in_flight, "cpu_s": 0.0}
        return self.server.stats()


@contextmanager
def measured(server: Server) -> Iterator[dict[str, Any]]:
    """Wall time, this process's CPU time, and the server's requests, delays and CPU time."""
    figures: dict[str, Any] = {}
    before = server.stats()
    cpu, start = time.process_time(), time.perf_counter()
    yield figures
    figures["wall"] = time.perf_counter() - start
    figures["client_cpu"] = time.process_time() - cpu
    after = server.stats()
    for key in ("requests", "service_s", "cpu_s"):
        figures[key] = after[key] - before[key]
    figures["max_in_flight"] = after["max_in_flight"]


def describe(figures: dict[str, Any], concurrency: int, latency_s: float, in_process: bool) -> tuple[str, float]:
    requests = figures["requests"]
    ideal = figures["service_s"] / concurrency
    ratio = figures["wall"] / ideal
    cpu_ms = 1000 * figures["client_cpu"] / requests
    server = "" if in_process else f", server CPU {1000 * figures['cpu_s'] / requests:.2f} ms/req"
    return (f"{requests} requests, {requests / figures['wall']:.1f} LLM calls/s, wall {figures['wall']:.2f} s / "
            f"(service {figures['service_s']:.1f} s / {concurrency}) = ratio {ratio:.2f}; client CPU {cpu_ms:.2f} ms/req "
            f"(core share {concurrency * cpu_ms / 1000 / latency_s:.2f}){server}, "
            f"{figures['max_in_flight']} in flight at most"), ratio


def one_configuration(args, goals, simulator, database, fmt, config, latency_ms, concurrency):
    """One harvest and its client-alone replay: (harvest figures, replay figures, nodes)."""
    latency = latency_ms / 1000
    trees_in_play = args.trees or concurrency
    n_goals = args.openai_goals or trees_in_play
    with Server(latency, args.spread, args.in_process) as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake", max_concurrency=concurrency, timeout_s=120))
        agent = RecordingAgent(client, fmt, SAMPLING)
        with measured(server) as harvest_figures:
            trees, _ = timed_harvest(goals[:n_goals], agent, simulator, database, config, trees_in_play, client.aclose)
        requests = [CompletionRequest(c.messages, "agent", SAMPLING, c.step_seed, tools=c.tools) for c in agent.contexts]
        alone = LLMClient(ClientConfig(base_url=server.base_url, model="fake", max_concurrency=concurrency, timeout_s=120))
        with measured(server) as floor_figures:
            alone.complete_many_sync(requests)
    return harvest_figures, floor_figures, sum(len(t.nodes) for t in trees), n_goals, trees_in_play


def openai_sweep(args: argparse.Namespace, goals, simulator, database, fmt) -> None:
    config = BeamConfig(max_turns=args.openai_turns)  # malformed turns only: a few rounds show the load
    where = "in this process" if args.in_process else "in its own process"
    print(f"openai agent, fake server {where}, reply latency x (1 +- {args.spread}), beam {config.max_beam}, "
          f"{config.max_turns} turns, {args.repeats} run(s) per configuration:", flush=True)
    with Server(0.0, 0.0, args.in_process) as server:  # warm-up: imports and first connections
        warm = [CompletionRequest([{"role": "user", "content": f"warm-up {i}"}], "agent", SAMPLING, i) for i in range(16)]
        LLMClient(ClientConfig(base_url=server.base_url, model="fake", timeout_s=120)).complete_many_sync(warm)
    verdicts = []
    for latency_ms in args.latency_ms:
        latency = latency_ms / 1000
        for concurrency in args.concurrency:
            runs = []
            for repeat in range(args.repeats):
                load = os.getloadavg()[0]
                harvest_figures, floor_figures, nodes, n_goals, trees_in_play = one_configuration(
                    args, goals, simulator, database, fmt, config, latency_ms, concurrency)
                text, ratio = describe(harvest_figures, concurrency, latency, args.in_process)
                floor_text, floor = describe(floor_figures, concurrency, latency, args.in_process)
                print(f"  {latency_ms:g} ms, concurrency {concurrency}, {n_goals} goals ({trees_in_play} trees in play), "
                      f"run {repeat + 1}, load average {load:.1f}:\n"
                      f"    harvest ({nodes} nodes, {nodes / harvest_figures['wall']:.1f} nodes/s): {text}\n"
                      f"    client alone, same requests: {floor_text}", flush=True)
                cpu_ms = 1000 * harvest_figures["client_cpu"] / harvest_figures["requests"]
                alone_ms = 1000 * floor_figures["client_cpu"] / floor_figures["requests"]
                runs.append((ratio, floor, cpu_ms, alone_ms))
            verdicts.append((latency_ms, concurrency, [statistics.median(r[k] for r in runs) for k in range(4)], runs))
    print(f"  target ratio <= {TARGET} (medians over the runs; every run's ratio in brackets):")
    for latency_ms, concurrency, (ratio, floor, cpu_ms, alone_ms), runs in verdicts:
        share = concurrency * cpu_ms / latency_ms
        print(f"    {latency_ms:g} ms x {concurrency}: ratio {ratio:.2f} [{', '.join(f'{r[0]:.2f}' for r in runs)}], "
              f"client alone {floor:.2f} [{', '.join(f'{r[1]:.2f}' for r in runs)}]: {verdict(ratio, floor, cpu_ms, alone_ms, share)}",
              flush=True)


def verdict(ratio: float, floor: float, cpu_ms: float, alone_ms: float, share: float) -> str:
    """Whether a configuration meets the target and, where not, what limits it."""
    if ratio <= TARGET:
        return "meets it"
    text = "misses it"
    if floor > TARGET:
        text += (f"; so does the client alone: the client's cost per request is the limit ({cpu_ms:.2f} ms of CPU in the "
                 f"harvest, {alone_ms:.2f} alone; keeping the bound busy takes {share:.2f} of a core"
                 + (", more than the one core an event loop can use)" if share >= 1 else " on this loaded machine)"))
    if ratio > 1.1 * floor:
        text += (f"; the harvest is {ratio / floor - 1:.0%} slower than the client alone: its own CPU "
                 f"({cpu_ms - alone_ms:+.2f} ms per request) or its scheduling")
    elif floor <= TARGET:
        text += "; the client alone does only <= 10 % better: the machine's noise, not the harvest's scheduling"
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--dialogues", type=int, default=600)
    parser.add_argument("--seed", type=int, default=13)
    parser.add_argument("--goals", type=int, default=100, help="goals of the rules harvest")
    parser.add_argument("--no-rules", action="store_true", help="skip the rules harvest")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[50.0, 200.0, 500.0, 1000.0])
    parser.add_argument("--spread", type=float, default=0.5, help="reply latencies spread over latency x (1 +- spread)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[16], help="the client's bound on requests in flight")
    parser.add_argument("--trees", type=int, default=None, help="trees in play at once (default: the concurrency)")
    parser.add_argument("--openai-goals", type=int, default=None, help="goals of each openai harvest (default: the trees in play)")
    parser.add_argument("--openai-turns", type=int, default=3, help="max turns of the openai harvest")
    parser.add_argument("--repeats", type=int, default=1, help="runs per configuration")
    parser.add_argument("--in-process", action="store_true", help="the fake server in this process (a thread), not its own")
    parser.add_argument("--hf", default=None, help="a local model directory for the hf run")
    args = parser.parse_args()

    dialogues, splits, entities, taxi = corpus(args.dialogues, args.seed)
    database = ToolWozDatabase(entities)
    goals = harvest_goals(toolwoz_goals(dialogues, splits, database))
    simulator = AgendaSimulator(Database(entities, taxi))
    fmt = get_format("react", toolwoz_tools())

    if not args.no_rules:
        trees, wall = timed_harvest(goals[: args.goals], RulesToolWozAgent(database, fmt), simulator, database, BeamConfig(), 16)
        report(f"rules (load average {os.getloadavg()[0]:.1f})", trees, wall)

    if args.latency_ms:
        openai_sweep(args, goals, simulator, database, fmt)

    if args.hf:
        from pipelines.episodes.agents import HFAgent
        from pipelines.llm.config import HFConfig
        from pipelines.llm.hf import HFBackend

        backend = HFBackend.from_config(HFConfig(args.hf, batch_size=64))
        agent = HFAgent(backend, fmt, SAMPLING)
        trees, wall = timed_harvest(goals[:24], agent, simulator, database, BeamConfig(max_turns=4), 16)
        report(f"hf ({args.hf})", trees, wall)


if __name__ == "__main__":
    main()
