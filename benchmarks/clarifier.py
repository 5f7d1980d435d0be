"""The τ-bench Clarifier, offline: the clarification budget against pass@1 and steps (the
paper's Figure 4 axes) for the informed agent, and episodes per second.

    python benchmarks/clarifier.py [--root vendor/taubench] [--budgets 0 1 2 3 5] [--patience 2]

For each domain's test tasks and each budget, the rules Clarifier plays with the informed
agent and the rules user; prints pass@1 (with the do-nothing floor), mean agent steps
(clarifications excluded), mean clarifications and the wall time. Budget 0 is "no
Clarifier". A mechanism check: the informed agent knows each solution (see
pipelines/clarifier/agent.py), so these are not model results.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from time import perf_counter

from pipelines.clarifier import RulesClarifier
from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.evaluation import DoNothingAgent, summarize
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import FunctionCallingFormat, run_episodes_sync
from pipelines.episodes.taubench import tau_runner_config, tau_specs
from pipelines.simulators.taubench import TauRulesUser
from catalog.taubench_dir import load_taubench_domain

DEFAULT_ROOT = Path(__file__).resolve().parents[1] / "vendor" / "taubench"  # in the repository (xz-compressed JSON)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--root", type=Path, default=DEFAULT_ROOT)
    parser.add_argument("--budgets", type=int, nargs="+", default=[0, 1, 2, 3, 5])
    parser.add_argument("--patience", type=int, default=2)
    args = parser.parse_args(argv)
    if not (args.root / "retail").is_dir():
        print(f"error: {args.root}: τ-bench data not found (--root or ASKFLOW_SHARED)", file=sys.stderr)
        return 1
    print(f"{'domain':8} {'budget':>6} {'pass@1':>12} {'floor':>6} {'agent':>6} {'clarify':>7} {'s':>6} {'ep/s':>6}")
    for name in ("retail", "airline"):
        domain = load_taubench_domain(args.root, name, ("test",))
        tasks, world = domain.tasks["test"], TauBenchWorld(domain)
        floor = run_episodes_sync(tau_specs(tasks), DoNothingAgent(FunctionCallingFormat()), TauRulesUser(), world, tau_runner_config(domain))
        floor_passed = sum(e.success for e in floor)
        for budget in args.budgets:
            specs = tau_specs(tasks)
            agent = TauInformedAgent({s.episode_id: s.goal for s in specs}, patience=args.patience)
            started = perf_counter()
            episodes = run_episodes_sync(specs, agent, TauRulesUser(), world, tau_runner_config(domain, max_exchanges=30 + budget),
                                         RulesClarifier() if budget else None, budget)
            seconds = perf_counter() - started
            r = summarize(f"budget {budget}", name, episodes, floor_passed)
            print(f"{name:8} {budget:>6} {f'{r.passed}/{r.n_tasks}':>12} {r.floor_passed:>6} {r.agent_steps:>6.2f} "
                  f"{r.clarifications:>7.2f} {seconds:>6.1f} {len(episodes) / seconds:>6.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
