"""Conformance of askflow's τ-bench tools with τ-bench's own (ground_truth_replay.json).

    python benchmarks/taubench_conformance.py [--root vendor/taubench]

Prints, per domain, tasks / calls / changed records reproduced, and the time taken; then,
through the dialogue runner with the offline rules user, the pass count of the ground-truth
replay agent (every task should pass) and of an agent that does nothing (τ-bench's floor:
19/50 airline test, 7/115 retail test, 5/500 retail train), with episodes per second.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter

from pipelines.env.taubench.conformance import check_conformance
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import AgentAction, AgentOutput, get_format, run_episodes_sync
from pipelines.episodes.taubench import TauReplayAgent, tau_runner_config, tau_specs
from pipelines.simulators.taubench import TauRulesUser
from catalog.taubench_dir import load_ground_truth_replay, load_taubench_domain

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "vendor" / "taubench"  # in the repository (xz-compressed JSON)


class _DoNothing:
    """Answers every user turn with an acknowledgement and never calls a tool."""

    name = "do_nothing"

    def __init__(self, fmt):
        self.format = fmt

    async def act(self, contexts):
        text, calls = self.format.render([AgentAction.respond("I see.")])
        return [AgentOutput(text, calls) for _ in contexts]


def _runner_line(domain) -> str:
    parts = []
    fmt = get_format("function_calling", domain.tool_schemas)
    for split, tasks in domain.tasks.items():
        specs = tau_specs(tasks)
        for agent in (TauReplayAgent({s.episode_id: s.goal for s in specs}, fmt), _DoNothing(fmt)):
            started = perf_counter()
            episodes = run_episodes_sync(specs, agent, TauRulesUser(), TauBenchWorld(domain), tau_runner_config(domain))
            took = perf_counter() - started
            passed = sum(e.success for e in episodes)
            parts.append(f"{split} {agent.name} {passed}/{len(episodes)} ({len(episodes) / took:.0f} episodes/s)")
    return f"{domain.name} through the runner: " + "; ".join(parts)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", default=str(DEFAULT_ROOT))
    args = parser.parse_args(argv)
    all_ok = True
    for domain_name in ("retail", "airline"):
        started = perf_counter()
        domain = load_taubench_domain(args.root, domain_name)
        loaded = perf_counter() - started
        report = check_conformance(domain, load_ground_truth_replay(args.root, domain_name))
        took = perf_counter() - started - loaded
        print(
            f"{domain_name}: tasks {report.tasks_conforming}/{report.tasks} conform; "
            f"calls {report.calls_matching}/{report.calls} outputs equal ({report.error_calls} are τ-bench errors); "
            f"changed records {report.records_matching}/{report.records}; load {loaded:.2f} s, replay {took:.2f} s"
        )
        for failure in report.failures[:10]:
            print(f"  {failure}")
        all_ok &= report.ok
        print(_runner_line(domain))
    return 0 if all_ok else 1


if __name__ == "__main__":
    sys.exit(main())
