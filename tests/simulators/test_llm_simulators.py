"""The JOSH goal- and guide-based LLM simulators against the fake OpenAI-compatible server."""

from __future__ import annotations

import pytest

from pipelines.llm import SamplingParams
from pipelines.llm.testing import fake_server
from pipelines.records import Dialogue, Turn
from pipelines.simulators import GoalLLMSimulator, GuideLLMSimulator, parse_reply
from pipelines.simulators.llm import AGENT_GREETING, EMPTY_CONVERSATION, GUIDE_NO_SOURCE, call_seed

from .conftest import domain_goal, make_client, make_goal, run

MESSAGE = (
    "You are looking for a <span class='emphasis'>restaurant</span>. The restaurant should serve <span class='emphasis'>indian</span> food",
    "Make sure you get the <span class='emphasis'>phone number</span>",
)
RESTAURANT = domain_goal("restaurant", {"food": "indian", "area": "north"}, reqt=("phone",))
GOAL = make_goal(RESTAURANT, message=MESSAGE)
REFERENCE = Dialogue(
    "TEST0001.json",
    GOAL,
    (
        Turn("TEST0001.json", 0, "user", "I want an indian restaurant in the north."),
        Turn("TEST0001.json", 1, "system", "The nirala is a moderate indian restaurant in the north."),
        Turn("TEST0001.json", 2, "user", "Lovely, what is their phone number?"),
        Turn("TEST0001.json", 3, "system", "It is 01223330003."),
    ),
)


def converse(simulator, goal, agent_texts, seed=0, reference=None):
    async def go():
        try:
            session = simulator.session(goal, seed, reference)
            turns = [await session.opening()]
            for text in agent_texts:
                turns.append(await session.respond(text))
                if turns[-1].end:
                    break
            return turns
        finally:
            await simulator.client.aclose()

    return run(go())


def contents(body) -> str:
    return "\n".join(m["content"] for m in body["messages"])


# -- goal-based -----------------------------------------------------------------------------


def test_goal_prompt_holds_the_goal_without_markup_and_the_conversation_from_the_users_side(server):
    simulator = GoalLLMSimulator(make_client(server.base_url))
    turns = converse(simulator, GOAL, ["Hello! Which area would you like?"])
    opening_body, reply_body = server.stats.bodies

    system = reply_body["messages"][0]
    assert system["role"] == "system"
    assert "You are looking for a restaurant. The restaurant should serve indian food" in system["content"]
    assert "Make sure you get the phone number" in system["content"]
    assert "END_CONVERSATION" in system["content"]
    for body in (opening_body, reply_body):
        assert "<span" not in contents(body) and "</span>" not in contents(body)
        assert body["messages"][-1]["content"].endswith("CUSTOMER:")
        assert contents(body).count("REMEMBER: You are a customer") == 1  # the reminder only comes last

    assert [m["role"] for m in opening_body["messages"]] == ["system", "user"]
    assert opening_body["messages"][1]["content"].startswith(AGENT_GREETING)
    # The customer's own turns are the model's (assistant) turns; the agent's are user turns.
    assert [m["role"] for m in reply_body["messages"]] == ["system", "user", "assistant", "user"]
    assert reply_body["messages"][2]["content"] == turns[0].text
    assert reply_body["messages"][3]["content"].startswith("Hello! Which area would you like?")

    assert opening_body["temperature"] == reply_body["temperature"] == 0.0
    assert opening_body["seed"] != reply_body["seed"]
    assert [t.text for t in turns] == [
        parse_reply(fake_server.reply_text(body["messages"], body["seed"], 0, False))[0] for body in (opening_body, reply_body)
    ]


def test_a_goal_without_message_is_rendered_for_the_prompt(server):
    simulator = GoalLLMSimulator(make_client(server.base_url))
    converse(simulator, make_goal(RESTAURANT), [])
    system = server.stats.bodies[0]["messages"][0]["content"]
    assert "You are looking for a restaurant serving indian food in the north." in system
    assert "Make sure you get the phone number." in system


def test_sampling_is_configurable(server):
    converse(GoalLLMSimulator(make_client(server.base_url), SamplingParams(temperature=0.7, max_tokens=64)), GOAL, [])
    assert (server.stats.bodies[0]["temperature"], server.stats.bodies[0]["max_tokens"]) == (0.7, 64)


def test_the_factory_gives_the_llm_user_its_roles_sampling(server):
    # simulator_from_config gets the user_simulator role's sampling from the stages (its
    # backend section's ``sampling``); without one, JOSH's temperature 0
    from pipelines.simulators import DEFAULT_SAMPLING, simulator_from_config

    role = SamplingParams(temperature=0.3, max_tokens=40)
    converse(simulator_from_config("goal_llm", client=make_client(server.base_url), sampling=role, protected=False), GOAL, [])
    converse(simulator_from_config("goal_llm", client=make_client(server.base_url), protected=False), GOAL, [])
    sent = [(body["temperature"], body["max_tokens"]) for body in server.stats.bodies]
    assert sent[0] == (0.3, 40) and sent[-1] == (DEFAULT_SAMPLING.temperature, DEFAULT_SAMPLING.max_tokens) == (0.0, 256)


