"""The GPU profile's ``evaluate.continuous``: the job's evaluation with continuous batching
plays the episodes the rounds play (greedy), says so in its report, and is refused with worker
processes or a value that is neither a boolean nor a known attention; the committed CPU comparison is what the README and
params.yaml quote (benchmarks/continuous.py)."""

from __future__ import annotations

import json

import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import ConfigError
from tests.benchmark_support import ROOT, flat, load_benchmark


def _section(corpus, continuous) -> dict:
    return {
        "source": str(corpus), "split": "test", "max_goals": 4, "seeds": [0], "max_exchanges": 3,
        "simulator": {"kind": "agenda"}, "generation": {"temperature": 0.0, "max_new_tokens": 12, "batch_size": 8, "threads": 1},
        "stats": {"resamples": 100}, "workers": 1, "continuous": continuous,
    }


def test_continuous_evaluation_plays_the_rounds_episodes(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread):
    from flows.gpu import evaluate

    runs = {}
    for continuous, attention in ((False, None), (True, "sdpa"), ({"attention": "matmul"}, "matmul")):
        out = tmp_path / str(attention)
        out.mkdir()
        report = evaluate(_section(small_corpus_dir, continuous), {"tiny": str(tiny_model_dir)}, out)
        assert report["setup"]["continuous"] is bool(continuous) and report["speed"]["tiny"]["episodes"] == 4
        assert report["setup"].get("attention") == attention
        decode = report["speed"]["tiny"]["decode"]
        assert ("slot_shrinks" in decode) is bool(continuous)
        # continuous batching says where the wall time went: the decoder's prefills and steps, the rest the host's
        assert ("device_s" in decode) is bool(continuous)
        if continuous:
            device = decode["device_s"]
            assert device["prefill"] > 0 and device["steps"] > 0 and device["prefill_tokens"] > 0 and device["ms_per_step"] > 0
            assert device["prefill"] + device["steps"] + device["host"] == pytest.approx(report["speed"]["tiny"]["wall_s"], abs=0.05)
        events = pq.read_table(out / "episode_events.parquet")
        runs[attention] = (report["models"], events.drop([c for c in events.column_names if "latency" in c]).to_pylist())
    assert len(runs["sdpa"][1]) > 4 * 3
    assert runs["sdpa"] == runs[None] == runs["matmul"]


def test_continuous_is_a_boolean_or_an_attention_of_one_process(small_corpus_dir, tiny_model_dir, tmp_path):
    from flows.gpu import evaluate

    for wrong in ("yes", {"attention": "flash"}, {"attention": "matmul", "slots": 4}):
        with pytest.raises(ConfigError, match=r"continuous: expected true, false or \{attention: one of \['auto', 'matmul', 'sdpa'\]\}, got "):
            evaluate(_section(small_corpus_dir, wrong), {"tiny": str(tiny_model_dir)}, tmp_path)
    with pytest.raises(ConfigError, match=r"workers must be 1, got 2"):
        evaluate({**_section(small_corpus_dir, True), "workers": 2}, {"tiny": str(tiny_model_dir)}, tmp_path)
    assert not list(tmp_path.iterdir())  # refused before anything is written


def test_auto_times_both_attentions_once_and_names_the_faster(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread):
    """``continuous: {attention: auto}``: the job times both slot steps with one model before
    its evaluations (flows.gpu.resolve_attention) and every evaluation takes the pick; an
    evaluation handed an unresolved auto is refused (two calls could pick differently)."""
    from flows.gpu import evaluate, resolve_attention

    section = _section(small_corpus_dir, {"attention": "auto"})
    with pytest.raises(ConfigError, match=r"attention auto is chosen once for the whole job"):
        evaluate(section, {"tiny": str(tiny_model_dir)}, tmp_path)
    assert not list(tmp_path.iterdir())
    resolved, timing = resolve_attention(section, tiny_model_dir, "w")
    assert set(timing["ms_per_step"]) == {"sdpa", "matmul"} and all(ms > 0 for ms in timing["ms_per_step"].values())
    assert timing["chosen"] == min(timing["ms_per_step"], key=timing["ms_per_step"].get)
    # as many slots as the evaluation decodes rows (4 goals, 1 seed), as many columns as its prompt and reply
    assert timing["rows"] == 4 and timing["columns"] == 448 + 12
    assert resolved == {**section, "continuous": {"attention": timing["chosen"]}}
    report = evaluate(resolved, {"tiny": str(tiny_model_dir)}, tmp_path)
    assert report["setup"]["attention"] == timing["chosen"]
    # an earlier run's pick is kept without timing again (no model is loaded: the path is not one)
    assert resolve_attention(section, tmp_path / "no model", "w", {"chosen": "matmul"}) == (
        {**section, "continuous": {"attention": "matmul"}}, {"chosen": "matmul"})
    # a section that names its attention, or plays in rounds, is left as it is
    for named in (_section(small_corpus_dir, True), _section(small_corpus_dir, False)):
        assert resolve_attention(named, tmp_path / "no model", "w") == (named, None)


