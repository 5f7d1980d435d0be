"""Shared fixtures: repository paths, the real MultiWOZ database (vendor/), small corpora."""

from __future__ import annotations

import os
import uuid
from pathlib import Path
from typing import Any, Callable, Iterator

import pytest

REPO = Path(__file__).resolve().parents[1]
SHARED = Path(os.environ.get("ASKFLOW_SHARED", REPO.parent / "shared"))
#: The real MultiWOZ database and val dialogues, in the repository (issue 30; xz-compressed JSON).
REAL_DB = REPO / "vendor" / "multiwoz_db"
REAL_VAL_DIR = REPO / "vendor" / "multiwoz_val"
TOOLWOZ = SHARED / "data" / "toolwoz"


# A canary API key in the environment for the whole run: after the last test, no file any
# test wrote (everything under pytest's temporary root) may contain it.
CANARY_API_KEY = f"sk-canary-{uuid.uuid4().hex}"


@pytest.fixture(scope="session", autouse=True)
def timings_dir(tmp_path_factory) -> Iterator[Path]:
    """Stages run in-process write their wall times here, not into the checkout's reports/."""
    import catalog.io

    previous = catalog.io.TIMINGS_DIR
    catalog.io.TIMINGS_DIR = tmp_path_factory.mktemp("timings")
    yield catalog.io.TIMINGS_DIR
    catalog.io.TIMINGS_DIR = previous


@pytest.fixture(scope="session", autouse=True)
def canary_api_key(tmp_path_factory):
    previous = os.environ.get("OPENAI_API_KEY")
    os.environ["OPENAI_API_KEY"] = CANARY_API_KEY
    yield CANARY_API_KEY
    if previous is None:
        os.environ.pop("OPENAI_API_KEY", None)
    else:
        os.environ["OPENAI_API_KEY"] = previous
    leaks = [
        path
        for path in tmp_path_factory.getbasetemp().rglob("*")
        if path.is_file() and not path.is_symlink() and CANARY_API_KEY.encode() in path.read_bytes()
    ]
    assert not leaks, f"the API key leaked into {leaks[:5]}"


@pytest.fixture(scope="session")
def real_db_dir() -> Path:
    return REAL_DB


@pytest.fixture(scope="session")
def real_raw_db(real_db_dir) -> dict:
    from catalog.multiwoz_dir import read_raw_database

    return read_raw_database(real_db_dir)


@pytest.fixture(scope="session")
def small_corpus_dir(tmp_path_factory) -> Path:
    """A 120-dialogue embedded corpus written in the official layout."""
    from pipelines.multiwoz.embedded import generate_corpus
    from catalog.multiwoz_dir import write_multiwoz

    target = tmp_path_factory.mktemp("corpus") / "multiwoz"
    write_multiwoz(generate_corpus(120, seed=7), target)
    return target


@pytest.fixture(scope="session")
def small_corpus(small_corpus_dir):
    from catalog.multiwoz_dir import load_multiwoz

    return load_multiwoz(small_corpus_dir)


# -- LLM test doubles, shared by tests/llm, tests/episodes, tests/simulators, tests/rewards ----


@pytest.fixture
def make_server() -> Iterator[Callable[..., Any]]:
    """``make_server(faults=FaultPlan(...), n_mode=..., ...)``: a started fake
    OpenAI-compatible server on 127.0.0.1, stopped at teardown."""
    from pipelines.llm.testing.fake_server import FakeOpenAIServer

    servers: list[FakeOpenAIServer] = []

    def make(*args: Any, **kwargs: Any) -> FakeOpenAIServer:
        server = FakeOpenAIServer(*args, **kwargs).start()
        servers.append(server)
        return server

    yield make
    for server in servers:
        server.stop()


@pytest.fixture
def server(make_server):
    """A fault-free fake server."""
    return make_server()


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory) -> Path:
    """A tiny Qwen2 chat model with a locally trained tokenizer (nothing from the hub)."""
    from pipelines.llm.testing.tiny_model import build_tiny_chat_model

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


@pytest.fixture(scope="session")
def prefect_api() -> Iterator[None]:
    """A temporary Prefect API (its own SQLite database) for the session's flow runs."""
    from prefect.testing.utilities import prefect_test_harness

    # Offline: the server's telemetry would only log connection errors.
    analytics = os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    with prefect_test_harness(server_startup_timeout=120):
        yield
    if analytics == "false":
        os.environ.pop("PREFECT_SERVER_ANALYTICS_ENABLED", None)


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    """``askflow argv...`` in process: (exit status, stdout, stderr)."""
    from stages.cli import main

    try:
        status = main(list(argv))
    except SystemExit as exit_:
        status = exit_.code
    out, err = capsys.readouterr()
    return status, out, err
