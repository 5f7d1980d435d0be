"""The GPU profile's ``evaluate.continuous``: the job's evaluation with continuous batching
plays the episodes the rounds play (greedy), says so in its report, and is refused with worker
processes or a value that is neither a boolean nor a known attention; the committed CPU comparison is what the README and
params.yaml quote (benchmarks/continuous.py)."""

from __future__ import annotations

import doctest
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
    drafted = {"attention": "matmul", "draft": {"tokens": 3}}
    for continuous, attention in ((False, None), (True, "sdpa"), ({"attention": "matmul"}, "matmul"), (drafted, "drafted")):
        out = tmp_path / str(attention)
        out.mkdir()
        report = evaluate(_section(small_corpus_dir, continuous), {"tiny": str(tiny_model_dir)}, out)
        assert report["setup"]["continuous"] is bool(continuous) and report["speed"]["tiny"]["episodes"] == 4
        assert report["setup"].get("attention") == (attention if attention != "drafted" else "matmul")
        assert report["setup"].get("draft") == ({"tokens": 3, "ngram": 3} if attention == "drafted" else None)
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
    assert runs["sdpa"] == runs[None] == runs["matmul"] == runs["drafted"]


def test_a_failed_continuous_evaluation_plays_in_rounds_and_says_why(small_corpus_dir, tiny_model_dir, tmp_path, single_torch_thread,
                                                                      monkeypatch):
    """Fault injection: continuous batching raises (as a device it never ran on might). The
    model plays again in rounds (the rounds' figures), the ones after it play in rounds without
    trying, the report says why, and the unbatched check compares in rounds too."""
    import pipelines.evaluation.continuous as continuous_play
    from flows.gpu import evaluate, unbatched_check

    (tmp_path / "rounds").mkdir()
    rounds = evaluate(_section(small_corpus_dir, False), {"tiny": str(tiny_model_dir)}, tmp_path / "rounds")
    tried = []

    def broken(*args, **kwargs):
        tried.append(kwargs)
        raise RuntimeError("injected: no graph")

    monkeypatch.setattr(continuous_play, "play_policy_continuous", broken)
    (tmp_path / "fallback").mkdir()
    played: dict = {}
    section = _section(small_corpus_dir, {"attention": "matmul", "draft": {"tokens": 3}})
    report = evaluate(section, {"tiny": str(tiny_model_dir), "again": str(tiny_model_dir)}, tmp_path / "fallback", played)
    assert len(tried) == 1 and tried[0]["draft"] == (3, 3)
    assert report["models"]["tiny"] == report["models"]["again"] == rounds["models"]["tiny"]
    why = "RuntimeError: injected: no graph"
    for name in ("tiny", "again"):
        speed = report["speed"][name]
        assert speed["continuous"] is False and speed["continuous_failed"] == why and "slot_shrinks" not in speed["decode"]
    assert report["setup"]["continuous"] is True and report["setup"]["continuous_failed"] == {"tiny": why, "again": why}
    check = unbatched_check(section, 2, {"tiny": str(tiny_model_dir)}, played)
    assert len(tried) == 1 and check["continuous_failed"] == {"tiny": why}
    assert [row["identical"] for row in check["models"]["tiny"].values()] == [2]
    assert f"`tiny` is checked in rounds, as the evaluation played it: continuous batching failed ({why})" in check["markdown"]


