"""Fixtures of the episode tests: the embedded corpus's database, a tiny local chat model."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from pipelines.env.tools import Database
from pipelines.llm.testing.tiny_model import build_tiny_chat_model


@pytest.fixture(scope="session")
def database(small_corpus) -> Database:
    return Database(small_corpus.entities, small_corpus.taxi_options)


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-qwen2-agent"))


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread while a module runs the tiny model: at this size thread
    synchronisation dominates (see tests/llm/conftest.py)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
