"""The openai agent against a local fake OpenAI-compatible server: one request per episode
step with the step's seed, token counts from the usage, failed calls handled as malformed
outputs, and the function-calling format: tools sent, tool_calls run by the environment,
the structured history (assistant tool_calls, tool messages) sent back on the next step."""

from __future__ import annotations

import json

import pytest

from pipelines.episodes import (
    DEFAULT_APOLOGY,
    EpisodeSpec,
    FunctionCallingFormat,
    OpenAIAgent,
    RunnerConfig,
    SpeakRLFormat,
    run_episodes_sync,
)
from pipelines.env.tools import TOOL_SCHEMAS
from pipelines.llm import ClientConfig, LLMClient, ResponseCache
from pipelines.llm.testing.fake_server import CALL_TOOL, FakeOpenAIServer, FaultPlan

from .helpers import ScriptedSimulator, talkative_user

CONFIG = RunnerConfig(max_exchanges=2)


def client_for(server: FakeOpenAIServer, cache: ResponseCache | None = None) -> LLMClient:
    config = ClientConfig(base_url=server.base_url, model="fake-agent", timeout_s=5.0, max_retries=1, backoff_base_s=0.001)
    return LLMClient(config, cache=cache)


def specs(small_corpus, n=3):
    return [EpisodeSpec.from_dialogue(d, seed=i) for i, d in enumerate(small_corpus.dialogues[:n])]


def test_every_step_is_one_request_with_its_own_seed(small_corpus, database):
    with FakeOpenAIServer() as server:
        agent = OpenAIAgent(client_for(server), SpeakRLFormat(), role="agent")
        episodes = run_episodes_sync(specs(small_corpus), agent, talkative_user(), database, CONFIG)
        bodies = server.stats.bodies

    # The fake model answers plain text: a response per exchange, until the turn limit.
    assert all(e.ended_by == "turn_limit" and e.n_turns == 4 and e.n_malformed == 0 for e in episodes)
    assert len(bodies) == 2 * len(episodes)
    assert len({b["seed"] for b in bodies}) == len(bodies)
    assert all(b["model"] == "fake-agent" and b["messages"][0]["role"] == "system" for b in bodies)
    # Token counts are the server's usage.
    assert all(e.prompt_tokens > 0 and e.completion_tokens > 0 for e in episodes)
    assert agent.name == "openai:fake-agent"


def test_a_failed_call_is_retried_then_the_turn_fails(small_corpus, database):
    with FakeOpenAIServer(FaultPlan(rate=1.0, kinds=("echo_auth_401",))) as server:
        agent = OpenAIAgent(client_for(server), SpeakRLFormat(), role="agent")
        [episode] = run_episodes_sync(specs(small_corpus, 1), agent, talkative_user(), database, CONFIG)
        requests = server.stats.requests

    malformed = [e for e in episode.events if e.kind == "malformed"]
    assert len(malformed) == 2 * (CONFIG.malformed_retries + 1) == requests
    assert all("rejected" in e.detail and e.text == "" for e in malformed)
    assert episode.n_agent_fallbacks == 2
    assert [text for actor, text in episode.transcript() if actor == "agent"] == [DEFAULT_APOLOGY] * 2


def test_unknown_roles_are_refused():
    client = LLMClient(ClientConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    with pytest.raises(ValueError, match="unknown role"):
        OpenAIAgent(client, SpeakRLFormat(), role="pilot")


def tool_calling_user() -> ScriptedSimulator:
    """A user whose opening makes the fake model call a tool in every turn."""
    return ScriptedSimulator(lambda goal, reference: [f"I need a table, {CALL_TOOL} please"] + [f"user line {i}" for i in range(50)])


def test_function_calling_runs_tool_calls_and_continues(small_corpus, database):
    first_tool = TOOL_SCHEMAS[0]["function"]["name"]
    with FakeOpenAIServer() as server:
        agent = OpenAIAgent(client_for(server), FunctionCallingFormat(), role="agent")
        episodes = run_episodes_sync(specs(small_corpus, 2), agent, tool_calling_user(), database, CONFIG)
        bodies = server.stats.bodies
        tool_requests = server.stats.tool_requests

    # Every exchange: a tool call (run by the environment), then a text reply once the
    # tool result is in the history.
    assert len(bodies) == tool_requests == 2 * 2 * len(episodes)
    for episode in episodes:
        assert episode.agent_format == "function_calling"
        assert episode.ended_by == "turn_limit" and episode.n_malformed == 0 and episode.n_agent_fallbacks == 0
        kinds = [e.kind for e in episode.events]
        assert kinds == ["user", "tool_call", "observation", "respond"] * 2 + ["end"]
        calls = [e for e in episode.events if e.kind == "tool_call"]
        assert all(c.tool_name == first_tool and json.loads(c.arguments_json) == {} for c in calls)
        observations = [e for e in episode.events if e.kind == "observation"]
        assert all(o.tool_name == first_tool and o.observation_json for o in observations)
        assert episode.n_tool_calls == 2
        assert episode.prompt_tokens > 0 and episode.completion_tokens > 0

    # Server side: the tools went with every request; the step after a call sends the
    # structured history back, arguments as a JSON string and the result answering the id.
    assert all(b["tools"] == [dict(t) for t in TOOL_SCHEMAS] for b in bodies)
    followups = [b for b in bodies if b["messages"][-1]["role"] == "tool"]
    assert len(followups) == 2 * len(episodes)
    for body in followups:
        call_message, result = body["messages"][-2], body["messages"][-1]
        assert call_message["role"] == "assistant" and call_message["content"] in ("", None)
        [call] = call_message["tool_calls"]
        assert call["id"].startswith("call_") and call["type"] == "function"
        assert call["function"] == {"name": first_tool, "arguments": "{}"}
        assert result["tool_call_id"] == call["id"] and result["name"] == first_tool
        assert isinstance(json.loads(result["content"]), dict)


def test_function_calling_episodes_rerun_from_the_cache(small_corpus, database, tmp_path):
    with FakeOpenAIServer() as server:
        first = run_episodes_sync(
            specs(small_corpus, 2),
            OpenAIAgent(client_for(server, ResponseCache(tmp_path)), FunctionCallingFormat()),
            tool_calling_user(),
            database,
            CONFIG,
        )
        sent = server.stats.requests
        again = run_episodes_sync(
            specs(small_corpus, 2),
            OpenAIAgent(client_for(server, ResponseCache(tmp_path)), FunctionCallingFormat()),
            tool_calling_user(),
            database,
            CONFIG,
        )
        assert server.stats.requests == sent > 0

    def trace(episodes):
        return [[(e.kind, e.text, e.tool_name, e.arguments_json, e.observation_json) for e in ep.events] for ep in episodes]

    assert trace(again) == trace(first)
    assert all(ep.n_tool_calls == 2 for ep in again)


def test_text_formats_send_no_tools(small_corpus, database):
    with FakeOpenAIServer() as server:
        agent = OpenAIAgent(client_for(server), SpeakRLFormat())
        run_episodes_sync(specs(small_corpus, 1), agent, tool_calling_user(), database, CONFIG)
        assert server.stats.tool_requests == 0
        assert all("tools" not in b for b in server.stats.bodies)
