"""τ-bench through the same dialogue runner, agents and episode tables as MultiWOZ."""

from __future__ import annotations

import asyncio
from collections import Counter

import pyarrow as pa
import pytest

from pipelines.env.taubench import TauAction, TauTask
from pipelines.env.world import MultiWozWorld, TauBenchWorld, as_world
from pipelines.episodes import AgentAction, AgentOutput, episode_tables, get_format, run_episodes_sync
from pipelines.episodes.records import AGENT_END, TURN_LIMIT, USER_END
from pipelines.episodes.tables import EPISODE_EVENTS, EPISODES
from pipelines.episodes.taubench import TauReplayAgent, tau_runner_config, tau_specs
from pipelines.simulators.taubench import STOP, TauRulesUser


class _Scripted:
    """An agent that plays fixed actions per episode step (one list per call of act)."""

    def __init__(self, fmt, script):
        self.format, self.name, self.script = fmt, "scripted", script

    async def act(self, contexts):
        outputs = []
        for context in contexts:
            actions = self.script(context)
            text, calls = self.format.render(actions)
            outputs.append(AgentOutput(text, calls))
        return outputs


def _play(domain, specs, agent, **config):
    return run_episodes_sync(specs, agent, TauRulesUser(), TauBenchWorld(domain), tau_runner_config(domain, **config))


@pytest.mark.parametrize("format_name", ["function_calling", "speakrl", "react"])
def test_ground_truth_replay_agent_scores_one_on_the_mini_tasks_in_every_format(mini_retail, format_name):
    specs = tau_specs(mini_retail.tasks["test"])
    agent = TauReplayAgent({s.episode_id: s.goal for s in specs}, get_format(format_name, mini_retail.tool_schemas))
    episodes = _play(mini_retail, specs, agent)
    assert [e.success for e in episodes] == [True, True]
    assert [e.dialogue_id for e in episodes] == ["retail/test/0", "retail/test/1"]
    first = episodes[0]
    assert (first.ended_by, first.n_tool_calls, first.n_tool_errors, first.goal_domains) == (AGENT_END, 2, 0, ("retail",))
    (domain_result,) = first.domain_results
    assert (domain_result.book, domain_result.inform) == (True, True)
    assert episodes[1].domain_results[0].inform is None  # no output required
    tables = episode_tables(episodes)
    assert tables["episodes"].schema == EPISODES.schema and tables["episode_events"].schema == EPISODE_EVENTS.schema
    observations = [r for r in tables["episode_events"].to_pylist() if r["kind"] == "observation"]
    assert observations[0]["observation_json"] == '{"output": "ann_lee_1"}'


def test_errors_reach_the_agent_as_tau_bench_text_and_the_transfer_ends_the_episode(mini_retail):
    def script(context):
        if not context.calls:
            return [AgentAction.tool_call("get_order_details", {"order_id": "W1"})]
        return [AgentAction.tool_call("transfer_to_human_agents", {"summary": "stuck"}),
                AgentAction.tool_call("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"})]

    spec = tau_specs(mini_retail.tasks["test"][1:])
    (episode,) = _play(mini_retail, spec, _Scripted(get_format("function_calling", mini_retail.tool_schemas), script))
    errors = [e for e in episode.events if e.kind == "observation" and e.detail]
    assert [e.detail for e in errors] == ["Error: order not found"]
    assert (episode.ended_by, episode.events[-1].actor, episode.n_tool_errors) == (AGENT_END, "environment", 1)
    # Nothing after the transfer is carried out: the cancellation never ran.
    assert [e.tool_name for e in episode.events if e.kind == "tool_call"] == ["get_order_details", "transfer_to_human_agents"]
    assert episode.success  # a read-only task: nothing changed, nothing to say


def test_the_thirty_action_budget_ends_an_episode_unfinished_and_it_scores_zero(mini_retail):
    def script(context):
        return [AgentAction.tool_call("get_order_details", {"order_id": "#W2"})]

    spec = tau_specs(mini_retail.tasks["test"][1:])
    (episode,) = _play(mini_retail, spec, _Scripted(get_format("function_calling", mini_retail.tool_schemas), script))
    assert (episode.ended_by, episode.n_tool_calls, episode.success) == (TURN_LIMIT, 30, False)
    assert episode.result.reward.database_ok and not episode.result.reward.finished


