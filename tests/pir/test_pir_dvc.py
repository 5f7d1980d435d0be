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
