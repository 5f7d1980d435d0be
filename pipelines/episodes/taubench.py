"""τ-bench in the dialogue runner: the runner settings of a domain and a ground-truth replay agent.

Play τ-bench episodes with the same runner, agents and tables as MultiWOZ ones::

    world = TauBenchWorld(domain)
    agent = HFAgent(..., fmt=get_format("function_calling", domain.tool_schemas))
    specs = tau_specs(domain.tasks["test"], seed=0)
    episodes = run_episodes_sync(specs, agent, TauRulesUser(), world, tau_runner_config(domain))
"""

from __future__ import annotations

from typing import Mapping, Sequence

from pipelines.env.taubench.data import TauDomain, TauTask
from pipelines.env.taubench.env import MAX_STEPS
from pipelines.episodes.agents import ActionAgent, AgentContext
from pipelines.episodes.formats import AgentAction, AgentFormat, FunctionCallingFormat
from pipelines.episodes.runner import EpisodeSpec, RunnerConfig


def tau_task_prompt(domain: TauDomain) -> str:
    """The agent's instructions: the domain's policy (wiki) and its rules, as τ-bench gives them."""
    rules = "\n".join(f"- {rule}" for rule in domain.rules)
    return domain.wiki.strip() + (f"\n\n## Rules\n\n{rules}" if rules else "")


def tau_runner_config(domain: TauDomain, **overrides) -> RunnerConfig:
    """Runner settings for τ-bench: the policy as the task prompt, and limits that leave the
    30-step budget (the world's) as the binding one."""
    settings = {"task_prompt": tau_task_prompt(domain), "max_exchanges": MAX_STEPS, "max_steps": MAX_STEPS} | overrides
    return RunnerConfig(**settings)


def tau_specs(tasks: Sequence[TauTask], seed: int = 0) -> list[EpisodeSpec]:
    """One spec per task; the episode id is ``<task id>#<seed>``."""
    return [EpisodeSpec(f"{task.task_id}#{seed}", task, seed) for task in tasks]


class TauReplayAgent(ActionAgent):
    """Makes the task's ground-truth calls, one per step, then says the required outputs and
    ends the episode. With the rules user it checks the τ-bench plumbing end to end: every
    task should score 1 (tests/taubench)."""

    def __init__(self, tasks: Mapping[str, TauTask], fmt: AgentFormat | None = None, *, name: str = "tau_replay"):
        self.tasks = dict(tasks)  # episode id -> task
        self.format = fmt or FunctionCallingFormat()
        self.name = name

    def actions(self, context: AgentContext) -> list[AgentAction]:
        task = self.tasks.get(context.episode_id)
        if task is None:
            raise ValueError(f"episode {context.episode_id!r}: the τ-bench replay agent has no task for it")
        made = len(context.calls)
        if made < len(task.actions):
            action = task.actions[made]
            return [AgentAction.tool_call(action.name, action.kwargs)]
        said = "; ".join(task.outputs)
        return [AgentAction.respond(f"All done. {said}".strip()), AgentAction.end()]
