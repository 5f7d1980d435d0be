"""Issue 19 item 6: user-simulator LLM failures and fallback turns, and the agent's, are
counted per role in reports/eval.json (a fault-injecting OpenAI-compatible server plays the
LLM user simulator's backend)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest

from pipelines.errors import LLMOutage
from pipelines.llm.testing.fake_server import FaultPlan
from stages.evaluate import run

from .test_stage import params_for

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("single_torch_thread")]


def test_simulator_llm_failures_and_fallbacks_are_counted_per_role(prefect_api, make_server, small_corpus_dir, tiny_model_dir, tmp_path):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))  # the simulator's endpoint is down
    params = params_for(
        tmp_path, small_corpus_dir, tiny_model_dir,
        max_goals=1, seeds=[0], simulator={"kind": "goal_llm", "max_stalled_turns": 2}, models={"only": {"path": str(tiny_model_dir)}},
    )
    llm = {
        "cache_dir": str(tmp_path / "cache"),
        "roles": {"user_simulator": {"backend": "openai", "base_url": server.base_url, "model": "fake-model",
                                     "max_retries": 0, "backoff_base_s": 0.001, "backoff_max_s": 0.002}},
    }

    # By default an outage of the simulator's endpoint stops the stage, which publishes nothing.
    with pytest.raises(LLMOutage, match=r"evaluate: (\d+) of \1 user_simulator LLM call\(s\) failed \(server_error: \1\)"):
        run(params, llm)
    assert not (tmp_path / "reports" / "eval.json").exists()
    assert not (tmp_path / "data" / "episodes" / "eval").exists()
    server.reset_stats()

    # Allowed to go on, the evaluation counts every fault.
    report = run({**params, "max_llm_failure_rate": 1.0}, llm)

    on_disk = json.loads((tmp_path / "reports" / "eval.json").read_text())
    faults = on_disk["models"]["only"]["faults"]
    events = pq.read_table(tmp_path / "data" / "episodes" / "eval" / "episode_events.parquet").to_pylist()
    episodes = pq.read_table(tmp_path / "data" / "episodes" / "eval" / "episodes.parquet").to_pylist()
    user_turns = [e for e in events if e["actor"] == "user" and e["kind"] in ("user", "fallback")]
    # Every user turn is a fallback after 1 + 2 protected attempts, each one failed LLM call.
    assert user_turns and all(e["kind"] == "fallback" for e in user_turns)
    simulator = faults["user_simulator"]
    assert simulator["turns"] == simulator["fallbacks"] == len(user_turns)
    assert simulator["faults"] == simulator["llm_failures"] == 3 * len(user_turns) == server.stats.requests
    assert simulator["faults_by_reason"] == {"llm_server_error": server.stats.requests}
    assert on_disk["llm"]["roles"]["user_simulator"]["failures_by_reason"] == {"server_error": server.stats.requests}
    # The agent's side agrees with the episode table.
    agent = faults["agent"]
    assert agent["malformed"] == sum(e["n_malformed"] for e in episodes)
    assert agent["fallbacks"] == sum(e["n_agent_fallbacks"] for e in episodes)
    assert agent["llm_failures"] == 0  # a local model has no backend to fail
    assert report["models"]["only"]["faults"] == faults
