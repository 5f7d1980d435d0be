"""The Clarifier stages under real DVC: out of the pipeline by default, built, validated and
idempotent when enabled (on the hand-made retail domain)."""

from __future__ import annotations

import json
import sys

import pytest

from tests.taubench.conftest import write_mini_retail
from tests.test_dvc_pipeline import _run, pipeline_project

pytestmark = pytest.mark.slow


def test_clarifier_stages_are_off_by_default_and_build_once_when_enabled(tmp_path):
    data = write_mini_retail(tmp_path / "taubench")

    def edit(params):
        params["clarifier"]["enable"] = ["taubench"]
        params["clarifier"]["data"]["taubench"] = str(data)
        params["clarifier"]["eval"].update(taubench=str(data), domains={"retail": "test"},
                                           clarifiers={"none": None, "rules": {"backend": "rules"}})

    project = pipeline_project(tmp_path / "project", edit)
    stages = _run([sys.executable, "-m", "dvc", "stage", "list"], project).stdout
    for stage in ("clarifier_data", "train_clarifier_sft", "train_clarifier_dpo", "train_clarifier_grpo", "clarifier_eval"):
        assert f"{stage}@taubench" in stages
    # Training is tested with the flows (tests/training/test_clarifier_training.py); here the
    # trained models are stand-ins the evaluation (without hf rows) does not read.
    for method in ("sft", "dpo", "grpo"):
        (project / "models" / f"clarifier_{method}").mkdir(parents=True)
    repro = [sys.executable, "-m", "dvc", "repro", "--single-item"]
    built = _run(repro + ["clarifier_data@taubench"], project)
    evaluated = _run(repro + ["clarifier_eval@taubench"], project)
    assert "Running stage 'clarifier_data@taubench'" in built.stdout and "Running stage 'clarifier_eval@taubench'" in evaluated.stdout
    metrics = json.loads((project / "reports" / "clarifier_data.json").read_text())
    assert sum(metrics["judge_outcomes"].values()) == metrics["states"] > 0
    for name in ("clarifier_sft", "clarifier_dpo", "clarifier_grpo"):
        assert (project / "data" / "processed" / "clarifier" / f"{name}.parquet").exists()
    assert "| rules |" in (project / "reports" / "clarifier_eval.md").read_text()
    for stage in ("clarifier_data@taubench", "clarifier_eval@taubench"):
        assert "Running stage" not in _run(repro + [stage], project).stdout

    # Off (the default): the stages are not in the pipeline at all, so a machine without
    # ../shared/data/taubench never needs it.
    off = pipeline_project(tmp_path / "off", lambda params: None)
    assert "clarifier" not in _run([sys.executable, "-m", "dvc", "stage", "list"], off).stdout
    # On, without the data: the stage says where it looked.
    missing = pipeline_project(tmp_path / "missing", lambda params: params["clarifier"].update(enable=["taubench"]))
    (missing / "params.yaml").write_text((missing / "params.yaml").read_text().replace("../shared/data/taubench", str(tmp_path / "absent")))
    failed = _run([sys.executable, "-m", "stages.clarifier_data"], missing, check=False)
    assert failed.returncode == 1 and "τ-bench data not found (params.yaml clarifier.data.taubench)" in failed.stderr
