"""What a τ-bench task needs from its user, and what the user has said: the ground truth
behind the offline Clarifier (``rules``), its noisy candidates and the goal-aware judge.

A task's user knows the details of :func:`pipelines.simulators.taubench.task_details` (email,
order ids, reason, payment, address, trip details, the request in its own words). A value of
a ground-truth action's arguments is *gated* when some detail's answer says it: the agent
cannot know it until the user has said it. Exception: the user id, which the agent looks up
from the email or name and zip, so a tool output revealing it is as good as the user saying
it. Other values (item ids, prices) are the agent's to work out with its tools.

A detail is *missing* when a gated value it carries has not been said; the missing details
are ordered by the first ground-truth action that needs them (the most urgent first).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Iterable

from pipelines.clarifier.prompts import user_text
from pipelines.env.taubench.data import TauAction, TauTask
from pipelines.simulators.taubench import Detail, asked_details, task_details

#: One question per detail, worded so that the rules user hears exactly that detail in it
#: (tests/clarifier check every one against ``asked_details``).
QUESTIONS: dict[str, str] = {
    "email": "Could you tell me the email on your account?",
    "name_zip": "Could you tell me your full name and zip code?",
    "user_id": "What is your user id?",
    "order_id": "Which order is this about? Please give me the order id.",
    "reservation_id": "Which reservation is this about? Please give me the reservation id.",
    "reason": "May I ask the reason for this request?",
    "payment": "Which payment method should I use?",
    "address": "What is the new address?",
    "route": "Where are you flying from and to?",
    "flights": "Which flights and on what date?",
    "cabin": "Which cabin class would you like?",
    "passengers": "Who is travelling? Please list each passenger with their birthday.",
    "bags": "How many bags will you check in total?",
    "insurance": "Would you like travel insurance?",
    "amount": "How much compensation are you asking for?",
    "request": "Could you describe exactly which items you mean and what you would like?",
}
# The agent finds the user id itself (from the email or name and zip).
_DERIVABLE = frozenset({"user_id"})


def _leaves(value: Any) -> Iterable[Any]:
    if isinstance(value, dict):
        for item in value.values():
            yield from _leaves(item)
    elif isinstance(value, list):
        for item in value:
            yield from _leaves(item)
    elif value is not None and not isinstance(value, bool):
        yield value


def said(value: Any, text: str) -> bool:
    """Whether ``value`` occurs in ``text`` as a word (case-insensitive).

    >>> said("#W1", "the order is #W1."), said(2, "2 bags"), said(2, "item 12")
    (True, True, False)
    """
    token = str(value).strip().lower()
    if not token:
        return True
    return re.search(r"(?<![\w#])" + re.escape(token) + r"(?!\w)", text.lower()) is not None


@dataclass(frozen=True)
class Gate:
    """A gated value of one ground-truth action and the details that say it."""

    action: int
    value: Any
    details: tuple[str, ...]


def gates(task: TauTask, details: list[Detail] | None = None) -> list[Gate]:
    details = task_details(task) if details is None else details
    found = []
    for index, action in enumerate(task.actions):
        for value in dict.fromkeys(str(v) for v in _leaves(action.kwargs)):
            names = tuple(d.name for d in details if said(value, d.answer))
            if names:
                found.append(Gate(index, value, names))
    return found


def action_ready(task: TauTask, action: int, user_said: str, tool_said: str, details: list[Detail] | None = None) -> bool:
    """Whether every gated value of ground-truth action ``action`` is known: said by the
    user, or (the user id) shown by a tool."""
    for gate in gates(task, details):
        if gate.action != action:
            continue
        known = said(gate.value, user_said) or (set(gate.details) <= _DERIVABLE and said(gate.value, tool_said))
        if not known:
            return False
    return True


def missing_details(task: TauTask, history: str, details: list[Detail] | None = None) -> list[Detail]:
    """The details the ground truth still needs from the user, most urgent first, given a
    rendered history (:func:`pipelines.episodes.clarify.history_text`)."""
    details = task_details(task) if details is None else details
    by_name = {d.name: d for d in details}
    spoken = user_text(history)
    tools = "\n".join(line for line in history.splitlines() if line.startswith("Tool["))
    missing: list[str] = []
    for gate in gates(task, details):
        if said(gate.value, spoken) or (set(gate.details) <= _DERIVABLE and said(gate.value, tools)):
            continue
        # The most specific detail saying the value (an id's own detail before the request).
        name = next((n for n in gate.details if n != "request"), gate.details[0])
        if name not in missing:
            missing.append(name)
    return [by_name[name] for name in missing]


def question_for(detail: Detail) -> str:
    return QUESTIONS.get(detail.name, f"Could you tell me the {detail.name.replace('_', ' ')}?")


def task_goal(task: TauTask) -> dict[str, Any]:
    """G*, as the judges see it: the instruction, the user id, the ground-truth actions and the
    required outputs."""
    return {
        "task_id": task.task_id,
        "user_id": task.user_id,
        "instruction": task.instruction,
        "actions": [{"name": a.name, "kwargs": a.kwargs} for a in task.actions],
        "outputs": list(task.outputs),
    }


def goal_task(goal: dict[str, Any]) -> TauTask:
    """The task back from :func:`task_goal`'s record."""
    domain, split, index = goal["task_id"].split("/")
    actions = tuple(TauAction(a["name"], a["kwargs"]) for a in goal["actions"])
    return TauTask(domain, split, int(index), goal["user_id"], goal["instruction"], actions, tuple(goal["outputs"]))


