"""The josh stage with an LLM agent behind a real local OpenAI-compatible server: sampling
settings and distinct sibling seeds reach the server, malformed outputs are recorded, an
outage stops the stage and is never checkpointed."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.errors import LLMOutage
from pipelines.llm.testing.fake_server import FaultPlan
from stages.josh import run


def josh_params(tmp_path: Path, corpus: Path, **overrides: object) -> dict:
    params = {
        "source": str(corpus), "output": str(tmp_path / "josh"), "metrics": str(tmp_path / "josh.json"),
        "work_dir": str(tmp_path / "checkpoints"), "max_goals": 2, "concurrency": 2,
        "agent": {"backend": "openai", "format": "react",
                  "sampling": {"temperature": 1.5, "top_p": 0.75, "top_k": 50, "max_tokens": 64}},
        "beam": {"max_beam": 4, "branching_factor": 2, "max_turns": 2}, "test": {"max_goals": 1},
    }
    params.update(overrides)
    return params


def llm_params(tmp_path: Path, base_url: str) -> dict:
    return {"cache_dir": str(tmp_path / "cache"), "roles": {"agent": {
        "backend": "openai", "base_url": base_url, "model": "fake-model",
        "max_retries": 0, "backoff_base_s": 0.001, "backoff_max_s": 0.002}}}


def test_openai_agent_harvest_sends_sampling_and_sibling_seeds(make_server, small_corpus_dir, tmp_path):
    server = make_server()
    # The fake model does not write ReAct: every output is malformed, no goal API is met, and
    # the stage says there is nothing to train on, publishing empty SFT / KTO tables.
    metrics = run(josh_params(tmp_path, small_corpus_dir), llm_params(tmp_path, server.base_url))
    assert metrics["training_data"] is False and "nothing to train M' on" in metrics["no_training_data"]
    assert pq.read_table(tmp_path / "josh" / "josh_sft.parquet").num_rows == pq.read_table(tmp_path / "josh" / "josh_kto.parquet").num_rows == 0
    assert json.loads((tmp_path / "josh.json").read_text())["training_data"] is False
    bodies = server.stats.bodies
    assert bodies and all(b["temperature"] == 1.5 and b["top_p"] == 0.75 and b["top_k"] == 50 for b in bodies)
    # The trees were checkpointed (malformed outputs are the model's, not an outage).
    trees = [json.loads(p.read_text()) for p in (tmp_path / "checkpoints").glob("*/*.json")]
    assert len(trees) == 2 and all(t["backend_failures"] == 0 and t["agent_calls"] > 0 for t in trees)
    # The two children of each root are asked with the same conversation but distinct seeds.
    openings = {n["user_text"] for t in trees for n in t["nodes"] if n["depth"] == 1}
    seeds: dict[str, set[int]] = {text: set() for text in openings}
    for body in bodies:
        users = [m for m in body["messages"] if m["role"] == "user"]
        if len(users) == 1 and users[0]["content"] in seeds:
            seeds[users[0]["content"]].add(body["seed"])
    assert len(openings) == 2 and all(len(s) >= 2 for s in seeds.values()), seeds
    assert any(n["errors"] > 0 for t in trees for n in t["nodes"])


def test_an_agent_outage_stops_the_stage_and_is_not_checkpointed(make_server, small_corpus_dir, tmp_path):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    with pytest.raises(LLMOutage, match=r"josh \(agent\)"):
        run(josh_params(tmp_path, small_corpus_dir), llm_params(tmp_path, server.base_url))
    assert not list((tmp_path / "checkpoints").glob("*/*.json"))
    assert not (tmp_path / "josh").exists() and not (tmp_path / "josh.json").exists()


def test_hf_agent_harvest_runs_a_local_model(small_corpus_dir, tiny_model_dir, tmp_path):
    params = josh_params(tmp_path, small_corpus_dir, max_goals=1, agent={
        "backend": "hf", "model_path": str(tiny_model_dir), "format": "react",
        "sampling": {"temperature": 1.5, "top_p": 0.75, "top_k": 50, "max_tokens": 16}})
    # A tiny random model writes no ReAct either; the harvest itself must still run.
    assert run(params)["training_data"] is False  # nothing to train M' on: reported, not an error
    (tree,) = [json.loads(p.read_text()) for p in (tmp_path / "checkpoints").glob("*/*.json")]
    assert tree["agent_calls"] > 0 and len(tree["nodes"]) > 1


@pytest.mark.parametrize("task_runner", ["thread", "process", "dask"])
def test_fan_out_over_prefect_workers_gives_the_in_process_tables(prefect_api, small_corpus_dir, tmp_path, task_runner):
    """The harvest fanned out over two Prefect workers (threads, processes, or a Dask
    LocalCluster of two worker processes: prefect-dask) writes the in-process tables."""
    base = {"source": str(small_corpus_dir), "max_goals": 6, "agent": {"backend": "rules"}, "beam": {"max_beam": 4, "branching_factor": 2, "max_turns": 10},
            "test": {"max_goals": 2}}
    inline = {**base, "output": str(tmp_path / "inline"), "metrics": str(tmp_path / "inline.json"), "work_dir": str(tmp_path / "ck_inline")}
    fanned = {**base, "output": str(tmp_path / "fanned"), "metrics": str(tmp_path / "fanned.json"), "work_dir": str(tmp_path / "ck_fanned"),
              "fan_out": {"workers": 2, "task_runner": task_runner, "chunk_size": 2}}
    run(inline)
    run(fanned)
    assert len(list((tmp_path / "ck_fanned").glob("*/*.json"))) == 6
    for name in ("josh_trees", "josh_sft", "josh_kto"):
        assert pq.read_table(tmp_path / "fanned" / f"{name}.parquet").equals(pq.read_table(tmp_path / "inline" / f"{name}.parquet")), name
    assert json.loads((tmp_path / "fanned.json").read_text()) == json.loads((tmp_path / "inline.json").read_text())
