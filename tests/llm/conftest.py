"""Fixtures for the LLM client tests: fake OpenAI-compatible servers, fast client configs, a
tiny local chat model."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

from pipelines.llm.testing.fake_server import FakeOpenAIServer
from pipelines.llm.testing.tiny_model import build_tiny_chat_model


@pytest.fixture
def make_server() -> Iterator[Callable[..., FakeOpenAIServer]]:
    """``make_server(faults=FaultPlan(...), n_mode=..., ...)``: a started server, stopped at teardown."""
    servers: list[FakeOpenAIServer] = []

    def make(*args: Any, **kwargs: Any) -> FakeOpenAIServer:
        server = FakeOpenAIServer(*args, **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server(make_server) -> FakeOpenAIServer:
    """A fault-free fake server."""
    return make_server()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    return build_tiny_chat_model(tmp_path_factory.mktemp("tiny-qwen2"))


@pytest.fixture(scope="module")
def single_torch_thread() -> Iterator[None]:
    """One intra-op thread while a module runs tiny models. At this size thread synchronisation
    dominates: on a busy 2-core machine a 2-thread forward pass was ~100x slower than 1-thread.
    The previous setting is restored, so other test modules are unaffected."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)

