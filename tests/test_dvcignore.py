"""Importing the code must not mark DVC stages changed (issue 19, item 5)."""

from __future__ import annotations

import subprocess
import sys

import pytest
import yaml

from tests.conftest import REPO
from tests.test_dvc_pipeline import _run, pipeline_project

pytestmark = pytest.mark.slow


def _tiny(params: dict) -> None:
    params["corpus"]["n_dialogues"] = 20


@pytest.mark.parametrize("with_dvcignore", [True, False], ids=["repo-dvcignore", "no-dvcignore"])
def test_importing_the_code_leaves_dvc_status_clean(tmp_path, monkeypatch, with_dvcignore):
    files = {".dvcignore": (REPO / ".dvcignore").read_text()} if with_dvcignore else {}
    project = pipeline_project(tmp_path / "project", _tiny, files=files)
    monkeypatch.setenv("PYTHONDONTWRITEBYTECODE", "1")  # the runs themselves leave no bytecode
    _run([sys.executable, "-m", "dvc", "repro", "seeds"], project)
    assert "up to date" in _run([sys.executable, "-m", "dvc", "status", "seeds"], project).stdout

    # A directory the stage depends on whole (dvc.yaml's generated deps list a directory when
    # every module in it is in the stage's import closure): where bytecode would be a "change".
    deps = yaml.safe_load((project / "dvc.yaml").read_text())["stages"]["seeds"]["deps"]
    package = next(d for d in deps if d.startswith("pipelines/") and (project / d).is_dir())

    # What a user's `python -c "import ..."`, an editor or pytest leaves beside the code.
    monkeypatch.delenv("PYTHONDONTWRITEBYTECODE")
    subprocess.run([sys.executable, "-c", f"import {package.replace('/', '.')}, stages.seeds"], cwd=project, check=True)
    assert list((project / package).glob("__pycache__/*.pyc"))
    (project / package / ".DS_Store").write_bytes(b"\0")
    (project / "stages" / "seeds.py~").write_text("editor backup\n")

    status = _run([sys.executable, "-m", "dvc", "status", "seeds"], project).stdout
    if with_dvcignore:
        assert "up to date" in status, status
    else:  # the control: without the ignore file the same import is a "change"
        assert "changed deps" in status and package in status, status