def test_forked_tau_episodes_play_on_independently(mini_retail):
    from pipelines.episodes.runner import EpisodeState

    spec = tau_specs(mini_retail.tasks["test"][:1])[0]
    agent = TauReplayAgent({spec.episode_id: spec.goal})
    world = TauBenchWorld(mini_retail)
    state = EpisodeState.start(spec, agent, TauRulesUser(), world, tau_runner_config(mini_retail))
    asyncio.run(state.hear_user())
    state.take(asyncio.run(agent.act([state.context()]))[0])  # the look-up
    twin = state.fork()
    twin.take(AgentOutput("", ({"id": "x", "type": "function", "function": {"name": "cancel_pending_order",
                                 "arguments": {"order_id": "#W1", "reason": "ordered by mistake"}}},)))
    assert twin.environment.tau.database.changed_records() and not state.environment.tau.database.changed_records()


def test_worlds_wrap_the_multiwoz_database(small_corpus):
    from pipelines.env.tools import Database

    database = Database(small_corpus.entities)
    assert isinstance(as_world(database), MultiWozWorld) and as_world(database).database is database


def test_rules_user_withholds_until_asked_and_stops_when_nothing_is_left():
    task = TauTask(
        "retail", "test", 0, "ann_lee_1", "You are Ann Lee in 78701. Cancel order #W1 because you no longer need it.",
        (
            TauAction("find_user_id_by_name_zip", {"first_name": "Ann", "last_name": "Lee", "zip": "78701"}),
            TauAction("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}),
        ),
        (),
    )
    session = TauRulesUser().session(task, 0)
    opening = asyncio.run(session.opening())
    assert opening.text == "I'd like to cancel an order." and "#W1" not in opening.text and "78701" not in opening.text
    twin = session.fork()
    assert asyncio.run(session.respond("Could you give me your name and zip code?")).text == "I'm Ann Lee, zip code 78701."
    assert asyncio.run(session.respond("Which order, and what is the reason?")).text == "The order is #W1. It's no longer needed."
    assert asyncio.run(session.respond("I will cancel #W1. Please confirm (yes) to proceed.")).text == "Yes, please go ahead."
    assert asyncio.run(session.respond("Cancelled. Your refund is on its way.")).text.startswith("My user id is")
    said = [asyncio.run(session.respond("Done.")) for _ in range(2)]
    assert said[-1].end and STOP in said[-1].text
    # The fork still withholds what the original has said since.
    assert asyncio.run(twin.respond("Anything else?")).text.startswith("I'm not sure")


def test_doing_nothing_through_the_runner_passes_the_airline_floor(airline):
    """An agent that never calls a tool, against the rules user that stops when it has said
    everything: exactly τ-bench's do-nothing floor (19 of 50 airline test tasks) passes."""
    specs = tau_specs(airline.tasks["test"])
    agent = _Scripted(get_format("function_calling", airline.tool_schemas), lambda c: [AgentAction.respond("I see.")])
    episodes = _play(airline, specs, agent)
    assert Counter(e.ended_by for e in episodes) == Counter({USER_END: 50})
    assert sum(e.success for e in episodes) == 19


def test_ground_truth_replay_through_the_runner_scores_one_on_every_real_task(retail, airline):
    for domain in (retail, airline):
        specs = tau_specs(domain.all_tasks())
        agent = TauReplayAgent({s.episode_id: s.goal for s in specs})
        episodes = _play(domain, specs, agent)
        assert all(e.success for e in episodes), [e.episode_id for e in episodes if not e.success][:5]
        tables = episode_tables(episodes)
        assert tables["episodes"].num_rows == len(domain.all_tasks())
        assert pa.compute.all(tables["episodes"]["success"]).as_py()


def test_openai_agent_sends_tau_bench_tools_and_reads_their_answers(mini_retail):
    """The openai agent in function calling over a τ-bench domain, against the local fake
    server: the domain's tool schemas go with every request and the tool's τ-bench answer
    (here an error for a call without arguments) comes back as the tool message."""
    import json

    from pipelines.episodes import FunctionCallingFormat, OpenAIAgent
    from pipelines.llm import ClientConfig, LLMClient
    from pipelines.llm.testing.fake_server import CALL_TOOL, FakeOpenAIServer
    from tests.episodes.helpers import ScriptedSimulator

    user = ScriptedSimulator(lambda goal, reference: [f"Hi, {CALL_TOOL} please"] + [f"line {i}" for i in range(5)])
    specs = tau_specs(mini_retail.tasks["test"])
    with FakeOpenAIServer() as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake-agent", timeout_s=5.0, max_retries=1, backoff_base_s=0.001))
        agent = OpenAIAgent(client, FunctionCallingFormat(mini_retail.tool_schemas), role="agent")
        episodes = run_episodes_sync(specs, agent, user, TauBenchWorld(mini_retail), tau_runner_config(mini_retail, max_exchanges=2))
        bodies = server.stats.bodies
    assert all(b["tools"] == [dict(t) for t in mini_retail.tool_schemas] for b in bodies)
    assert "Retail agent policy" in bodies[0]["messages"][0]["content"]
    results = [b["messages"][-1] for b in bodies if b["messages"][-1]["role"] == "tool"]
    assert results and all(
        json.loads(r["content"]) == {"error": "Error: calculate() missing 1 required positional argument: 'expression'"} for r in results
    )
    assert all(e.ended_by == TURN_LIMIT and e.n_tool_errors == 2 and not e.success for e in episodes)
    assert episode_tables(episodes)["episodes"].num_rows == 2


def test_fuzzy_llm_user_sends_the_papers_prompt_and_plays_through_the_runner(mini_retail):
    """The paper's User-Driven Fuzzy Intent user over the fake server, behind the usual
    failure protection: the hidden instruction and the paper's rules in the system prompt,
    τ-bench's greeting first, the conversation from the user's side; STOP ends it."""
    from pipelines.llm import ClientConfig, LLMClient
    from pipelines.llm.testing.fake_server import FakeOpenAIServer
    from pipelines.simulators.protection import ProtectedSimulator
    from pipelines.simulators.taubench import FuzzyLLMUser, fuzzy_user_messages, parse_fuzzy_reply

    task = mini_retail.tasks["test"][0]
    messages = fuzzy_user_messages(task, (("user", "I want to cancel an order."), ("agent", "Your email, please?")))
    assert task.instruction in messages[0]["content"] and "Reveal information gradually" in messages[0]["content"]
    assert [m["role"] for m in messages] == ["system", "user", "assistant", "user"]
    assert parse_fuzzy_reply("user: That's all, thanks. STOP") == ("That's all, thanks.", True)

    specs = tau_specs(mini_retail.tasks["test"])
    with FakeOpenAIServer() as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model="fake-user", timeout_s=5.0, max_retries=1, backoff_base_s=0.001))
        user = ProtectedSimulator(FuzzyLLMUser(client))
        agent = _Scripted(get_format("function_calling", mini_retail.tool_schemas), lambda c: [AgentAction.respond("Could you tell me more?")])
        episodes = run_episodes_sync(specs, agent, user, TauBenchWorld(mini_retail), tau_runner_config(mini_retail, max_exchanges=3))
        bodies = server.stats.bodies
    assert len(bodies) == 3 * len(specs)  # an opening and two replies each, then the exchange limit
    assert all(b["messages"][0]["content"].startswith("You are a user interacting with an agent.") for b in bodies)
    assert all(e.ended_by == TURN_LIMIT and e.simulator_fallbacks == 0 for e in episodes)
    users = [[ev.text for ev in e.events if ev.kind == "user"] for e in episodes]
    assert all(len(texts) == 3 and all(texts) for texts in users)