def test_continuous_is_a_boolean_or_an_attention_of_one_process(small_corpus_dir, tiny_model_dir, tmp_path):
    from flows.gpu import evaluate

    for wrong in ("yes", {"attention": "flash"}, {"attention": "matmul", "slots": 4}, {"draft": {"tokens": 4}}):
        with pytest.raises(ConfigError, match=r"continuous: expected true, false or \{attention: one of \['auto', 'matmul', 'sdpa'\], "
                                              r"draft: \{tokens, ngram\}\}, got "):
            evaluate(_section(small_corpus_dir, wrong), {"tiny": str(tiny_model_dir)}, tmp_path)
    for wrong in ({"tokens": 0}, {"tokens": 4, "ngram": "3"}, {"ngram": 2}, 4):
        with pytest.raises(ConfigError, match=r"continuous.draft: expected \{tokens: n >= 1, ngram: n >= 1\}, got "):
            evaluate(_section(small_corpus_dir, {"attention": "sdpa", "draft": wrong}), {"tiny": str(tiny_model_dir)}, tmp_path)
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
    # a drafted evaluation's steps are timed as it takes them, its draft kept beside the pick
    drafted = _section(small_corpus_dir, {"attention": "auto", "draft": {"tokens": 2, "ngram": 2}})
    resolved_drafted, _ = resolve_attention(drafted, tiny_model_dir, "w")
    assert resolved_drafted["continuous"]["draft"] == {"tokens": 2, "ngram": 2} and resolved_drafted["continuous"]["attention"] in ("sdpa", "matmul")
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
    assert bench.main(["--params", str(params), "--model", "tiny", "--goals", "3", "--threads", "1", "--draft", "3", "2",
                       "--out", str(out)]) == 0
    drafted = json.loads(out.read_text())
    assert drafted["identical_transcripts"] == 3 and drafted["draft"] == {"tokens": 3, "ngram": 2}
    run = drafted["runs"]["continuous_drafted"]
    # a random tiny model's replies seldom repeat their context: drafts made, few or none confirmed
    assert run["drafted_ids"] >= run["confirmed_ids"] >= 0 and run["drafted_ids"] > 0
    assert run["steps"] <= drafted["runs"]["continuous"]["steps"]
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
    drafted = report["runs"]["continuous_drafted"]
    assert report["draft"] == {"tokens": 4, "ngram": 3}
    assert (f"{report['goals']} test goals, `reports/continuous_cpu.json`): {drafted['steps']:,} sequential decode steps with "
            f"drafts against {continuous:,} without and {rounds:,} in rounds, all {report['goals']} transcripts identical; "
            f"{drafted['confirmed_ids']:,} of the {drafted['drafted_ids']:,} drafted ids confirmed") in readme


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


def test_the_offline_count_of_drafted_steps_is_the_decoders(tiny_model_dir, single_torch_thread):
    """``benchmarks/draft_depth.py`` reads what drafts save off recorded replies; a drafted
    decoder writing one row takes exactly the steps it counts for the ids it wrote."""
    from pipelines.episodes import decoding
    from pipelines.episodes.continuous import Request, SlotDecoder
    from pipelines.llm import HFBackend, HFConfig

    bench = load_benchmark("draft_depth")
    assert doctest.testmod(bench).failed == 0
    assert bench.main([str(ROOT / "reports" / "no such run")]) == 2  # says what is missing, exits non-zero
    model = HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=1)).model
    saved = 0
    for row in ([21, 22, 23, 21, 22, 23, 21, 22], [40, 41, 40, 41, 40]):
        for tokens, ngram in ((3, 2), (4, 3), (1, 1)):
            decoder = SlotDecoder(model, 1, 24, frozenset(), 0, draft=(tokens, ngram))
            request = Request(None, list(row), None, None, 0.0)
            assert decoder.admit([request]) == []
            before = decoding.DECODE_STATS["steps"]
            while decoder.busy():
                decoder.step()
            steps = decoding.DECODE_STATS["steps"] - before
            assert steps == bench.drafted_steps(row, request.generated, tokens, ngram)
            saved += len(request.generated) - 1 - steps
    assert saved > 0  # some drafts were confirmed: the count is not the trivial one


def test_the_quoted_draft_savings_are_the_committed_replay():
    """The README's table and the figures params.yaml and the decoder's docstring quote are
    ``reports/draft_depth.json``'s (benchmarks/draft_depth.py), a replay that reproduced
    every transcript of the run it read."""
    from pipelines.episodes import continuous

    bench = load_benchmark("draft_depth")
    report = json.loads((ROOT / "reports" / "draft_depth.json").read_text(encoding="utf-8"))
    assert report["run"] == "2026-11-30_nvidia-h200_speakrl_222527"
    assert all(row["identical_transcripts"] == row["episodes"] == 100 for row in report["rows"])
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    assert bench.markdown(report["rows"]) in readme
    sft = {row["draft_tokens"]: row for row in report["rows"] if row["model"] == "sft"}
    quoted = (f"{sft[4]['ids_per_step']:.2f} ids per step", f"{sft[0]['longest_dialogue_steps']:,}", f"{sft[4]['longest_dialogue_steps']:,}")
    params = flat(" ".join(line.strip().lstrip("#") for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()))
    assert f"{quoted[0]}, the longest dialogue {quoted[1]} -> {quoted[2]} steps" in params
    assert f"4-id drafts give {quoted[0]} and take that model's longest dialogue from {quoted[1]} steps to {quoted[2]}" in flat(continuous.__doc__)
    assert "1,646 for the SFT model above" in flat(readme) and sft[0]["longest_dialogue_steps"] == 1646
    fewer = 100 * (1 - sft[4]["longest_dialogue_steps"] / sft[0]["longest_dialogue_steps"])
    assert (f"With 4-id drafts the SFT model's floor is {quoted[2]} steps ({fewer:.0f} % fewer), and 5 dialogues/s allows "
            f"{20_000 / sft[4]['longest_dialogue_steps']:.1f} ms a step") in flat(readme)
