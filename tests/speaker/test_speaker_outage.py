"""Issue 19 item 1: an LLM outage stops the ``speaker`` stage (exit 1) and leaves the datasets of
the previous run in place, against a local fault-injecting OpenAI-compatible server."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.errors import AskflowError, ConfigError, LLMOutage, LowYield, ValidationFailed
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
    # Every request fails, but the threshold allows all of them (and min_yield is off): the
    # stage then goes on, and the minimum row count is what stops it (no kept dialogue, so no SFT rows).
    server = make_server(FaultPlan(rate=1.0, kinds=("http_401",)))
    before = _snapshot(published)
    params = {**published, "synthesizer": _synthesizer(server.base_url), "max_llm_failure_rate": 1.0, "min_yield": 0.0}
    with pytest.raises(ValidationFailed, match="expect_table_row_count_to_be_between"):
        run(params)
    assert _snapshot(published) == before
    with pytest.raises(ConfigError, match="max_llm_failure_rate"):
        run({**published, "max_llm_failure_rate": 1.5})


def test_a_garbage_reply_is_not_cached_and_the_next_run_asks_again(make_server, published):
    """Issue 28 item 3: HTTP 200 with content that is not the dialogue JSON (after repairs) is
    not written to the cache, so once the server is fixed a re-run asks again instead of
    failing from the cache."""
    server = make_server(FaultPlan(rate=1.0, kinds=("invalid_content",)))
    before = _snapshot(published)
    params = {**published, "synthesizer": {**_synthesizer(server.base_url), "repair_retries": 1}}

    with pytest.raises(AskflowError):
        run(params)
    first = server.stats.requests
    assert first > 0 and server.stats.faults["invalid_content"] == first
    assert not list(Path(params["cache_dir"]).rglob("*.json")), "a garbage reply was cached"

    server.faults = FaultPlan()  # the server is fixed (its replies still do not make dialogues)
    with pytest.raises(AskflowError):
        run(params)
    assert server.stats.requests == 2 * first, "the re-run must ask the server again"
    assert _snapshot(published) == before


def _writes_the_draft(messages, seed, index, as_json) -> str:
    """A fake model that writes every dialogue it is asked for: it returns the prompt's draft."""
    prompt = str(messages[-1]["content"])
    return prompt.split("## Draft\n", 1)[1].split("\n\n## ", 1)[0]


def test_invalid_model_output_counts_as_failures_and_a_low_yield_fails(make_server, published):
    """Issue 28 item 4: with 90 % garbage replies the stage used to exit 0 and publish a tenth of
    the dialogues over the good ones. Invalid output now counts toward max_llm_failure_rate,
    and with that check off, min_yield stops the stage; nothing is published either way."""
    good = make_server(reply_fn=_writes_the_draft)
    healthy = run({**published, "output": published["output"] + "-healthy", "metrics": published["metrics"] + ".healthy",
                   "cache_dir": published["cache_dir"] + "-healthy", "synthesizer": _synthesizer(good.base_url)})
    assert healthy["dialogues"]["kept"] > 40, "the draft-writing model keeps the dialogues"

    server = make_server(FaultPlan(rate=0.9, kinds=("invalid_content",)), reply_fn=_writes_the_draft)
    before = _snapshot(published)
    params = {**published, "synthesizer": {**_synthesizer(server.base_url), "repair_retries": 0}}
    with pytest.raises(LLMOutage, match=r"synthesizer LLM call\(s\) failed \(invalid_output: \d+\)"):
        run(params)
    assert _snapshot(published) == before
    with pytest.raises(LowYield, match=r"speaker: \d+ of \d+ planned seeds made a kept dialogue .*speaker.min_yield \(50%\)"):
        run({**params, "max_llm_failure_rate": 1.0})
    assert _snapshot(published) == before
    assert not list(Path(published["output"]).glob(".*")), "no staging leftovers"


@pytest.mark.parametrize("value", [-0.1, 1.5, True, "half", None])
def test_a_bad_min_yield_is_refused_before_any_work(published, value):
    with pytest.raises(ConfigError, match=r"params.yaml speaker.min_yield: expected a number in \[0, 1\]"):
        run({**published, "source": "/nonexistent", "min_yield": value})


def test_metrics_do_not_depend_on_retries_or_the_cache(make_server, published, tmp_path):
    """Issue 28 item 9: the same data with and without injected server errors (retried), and
    from the cache, gives the same reports/speaker.json bytes; the retries are in reports/timings/."""
    from catalog.io import TIMINGS_DIR

    clean, faulty = make_server(reply_fn=_writes_the_draft), make_server(FaultPlan(rate=0.2, kinds=("http_500",)), reply_fn=_writes_the_draft)
    texts = {}
    for name, server in [("clean", clean), ("faulty", faulty), ("cached", faulty)]:
        if name == "cached":
            faulty.stats.requests = 0
        params = {**published, "output": str(tmp_path / name), "metrics": str(tmp_path / f"{name}.json"),
                  "cache_dir": str(tmp_path / f"cache-{server.port}"), "synthesizer": {**_synthesizer(server.base_url), "max_retries": 6}}
        run(params)
        texts[name] = Path(params["metrics"]).read_text()
        timings = json.loads((TIMINGS_DIR / "speaker.json").read_text())["llm"]["total"]
        if name == "faulty":
            assert timings["retries_by_reason"]["server_error"] > 0
        if name == "cached":
            assert faulty.stats.requests == 0 and timings["cache_hits"] > 0 and timings["requests"] == 0
    assert texts["clean"] == texts["faulty"] == texts["cached"]
    assert "retries" not in texts["clean"] and "cache_hits" not in texts["clean"]