# -- goal-aware utility -------------------------------------------------------------------

#: Utilities (0-10, the GRPO judge's scale) of a final output against G*.
ASK_MOST_URGENT, ASK_NEEDED_LATER, NO_WHEN_NOTHING_MISSING = 10.0, 7.0, 10.0
NO_WHEN_MISSING, ASK_REPEAT, ASK_NOTHING_NEEDED, MALFORMED = 3.0, 2.0, 1.0, 0.0
#: At or above this a decision is good (TIE when both are), below it poor (BOTH_BAD).
GOOD = 5.0


def utility(task: TauTask, history: str, question: str | None, *, malformed: bool = False) -> tuple[float, str]:
    """The goal-aware utility of one final output, with the rule that gave it: asking for
    the most urgent missing detail 10, for another missing one 7; not asking when nothing is
    missing 10, when something is 3; asking again for something said 2, for nothing the
    user must supply 1 (retrievable data, vague or off-task); a malformed answer 0."""
    if malformed:
        return MALFORMED, "malformed"
    details = task_details(task)
    missing = missing_details(task, history, details)
    if question is None:
        return (NO_WHEN_NOTHING_MISSING, "no_need_correct") if not missing else (NO_WHEN_MISSING, "no_need_but_missing")
    asked = {d.name for d in asked_details(question, details)}
    missing_names = [d.name for d in missing]
    if missing_names and missing_names[0] in asked:
        return ASK_MOST_URGENT, "asks_most_urgent"
    if asked & set(missing_names):
        return ASK_NEEDED_LATER, "asks_missing"
    if asked:
        return ASK_REPEAT, "asks_known"
    return ASK_NOTHING_NEEDED, "asks_nothing_needed"


def preference(u_a: float, u_b: float) -> str:
    """The pairwise verdict from two utilities: A or B when they differ and the better is
    good, TIE when both are equally good, BOTH_BAD when neither is good.

    >>> preference(10, 3), preference(7, 7), preference(2, 1), preference(3, 10)
    ('A', 'TIE', 'BOTH_BAD', 'B')
    """
    if max(u_a, u_b) < GOOD:
        return "BOTH_BAD"
    if u_a == u_b:
        return "TIE"
    return "A" if u_a > u_b else "B"
