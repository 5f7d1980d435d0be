"""Shared fixtures: repository paths, the real MultiWOZ database when present, small corpora."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ASKFLOW_SHARED", REPO.parent / "shared"))
REAL_DB = SHARED / "data" / "multiwoz_db"
TOOLWOZ = SHARED / "data" / "toolwoz"


@pytest.fixture(scope="session")
def real_db_dir() -> Path:
    if not (REAL_DB / "restaurant_db.json").exists():
        pytest.skip(f"real MultiWOZ database not present at {REAL_DB}")
    return REAL_DB


@pytest.fixture(scope="session")
def real_raw_db(real_db_dir) -> dict:
    return {p.name[: -len("_db.json")]: json.loads(p.read_text(encoding="utf-8")) for p in sorted(real_db_dir.glob("*_db.json"))}


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory) -> Path:
    """A 120-dialogue embedded corpus written in the official layout."""
    from pipelines.multiwoz.embedded import generate_corpus
    from stages.multiwoz_dir import write_multiwoz

    target = tmp_path_factory.mktemp("corpus") / "multiwoz"
    write_multiwoz(generate_corpus(120, seed=7), target)
    return target


@pytest.fixture(scope="session")
def small_corpus(small_corpus_dir):
    from stages.multiwoz_dir import load_multiwoz

    return load_multiwoz(small_corpus_dir)
