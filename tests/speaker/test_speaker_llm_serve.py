"""The ``speaker`` stage with the ``openai`` synthesizer against a real ``transformers serve``
process over a tiny random model. The model cannot write the dialogue JSON: every reply is
repaired once and then dropped with its reason. With no dialogue kept the stage must refuse to
publish (an empty dataset is an error), and a re-run must ask again: invalid output is not cached."""

from __future__ import annotations

import time

import pytest

from pipelines.errors import ValidationFailed
from pipelines.llm.testing.serve import TransformersServe
from pipelines.llm.testing.tiny_model import build_tiny_chat_model
from pipelines.multiwoz.embedded import generate_corpus
from catalog.multiwoz_dir import write_multiwoz
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
    # The failure-rate and yield guards off: this test is about the row-count expectation.
    params = stage_params(corpus, tmp_path / "out", synthesizer=synthesizer, max_llm_failure_rate=1.0, min_yield=0.0)
    before = server.chat_requests()

    # Nothing the model writes validates, so no dialogue is kept: the stage must refuse to
    # publish an empty SFT dataset (its minimum row count), and publish nothing at all.
    with pytest.raises(ValidationFailed, match="speaker_sft") as failure:
        run(params)
    assert "expect_table_row_count_to_be_between" in str(failure.value)
    assert not (tmp_path / "out" / "speaker").exists() or not list((tmp_path / "out" / "speaker").iterdir())
    time.sleep(0.5)  # the access-log line lands just after the response
    sent = server.chat_requests() - before
    # Each synthesized seed: one request and one repair; only train and val seeds are sent.
    assert 0 < sent <= 2 * training_seeds and sent % 2 == 0
    expected = before + sent

    # Invalid output is not cached (issue 28 item 3): the re-run asks the server again.
    with pytest.raises(ValidationFailed, match="speaker_sft"):
        run(params)
    time.sleep(0.5)  # a request the re-run made would be logged by now
    assert server.chat_requests() == expected + sent, "the re-run must ask again for what was invalid"
