"""Fixtures for the SpeakER tests: a small embedded corpus on disk, its database, a rules
pipeline run in process and a run of the ``speaker`` stage."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.env.tools import Database
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.speaker.pipeline import SpeakerConfig, run_speaker
from pipelines.speaker.synthesis import RulesSynthesizer
from catalog.multiwoz_dir import load_multiwoz, write_multiwoz

CORPUS_SIZE = 80
CORPUS_SEED = 11


@pytest.fixture(scope="session")
def speaker_corpus_dir(tmp_path_factory) -> Path:
    target = tmp_path_factory.mktemp("speaker-corpus") / "multiwoz"
    write_multiwoz(generate_corpus(CORPUS_SIZE, seed=CORPUS_SEED), target)
    return target


@pytest.fixture(scope="session")
def speaker_corpus(speaker_corpus_dir):
    return load_multiwoz(speaker_corpus_dir)


@pytest.fixture(scope="session")
def database(speaker_corpus) -> Database:
    return Database(speaker_corpus.entities, speaker_corpus.taxi_options)


@pytest.fixture(scope="session")
def rules_result(speaker_corpus, database):
    return run_speaker(speaker_corpus.dialogues, database, RulesSynthesizer(database, seed=3), SpeakerConfig(source="data/raw/embedded_multiwoz", output="unused", metrics="unused", seed=3))


def stage_params(corpus_dir: Path, out: Path, **overrides) -> dict:
    params = {
        "source": str(corpus_dir),
        "db_dir": None,
        "synthesizer": {"backend": "rules"},
        "seed": 3,
        "max_clarifications": 3,
        "dedup": {"threshold": 0.8, "ngram": 3},
        "output": str(out / "speaker"),
        "metrics": str(out / "speaker.json"),
        "cache_dir": str(out / "cache"),
    }
    params.update(overrides)
    return params


@pytest.fixture(scope="session")
def stage_run(speaker_corpus_dir, tmp_path_factory) -> tuple[dict, dict]:
    """(params, metrics) of one run of the stage with the rules backend."""
    from stages.speaker import run

    params = stage_params(speaker_corpus_dir, tmp_path_factory.mktemp("speaker-stage"))
    return params, run(params)
