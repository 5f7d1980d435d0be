"""The ``speaker`` stage with the ``openai`` synthesizer against a real ``transformers serve``
process over a tiny random model. The model cannot write the dialogue JSON: every reply is
repaired once and then dropped with its reason. The stage must run to the end, and a re-run
with unchanged inputs must not reach the server."""

from __future__ import annotations

import time

import pytest

from pipelines.llm.testing.serve import TransformersServe
from pipelines.llm.testing.tiny_model import build_tiny_chat_model
from pipelines.multiwoz.embedded import generate_corpus
from stages.multiwoz_dir import write_multiwoz
from stages.speaker import run

from .conftest import stage_params

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

N_SEEDS = 8


@pytest.fixture(scope="module")
def serve(tmp_path_factory):
    model = build_tiny_chat_model(tmp_path_factory.mktemp("tiny-model"))
    # One torch thread: a tiny model on a busy 2-core machine is far faster that way.
    with TransformersServe(model, tmp_path_factory.mktemp("serve") / "serve.log", env={"OMP_NUM_THREADS": "1"}) as server:
        yield server, model


def test_openai_synthesizer_drops_invalid_replies_and_rerun_uses_the_cache(serve, tmp_path):
    server, model = serve
    corpus = tmp_path / "corpus"
    generated = generate_corpus(N_SEEDS, seed=21)
    write_multiwoz(generated, corpus)
    training_seeds = N_SEEDS - len(generated["splits"]["test"])  # the test split is never synthesized
    synthesizer = {
        "backend": "openai",
        "base_url": server.base_url,
        "model": str(model),  # the server is pinned to this path
        "structured_output": "prompt",  # transformers serve ignores response_format
        "timeout_s": 120.0,
        "max_retries": 1,
        "repair_retries": 1,
        "sampling": {"temperature": 0.0, "max_tokens": 24},
    }
    params = stage_params(corpus, tmp_path / "out", synthesizer=synthesizer)
    before = server.chat_requests()

    metrics = run(params)

    llm = metrics["llm"]
    synthesized = llm["synthesizer"]["seeds_sent"]
    assert synthesized > 0 and llm["total"]["calls"] == synthesized
    assert llm["total"]["requests"] == 2 * synthesized and llm["total"]["repairs"] == synthesized
    assert llm["total"]["failures_by_reason"] == {"invalid_output": synthesized}
    assert metrics["dialogues"]["kept"] == 0
    assert metrics["dialogues"]["dropped_by_reason"]["llm_invalid_output"] == synthesized
    assert metrics["rows"]["speaker_dialogues"] == training_seeds and metrics["rows"]["speaker_sft"] == 0
    deadline = time.monotonic() + 5
    while server.chat_requests() < before + 2 * synthesized and time.monotonic() < deadline:
        time.sleep(0.05)  # the access-log line lands just after the response
    assert server.chat_requests() == before + 2 * synthesized

    again = run(params)

    assert again["llm"]["total"]["calls"] == 0 and again["llm"]["total"]["requests"] == 0
    assert again["llm"]["synthesizer"] == {"seeds_sent": 0, "remembered_failures": synthesized}
    assert again["dialogues"] == metrics["dialogues"]
    time.sleep(0.5)
    assert server.chat_requests() == before + 2 * synthesized, "the re-run reached the server"
