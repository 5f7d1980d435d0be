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

from dataclasses import dataclass
from typing import Any, Iterable, Mapping, Sequence

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
