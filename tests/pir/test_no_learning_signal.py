"""US-GRPO with zero reward variance in every group (issue 27): an error naming the counts and
nothing published, unless ``allow_no_signal: true``, which publishes the copy labelled."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import yaml

from pipelines.errors import NoLearningSignal
from tests.test_dvc_pipeline import REPO


def constant_reward(prompts, completions, **columns):
    """The same reward for every completion: no group can have variance.

    >>> constant_reward(["p", "p"], ["a", "b"])
    [0.5, 0.5]
    """
    return [0.5 for _ in completions]


@pytest.fixture()
def section(tmp_path, small_corpus_dir, tiny_model_dir) -> dict:
    grpo = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text())["pir_train"]["grpo"])
    grpo["model"]["path"] = str(tiny_model_dir)
    grpo["env"].update(source=str(small_corpus_dir), max_goals=2, eval_goals=1)
    grpo["env"]["rollout"].update(max_exchanges=1, max_turn_tokens=8, max_total_tokens=1024)
    grpo["optim"].update(max_steps=2, batch_size=2, logging_steps=1)
    grpo["objective"].update(num_generations=2, rewards={"tests.pir.test_no_learning_signal:constant_reward": 1.0})
    grpo["output"] = {key: str(tmp_path / "out" / name) for key, name in
                      (("model_dir", "pir_grpo"), ("metrics", "pir_grpo.json"), ("curve", "pir_grpo_curve.csv"))}
    return grpo


@pytest.fixture()
def in_tmp(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PREFECT_HOME", str(tmp_path / ".prefect"))


def test_no_signal_fails_and_publishes_nothing(section, in_tmp, tmp_path):
    from stages.pir_grpo import run

    section["allow_no_signal"] = False
    with pytest.raises(NoLearningSignal, match=r"no learning signal: 2 of 2 groups had zero reward variance"):
        run(section)
    assert not (tmp_path / "out" / "pir_grpo").exists() and not (tmp_path / "out" / "pir_grpo.json").exists()


def test_allowed_no_signal_is_published_labelled(section, in_tmp, tmp_path, capsys):
    from stages.pir_grpo import run

    section["allow_no_signal"] = True
    report = run(section)
    assert report["learning_signal"] == {"groups": 2, "zero_variance_groups": 2, "no_signal": True, "logged_steps": 2}
    assert json.loads(Path(section["output"]["metrics"]).read_text())["learning_signal"]["no_signal"] is True
    assert "NO LEARNING SIGNAL: 2 of 2 groups" in capsys.readouterr().out


def test_allow_no_signal_must_be_a_boolean(section, in_tmp):
    from pipelines.errors import ConfigError
    from stages.pir_grpo import run

    section["allow_no_signal"] = "yes"
    with pytest.raises(ConfigError, match="allow_no_signal: true or false"):
        run(section)
