"""PIR's table across training seeds (issue 28): a model listed once per training seed is
played per seed and pooled into one row, each seed's numbers beside it; the seeds profile's
stages train and evaluate every seed's model; GRPO of seed k starts from SFT of seed k."""

from __future__ import annotations

import copy
import json
import shutil

import pytest
import yaml

from catalog.profiles import merge
from pipelines.errors import ConfigError
from tests.test_dvc_pipeline import REPO


def test_the_profile_lists_every_seed_and_the_default_none():
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert params["pir_train"]["more_seeds"] == [] and params["pir_eval_seeds"]["tables"] == []
    merge(params, yaml.safe_load((REPO / "profiles" / "seeds.yaml").read_text()), "", "profiles/seeds.yaml")
    seeds = params["pir_train"]["more_seeds"]
    assert len(seeds) >= 2 and params["pir_eval_seeds"]["tables"]
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    deps = stages["pir_eval_seeds"]["do"]["deps"]
    models = params["pir_eval_seeds"]["models"]
    assert models["base"] == params["pir_eval"]["models"]["base"]
    for method in ("sft", "grpo"):
        base = params["pir_train"][method]["output"]["model_dir"]
        assert models[f"pir_{method}"] == [base, *[f"{base}_s{k}" for k in seeds]]
        assert [d for d in deps if d.startswith(f"${{pir_train.{method}.output")] == [f"${{pir_train.{method}.output.model_dir}}_s{k}" for k in seeds]
        assert stages[f"train_pir_{method}_seeds"]["foreach"] == "${pir_train.more_seeds}"
    assert "--start ${pir_train.sft.output.model_dir}_s${item}" in stages["train_pir_grpo_seeds"]["do"]["cmd"]


def test_grpo_under_another_seed_gets_its_own_outputs_and_start(tiny_model_dir, small_corpus_dir, tmp_path):
    from stages.pir_grpo import grpo_config

    section = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text())["pir_train"]["grpo"])
    section["model"]["path"] = str(tiny_model_dir)
    section["env"]["source"] = str(small_corpus_dir)
    config, _ = grpo_config(section, seed=2, start=str(tiny_model_dir))
    assert config.optim.seed == 2 and config.output.model_dir == "models/pir_grpo_s2"
    assert config.output.metrics == "reports/train/pir_grpo_s2.json" and config.model.path == str(tiny_model_dir)
    with pytest.raises(ConfigError, match="give --seed too"):
        grpo_config(section, start=str(tiny_model_dir))


@pytest.mark.usefixtures("single_torch_thread")
def test_a_row_of_seeds_is_pooled_with_each_seed_beside_it(tiny_model_dir, small_corpus_dir, tmp_path, timings_dir):
    from stages.pir_eval import run

    copy_dir = tmp_path / "copy"  # the same weights as a second "seed" (the directories must differ)
    shutil.copytree(tiny_model_dir, copy_dir)
    section = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text())["pir_eval"])
    section.update(source=str(small_corpus_dir), max_goals=2,
                   models={"one": str(tiny_model_dir), "seeded": [str(tiny_model_dir), str(copy_dir)]},
                   output={"metrics": str(tmp_path / "pir_seeds.json"), "markdown": str(tmp_path / "pir_seeds.md")})
    section["rollout"] = {**section["rollout"], "max_exchanges": 2, "max_turn_tokens": 32, "max_total_tokens": 96}
    report = run(section)
    one, seeded = report["results"]["one"], report["results"]["seeded"]
    assert seeded["training_seeds"] == 2 and seeded["conversations"] == 2 * one["conversations"]
    assert set(seeded["per_training_seed"]) == {"seeded", "seeded@1"}
    for key in ("success", "ttr", "tokens", "questions"):  # the same greedy model twice: pooled = single
        assert seeded[key] == one[key] and seeded["seed_range"][key] == [one[key], one[key]]
    assert report["models"] == {"one": str(tiny_model_dir), "seeded": [str(tiny_model_dir), str(copy_dir)]}
    markdown = (tmp_path / "pir_seeds.md").read_text()
    assert "| seeded (2 seeds) |" in markdown and "| seed 1 (seeded@1) |" in markdown and "Training seeds: seeded" in markdown
    assert json.loads((timings_dir / "pir_seeds.json").read_text())["seeded@1_s"] >= 0
