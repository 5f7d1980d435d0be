"""Issue 27 (Clarifier): the measured setting never reads a task's solution.

No agent kind of the headline (``policy``, ``openai``, ``hf``) is handed a task, its
ground-truth actions or outputs; the offline user states only what its instruction says; the
``rules`` Clarifier, which reads the ground truth, is an oracle row by name; the README's
Clarifier table is the committed report's.
"""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path
from typing import Any, Iterator

import pytest

from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.policy_agent import TauPolicyAgent
from pipelines.env.taubench.data import TauAction, TauTask
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import FunctionCallingFormat
from pipelines.episodes.runner import EpisodeSpec, run_episodes_sync
from pipelines.episodes.taubench import tau_runner_config
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, ResponseCache
from pipelines.simulators.taubench import TauInstructionUser, TauRulesUser, TauUserView, instruction_details

ROOT = Path(__file__).resolve().parents[2]


def _reachable(obj: Any, depth: int = 6) -> Iterator[Any]:
    """Every object reachable from ``obj`` through attributes and containers (bounded)."""
    seen: set[int] = set()
    stack = [(obj, 0)]
    while stack:
        current, level = stack.pop()
        if id(current) in seen or level > depth:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, (str, bytes, int, float, bool, type(None))) or type(current).__module__.startswith(("torch", "numpy")):
            continue
        if isinstance(current, dict):
            children = [*current.keys(), *current.values()]
        elif isinstance(current, (list, tuple, set, frozenset)):
            children = list(current)
        else:
            children = list(getattr(current, "__dict__", {}).values())
            children += [getattr(current, slot) for slot in getattr(type(current), "__slots__", ()) if hasattr(current, slot)]
        stack.extend((child, level + 1) for child in children)


def _holds_a_solution(agent: Any) -> bool:
    return any(isinstance(o, (TauTask, TauAction)) for o in _reachable(agent))


def _solution_values(task: TauTask) -> set[str]:
    """The ground truth's string values (ids, flight numbers, names) of five or more characters."""
    values: set[str] = set()

    def walk(value: Any) -> None:
        if isinstance(value, str) and len(value) >= 5:
            values.add(value)
        elif isinstance(value, dict):
            for v in value.values():
                walk(v)
        elif isinstance(value, (list, tuple)):
            for v in value:
                walk(v)

    for action in task.actions:
        walk(action.kwargs)
    return values


def _user_texts(episode) -> list[str]:
    return [e.text or "" for e in episode.events if e.actor == "user"]


def _play(domain, task: TauTask, agent, user, clarifier=None, budget: int = 0):
    spec = EpisodeSpec(f"{task.task_id}#0", task, 0)
    return run_episodes_sync([spec], agent, user, TauBenchWorld(domain), tau_runner_config(domain, max_exchanges=33), clarifier, budget)[0]


def test_no_measured_agent_kind_is_handed_a_task_and_the_oracle_is(tmp_path, retail, tiny_model_dir):
    """Every non-oracle agent kind the stage builds holds no task (so no ground-truth actions or
    outputs); the oracle kind does, which shows that the check finds one."""
    from catalog.clarifier import make_agent
    from pipelines.clarifier.evaluation import HONEST_AGENTS, ORACLE_AGENTS

    tasks = {f"x:{t.task_id}#0": t for t in retail.tasks["test"][:5]}
    sections = {
        "policy": {"kind": "policy"},
        "openai": {"kind": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "max_retries": 0, "timeout_s": 1.0},
        "hf": {"kind": "hf", "model_path": str(tiny_model_dir)},
    }
    assert set(sections) == set(HONEST_AGENTS)
    for kind, section in sections.items():
        agent = make_agent(section, retail, tasks, Accounting(), ResponseCache(tmp_path))
        assert not _holds_a_solution(agent), f"agent kind {kind!r} can read the task's solution"
    for kind in ORACLE_AGENTS:
        assert _holds_a_solution(make_agent({"kind": kind}, retail, tasks, Accounting(), ResponseCache(tmp_path)))
    with pytest.raises(ConfigError, match="expected one of"):
        make_agent({"kind": "informed"}, retail, tasks, Accounting(), ResponseCache(tmp_path))


def test_the_rules_clarifier_must_be_named_an_oracle(tmp_path):
    from catalog.clarifier import make_clarifier

    with pytest.raises(ConfigError, match="oracle"):
        make_clarifier("rules", {"backend": "rules"}, Accounting(), ResponseCache(tmp_path))
    assert make_clarifier("oracle_rules", {"backend": "rules"}, Accounting(), ResponseCache(tmp_path)).name == "oracle_rules"


def test_the_instruction_user_never_says_a_solution_value_its_instruction_lacks(retail, airline):
    """Asked for every detail (and to describe the request), on every real test task, the user
    says no ground-truth value that its instruction does not contain; the solution-grounded
    user of the training data does (that is the leak this user removes)."""
    questions = ["Could you tell me your email address, or your name and zip code?", "What is your user id?",
                 "Which order is it? What is the order id?", "What is the reservation id?", "What is the reason?",
                 "Which payment method should I use for the refund?", "What is the new address?", "Where are you flying from?",
                 "What date?", "Which cabin class?", "Who are the passengers and their dates of birth?", "How many bags?",
                 "Do you want insurance?", "How much compensation?", "Which items? Please describe the request.", "I see."]
    import asyncio

    leaked_before = 0
    for domain in (retail, airline):
        for task in domain.tasks["test"]:
            # an order id the instruction writes without its "#" counts as stated
            unstated = {v for v in _solution_values(task) if v.lstrip("#") not in task.instruction}
            for user in (TauInstructionUser(), TauRulesUser()):
                session = user.session(task, 0)
                said = [asyncio.run(session.opening()).text] + [asyncio.run(session.respond(q)).text for q in questions]
                leaks = {v for v in unstated if any(v in text for text in said)}
                if isinstance(user, TauInstructionUser):
                    assert not leaks, f"{task.task_id}: the instruction user said {sorted(leaks)}"
                else:
                    leaked_before += bool(leaks)
    assert leaked_before > 20


