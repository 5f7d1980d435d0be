"""Each training flow on a tiny model and tiny data, as a real Prefect flow run."""

from __future__ import annotations

import csv
import json
from dataclasses import replace

import pytest

from pipelines.errors import ConfigError
from pipelines.training.config import DeviceSpec, LoraSpec, ModelSpec
from pipelines.training.device import Machine

from .conftest import run_flow, tiny_config

pytestmark = [pytest.mark.timeout(300), pytest.mark.usefixtures("single_torch_thread")]


@pytest.mark.parametrize("method", ["sft", "dpo", "kto", "grpo"])
def test_flow_completes_as_a_prefect_flow_run_and_writes_its_outputs(trained, method):
    config, state, flow_run = trained[method]

    assert state.is_completed(), state.message
    assert flow_run.state.is_completed() and flow_run.name
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId
    from prefect.client.schemas.sorting import TaskRunSort

    with get_client(sync_client=True) as client:
        flow = client.read_flow(flow_run.flow_id)
        task_runs = client.read_task_runs(
            flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[flow_run.id])),
            sort=TaskRunSort.EXPECTED_START_TIME_ASC,
            limit=50,
        )
    assert flow.name == f"train-{method}"
    assert all(t.state.is_completed() for t in task_runs)
    names = [t.name.rsplit("-", 1)[0] for t in task_runs]
    assert names == [
        "preflight", "load-tokenizer", "load-datasets", "build-dataset", "load-model", "evaluate",
        "build-trainer", "train", "evaluate", "save-model", "write-reports", "write-timings",
    ]

    model_dir = config.output.model_dir
    report = json.loads(open(config.output.metrics).read())
    assert report["method"] == method and report["train"]["steps"] == 2
    sources = report["data"]["sources"]
    assert all(s["train"] > 0 and s["heldout"] > 0 and len(s["md5"]) == 32 for s in sources.values())
    assert set(report["eval"]) == {"before", "after", "delta"}
    card = open(f"{model_dir}/README.md").read()
    assert "Held-out metrics" in card and next(iter(sources.values()))["md5"] in card
    with open(config.output.curve) as file:
        rows = list(csv.DictReader(file))
    assert [int(r["step"]) for r in rows] == [1, 2]
    assert rows[-1]["reward" if method == "grpo" else "loss"] != ""


def test_each_method_reports_what_it_should_move(trained):
    after = {m: json.loads(open(c.output.metrics).read())["eval"]["after"] for m, (c, _, _) in trained.items()}
    assert {"n", "well_formed", "format_reward", "decision_match"} <= set(after["sft"]["speaker_sft"]["generation"])
    assert {"margin", "accuracy", "accuracy_ask", "accuracy_act"} <= set(after["dpo"]["speaker_dpo"]["preference"])
    assert {"margin", "accuracy"} <= set(after["kto"]["speaker_dpo"]["preference"])
    # Over-asking (questions at act-here points) beside the clarify rate.
    assert {"clarify_rate", "over_asking", "clarify_rate_when_needed"} <= set(after["grpo"]["speaker_grpo"]["generation"])
    rewards = after["grpo"]["speaker_grpo"]["rewards"]
    assert {"reward/format_reward", "reward/clarify_verifiable", "reward/total"} <= set(rewards)


def test_grpo_curve_has_each_reward_component(trained):
    config = trained["grpo"][0]
    with open(config.output.curve) as file:
        header = next(csv.reader(file))
    assert {"reward", "rewards_format_reward_mean", "rewards_clarify_verifiable_mean"} <= set(header)
    assert "kl" not in header  # beta = 0: no KL term


def test_lora_run_saves_an_adapter_that_loads_and_generates(prefect_api, tiny_model_dir, tiny_data_dir, tmp_path):
    import torch
    from peft import AutoPeftModelForCausalLM
    from transformers import AutoTokenizer

    config = tiny_config("sft", tiny_model_dir, tiny_data_dir, tmp_path)
    config = replace(config, model=ModelSpec(path=str(tiny_model_dir), lora=LoraSpec(r=4, alpha=8)))
    state, _ = run_flow("sft", config)
    assert state.is_completed(), state.message

    directory = config.output.model_dir
    report = json.loads(open(config.output.metrics).read())
    assert report["model"]["lora"] and report["model"]["trainable_parameters"] < report["model"]["parameters"]
    model = AutoPeftModelForCausalLM.from_pretrained(directory)
    tokenizer = AutoTokenizer.from_pretrained(directory)
    inputs = tokenizer.apply_chat_template([{"role": "user", "content": "a hotel"}], add_generation_prompt=True, return_tensors="pt", return_dict=True)
    with torch.no_grad():
        output = model.generate(**inputs, max_new_tokens=5, do_sample=False)
    assert output.shape[1] > inputs["input_ids"].shape[1]


@pytest.mark.skipif(Machine.detect().accelerator != "cpu", reason="bf16 is refused on a CPU-only machine")
def test_a_bad_config_fails_the_flow_before_training(prefect_api, tiny_model_dir, tiny_data_dir, tmp_path):
    from flows.train import train_sft

    config = tiny_config("sft", tiny_model_dir, tiny_data_dir, tmp_path)
    config = replace(config, device=DeviceSpec(bf16=True))  # no bf16 on this CPU
    state = train_sft(config, return_state=True)

    assert state.is_failed()
    with pytest.raises(ConfigError, match="bf16"):
        state.result()
    assert not (tmp_path / "models").exists()