def test_end_conversation_in_the_reply_ends_the_session(server, scripted_replies):
    def script(messages, seed):
        return "Wonderful, thank you! END_CONVERSATION" if "reference" in messages[-1]["content"] else "An indian place, please."

    scripted_replies(script)
    turns = converse(GoalLLMSimulator(make_client(server.base_url)), GOAL, ["Which area?", "Booked: reference 12345678.", "More?"])
    assert [t.end for t in turns] == [False, False, True]
    assert turns[-1].text == "Wonderful, thank you!"


def test_a_rerun_is_served_from_the_cache(server, tmp_path):
    agent = ["Which area?", "The nirala is in the north."]
    first = converse(GoalLLMSimulator(make_client(server.base_url, tmp_path / "cache")), GOAL, agent, seed=5)
    assert server.stats.requests == 3
    rerun_client = make_client(server.base_url, tmp_path / "cache")
    second = converse(GoalLLMSimulator(rerun_client), GOAL, agent, seed=5)
    assert second == first
    assert server.stats.requests == 3, "a rerun must not send a single request"
    usage = rerun_client.accounting.role("user_simulator")
    assert (usage.calls, usage.cache_hits, usage.requests) == (3, 3, 0)
    # Another seed is another user: its calls are not served from the first one's records.
    converse(GoalLLMSimulator(make_client(server.base_url, tmp_path / "cache")), GOAL, agent, seed=6)
    assert server.stats.requests == 6


def test_a_fork_continues_from_the_same_conversation(server):
    simulator = GoalLLMSimulator(make_client(server.base_url))

    async def go():
        session = simulator.session(GOAL, 1)
        await session.opening()
        fork = session.fork()
        a = await session.respond("Which area?")
        b = await fork.respond("Which area?")
        c = await fork.respond("Anything else?")
        await simulator.client.aclose()
        return a, b, c, session, fork

    a, b, c, session, fork = run(go())
    assert a == b  # same conversation, same seed: same request
    assert len(session.history) == 3 and len(fork.history) == 5


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("CUSTOMER: Hi, I need a train.", ("Hi, I need a train.", False)),
        ('"Thanks, goodbye" END_CONVERSATION', ("Thanks, goodbye", True)),
        ("That's all. [END_CONVERSATION]", ("That's all.", True)),
        ("END_CONVERSATION", ("", True)),
        ("  I'd like it in the   north. ", ("I'd like it in the north.", False)),
    ],
)
def test_replies_are_parsed(raw, expected):
    assert parse_reply(raw) == expected


def test_call_seeds_are_stable_and_distinct():
    seeds = {call_seed(session, turn, attempt) for session in range(3) for turn in range(5) for attempt in range(3)}
    assert len(seeds) == 45
    assert call_seed(1, 2, 0) == call_seed(1, 2, 0)


# -- guide-based ----------------------------------------------------------------------------


def test_the_guide_reads_the_reference_users_turns_and_the_customer_follows_its_advice(server):
    simulator = GuideLLMSimulator(make_client(server.base_url))
    turns = converse(simulator, GOAL, ["Which area would you like?"], reference=REFERENCE)
    bodies = server.stats.bodies
    assert len(bodies) == 4, "two calls per turn: the guide, then the customer"

    for guide_body, customer_body in (bodies[0:2], bodies[2:4]):
        guide = contents(guide_body)
        assert [m["role"] for m in guide_body["messages"]] == ["user"]
        assert "You are a coach giving tips to a user simulator" in guide
        assert "You are looking for a restaurant. The restaurant should serve indian food" in guide and "<span" not in guide
        assert "customer: I want an indian restaurant in the north." in guide
        assert "customer: Lovely, what is their phone number?" in guide
        assert "The nirala is a moderate indian restaurant" not in guide  # the source agent's lines are not the guide's business
        advice = fake_server.reply_text(guide_body["messages"], guide_body["seed"], 0, False)
        assert advice.strip() in customer_body["messages"][-1]["content"]
        assert customer_body["messages"][-1]["content"].endswith("CUSTOMER:")
    assert EMPTY_CONVERSATION in contents(bodies[0])
    assert f"customer: {turns[0].text}\nagent: Which area would you like?" in contents(bodies[2])


def test_the_guide_without_a_reference_grounds_in_the_goal(server):
    converse(GuideLLMSimulator(make_client(server.base_url)), GOAL, [])
    guide = contents(server.stats.bodies[0])
    assert GUIDE_NO_SOURCE in guide and "source conversation the user simulator is trying to replicate" not in guide


def test_the_guided_customer_ends_when_its_reply_says_so(server, scripted_replies):
    def script(messages, seed):
        if messages[0]["role"] == "user":  # the guide
            return 'Advice:\nThe conversation should be ended\nSuggested quote:\n"Thanks, goodbye" END_CONVERSATION'
        return '"Thanks, goodbye" END_CONVERSATION'

    scripted_replies(script)
    turns = converse(GuideLLMSimulator(make_client(server.base_url)), GOAL, ["Here you go."], reference=REFERENCE)
    assert turns[0].end and turns[0].text == "Thanks, goodbye"
