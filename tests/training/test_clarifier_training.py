"""The Clarifier datasets on the existing training flows: SFT on the teacher's answers, DPO
on the judged pairs, GRPO with the goal-aware reward (``clarifier_goal``) — a few steps of
the tiny model each, on data built from the hand-made retail domain."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from pipelines.training.config import DataSpec, GRPOObjective, HoldoutSpec, SourceSpec

from .conftest import run_flow, tiny_config

pytestmark = [pytest.mark.timeout(600), pytest.mark.usefixtures("single_torch_thread")]


@pytest.fixture(scope="module")
def clarifier_data_dir(tmp_path_factory):
    from stages.clarifier_data import run
    from tests.taubench.conftest import write_mini_retail

    root = tmp_path_factory.mktemp("clarifier")
    taubench = write_mini_retail(root / "taubench")
    run({"taubench": str(taubench), "output": str(root / "out"), "metrics": str(root / "metrics.json"), "cache_dir": str(root / "cache")})
    return root / "out"


@pytest.mark.parametrize("method", ["sft", "dpo", "grpo"])
def test_clarifier_data_trains_on_the_existing_flows(prefect_api, tiny_model_dir, clarifier_data_dir, tmp_path, method):
    source = SourceSpec(str(clarifier_data_dir / f"clarifier_{method}.parquet"))
    data = DataSpec(sources=(source,), holdout=HoldoutSpec(fraction=0.2), compact_prompts=False)
    config = tiny_config(method, tiny_model_dir, clarifier_data_dir, tmp_path, data=data)
    config = replace(config, optim=replace(config.optim, max_length=960))
    if method == "grpo":
        config = replace(config, objective=GRPOObjective(num_generations=2, max_completion_length=16, rewards=(("clarifier_goal", 1.0),)))
    state, _ = run_flow(method, config)
    assert state.is_completed(), state.message
    report = json.loads(open(config.output.metrics).read())
    assert report["data"]["sources"][f"clarifier_{method}"]["train"] > 0
    if method == "grpo":
        assert "reward/clarifier_goal" in report["eval"]["after"]["clarifier_grpo"]["rewards"]
