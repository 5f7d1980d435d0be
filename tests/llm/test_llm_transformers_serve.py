"""LLMClient against a real ``transformers serve`` process serving a tiny local model.

``transformers serve`` exposes no request counter, so requests are counted from its access log
(``TransformersServe.chat_requests``) as well as from the client's accounting.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import pytest

from pipelines.llm import ClientConfig, Failure, LLMClient, ResponseCache, SamplingParams
from pipelines.llm.testing.serve import TransformersServe

from .helpers import requests_for, user

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

GREEDY = SamplingParams(temperature=0.0, max_tokens=8)


@pytest.fixture(scope="module")
def serve(tiny_model_dir, tmp_path_factory):
    log_path = tmp_path_factory.mktemp("serve") / "serve.log"
    # One torch thread: see the single_torch_thread fixture for why, at this model size.
    with TransformersServe(tiny_model_dir, log_path, env={"OMP_NUM_THREADS": "1"}) as server:
        yield server


def config(serve: TransformersServe, model_dir: Path, **overrides: Any) -> ClientConfig:
    settings: dict[str, Any] = {
        "base_url": serve.base_url,
        "model": str(model_dir),  # the server is pinned to this path
        "timeout_s": 60.0,
        "max_retries": 2,
        # transformers serve ignores response_format (with a warning), so the schema must travel
        # in the prompt.
        "structured_output": "prompt",
    }
    settings.update(overrides)
    return ClientConfig(**settings)


def wait_for(condition: Callable[[], bool], timeout_s: float = 5.0) -> bool:
    """The access-log line is written just after the response is sent; allow it to land."""
    deadline = time.monotonic() + timeout_s
    while not condition():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_requests_concurrency_cache_and_accounting(serve, tiny_model_dir, tmp_path):
    requests = requests_for([f"find me a hotel, option {i}" for i in range(8)], sampling=GREEDY)
    start = serve.chat_requests()

    sequential = LLMClient(config(serve, tiny_model_dir, max_concurrency=1)).complete_many_sync(requests)
    client = LLMClient(config(serve, tiny_model_dir, max_concurrency=4), cache=ResponseCache(tmp_path / "cache"))
    concurrent = client.complete_many_sync(requests)

    texts = [r.unwrap().text for r in concurrent]
    assert texts == [r.unwrap().text for r in sequential], "greedy replies must not depend on concurrency"
    assert len(set(texts)) > 1 and all(texts)
    usage = client.accounting.role("judge")
    assert (usage.calls, usage.requests, usage.cache_hits) == (8, 8, 0) and not usage.failures
    assert usage.prompt_tokens == sum(r.usage.prompt_tokens for r in concurrent) > 8 * 10
    assert usage.completion_tokens == sum(r.usage.completion_tokens for r in concurrent)
    assert 8 <= usage.completion_tokens <= 8 * GREEDY.max_tokens
    assert wait_for(lambda: serve.chat_requests() == start + 16), serve.chat_requests() - start

    rerun = LLMClient(config(serve, tiny_model_dir, max_concurrency=4), cache=ResponseCache(tmp_path / "cache"))
    again = rerun.complete_many_sync(requests)

    assert [r.unwrap().text for r in again] == texts and all(r.cached for r in again)
    rerun_usage = rerun.accounting.role("judge")
    assert (rerun_usage.calls, rerun_usage.cache_hits, rerun_usage.requests) == (8, 8, 0)
    time.sleep(0.5)
    assert serve.chat_requests() == start + 16, "the re-run reached the server"


def test_seeded_choices_fan_out_because_the_server_ignores_n(serve, tiny_model_dir):
    # One request at a time: transformers serve seeds torch's global RNG in the request handler
    # while generation runs on another thread, so concurrent sampled requests race for the seed.
    client = LLMClient(config(serve, tiny_model_dir, max_concurrency=1))
    sampling = SamplingParams(temperature=1.0, max_tokens=8)
    start = serve.chat_requests()

    two = client.complete_sync(user("pick a restaurant"), "synthesizer", sampling, seed=3, n=2).unwrap()
    seed_4 = client.complete_sync(user("pick a restaurant"), "synthesizer", sampling, seed=4).unwrap()

    assert client.supports_n is False and two.seeds == (3, 4)
    assert len(two.texts) == 2 and two.texts[0] != two.texts[1]
    assert seed_4.text == two.texts[1], "a seeded sample must be reproducible"
    assert two.attempts == 1 + 2  # the probe that came back with one choice, then one per seed
    assert wait_for(lambda: serve.chat_requests() == start + 4)


def test_unparseable_output_is_repaired_then_fails(serve, tiny_model_dir):
    # A random tiny model does not write JSON: the repair path runs against a real server.
    client = LLMClient(config(serve, tiny_model_dir, repair_retries=1))
    schema = {"type": "object", "properties": {"answer": {"type": "string"}}, "required": ["answer"]}

    result = client.complete_sync(user("answer in JSON"), "synthesizer", GREEDY, seed=0, response_schema=schema)

    assert isinstance(result, Failure) and (result.reason, result.attempts) == ("invalid_output", 2)
    usage = client.accounting.role("synthesizer")
    assert usage.repairs == 1 and dict(usage.failures) == {"invalid_output": 1}
