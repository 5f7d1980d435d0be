"""Fault injection end to end: episodes whose agent AND user simulator sit behind an
OpenAI-compatible endpoint that fails 20% of requests (timeouts, 500, 429, truncated JSON).

The batch must complete, every injected fault must be counted by the client, and the
episodes must equal those of a fault-free run with the same seeds."""

from __future__ import annotations

from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, OpenAIAgent, RunnerConfig, SpeakRLFormat, run_episodes_sync
from pipelines.llm import Accounting, ClientConfig, LLMClient, ResponseCache
from pipelines.llm.testing.fake_server import FakeOpenAIServer, FaultPlan
from pipelines.simulators.factory import simulator_from_config

FAULTS = FaultPlan(rate=0.2, kinds=("timeout", "http_500", "http_429", "truncated"))
N_EPISODES = 6


def _play(server: FakeOpenAIServer, cache_dir, corpus):
    accounting = Accounting()
    config = ClientConfig(
        base_url=server.base_url,
        model="fake-model",
        api_key_env="OPENAI_API_KEY",  # the session's canary key (tests/conftest.py)
        # A real reply must not pass for an injected timeout on a loaded machine (a CI run counted
        # 4 timeouts for 2 injected at 0.5 s): 2 s of margin, injected timeouts hang 4 s.
        timeout_s=2.0,
        max_retries=8,
        backoff_base_s=0.01,
        backoff_max_s=0.05,
        max_concurrency=4,
    )
    client = LLMClient(config, cache=ResponseCache(cache_dir), accounting=accounting)
    database = Database(corpus.entities, corpus.taxi_options)
    simulator = simulator_from_config("goal_llm", database=database, client=client)
    specs = [EpisodeSpec.from_dialogue(d, seed=100 + i) for i, d in enumerate(corpus.dialogues[:N_EPISODES])]
    episodes = run_episodes_sync(specs, OpenAIAgent(client, SpeakRLFormat()), simulator, database, RunnerConfig(max_exchanges=3))
    return episodes, accounting


def _observable(episode):
    return (episode.episode_id, episode.ended_by, episode.n_turns, episode.success, tuple(episode.transcript()),
            episode.n_tool_calls, episode.simulator_fallbacks)


def test_faulty_endpoint_gives_the_same_episodes_with_every_fault_counted(tmp_path, small_corpus):
    with FakeOpenAIServer(hang_s=4.0) as clean:
        expected, clean_accounting = _play(clean, tmp_path / "clean-cache", small_corpus)
    with FakeOpenAIServer(FAULTS, hang_s=4.0) as faulty:
        episodes, accounting = _play(faulty, tmp_path / "faulty-cache", small_corpus)
        injected = sum(faulty.stats.faults.values())
        requests = faulty.stats.requests

    assert len(episodes) == N_EPISODES
    assert [_observable(e) for e in episodes] == [_observable(e) for e in expected]
    assert injected >= 0.15 * requests and set(faulty.stats.faults) == set(FAULTS.kinds)
    total = accounting.total()
    assert sum(total.retries.values()) == injected, (dict(total.retries), dict(faulty.stats.faults))
    assert not total.failures and not clean_accounting.total().failures
    # Both roles really went through the endpoint.
    assert accounting.role("agent").requests > 0 and accounting.role("user_simulator").requests > 0
    assert all(e.simulator_fallbacks == 0 for e in episodes)


def test_a_rerun_is_served_from_the_cache(tmp_path, small_corpus):
    with FakeOpenAIServer() as server:
        first, _ = _play(server, tmp_path / "cache", small_corpus)
        sent = server.stats.requests
        again, accounting = _play(server, tmp_path / "cache", small_corpus)
        assert server.stats.requests == sent  # zero new requests
    assert [_observable(e) for e in again] == [_observable(e) for e in first]
    assert accounting.total().cache_hits == accounting.total().calls > 0
