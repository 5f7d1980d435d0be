"""The Clarifier evaluation (paper section 4, Table 1 / Table 2 layout).

For each Clarifier (``none``: no Clarifier) and each τ-bench domain, every test task is
played once per seed by the same agent and user; per run:

* **pass@1**: τ-bench's reward, mean over tasks and seeds, with a 95 % percentile interval
  from a bootstrap over tasks (each task's mean over the seeds resampled), beside the **floor**: the share a
  do-nothing agent passes against the same user (tasks that change nothing and require no
  output; 7/115 retail test, 19/50 airline test), measured by :func:`floor` through the runner;
* **agent steps**: the agent's own actions per episode, clarifications excluded (tool
  calls and visible replies; the paper's "Average Agent");
* **clarifications**: the Clarifier's questions per episode ("Average Clarify"), and their
  sum ("Average Sum").
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np

from pipelines.episodes.formats import AgentAction
from pipelines.episodes.records import Episode

AGENT_STEP_KINDS = ("tool_call", "respond", "clarify", "fallback")


def agent_steps(episode: Episode) -> int:
    """The agent's own actions (tool calls and what it showed the user), the Clarifier's
    questions excluded."""
    return sum(1 for e in episode.events if e.actor == "agent" and e.kind in AGENT_STEP_KINDS)


def clarifications(episode: Episode) -> int:
    return sum(1 for e in episode.events if e.actor == "clarifier" and e.kind == "clarify")


@dataclass(frozen=True)
class RunResult:
    """One (Clarifier, domain) cell of the table."""

    clarifier: str
    domain: str
    n_tasks: int
    passed: int  # over every seed
    floor_passed: int  # tasks the do-nothing agent passes (deterministic: one run)
    agent_steps: float
    clarifications: float
    consultations: float
    malformed: int
    seeds: int = 1
    ci95: tuple[float, float] | None = None  # of pass@1, bootstrap over tasks (and training seeds)
    passed_by_seed: tuple[int, ...] = ()
    # A Clarifier trained under several seeds, pooled (issue 28): how many, each one's passes.
    training_seeds: int = 1
    passed_by_training_seed: tuple[int, ...] = ()
    clarify_by_training_seed: tuple[float, ...] = ()  # questions per episode of each seed's model

    @property
    def episodes(self) -> int:
        return self.n_tasks * self.seeds * self.training_seeds

    @property
    def pass_at_1(self) -> float:
        return self.passed / self.episodes

    @property
    def floor(self) -> float:
        return self.floor_passed / self.n_tasks

    def as_dict(self) -> dict[str, Any]:
        low, high = self.ci95 if self.ci95 else (None, None)
        return {
            "n_tasks": self.n_tasks, "seeds": self.seeds, "passed": self.passed, "passed_by_seed": list(self.passed_by_seed),
            "pass_at_1": round(self.pass_at_1, 4), "ci95_low": low, "ci95_high": high,
            "floor_passed": self.floor_passed, "floor": round(self.floor, 4),
            "avg_agent_steps": round(self.agent_steps, 3), "avg_clarify": round(self.clarifications, 3),
            "avg_sum": round(self.agent_steps + self.clarifications, 3),
            "avg_consultations": round(self.consultations, 3), "clarifier_malformed": self.malformed,
            **({"training_seeds": self.training_seeds, "passed_by_training_seed": list(self.passed_by_training_seed),
                "avg_clarify_by_training_seed": [round(c, 3) for c in self.clarify_by_training_seed]}
               if self.training_seeds > 1 else {}),
        }


def task_interval(successes: Mapping[str, Sequence[bool]], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """The 95 % percentile interval of pass@1 over a bootstrap of tasks (each task's mean
    success over its seeds is the unit; the seeds of a task stay together).

    >>> task_interval({"a": [True, True], "b": [False, False]}, resamples=200)[1]
    1.0
    """
    from pipelines.stats import LEVEL, resample_indices

    means = np.array([sum(v) / len(v) for v in successes.values()], dtype=float)
    if not len(means):
        raise ValueError("no tasks to resample")
    draws = means[resample_indices(len(means), resamples, seed)].mean(axis=1)
    tail = (1.0 - LEVEL) / 2.0
    low, high = np.quantile(draws, [tail, 1.0 - tail])
    return round(float(low), 4), round(float(high), 4)


def task_interval_seeds(per_seed: Sequence[Mapping[str, Sequence[bool]]], resamples: int = 2000, seed: int = 0) -> tuple[float, float]:
    """:func:`task_interval` of a Clarifier trained under several seeds (``per_seed[k]``: task
    -> successes of training seed k's model, the same tasks): each resample draws the training
    seeds, then the tasks, with replacement, so the interval carries what a re-training moves.
    One seed: :func:`task_interval`.

    >>> task_interval_seeds([{"a": [True], "b": [True]}, {"a": [False], "b": [False]}], resamples=200)
    (0.0, 1.0)
    """
    from pipelines.stats import LEVEL, resample_indices, seed_draws

    if len(per_seed) == 1:
        return task_interval(per_seed[0], resamples, seed)
    tasks = list(per_seed[0])
    if any(list(s) != tasks for s in per_seed):
        raise ValueError("every training seed must play the same tasks")
    means = np.array([[sum(s[t]) / len(s[t]) for t in tasks] for s in per_seed], dtype=float)  # seeds x tasks
    by_seed = means[:, resample_indices(len(tasks), resamples, seed)].mean(axis=2)  # seeds x resamples
    draws = seed_draws(len(per_seed), resamples, seed)
    values = by_seed[draws.T, np.arange(resamples)].mean(axis=0)
    tail = (1.0 - LEVEL) / 2.0
    low, high = np.quantile(values, [tail, 1.0 - tail])
    return round(float(low), 4), round(float(high), 4)


def summarize(clarifier: str, domain: str, episodes: Sequence[Episode], floor_passed: int) -> RunResult:
    """One cell over every seed's episodes (the same tasks in each seed)."""
    return summarize_seeds(clarifier, domain, [episodes], floor_passed)


def summarize_seeds(clarifier: str, domain: str, per_seed: Sequence[Sequence[Episode]], floor_passed: int) -> RunResult:
    """One cell of a Clarifier trained under ``len(per_seed)`` seeds (``per_seed[k]``: the
    episodes of training seed k's model, every evaluation seed): pooled, its interval over
    training seeds and tasks (:func:`task_interval_seeds`)."""
    episodes = [ep for played in per_seed for ep in played]
    n = len(episodes)
    if n == 0 or any(not played for played in per_seed):
        raise ValueError(f"no episodes for clarifier {clarifier!r} on {domain}")
    tasks_by_seed: list[dict[str, list[bool]]] = []
    by_seed: dict[int, int] = {}
    for played in per_seed:
        by_task: dict[str, list[bool]] = {}
        seeds_here: set[int] = set()
        for ep in played:
            by_task.setdefault(ep.dialogue_id, []).append(bool(ep.success))
            by_seed[ep.seed] = by_seed.get(ep.seed, 0) + int(ep.success)
            seeds_here.add(ep.seed)
        if any(len(v) != len(seeds_here) for v in by_task.values()):
            raise ValueError(f"clarifier {clarifier!r} on {domain}: every task must be played once per seed")
        tasks_by_seed.append(by_task)
    seeds = len(by_seed)
    decisions = [e for ep in episodes for e in ep.events if e.actor == "clarifier" and e.kind == "think"]
    asked = [[clarifications(ep) for ep in played] for played in per_seed]  # counted once, pooled and per seed
    return RunResult(
        clarifier, domain, len(by_task), sum(ep.success for ep in episodes), floor_passed,
        sum(agent_steps(ep) for ep in episodes) / n, sum(map(sum, asked)) / n,
        len(decisions) / n, sum(1 for e in decisions if e.detail == "malformed"),
        seeds, task_interval_seeds(tasks_by_seed), tuple(by_seed[s] for s in sorted(by_seed)),
        len(per_seed), tuple(sum(ep.success for ep in played) for played in per_seed) if len(per_seed) > 1 else (),
        tuple(sum(counts) / len(counts) for counts in asked) if len(per_seed) > 1 else (),
    )


class DoNothingAgent:
    """Says something that asks nothing, every turn: the floor's agent."""

    name = "do_nothing"

    def __init__(self, fmt: Any):
        self.format = fmt

    async def act(self, contexts: Sequence[Any]) -> list[Any]:
        from pipelines.episodes.agents import AgentOutput

        text, calls = self.format.render([AgentAction.respond("I see.")])
        return [AgentOutput(text, calls) for _ in contexts]


def table1_markdown(results: Iterable[RunResult], domains: Sequence[str], notes: Sequence[str] = ()) -> str:
    """The paper's Table 1/2 layout: success per domain (with its floor) and their average,
    then the step columns averaged over domains."""
    by_clarifier: dict[str, dict[str, RunResult]] = {}
    for result in results:
        by_clarifier.setdefault(result.clarifier, {})[result.domain] = result
    header = ["Clarifier", *(f"{d.capitalize()} pass@1 % [95 % CI] (floor; passed/episodes)" for d in domains), "Average",
              "Avg Agent", "Avg Clarify", "Avg Sum", "Unreadable % (of consultations)"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for name, cells in by_clarifier.items():
        k = max(c.training_seeds for c in cells.values())
        row = [name if k == 1 else f"{name} ({k} seeds)"]  # pooled over training seeds (each seed: the notes)
        present = [cells[d] for d in domains if d in cells]
        for domain in domains:
            cell = cells.get(domain)
            if cell is None:
                row.append("n/a")
                continue
            ci = f" [{100 * cell.ci95[0]:.1f}, {100 * cell.ci95[1]:.1f}]" if cell.ci95 else ""
            row.append(f"{100 * cell.pass_at_1:.1f}{ci} ({100 * cell.floor:.1f}; {cell.passed}/{cell.episodes})")
        mean = lambda values: sum(values) / len(values)  # noqa: E731
        row.append(f"{100 * mean([c.pass_at_1 for c in present]):.1f}")
        agent, clarify = mean([c.agent_steps for c in present]), mean([c.clarifications for c in present])
        row += [f"{agent:.2f}", f"{clarify:.2f}", f"{agent + clarify:.2f}"]
        # An unreadable answer asks nothing: a trained row equal to `none` may just be this.
        consulted = sum(c.consultations * c.episodes for c in present)
        row.append(f"{100 * sum(c.malformed for c in present) / consulted:.1f}" if consulted else "–")
        lines.append("| " + " | ".join(row) + " |")
    return "\n".join(lines + [""] + [f"- {note}" for note in notes]) + "\n"


def results_json(results: Iterable[RunResult], setting: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"setting": dict(setting), "runs": {}}
    for result in results:
        out["runs"].setdefault(result.clarifier, {})[result.domain] = result.as_dict()
    return out


#: Agent kinds that never receive a task (its ground-truth actions and outputs); the rest are oracles.
HONEST_AGENTS = ("policy", "openai", "hf")
ORACLE_AGENTS = ("oracle_informed",)
#: The report's notes on each agent setting (a model backbone: ``model``).
NOTES = {
    "policy": [
        "Agent `policy` (offline rules, `pipelines/clarifier/policy_agent.py`): it is built from the domain's name alone and "
        "never sees a task's solution; it authenticates the user with what the user says, reads the profile and orders, "
        "reads the request from the user's words (items, reason, variant, payment), asks for what it lacks, confirms and "
        "writes. It has no give-up timer. Airline: it only cancels a reservation whose id the user gives. Its pass@1 is "
        "what a script that does not know the answer reaches here, not a model's τ-bench ability.",
        "User `rules`: it knows only its instruction (values the instruction states) and says it does not know anything else.",
        "`oracle_rules` is an ORACLE upper bound, not a Clarifier a model can be: it reads the task's ground-truth actions "
        "to pick its question. Every other row reads only the dialogue.",
    ],
    "oracle_informed": [
        "ORACLE agent `oracle_informed`: it replays each task's ground-truth actions once the user has said their values and "
        "gives up after `patience` idle turns; its pass@1 is not an agent's result.",
    ],
    "model": [
        "A model backbone: pass@1 is a real τ-bench result for this agent, user and Clarifier "
        "(meaningful when the backbone is a real instruct model; the embedded tiny models stay at the floor).",
    ],
}


def play_domain(domain: Any, domain_name: str, tasks: Sequence[Any], seeds: Sequence[int], rows: Mapping[str, Sequence[tuple[str, Any]]],
                agent_for: Callable[[Mapping[str, Any]], Any], user: Any, budget: int) -> tuple[list[RunResult], list[Episode], dict[str, float]]:
    """Each row's Clarifiers (``(label, Clarifier)``, one per training seed; None: no Clarifier)
    on every task of ``tasks`` once per seed with at most ``budget`` questions, beside the
    do-nothing floor; ``agent_for(tasks by episode id)`` builds the agent for each seed (only
    an oracle agent reads the tasks). The rows' results, every episode, each row's seconds."""
    from pipelines.env.world import TauBenchWorld
    from pipelines.episodes import FunctionCallingFormat
    from pipelines.episodes.runner import EpisodeSpec, run_episodes
    from pipelines.episodes.taubench import tau_runner_config, tau_specs
    from pipelines.simulators.taubench import TauInstructionUser

    world = TauBenchWorld(domain)
    fmt = FunctionCallingFormat(domain.tool_schemas)
    floor_episodes = asyncio.run(run_episodes(tau_specs(tasks, seeds[0]), DoNothingAgent(fmt), TauInstructionUser(), world, tau_runner_config(domain)))
    floor_passed = sum(e.success for e in floor_episodes)
    results, episodes, timings = [], [], {}
    for name, seeded in rows.items():
        t0 = time.perf_counter()
        per_seed = []
        for label, clarifier in seeded:  # one per training seed of the row
            played = []
            for seed in seeds:
                specs = [EpisodeSpec(f"{label}:{task.task_id}#{seed}", task, seed) for task in tasks]
                agent = agent_for({s.episode_id: s.goal for s in specs})
                config = tau_runner_config(domain, max_exchanges=30 + budget)
                played += asyncio.run(run_episodes(specs, agent, user, world, config, clarifier, budget))
            per_seed.append(played)
        results.append(summarize_seeds(name, domain_name, per_seed, floor_passed))
        episodes.extend(ep for played in per_seed for ep in played)
        timings[f"{name}/{domain_name}_s"] = round(time.perf_counter() - t0, 2)
    return results, episodes, timings


def evaluation_markdown(results: Sequence[RunResult], setting: Mapping[str, Any], training_seeds: Mapping[str, int]) -> str:
    """The report's Markdown: a title that names an oracle agent, the table and its notes
    (the agent setting, the floor and budget, the rows pooled over ``training_seeds``)."""
    agent_kind, budget, seeds, max_tasks = setting["agent"], setting["budget"], setting["seeds"], setting["max_tasks"]
    notes = NOTES.get(agent_kind, NOTES["model"]) + [
        f"Floor: a do-nothing agent against the same user (tasks that change nothing and require no output). "
        f"Budget {budget} Clarifier questions per episode; user `{setting['user']}`; seeds {seeds}: every task played once "
        f"per seed (pass@1 is the mean over tasks and seeds; the interval is a 95 % bootstrap over tasks, 2,000 resamples)."
        + (f" The first {max_tasks} tasks of each split." if max_tasks is not None else "")
    ]
    pooled = [name for name, k in training_seeds.items() if k > 1]
    if pooled:
        notes.append(f"Training seeds: {', '.join(pooled)} each pool {max(training_seeds.values())} Clarifiers trained "
                     "under different seeds (every one plays every task and seed); pass@1 is the mean over all their "
                     "episodes and the interval resamples the training seeds, then the tasks, so it carries what a "
                     "re-training moves. Each seed's model, passed / questions per episode (Avg Clarify): "
                     + "; ".join(f"{r.clarifier} {r.domain} " + ", ".join(f"{p}/{r.n_tasks * r.seeds} {c:.2f}" for p, c in zip(
                         r.passed_by_training_seed, r.clarify_by_training_seed)) for r in results if r.training_seeds > 1) + ".")
    title = ("# τ-bench Clarifier evaluation: ORACLE agent (it replays the solution)" if agent_kind in ORACLE_AGENTS
             else "# τ-bench Clarifier evaluation (Table 1 layout)")
    return title + "\n\n" + table1_markdown(results, list(setting["domains"]), notes)
