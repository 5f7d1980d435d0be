"""params.yaml ``policy``: one switch for the starting model of training and evaluation."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pipelines.errors import ConfigError
from stages.common import with_policy
from stages.train import train_config

REPO = Path(__file__).resolve().parents[2]
PARAMS = yaml.safe_load((REPO / "params.yaml").read_text())


def test_base_keeps_the_embedded_policy_trained_whole():
    config = train_config("sft", PARAMS["train"], policy={**PARAMS["policy"], "use": "base"})
    assert config.model.path == "models/base" and config.model.lora is None
    assert config.optim.learning_rate == PARAMS["train"]["sft"]["optim"]["learning_rate"]


def test_smollm2_starts_sft_with_lora_and_later_stages_keep_their_model():
    policy = {**PARAMS["policy"], "use": "smollm2", "dir": "models/smollm2"}
    sft = train_config("sft", PARAMS["train"], policy=policy)
    assert sft.model.path == "models/smollm2" and sft.model.lora.r == policy["lora"]["r"] and sft.model.lora.merge
    assert sft.optim.learning_rate == policy["optim"]["learning_rate"]
    assert sft.optim.max_steps == PARAMS["train"]["sft"]["optim"]["max_steps"]
    grpo = train_config("grpo", PARAMS["train"], policy=policy)
    assert grpo.model.path == "models/sft" and grpo.model.lora is not None
    models = with_policy(PARAMS["evaluate"], policy)["models"]
    assert models["base"]["path"] == "models/smollm2" and models["sft"] == PARAMS["evaluate"]["models"]["sft"]


def test_a_hub_id_is_a_hub_model():
    policy = {**PARAMS["policy"], "use": "HuggingFaceTB/SmolLM2-360M-Instruct", "dir": "models/base"}
    sft = train_config("sft", PARAMS["train"], policy=policy)
    assert sft.model.hub_id == "HuggingFaceTB/SmolLM2-360M-Instruct" and sft.model.path is None
    assert with_policy(PARAMS["evaluate"], policy)["models"]["base"] == {"hub_id": "HuggingFaceTB/SmolLM2-360M-Instruct"}


def test_a_dir_that_does_not_go_with_the_policy_is_refused():
    with pytest.raises(ConfigError, match="policy.dir.*models/smollm2"):
        train_config("sft", PARAMS["train"], policy={"use": "smollm2", "dir": "models/base"})
    with pytest.raises(ConfigError, match="unknown key"):
        train_config("sft", PARAMS["train"], policy={"use": "base", "lr": 1})
