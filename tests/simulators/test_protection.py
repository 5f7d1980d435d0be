"""Failure protection (PIR A.2): injected faults give bounded retries, then a recorded fallback."""

from __future__ import annotations

import asyncio
import random

import pytest

from pipelines.errors import ConfigError
from pipelines.llm.testing.fake_server import FaultPlan
from pipelines.simulators import (
    SimulatorSpec,
    FALLBACK_REPLIES,
    AgendaSimulator,
    GoalLLMSimulator,
    GuideLLMSimulator,
    ProtectedSession,
    ProtectedSimulator,
    UserTurn,
    simulator_from_config,
    turn_fault,
)
from pipelines.simulators.llm import call_seed

from .conftest import domain_goal, make_client, make_goal, run

GOAL = make_goal(domain_goal("restaurant", {"food": "indian", "area": "north"}, reqt=("phone",)))


def episode(simulator, agent_texts, seed=0):
    async def go():
        try:
            session = simulator.session(GOAL, seed)
            turns = [await session.opening()]
            for text in agent_texts:
                turns.append(await session.respond(text))
            return turns
        finally:
            await simulator.inner.client.aclose()

    return run(go())


# -- LLM faults through the real client and the fake server ----------------------------------


def test_llm_failures_are_retried_with_new_seeds_then_fall_back_to_the_agenda_reply(make_server, tiny_db):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    simulator = simulator_from_config("goal_llm", client=make_client(server.base_url), database=tiny_db)
    (turn,) = episode(simulator, [], seed=3)

    assert turn.fallback and turn.retries == 2
    assert turn.failure.startswith("llm_server_error")
    assert turn.text == run(AgendaSimulator(tiny_db).session(GOAL, 3).opening()).text
    assert server.stats.requests == 3  # one per attempt: the client itself does not retry here
    assert len({body["seed"] for body in server.stats.bodies}) == 3, "each retry must ask anew"


def test_without_a_fallback_simulator_a_neutral_pir_reply_is_used(make_server):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    simulator = simulator_from_config("goal_llm", client=make_client(server.base_url), spec=SimulatorSpec(kind="goal_llm", max_retries=1))
    (turn,) = episode(simulator, [])
    assert turn.fallback and turn.retries == 1 and turn.text in FALLBACK_REPLIES


def test_an_empty_reply_is_retried_and_the_retry_recorded(server, scripted_replies):
    bad_seed = call_seed(0, 0, 0)
    scripted_replies(lambda messages, seed: "   " if seed == bad_seed else "I need an indian restaurant.")
    simulator = ProtectedSimulator(GoalLLMSimulator(make_client(server.base_url)))
    (turn,) = episode(simulator, [])
    assert (turn.text, turn.retries, turn.fallback, turn.failure) == ("I need an indian restaurant.", 1, False, "empty")


def test_role_confused_replies_are_faults(server, scripted_replies, tiny_db):
    scripted_replies(lambda messages, seed: "Assistant: How can I help you today?")
    simulator = simulator_from_config("guide_llm", client=make_client(server.base_url), database=tiny_db)
    (turn,) = episode(simulator, [])
    assert turn.fallback and turn.failure.startswith("role_confused")
    assert server.stats.requests == 6  # guide + customer, three attempts


def test_a_fallback_turn_becomes_part_of_the_llm_users_conversation(server, scripted_replies, tiny_db):
    # Every opening attempt fails (no customer turn yet); later turns work.
    scripted_replies(lambda messages, seed: "Sure, thanks." if any(m["role"] == "assistant" for m in messages) else "")
    simulator = simulator_from_config("goal_llm", client=make_client(server.base_url), database=tiny_db)
    turns = episode(simulator, ["Which area?", "The nirala is in the north."])
    assert [t.fallback for t in turns] == [True, False, False]
    assert sum(t.fallback for t in turns) == 1  # what the runner counts per episode
    messages = server.stats.bodies[-1]["messages"]
    assert messages[2] == {"role": "assistant", "content": turns[0].text}
    assert messages[3]["content"].startswith("Which area?")


# -- any session: exceptions, partial state, timeouts ----------------------------------------


