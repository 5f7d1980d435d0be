"""Fixtures for the embedded policy's tests: seed chats of the small embedded corpus, a
small tokenizer trained on them and a tiny architecture."""

from __future__ import annotations

import pytest

from pipelines.env.tools import Database
from pipelines.policy.bootstrap import tokenizer_texts
from pipelines.policy.model import Architecture
from pipelines.policy.pretrain_data import seed_chat
from pipelines.policy.tokenizer import train_tokenizer

TINY = Architecture(
    hidden_size=32,
    num_hidden_layers=1,
    num_attention_heads=2,
    num_key_value_heads=1,
    intermediate_size=64,
    max_position_embeddings=512,
)
SMALL_VOCAB = 1000


@pytest.fixture(scope="module", autouse=True)
def one_torch_thread():
    """Tiny models gain nothing from a second thread, and on a busy 2-core machine two
    spinning OpenMP threads make every step several times slower."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(scope="session")
def database(small_corpus) -> Database:
    return Database(small_corpus.entities, small_corpus.taxi_options)


@pytest.fixture(scope="session")
def chats(small_corpus, database) -> dict[str, list[list[dict]]]:
    """Seed chats of the small corpus by split."""
    return {
        split: [seed_chat(d, database) for d in small_corpus.dialogues if d.split == split]
        for split in ("train", "val")
    }


@pytest.fixture(scope="session")
def tokenizer(chats):
    return train_tokenizer(tokenizer_texts(chats["train"][:40]), SMALL_VOCAB)
