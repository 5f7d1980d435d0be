"""A trained model is a plain Hugging Face directory: ``transformers serve`` serves it, and an
``openai`` client gets an answer."""

from __future__ import annotations

import pytest

from pipelines.llm.testing.serve import TransformersServe

pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]


def test_the_sft_model_serves_through_transformers_serve(trained, tmp_path):
    import openai

    config, state, _ = trained["sft"]
    assert state.is_completed()
    model_dir = config.output.model_dir
    with TransformersServe(model_dir, tmp_path / "serve.log", env={"OMP_NUM_THREADS": "1"}) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="not-needed", timeout=60, max_retries=1)
        reply = client.chat.completions.create(
            model=str(model_dir),  # the server is pinned to this path
            messages=[{"role": "user", "content": "I need a hotel for 2 people."}],
            max_tokens=8,
            temperature=0.0,
        )
    assert reply.choices[0].message.role == "assistant"
    assert reply.choices[0].message.content
    assert reply.usage.completion_tokens >= 1
