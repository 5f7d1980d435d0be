"""Fixtures of the episode tests: the embedded corpus's database, a tiny local chat model."""

from __future__ import annotations


import pytest

from pipelines.env.tools import Database


@pytest.fixture(scope="session")
def database(small_corpus) -> Database:
    return Database(small_corpus.entities, small_corpus.taxi_options)
