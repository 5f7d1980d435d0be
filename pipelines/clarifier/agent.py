"""An ORACLE τ-bench agent: :class:`TauInformedAgent` (``clarifier.eval.agent: {kind:
oracle_informed}``; the Clarifier's training data is played with it). It reads each task's
ground-truth actions and outputs, so its pass@1 is never a measured result: the measured
offline agent is :class:`pipelines.clarifier.policy_agent.TauPolicyAgent`.

It knows how to solve the task (the ground-truth actions, like the replay agent) but may
only make a call once the user has said every value of it that only the user knows
(:func:`pipelines.clarifier.grounding.action_ready`); it never asks anything itself. While a
detail is missing it says so without a question ("Please go on."), and the rules user then
volunteers its next withheld detail, whichever that is; after ``patience`` such turns for
the same ground-truth step it gives up and ends the episode. While it waits it looks up what it has learnt (the user's
account once it knows the user id, an order or reservation the user named), as an agent
does; those tool calls are where the Clarifier is consulted.

So it stands for an agent that uses its tools well but does not resolve a fuzzy request:
with no Clarifier it passes only the tasks where the user happens to volunteer details in
the order they are needed; a Clarifier that asks for the right detail after a tool call
lets it go on. Its pass@1 measures the Clarifier's questions, not a model's tool use: a
mechanism check offline, never a result to compare with the paper's.
"""

from __future__ import annotations

import json
from typing import Mapping

from pipelines.clarifier.grounding import action_ready, said
from pipelines.config import positive_int
from pipelines.env.taubench.data import TauTask
from pipelines.episodes.agents import ActionAgent, AgentContext
from pipelines.episodes.formats import AgentAction, AgentFormat, FunctionCallingFormat
from pipelines.simulators.taubench import task_details

WAIT = "I can help with that. Please go on."
GIVE_UP = "I'm sorry, I cannot complete this without more details."


class TauInformedAgent(ActionAgent):
    """See the module docstring. ``tasks``: episode id -> task."""

    def __init__(self, tasks: Mapping[str, TauTask], fmt: AgentFormat | None = None, *, patience: int = 2, name: str = "tau_informed"):
        positive_int(patience, "patience", minimum=0)
        self.tasks = dict(tasks)
        self.format = fmt or FunctionCallingFormat()
        self.patience = patience
        self.name = name
        self._details = {episode_id: task_details(task) for episode_id, task in self.tasks.items()}
        # (episode, ground-truth step) -> turns waited there; look-ups do not reset it
        self._waited: dict[tuple[str, int], int] = {}

    def actions(self, context: AgentContext) -> list[AgentAction]:
        task = self.tasks.get(context.episode_id)
        if task is None:
            raise ValueError(f"episode {context.episode_id!r}: the informed agent has no task for it")
        made = self._made(task, context)
        if made >= len(task.actions):
            said = "; ".join(task.outputs)
            return [AgentAction.respond(f"All done. {said}".strip()), AgentAction.end()]
        user_said = "\n".join(str(m.get("content") or "") for m in context.messages if m.get("role") == "user")
        tool_said = "\n".join(call.observation_json if hasattr(call, "observation_json") else str(call.observation) for _, call in context.calls)
        if action_ready(task, made, user_said, tool_said, self._details[context.episode_id]):
            action = task.actions[made]
            return [AgentAction.tool_call(action.name, action.kwargs)]
        lookup = self._lookup(task, context, user_said, tool_said)
        if lookup is not None:
            return [lookup]
        key = (context.episode_id, made)
        if self._waited.get(key, 0) >= self.patience:
            return [AgentAction.respond(GIVE_UP), AgentAction.end()]
        self._waited[key] = self._waited.get(key, 0) + 1
        return [AgentAction.respond(WAIT)]

    @staticmethod
    def _made(task: TauTask, context: AgentContext) -> int:
        """Ground-truth actions made so far, in order (look-ups in between do not count)."""
        made = 0
        for _, call in context.calls:
            if made < len(task.actions) and call.name == task.actions[made].name and dict(call.arguments) == task.actions[made].kwargs:
                made += 1
        return made

    @staticmethod
    def _lookup(task: TauTask, context: AgentContext, user_said: str, tool_said: str) -> AgentAction | None:
        """A read-only look-up of what it has learnt and not yet looked at (the user's
        account, an order or reservation the user named), as an agent does while it waits."""
        done = {(call.name, json.dumps(dict(call.arguments), sort_keys=True)) for _, call in context.calls}
        wanted = []
        if said(task.user_id, user_said) or said(task.user_id, tool_said):
            wanted.append(("get_user_details", {"user_id": task.user_id}))
        key, tool = ("order_id", "get_order_details") if task.domain == "retail" else ("reservation_id", "get_reservation_details")
        for action in task.actions:
            value = action.kwargs.get(key)
            if isinstance(value, str) and said(value, user_said):
                wanted.append((tool, {key: value}))
        for name, arguments in wanted:
            if (name, json.dumps(arguments, sort_keys=True)) not in done:
                return AgentAction.tool_call(name, arguments)
        return None
