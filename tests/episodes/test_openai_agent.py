"""The openai agent against a local fake OpenAI-compatible server: one request per episode
step with the step's seed, token counts from the usage, failed calls handled as malformed
outputs, and the function-calling format refused (LLMClient sends no tools)."""

from __future__ import annotations

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
from pipelines.llm import ClientConfig, LLMClient
from pipelines.llm.testing.fake_server import FakeOpenAIServer, FaultPlan

from .helpers import talkative_user

CONFIG = RunnerConfig(max_exchanges=2)


def client_for(server: FakeOpenAIServer) -> LLMClient:
    config = ClientConfig(base_url=server.base_url, model="fake-agent", timeout_s=5.0, max_retries=1, backoff_base_s=0.001)
    return LLMClient(config)


def specs(small_corpus, n=3):
    return [EpisodeSpec.from_dialogue(d, seed=i) for i, d in enumerate(small_corpus.dialogues[:n])]


def test_every_step_is_one_request_with_its_own_seed(small_corpus, database):
    with FakeOpenAIServer() as server:
        agent = OpenAIAgent(client_for(server), SpeakRLFormat(), role="teacher")
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
        agent = OpenAIAgent(client_for(server), SpeakRLFormat(), role="teacher")
        [episode] = run_episodes_sync(specs(small_corpus, 1), agent, talkative_user(), database, CONFIG)
        requests = server.stats.requests

    malformed = [e for e in episode.events if e.kind == "malformed"]
    assert len(malformed) == 2 * (CONFIG.malformed_retries + 1) == requests
    assert all("rejected" in e.detail and e.text == "" for e in malformed)
    assert episode.n_agent_fallbacks == 2
    assert [text for actor, text in episode.transcript() if actor == "agent"] == [DEFAULT_APOLOGY] * 2


def test_function_calling_and_unknown_roles_are_refused():
    client = LLMClient(ClientConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    with pytest.raises(ValueError, match="does not support"):
        OpenAIAgent(client, FunctionCallingFormat(), role="teacher")
    with pytest.raises(ValueError, match="unknown role"):
        OpenAIAgent(client, SpeakRLFormat(), role="pilot")
