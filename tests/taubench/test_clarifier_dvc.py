"""The Clarifier stages under real DVC: built, validated and idempotent (on the hand-made retail
domain), in the pipeline on every machine (τ-bench is read from vendor/taubench, in the
repository), dropped by `enable: []`."""

from __future__ import annotations

import json
import sys

import pytest

from catalog.repro import outside_dependencies
from tests.taubench.conftest import write_mini_retail
from tests.test_dvc_pipeline import _run, pipeline_project

pytestmark = pytest.mark.slow


def test_clarifier_stages_build_once_and_need_nothing_outside_the_project(tmp_path):
    data = write_mini_retail(tmp_path / "taubench")

    def edit(params):
        params["clarifier"]["enable"] = ["taubench"]
        params["clarifier"]["data"]["taubench"] = str(data)
        params["clarifier"]["eval"].update(taubench=str(data), domains={"retail": "test"},
                                           clarifiers={"none": None, "oracle_rules": {"backend": "rules"}})

    project = pipeline_project(tmp_path / "project", edit)
    stages = _run([sys.executable, "-m", "dvc", "stage", "list"], project).stdout
    for stage in ("clarifier_data", "train_clarifier_sft", "train_clarifier_dpo", "train_clarifier_grpo", "clarifier_eval"):
        assert f"{stage}@taubench" in stages
    # Training is tested with the flows (tests/training/test_clarifier_training.py); here the
    # starting and trained models are stand-ins the evaluation (without hf rows) does not read.
    for name in ("base", "clarifier_sft", "clarifier_dpo", "clarifier_grpo"):
        (project / "models" / name).mkdir(parents=True)
    repro = [sys.executable, "-m", "dvc", "repro", "--single-item"]
    built = _run(repro + ["clarifier_data@taubench"], project)
    evaluated = _run(repro + ["clarifier_eval@taubench"], project)
    assert "Running stage 'clarifier_data@taubench'" in built.stdout and "Running stage 'clarifier_eval@taubench'" in evaluated.stdout
    metrics = json.loads((project / "reports" / "clarifier_data.json").read_text())
    assert sum(metrics["judge_outcomes"].values()) == metrics["states"] > 0
    for name in ("clarifier_sft", "clarifier_dpo", "clarifier_grpo"):
        assert (project / "data" / "processed" / "clarifier" / f"{name}.parquet").exists()
    assert "| oracle_rules |" in (project / "reports" / "clarifier_eval.md").read_text()
    for stage in ("clarifier_data@taubench", "clarifier_eval@taubench"):
        assert "Running stage" not in _run(repro + [stage], project).stdout

    # Off: the stages are not in the pipeline at all.
    off = pipeline_project(tmp_path / "off", lambda params: params["clarifier"].update(enable=[]))
    assert "clarifier" not in _run([sys.executable, "-m", "dvc", "stage", "list"], off).stdout
    # On (the default): τ-bench is read from vendor/taubench, inside the project, so no stage
    # has a dependency outside it and `make run` runs them all. Pointed at an absent directory,
    # the stage says where it looked.
    default = pipeline_project(tmp_path / "default", lambda params: None)
    assert outside_dependencies(default) == {}
    assert {"clarifier_data@taubench", "clarifier_eval@taubench", "gold_replay_real"} <= set(
        _run([sys.executable, "-m", "dvc", "stage", "list", "--name-only"], default).stdout.split())
    missing = pipeline_project(tmp_path / "missing", lambda params: params["clarifier"]["data"].update(taubench=str(tmp_path / "absent")))
    failed = _run([sys.executable, "-m", "stages.clarifier_data"], missing, check=False)
    assert failed.returncode == 1 and "τ-bench data not found (params.yaml clarifier.data.taubench)" in failed.stderr
