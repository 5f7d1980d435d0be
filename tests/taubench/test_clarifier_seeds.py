"""The Clarifier's table across training seeds (issue 28): a Clarifier listed once per training
seed plays every task and seed per model and is pooled into one row, whose interval resamples
the training seeds and then the tasks; the seeds profile's stages make every seed's model."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import yaml

from catalog.profiles import merge
from pipelines.clarifier.evaluation import summarize, summarize_seeds, task_interval, task_interval_seeds
from pipelines.errors import ConfigError

ROOT = Path(__file__).resolve().parents[2]


def test_the_profile_lists_every_seed_and_the_default_none():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["clarifier"]["train"]["more_seeds"] == [] and params["clarifier_eval_seeds"]["tables"] == []
    merge(params, yaml.safe_load((ROOT / "profiles" / "seeds.yaml").read_text()), "", "profiles/seeds.yaml")
    seeds = params["clarifier"]["train"]["more_seeds"]
    assert len(seeds) >= 2 and params["clarifier_eval_seeds"]["tables"]
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    deps = stages["clarifier_eval_seeds"]["do"]["deps"]
    models = params["clarifier_eval_seeds"]["models"]
    assert set(models) == set(params["clarifier"]["eval"]["clarifiers"])
    for method in ("sft", "dpo", "grpo"):
        base = params["clarifier"]["train"][method]["output"]["model_dir"]
        row = params["clarifier"]["eval"]["clarifiers"][method]
        assert models[method] == [row, *[{**row, "model_path": f"{base}_s{k}"} for k in seeds]]
        assert [d for d in deps if d.startswith(f"${{clarifier.train.{method}.output")] == [
            f"${{clarifier.train.{method}.output.model_dir}}_s{k}" for k in seeds]
        stage = stages[f"train_clarifier_{method}_seeds"]
        assert stage["foreach"] == "${clarifier.train.more_seeds}"
        if method != "sft":
            assert "--start ${clarifier.train.sft.output.model_dir}_s${item}" in stage["do"]["cmd"]


def test_one_training_seed_is_the_interval_of_before_and_seeds_that_disagree_widen_it():
    same = {"a": [True, False], "b": [False, False], "c": [True, True]}
    assert task_interval_seeds([same], resamples=300) == task_interval(same, resamples=300)
    other = {"a": [False, False], "b": [False, False], "c": [False, False]}
    low, high = task_interval_seeds([same, other], resamples=300)
    assert low == 0.0 and high > 0.5
    with pytest.raises(ValueError, match="same tasks"):
        task_interval_seeds([same, {"a": [True]}], resamples=10)


@pytest.mark.usefixtures("single_torch_thread")
def test_a_clarifier_listed_per_seed_is_pooled(tmp_path, mini_root, tiny_model_dir, monkeypatch):
    from stages.clarifier_eval import run

    copy = tmp_path / "copy"  # the same weights as a second "seed"
    shutil.copytree(tiny_model_dir, copy)
    monkeypatch.chdir(tmp_path)
    tiny = {"backend": "hf", "model_path": str(tiny_model_dir), "sampling": {"temperature": 0.0, "max_tokens": 8}}
    params = {"taubench": str(mini_root), "domains": {"retail": "test"}, "output": "episodes", "metrics": "seeds.json", "markdown": "seeds.md",
              "clarifiers": {"tiny": tiny, "seeded": [tiny, {**tiny, "model_path": str(copy)}]}}
    metrics = run(params)
    one, seeded = metrics["runs"]["tiny"]["retail"], metrics["runs"]["seeded"]["retail"]
    assert "training_seeds" not in one and seeded["training_seeds"] == 2
    assert seeded["passed"] == 2 * one["passed"] and seeded["passed_by_training_seed"] == [one["passed"]] * 2
    assert seeded["pass_at_1"] == one["pass_at_1"] and seeded["avg_clarify"] == one["avg_clarify"]
    assert seeded["avg_clarify_by_training_seed"] == [one["avg_clarify"]] * 2
    assert set(metrics["prompts"]) == {"tiny", "seeded", "seeded@1"}
    markdown = (tmp_path / "seeds.md").read_text()
    assert "| seeded (2 seeds) |" in markdown
    assert "Training seeds: seeded each pool 2 Clarifiers" in markdown
    cell = f"{one['passed']}/{one['n_tasks']} {one['avg_clarify']:.2f}"
    assert f"seeded retail {cell}, {cell}." in markdown
    with pytest.raises(ConfigError, match="one trained Clarifier per training seed"):
        run(params | {"clarifiers": {"seeded": []}})


def test_summarize_of_one_seed_is_summarize_seeds_of_one(mini_retail):
    from tests.taubench.test_clarifier import _play

    episodes = _play(mini_retail, mini_retail.tasks["test"])
    assert summarize("x", "retail", episodes, 1) == summarize_seeds("x", "retail", [episodes], 1)
    pooled = summarize_seeds("x", "retail", [episodes, episodes], 1)
    assert pooled.training_seeds == 2 and pooled.episodes == 2 * len(episodes) and pooled.pass_at_1 == summarize("x", "retail", episodes, 1).pass_at_1
