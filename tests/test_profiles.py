"""Run profiles (issue 30): ``profiles/full.yaml`` over the default ``params.yaml`` gives the long
tables' params; a profile cannot invent a key; ``stages.run --profile`` (make run) applies it before
``dvc repro`` and refuses an unknown one with nothing written."""

from __future__ import annotations

import copy
import shutil

import pytest
import yaml

from stages import run as repro
from catalog.profiles import apply_profile, merge
from pipelines.errors import ConfigError
from tests.conftest import REPO


@pytest.fixture
def project(tmp_path):
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    shutil.copytree(REPO / "profiles", tmp_path / "profiles")
    return tmp_path


def test_full_profile_sets_only_existing_keys_and_keeps_the_rest(project):
    before = yaml.safe_load((project / "params.yaml").read_text())
    overrides = yaml.safe_load((project / "profiles" / "full.yaml").read_text())
    changed = apply_profile(project, "full")
    after = yaml.safe_load((project / "params.yaml").read_text())
    expected = copy.deepcopy(before)
    assert sorted(merge(expected, overrides, "", "full.yaml")) == sorted(changed)
    assert after == expected
    assert "train.sft.optim.max_steps" in changed and after["train"]["sft"]["optim"]["max_steps"] > before["train"]["sft"]["optim"]["max_steps"]
    assert after["corpus"] == before["corpus"]  # what the profile does not name is untouched
    text = (project / "params.yaml").read_text()
    assert "# Every gold dialogue replayed through the runner" in text  # comments survive
    assert "db_dir: null" in text and "seeds: [0, 1, 2, 3, 4]" in text
    assert apply_profile(project, "full") == []  # a second time: nothing left to change


def test_profile_with_an_unknown_key_is_refused_and_writes_nothing(project):
    (project / "profiles" / "typo.yaml").write_text("train:\n  sft:\n    optim: {max_step: 5}\n")
    before = (project / "params.yaml").read_text()
    with pytest.raises(ConfigError, match=r"typo\.yaml: train\.sft\.optim\.max_step: params\.yaml has no such key"):
        apply_profile(project, "typo")
    assert (project / "params.yaml").read_text() == before


def test_repro_refuses_an_unknown_profile_before_running_anything(project, monkeypatch, capsys):
    monkeypatch.chdir(project)
    monkeypatch.setattr(repro, "repro_keeping_outputs", lambda *a, **k: pytest.fail("dvc repro must not start"))
    assert repro.main(["--profile", "nosuch"]) == 1
    assert "no such profile (known: full, seeds)" in capsys.readouterr().err


def test_profile_argument_is_taken_out_of_dvcs_arguments():
    assert repro._profile_argument(["--profile", "full", "-f", "speaker"]) == ("full", ["-f", "speaker"])
    assert repro._profile_argument(["--profile=full"]) == ("full", [])
    assert repro._profile_argument(["--profile", ""]) == (None, [])
