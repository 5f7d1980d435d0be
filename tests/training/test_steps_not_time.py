"""Training length is decided by steps: no time cap unless a user sets one, and a run a cap
ended is reported incomplete."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.training.config import METHODS
from pipelines.training.config import DeviceSpec
from pipelines.training.report import TrainSummary, training_report
from stages.train import train_config

PARAMS = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text())


def test_params_set_no_time_caps():
    assert PARAMS["bootstrap"]["train"].get("max_seconds") is None
    for method in METHODS:
        assert train_config(method, PARAMS["train"]).optim.max_time_s is None, method


@pytest.mark.parametrize("stopped_by, complete", [("max_steps", True), ("time_budget", False)])
def test_a_run_a_time_cap_ended_is_reported_incomplete(stopped_by, complete):
    config = train_config("sft", PARAMS["train"])
    summary = TrainSummary(steps=3 if complete else 2, max_steps=3, stopped_by=stopped_by, epochs=0.1,
                           mean_loss=1.0, final_loss=0.9, runtime_s=1.0, curve=())
    device = DeviceSpec(accelerator="cpu", bf16=False, gradient_checkpointing=False, use_vllm=False, vllm_mode="server")
    report = training_report(config, device, {"total": 10, "trainable": 10}, [], 8, summary, None, {})
    assert report["train"]["complete"] is complete and report["train"]["stopped_by"] == stopped_by