class FlakySession:
    """Fails the first ``failures[0]`` attempts, after changing its own state: a failed
    attempt must not leave that change behind."""

    def __init__(self, failures: list[int], history: tuple[str, ...] = ()):
        self.failures = failures  # shared by forks: it counts attempts, not sessions
        self.history = history

    async def opening(self) -> UserTurn:
        return await self.respond("")

    async def respond(self, agent_text: str) -> UserTurn:
        self.history += (agent_text,)
        if self.failures[0] > 0:
            self.failures[0] -= 1
            raise RuntimeError("boom")
        return UserTurn(f"reply {len(self.history)}")

    def fork(self) -> FlakySession:
        return type(self)(self.failures, self.history)


class SlowSession(FlakySession):
    async def respond(self, agent_text: str) -> UserTurn:
        await asyncio.sleep(5)
        return UserTurn("too late")


def test_exceptions_are_retried_on_forks_so_failed_attempts_leave_no_state():
    inner = FlakySession([2])
    session = ProtectedSession(inner, SimulatorSpec(max_retries=2), None, random.Random(0))
    turn = run(session.respond("hello"))
    assert (turn.text, turn.retries, turn.fallback) == ("reply 1", 2, False)
    assert turn.failure == "exception: RuntimeError: boom"
    assert run(session.respond("again")) == UserTurn("reply 2")


def test_retries_are_bounded_and_the_fallback_is_recorded():
    session = ProtectedSession(FlakySession([10]), SimulatorSpec(max_retries=3), None, random.Random(0))
    turn = run(session.respond("hello"))
    assert turn.fallback and turn.retries == 3 and turn.text in FALLBACK_REPLIES
    assert turn.failure == "exception: RuntimeError: boom" and not turn.end


def test_a_turn_that_takes_too_long_is_a_fault():
    session = ProtectedSession(SlowSession([0]), SimulatorSpec(max_retries=1, turn_timeout_s=0.05), None, random.Random(0))
    turn = run(session.respond("hello"))
    assert turn.fallback and turn.failure.startswith("timeout")


def test_protected_sessions_fork_independently(tiny_db):
    simulator = ProtectedSimulator(AgendaSimulator(tiny_db), fallback=AgendaSimulator(tiny_db))
    session = simulator.session(GOAL, 2)
    run(session.opening())
    fork = session.fork()
    assert run(fork.respond("The nirala is in the north.")).acts
    twin = AgendaSimulator(tiny_db).session(GOAL, 2)
    run(twin.opening())
    assert run(session.respond("Which area?")) == run(twin.respond("Which area?"))


def test_turn_faults():
    assert turn_fault(UserTurn("Hi")) is None
    assert turn_fault(UserTurn("", end=True)) is None  # hanging up needs no words
    assert turn_fault(UserTurn("  \n")) == "empty"
    assert turn_fault(UserTurn("AGENT: what else?")).startswith("role_confused")
    assert turn_fault(UserTurn("**Assistant**: sure")).startswith("role_confused")
    assert turn_fault("hello").startswith("not_a_turn")


@pytest.mark.parametrize("fields", [{"max_retries": -1}, {"max_retries": 1.5}, {"turn_timeout_s": 0}, {"turn_timeout_s": "1"}])
def test_bad_protection_configuration_is_rejected(fields):
    with pytest.raises(ConfigError):
        SimulatorSpec(**fields)


# -- the factory ------------------------------------------------------------------------------


def test_simulator_from_config(tiny_db, server):
    client = make_client(server.base_url)
    agenda = simulator_from_config("agenda", database=tiny_db)
    assert isinstance(agenda, AgendaSimulator) and agenda.name == "agenda"
    goal = simulator_from_config("goal_llm", client=client, database=tiny_db)
    assert isinstance(goal, ProtectedSimulator) and isinstance(goal.inner, GoalLLMSimulator)
    assert isinstance(goal.fallback, AgendaSimulator) and goal.name == "goal_llm"
    guide = simulator_from_config("guide_llm", client=client, protected=False)
    assert isinstance(guide, GuideLLMSimulator) and guide.name == "guide_llm"
    with pytest.raises(ConfigError, match="unknown kind"):
        simulator_from_config("oracle", database=tiny_db)
    with pytest.raises(ConfigError, match="LLM client"):
        simulator_from_config("goal_llm", database=tiny_db)
    with pytest.raises(ConfigError, match="database"):
        simulator_from_config("agenda")
