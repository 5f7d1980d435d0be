"""GRPO with the paper's LLM judge (``clarify_llm``, the ``judge`` role) against a local
``transformers serve`` over the tiny model, and with the verifiable reward offline."""

from __future__ import annotations

import csv
import json
import socket
from dataclasses import replace

import pytest

from pipelines.errors import ConfigError
from pipelines.llm import BackendConfig
from pipelines.llm.testing.serve import TransformersServe
from pipelines.training.config import GRPOObjective
from pipelines.training.trainers import reward_functions
from stages.train import train_config

from .conftest import CLARIFY, run_flow, tiny_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("single_torch_thread")]

LLM_REWARDS = (("format", 1.0), ("clarify_llm", 1.0))


def _judge(base_url: str, model: str) -> BackendConfig:
    section = {
        "backend": "openai", "base_url": base_url, "model": model, "max_concurrency": 1, "timeout_s": 120.0,
        "max_retries": 0, "sampling": {"temperature": 0.0, "max_tokens": 4},
    }
    return BackendConfig.from_dict("judge", section, "llm.roles.judge")


@pytest.mark.slow
def test_grpo_trains_with_the_llm_judge_reward_against_transformers_serve(prefect_api, tiny_model_dir, tiny_data_dir, tmp_path):
    with TransformersServe(tiny_model_dir, tmp_path / "serve.log", env={"OMP_NUM_THREADS": "1"}) as server:
        judge = _judge(server.base_url, str(tiny_model_dir))  # the server is pinned to this path
        objective = GRPOObjective(num_generations=2, max_completion_length=16, rewards=LLM_REWARDS)
        config = tiny_config("grpo", tiny_model_dir, tiny_data_dir, tmp_path, objective=objective, judge=judge)

        # The reward the run builds asks the server: one request per question, none for an
        # output without one (and none at an act-here point, where a question is over-asking).
        functions, weights = reward_functions(objective, judge)
        clarify_llm = functions[1]
        before = server.chat_requests()
        verdicts = clarify_llm.verdicts(
            ["p"] * 3, [CLARIFY.format(a="north", b="south"), "<think>x</think>Done.", CLARIFY.format(a="east", b="west")],
            ask_needed=[True, True, False],
        )
        assert weights == [1.0, 1.0] and clarify_llm.__name__ == "clarify_llm"
        assert [v.reason for v in verdicts][1:] == ["no_question", "needless_question"]
        # The tiny model is no judge: its reply is a score or, mostly, unparseable (None).
        assert verdicts[0].reason in ("judged", "unparseable")
        assert server.chat_requests() - before == 1

        state, flow_run = run_flow("grpo", config)
    assert state.is_completed(), state.message
    report = json.loads(open(config.output.metrics).read())
    assert {"reward/format_reward", "reward/clarify_llm", "reward/total"} <= set(report["eval"]["after"]["speaker_grpo"]["rewards"])
    with open(config.output.curve) as file:
        assert "rewards_clarify_llm_mean" in next(csv.reader(file))


def test_grpo_with_the_verifiable_reward_needs_no_server(prefect_api, tiny_model_dir, tiny_data_dir, tmp_path, monkeypatch):
    """Offline: any attempt to open a network connection fails the run."""

    def no_network(*args, **kwargs):
        raise AssertionError("the verifiable reward must not reach the network")

    monkeypatch.setattr(socket.socket, "connect", no_network)
    objective = GRPOObjective(num_generations=2, max_completion_length=16)
    config = tiny_config("grpo", tiny_model_dir, tiny_data_dir, tmp_path, objective=objective)
    assert config.judge is None and dict(objective.rewards) == {"format": 1.0, "clarify_verifiable": 1.0}
    # The flow itself is run in-process against the session's Prefect API, which talks over
    # HTTP: check the rewards the run builds instead, then run it with the network back.
    functions, _ = reward_functions(objective, config.judge)
    rows = [{"discriminating_slots": ["area"], "candidate_values": '{"area": ["north", "south"]}', "known_slots": [], "ask_needed": True}]
    columns = {k: [r[k] for r in rows] for k in rows[0]}
    assert [f(prompts=["p"], completions=[CLARIFY.format(a="north", b="south")], **columns) for f in functions] == [[1.0], [1.0]]
    monkeypatch.undo()
    state, _ = run_flow("grpo", config)
    assert state.is_completed(), state.message
    generation = json.loads(open(config.output.metrics).read())["eval"]["after"]["speaker_grpo"]["generation"]
    assert {"clarify_rate", "over_asking", "clarify_rate_when_needed"} <= set(generation)


def test_clarify_llm_without_a_judge_role_and_unknown_rewards_are_config_errors():
    with pytest.raises(ConfigError, match="needs the judge role"):
        reward_functions(GRPOObjective(rewards=LLM_REWARDS))
    with pytest.raises(ConfigError, match="needs the judge role"):
        reward_functions(GRPOObjective(rewards=LLM_REWARDS), BackendConfig.from_dict("judge", {"backend": "rules"}))
    with pytest.raises(ConfigError, match="cannot import"):
        reward_functions(GRPOObjective(rewards=(("no.such.module:reward", 1.0),)))
    with pytest.raises(ConfigError, match="is unknown"):
        reward_functions(GRPOObjective(rewards=(("bogus", 1.0),)))
    # Any reward callable by import path, with its weight.
    functions, weights = reward_functions(GRPOObjective(rewards=(("pipelines.rewards.format:format_reward", 0.5),)))
    assert functions[0].__name__ == "format_reward" and weights == [0.5]


def test_the_train_stage_reads_the_judge_role_from_the_llm_section():
    params = {"holdout": {}, "grpo": {"data": {"sources": [{"path": "x.parquet"}]}, "objective": {"rewards": {"format": 1.0, "clarify_llm": 1.0}}}}
    llm = {"roles": {"judge": {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}}}
    config = train_config("grpo", params, llm=llm)
    assert config.judge.kind == "openai" and config.judge.client.base_url == "http://127.0.0.1:9/v1"
    assert dict(config.objective.rewards) == {"format": 1.0, "clarify_llm": 1.0}
    assert train_config("grpo", params).judge is None
    assert replace(config, judge=None).judge is None
