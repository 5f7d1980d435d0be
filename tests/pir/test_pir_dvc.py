"""`dvc repro pir_augment` for real, in a temporary git + DVC repository: it builds a valid
artifact, and a second run does nothing."""

from __future__ import annotations

import sys

import pytest

from catalog.io import read_artifact
from tests.test_dvc_pipeline import _run, pipeline_project

pytestmark = pytest.mark.slow


def test_dvc_repro_pir_augment_is_idempotent(tmp_path, small_corpus_dir, tiny_model_dir):
    def edit(params: dict) -> None:
        params["pir"].update(source=str(small_corpus_dir), max_traces=8,
                             teacher={"backend": "hf", "model_path": str(tiny_model_dir), "batch_size": 4})

    project = pipeline_project(tmp_path / "project", edit)
    first = _run([sys.executable, "-m", "dvc", "repro", "--single-item", "pir_augment"], project)
    assert "Running stage 'pir_augment'" in first.stdout
    table = read_artifact(project / "data/processed/pir/pir_traces.parquet")
    assert table.num_rows == 8
    lock = (project / "dvc.lock").read_text()
    second = _run([sys.executable, "-m", "dvc", "repro", "--single-item", "pir_augment"], project)
    assert "didn't change, skipping" in second.stdout
    assert (project / "dvc.lock").read_text() == lock
    status = _run([sys.executable, "-m", "dvc", "status", "pir_augment"], project)
    assert "up to date" in status.stdout


def test_dvc_repro_pir_training_and_eval_is_idempotent(tmp_path, small_corpus_dir, tiny_model_dir):
    """pir_augment -> train_pir_sft -> train_pir_grpo -> pir_eval under real DVC, tiny: the
    models, their reports and the metrics table are written, and a second run does nothing."""
    import json

    def edit(params: dict) -> None:
        corpus, tiny = str(small_corpus_dir), str(tiny_model_dir)
        params["pir"].update(source=corpus, max_traces=12, teacher={"backend": "hf", "model_path": tiny, "batch_size": 4})
        sft = params["pir_train"]["sft"]
        sft["model"]["path"] = tiny
        sft["data"]["compact_prompts"] = False  # the tiny tokenizer's compact prompt alone is ~600 tokens
        sft["optim"].update(max_steps=2, batch_size=2, max_length=1024, logging_steps=1)
        sft["eval"] = {"max_examples": 2, "before": False, "max_new_tokens": 8}
        grpo = params["pir_train"]["grpo"]
        grpo["env"].update(source=corpus, max_goals=2, eval_goals=2)
        grpo["env"]["rollout"].update(max_exchanges=1, max_turn_tokens=8, max_total_tokens=1024)
        grpo["optim"].update(max_steps=1, batch_size=2)
        grpo["objective"]["num_generations"] = 2
        params["pir_eval"].update(source=corpus, max_goals=2)
        params["pir_eval"]["models"]["base"] = tiny
        params["pir_eval"]["rollout"].update(max_exchanges=1, max_turn_tokens=8)

    project = pipeline_project(tmp_path / "project", edit)
    first = _run([sys.executable, "-m", "dvc", "repro", "pir_eval"], project)
    for stage in ("pir_augment", "train_pir_sft", "train_pir_grpo", "pir_eval"):
        assert f"Running stage '{stage}'" in first.stdout
    for model in ("models/pir_sft", "models/pir_grpo"):
        assert (project / model / "config.json").is_file()
    sft = json.loads((project / "reports/train/pir_sft.json").read_text())
    assert sft["train"]["steps"] == 2 and sft["data"]["sources"]["pir_traces"]["heldout"] >= 1
    grpo = json.loads((project / "reports/train/pir_grpo.json").read_text())
    assert grpo["train"]["steps"] == 1 and grpo["train"]["rollouts"]["episodes"] >= 2
    report = json.loads((project / "reports/pir_eval.json").read_text())
    assert set(report["results"]) == {"base", "pir_sft", "pir_grpo"} and report["goals"] == 2
    assert "| pir_grpo |" in (project / "reports/pir_eval.md").read_text()

    lock = (project / "dvc.lock").read_text()
    second = _run([sys.executable, "-m", "dvc", "repro", "pir_eval"], project)
    assert "Running stage" not in second.stdout
    assert (project / "dvc.lock").read_text() == lock