@pytest.mark.usefixtures("single_torch_thread")
def test_hf_agent_plays_tau_bench_episodes(mini_retail, tiny_model_dir):
    """A local transformers model (the tiny test model: 1024 positions, so a short prompt
    and one tool) in function calling over τ-bench: the τ-bench tool reaches the chat
    template and the episodes are played, graded and tabled like any other."""
    from pipelines.episodes import FunctionCallingFormat, HFAgent
    from pipelines.llm import HFBackend, HFConfig, SamplingParams

    backend = HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=2))
    fmt = FunctionCallingFormat(tools=[mini_retail.schema("get_order_details")])
    agent = HFAgent(backend, fmt, SamplingParams(temperature=0.0, max_tokens=8))
    specs = tau_specs(mini_retail.tasks["test"])
    config = tau_runner_config(mini_retail, task_prompt="Be brief.", max_exchanges=2, max_steps=2, malformed_retries=0)
    episodes = run_episodes_sync(specs, agent, TauRulesUser(), TauBenchWorld(mini_retail), config)
    assert len(episodes) == 2 and all(e.agent_format == "function_calling" for e in episodes)
    assert all(e.ended_by in (TURN_LIMIT, USER_END, AGENT_END) for e in episodes)
    # The cancellation task cannot pass without tools that change anything.
    assert not episodes[0].success and episodes[0].result.reward.database_ok is False
    assert episode_tables(episodes)["episodes"].num_rows == 2
