"""Issue 19 item 1: an LLM outage stops the ``speaker`` stage (exit 1) and leaves the datasets of
the previous run in place, against a local fault-injecting OpenAI-compatible server."""

from __future__ import annotations

from pathlib import Path

import pytest

from pipelines.errors import ConfigError, LLMOutage, ValidationFailed
from pipelines.llm.testing.fake_server import FaultPlan
from stages.entry import main_wrapper
from stages.speaker import run

from .conftest import stage_params

ARTIFACTS = ("speaker_dialogues", "speaker_sft", "speaker_grpo", "speaker_dpo")


def _snapshot(params: dict) -> dict[str, tuple[bytes, int]]:
    out = Path(params["output"])
    return {name: ((out / f"{name}.parquet").read_bytes(), (out / f"{name}.parquet").stat().st_mtime_ns) for name in ARTIFACTS}


def _synthesizer(base_url: str) -> dict:
    return {
        "backend": "openai",
        "base_url": base_url,
        "model": "fake-model",
        "max_concurrency": 8,
        "timeout_s": 2.0,
        "max_retries": 1,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.002,
    }


@pytest.fixture
def published(speaker_corpus_dir, tmp_path) -> dict:
    """Params of a directory holding good datasets from a rules run."""
    params = stage_params(speaker_corpus_dir, tmp_path)
    metrics = run(params)
    assert metrics["rows"]["speaker_sft"] > 0
    return params


@pytest.mark.parametrize("kind", ["http_401", "http_500"])
def test_an_llm_outage_exits_non_zero_and_leaves_the_previous_datasets(make_server, published, kind):
    server = make_server(FaultPlan(rate=1.0, kinds=(kind,)))
    before = _snapshot(published)
    params = {**published, "synthesizer": _synthesizer(server.base_url)}

    with pytest.raises(LLMOutage, match=r"speaker: (\d+) of \1 synthesizer LLM call\(s\) failed"):
        run(params)
    with pytest.raises(SystemExit) as exit_info:
        main_wrapper(lambda: run(params))()

    assert exit_info.value.code == 1
    assert server.stats.requests > 0
    assert _snapshot(published) == before, "an outage must not touch the published datasets"


def test_an_endpoint_that_is_down_is_an_outage(make_server, published):
    server = make_server()
    base_url = server.base_url
    server.stop()  # nothing listens there any more: connection refused
    before = _snapshot(published)

    with pytest.raises(LLMOutage, match=r"\(connection: \d+\)"):
        run({**published, "synthesizer": _synthesizer(base_url)})

    assert _snapshot(published) == before


def test_failures_up_to_the_threshold_are_tolerated_and_a_bad_threshold_is_refused(make_server, published):
    # Every request fails, but the threshold allows all of them: the stage then goes on, and
    # the minimum row count is what stops it (no kept dialogue, so no SFT rows).
    server = make_server(FaultPlan(rate=1.0, kinds=("http_401",)))
    before = _snapshot(published)
    params = {**published, "synthesizer": _synthesizer(server.base_url), "max_llm_failure_rate": 1.0}
    with pytest.raises(ValidationFailed, match="expect_table_row_count_to_be_between"):
        run(params)
    assert _snapshot(published) == before
    with pytest.raises(ConfigError, match="max_llm_failure_rate"):
        run({**published, "max_llm_failure_rate": 1.5})
