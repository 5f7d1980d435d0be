"""``speaker.fan_out`` (issue 31): the seeds' synthesis as a Prefect flow over thread workers,
process workers or a Dask ``LocalCluster`` of worker processes (prefect-dask) publishes the
in-process tables and metrics, and an outage seen by the workers still stops the stage."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.errors import ConfigError, LLMOutage
from pipelines.llm.testing.fake_server import FaultPlan
from stages.speaker import run

from .conftest import stage_params
from .test_speaker_outage import ARTIFACTS, _synthesizer

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("task_runner", ["thread", "process", "dask"])
def test_fanned_out_synthesis_publishes_the_in_process_tables(prefect_api, stage_run, speaker_corpus_dir, tmp_path, task_runner):
    reference, reference_metrics = stage_run
    params = stage_params(speaker_corpus_dir, tmp_path, fan_out={"workers": 2, "task_runner": task_runner, "chunk_size": 16})
    metrics = run(params)
    assert metrics == reference_metrics
    for name in ARTIFACTS:
        fanned, alone = (pq.read_table(Path(p["output"]) / f"{name}.parquet") for p in (params, reference))
        assert fanned.equals(alone), name
    assert json.loads(Path(params["metrics"]).read_text()) == json.loads(Path(reference["metrics"]).read_text())


def test_an_outage_in_the_workers_stops_the_stage(prefect_api, make_server, speaker_corpus_dir, tmp_path):
    """Each worker counts its own LLM calls; the stage merges the counts before it publishes."""
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    params = stage_params(speaker_corpus_dir, tmp_path, synthesizer=_synthesizer(server.base_url),
                          fan_out={"workers": 2, "task_runner": "thread", "chunk_size": 16})
    with pytest.raises(LLMOutage, match=r"speaker: (\d+) of \1 synthesizer LLM call\(s\) failed"):
        run(params)
    assert server.stats.requests > 0
    assert not Path(params["output"]).exists()


@pytest.mark.parametrize("fan_out, message", [
    ({"workers": -1}, "params.yaml speaker.fan_out: workers: expected an integer >= 0"),
    ({"workers": 2, "task_runner": "mpi"}, "params.yaml speaker.fan_out: task_runner: expected one of"),
    ({"workers": 2, "chunk": 4}, r"params.yaml speaker.fan_out: unknown key\(s\) \['chunk'\]"),
])
def test_a_bad_fan_out_is_refused_before_any_work(speaker_corpus_dir, tmp_path, fan_out, message):
    with pytest.raises(ConfigError, match=message):
        run(stage_params(speaker_corpus_dir, tmp_path, fan_out=fan_out))