def test_a_failed_timing_leaves_the_evaluations_sdpa(small_corpus_dir, tmp_path):
    """Fault injection: no model where the timing loads one. The job must still evaluate
    (its own stage reports a missing model), so the pick falls back to sdpa, the error kept."""
    from flows.gpu import resolve_attention

    section = _section(small_corpus_dir, {"attention": "auto"})
    resolved, timing = resolve_attention(section, tmp_path / "missing", "w")
    assert resolved["continuous"] == {"attention": "sdpa"} and timing["chosen"] == "sdpa" and "missing" in timing["error"]


def test_the_benchmark_compares_both_ways(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread):
    bench = load_benchmark("continuous")
    params = tmp_path / "params.yaml"
    section = {**_section(small_corpus_dir, False), "models": {"tiny": {"path": str(tiny_model_dir)}}}
    params.write_text(yaml.safe_dump({"evaluate": section}))
    out = tmp_path / "report.json"
    assert bench.main(["--params", str(params), "--model", "tiny", "--goals", "3", "--threads", "1", "--out", str(out)]) == 0
    report = json.loads(out.read_text())
    assert report["goals"] == 3 and report["identical_transcripts"] == 3
    assert set(report["runs"]) == {"rounds", "continuous"} and report["runs"]["rounds"]["steps"] > 0
    assert "wall_s" not in report["runs"]["rounds"]  # timings stay in the printed line
    assert bench.main(["--params", str(params), "--section", "nothing"]) == 2


def test_the_quoted_cpu_comparison_is_the_committed_run():
    report = json.loads((ROOT / "reports" / "continuous_cpu.json").read_text(encoding="utf-8"))
    rounds, continuous = report["runs"]["rounds"]["steps"], report["runs"]["continuous"]["steps"]
    assert report["identical_transcripts"] == report["goals"]
    params = flat(" ".join(line.strip().lstrip("#") for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()))
    assert (f"the embedded SFT policy's {report['goals']} test goals took {continuous:,} steps instead of {rounds:,}, "
            "transcripts identical") in params
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert (f"{report['goals']} test goals: {continuous:,} sequential decode steps instead of {rounds:,} "
            f"({100 * report['steps_saved']:.0f} % fewer), all {report['goals']} transcripts identical") in readme


def test_the_quoted_floor_is_the_h200_runs_longest_dialogue():
    """The steps continuous batching can reach: the SFT model's longest dialogue in the H200
    run, against the steps its rounds took (benchmarks/decode_depth.py's figures)."""
    from pipelines.evaluation.speed import agent_calls, longest_dialogue_steps

    run = ROOT / "reports" / "gpu" / "2026-11-30_nvidia-h200_speakrl_222527"
    events = [e for e in pq.read_table(run / "evaluate_sft_episode_events.parquet").to_pylist() if e["episode_id"].startswith("sft/")]
    floor = longest_dialogue_steps(agent_calls(events))
    steps = json.loads((run / "evaluate_sft.json").read_text())["speed"]["sft"]["decode"]["steps"]
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert f"the SFT model's 100 dialogues above took {steps:,} sequential steps where its longest dialogue needed {floor:,}." in readme
    params = flat(" ".join(line.strip().lstrip("#") for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()))
    assert f"The H200 run's SFT episodes needed {steps:,} lockstep steps in rounds against a floor of {floor:,}" in params
