"""The GPU profile's evaluation split between processes (``evaluate.workers``): the same
episodes, in the same order, as one process playing every goal (greedy decoding)."""

from __future__ import annotations

import pyarrow.parquet as pq
import pytest

from pipelines.errors import ConfigError


def _section(corpus, workers: int) -> dict:
    return {
        "source": str(corpus), "split": "test", "max_goals": 4, "seeds": [0], "max_exchanges": 3,
        "simulator": {"kind": "agenda"}, "generation": {"temperature": 0.0, "max_new_tokens": 12, "batch_size": 8, "threads": 1},
        "stats": {"resamples": 100}, "workers": workers,
    }


def test_goals_played_in_worker_processes_give_the_one_process_episodes(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread):
    from flows.gpu import evaluate

    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"w{workers}"
        out.mkdir()
        report = evaluate(_section(small_corpus_dir, workers), {"tiny": str(tiny_model_dir)}, out)
        assert report["setup"]["workers"] == workers and report["speed"]["tiny"]["episodes"] == 4
        runs[workers] = (report["models"], pq.read_table(out / "episode_events.parquet").to_pylist(),
                         pq.read_table(out / "episodes.parquet").to_pylist())
    one, two = runs[1], runs[2]
    assert len(one[1]) > 4 * 3  # more than a greeting per episode: the agent spoke
    assert two == one


def test_the_cpu_stage_refuses_worker_processes(small_corpus_dir, tiny_model_dir):
    from pipelines.config import from_params
    from flows.evaluate import check_inputs
    from pipelines.evaluation.config import EvalConfig

    config = from_params(EvalConfig, {**_section(small_corpus_dir, 2), "models": {"tiny": {"path": str(tiny_model_dir)}}}, "test")
    with pytest.raises(ConfigError, match="evaluate.workers"):
        check_inputs(config)
    with pytest.raises(ConfigError, match="evaluate.workers"):
        from_params(EvalConfig, {**_section(small_corpus_dir, 0), "models": {"tiny": {"path": "x"}}}, "test")
