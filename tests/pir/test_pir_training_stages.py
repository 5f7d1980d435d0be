"""The PIR training and evaluation stages refuse bad settings before anything loads."""

from __future__ import annotations

import copy

import pytest
import yaml

from pipelines.errors import ConfigError
from tests.test_dvc_pipeline import REPO


@pytest.fixture()
def params() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_grpo_section_errors_name_the_setting(params, tiny_model_dir, small_corpus_dir):
    from stages.pir_grpo import grpo_config

    section = copy.deepcopy(params["pir_train"]["grpo"])
    section["model"]["path"] = str(tiny_model_dir)
    section["env"]["source"] = str(small_corpus_dir)
    config, env = grpo_config(section)
    assert config.resolved_objective().rewards == (("pir_composite_rules", 1.0),)
    assert env.rollout.ask_inside_reasoning and env.split == "train" and env.eval_split == "val"
    for change, message in (
        (lambda s: s.update(extra=1), "unknown key"),
        (lambda s: s["optim"].update(batch_size=3), "multiple of objective.num_generations"),
        (lambda s: s["env"]["rollout"].update(max_turn_tokens=0), "max_turn_tokens"),
        (lambda s: s["env"].update(source="no/such/dir"), "does not exist"),
        (lambda s: s["objective"].update(temperature=0.6), r"env.rollout.temperature \(1.0\) must equal objective.temperature \(0.6\)"),
        (lambda s: s["objective"].update(rewards={"no.such.module:reward": 1.0}), "cannot import"),
    ):
        bad = copy.deepcopy(section)
        change(bad)
        with pytest.raises(ConfigError, match=message):
            grpo_config(bad)


def test_eval_section_errors_name_the_setting(params, tiny_model_dir, small_corpus_dir):
    from stages.pir_eval import check

    section = copy.deepcopy(params["pir_eval"])
    section.update(source=str(small_corpus_dir), models={"base": str(tiny_model_dir)})
    rollout, _, models = check(section)
    assert rollout.temperature == 0.0 and models == {"base": [str(tiny_model_dir)]}  # one per training seed
    with pytest.raises(ConfigError, match="pir_eval.models.pir_sft: models/nowhere is not a model directory"):
        check({**section, "models": {"pir_sft": "models/nowhere"}})
    with pytest.raises(ConfigError, match="pir_eval.models.pir_sft: models/nowhere is not a model directory"):
        check({**section, "models": {"pir_sft": [str(tiny_model_dir), "models/nowhere"]}})
    for seeds in ([], [str(tiny_model_dir)] * 2):  # a list: distinct directories, one per training seed
        with pytest.raises(ConfigError, match="pir_eval.models.pir_sft: expected a model directory or a list of distinct ones"):
            check({**section, "models": {"pir_sft": seeds}})
    with pytest.raises(ConfigError, match="unknown key"):
        check({**section, "extra": 1})


def test_sft_section_reads_the_traces_with_the_response_mask(params):
    from pipelines.preflight import preflight
    from stages.train import train_config

    config = train_config("sft", params["pir_train"], section_name="sft")
    assert config.resolved_objective().loss_mask == "pipelines.pir.sft:response_spans"
    [source] = config.data.sources
    assert (source.prompt_column, source.completion_column) == ("input", "augmented_trace")
    assert config.data.holdout.split == "val" and config.output.model_dir == "models/pir_sft"
    bad = copy.deepcopy(params["pir_train"])
    bad["sft"]["objective"]["loss_mask"] = "pipelines.pir.sft:nothing_here"
    with pytest.raises(ConfigError, match="loss_mask 'pipelines.pir.sft:nothing_here': cannot import"):
        preflight(train_config("sft", bad, section_name="sft"))