def test_the_instruction_user_says_it_does_not_know_what_its_instruction_lacks():
    import asyncio

    view = TauUserView("airline", "Your user id is olivia_gonzalez_2305. It is in your reservations but you don't remember the reservation id.")
    assert [d.name for d in instruction_details(view)] == ["user_id", "request"]
    task = TauTask("airline", "test", 0, "olivia_gonzalez_2305", view.instruction, (TauAction("cancel_reservation", {"reservation_id": "Z7GOZK"}),), ())
    session = TauInstructionUser().session(task, 0)
    assert "don't know" in asyncio.run(session.respond("What is your reservation id?")).text
    assert "olivia_gonzalez_2305" in asyncio.run(session.respond("What is your user id?")).text


def test_the_policy_agent_cannot_reach_a_solution_that_nobody_states(airline, retail):
    """A real airline task whose reservation id the user does not remember: the policy agent
    never calls a write with it (it cannot know it), the user never says it; the oracle agent
    with the solution-grounded user of the training data does reach it. A retail task stripped
    of the user's identity: the agent cannot even find the user, and writes nothing."""
    task = next(t for t in airline.tasks["test"] if "don't remember the reservation id" in t.instruction
                and [a.name for a in t.actions] == ["cancel_reservation"])
    target = task.actions[0].kwargs["reservation_id"]
    fmt = FunctionCallingFormat(airline.tool_schemas)
    honest = _play(airline, task, TauPolicyAgent("airline", fmt), TauInstructionUser())
    assert not honest.success
    assert all(target not in (e.arguments_json or "") for e in honest.events if e.kind == "tool_call")
    assert all(target not in text for text in _user_texts(honest))
    oracle = _play(airline, task, TauInformedAgent({f"{task.task_id}#0": task}, fmt, patience=5), TauRulesUser())
    assert oracle.success and any(target in text for text in _user_texts(oracle))

    cancel = next(t for t in retail.tasks["test"] if [a.name for a in t.actions if not a.name.startswith(("get_", "find_"))] == ["cancel_pending_order"])
    anonymous = dataclasses.replace(cancel, instruction="You want to cancel an order because you no longer need it.")
    played = _play(retail, anonymous, TauPolicyAgent("retail", FunctionCallingFormat(retail.tool_schemas)), TauInstructionUser())
    assert not played.success
    assert not [e for e in played.events if e.kind == "tool_call" and not (e.tool_name or "").startswith(("get_", "find_"))]


def test_the_policy_agent_solves_what_the_user_states(retail):
    """Not a stub: a cancellation whose order and reason the instruction states is carried out
    (identity by name and zip, the order read, the policy's confirmation, the write)."""
    cancel = next(t for t in retail.tasks["test"] if [a.name for a in t.actions if not a.name.startswith(("get_", "find_"))] == ["cancel_pending_order"])
    ident = next(a.kwargs for a in cancel.actions if a.name.startswith("find_user_id"))
    who = f"You are {ident['first_name']} {ident['last_name']} in {ident['zip']}." if "zip" in ident else f"Your email is {ident['email']}."
    order_id, reason = cancel.actions[-1].kwargs["order_id"], cancel.actions[-1].kwargs["reason"]
    because = "you ordered it by mistake" if reason == "ordered by mistake" else "you no longer need it"
    task = dataclasses.replace(cancel, instruction=f"{who} You want to cancel order {order_id} because {because}.")
    played = _play(retail, task, TauPolicyAgent("retail", FunctionCallingFormat(retail.tool_schemas)), TauInstructionUser())
    calls = [(e.tool_name, json.loads(e.arguments_json)) for e in played.events if e.kind == "tool_call"]
    assert ("cancel_pending_order", task.actions[-1].kwargs) in calls, task.instruction
    confirm = [e.text for e in played.events if e.kind == "respond" and "Do you confirm" in (e.text or "")]
    assert confirm and played.success


def _table(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.startswith("| ")]


def test_the_readme_clarifier_table_is_the_committed_report():
    """README "The τ-bench Clarifier": its table is reports/clarifier_eval.md's, row for row,
    and it names the oracle and what the numbers do not show."""
    report = (ROOT / "reports" / "clarifier_eval.md").read_text()
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("### The τ-bench Clarifier"):]
    section = section[: section.index("\n## ")]
    rows = _table(report)
    assert rows and all(row in section for row in rows), "README's Clarifier table differs from reports/clarifier_eval.md"
    metrics = json.loads((ROOT / "reports" / "clarifier_eval.json").read_text())
    assert metrics["setting"]["agent"] == "policy" and not metrics["setting"]["oracle_agent"]
    assert len(metrics["setting"]["seeds"]) >= 3
    assert "ORACLE" not in report.splitlines()[0]
    for name, cells in metrics["runs"].items():
        assert any(row.startswith(f"| {name} |") for row in rows)
        for domain, cell in cells.items():
            assert f"{100 * cell['pass_at_1']:.1f} [{100 * cell['ci95_low']:.1f}, {100 * cell['ci95_high']:.1f}]" in section
    assert all(name.startswith("oracle") for name in metrics["setting"]["oracle_rows"]) and "oracle_rules" in metrics["runs"]
    prose = " ".join(section.split())
    assert "upper bound" in prose and "what they do not show" in prose
