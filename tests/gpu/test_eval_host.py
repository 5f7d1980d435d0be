"""benchmarks/eval_host.py: a GPU run's evaluation replayed without the model is the run (the
same transcripts and verdicts, or it stops and says where it diverged), and the README's
account of the host's share is the committed replay's report."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from tests.benchmark_support import ROOT, flat, load_benchmark

RUN = ROOT / "reports" / "gpu" / "2026-11-30_nvidia-h200_speakrl_222527"


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """The embedded corpus as `make run` writes it (the run's test goals come from it)."""
    from stages.corpus import run

    params = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["corpus"]
    return run({**params, "output": str(tmp_path_factory.mktemp("corpus") / "embedded_multiwoz")})


def test_the_replayed_evaluation_is_the_run(corpus, tiny_model_dir, tmp_path, single_torch_thread):
    bench = load_benchmark("eval_host")
    out = tmp_path / "host.json"
    # Any tokenizer with a chat template: the outputs are the recorded ones, only the prompts' lengths differ.
    assert bench.main([str(RUN), "--model", str(tiny_model_dir), "--models", "sft", "--goals", "6",
                       "--source", str(corpus), "--out", str(out)]) == 0
    (row,) = json.loads(out.read_text())["rows"]
    assert row["model"] == "sft" and row["episodes"] == 6
    assert row["identical_transcripts"] == 6 and row["same_verdicts"] == 6
    assert row["calls"] > 6 * 3 and 0 < row["reusable_tokens"] < row["prompt_tokens"]
    assert row["prefill_tokens"] == row["prompt_tokens"] - row["reusable_tokens"]
    assert row["same_prompts_counted_whole"]
    for counting in ("pieces", "whole"):  # this checkout's prompt counting, and the runs' (whole prompts)
        parts = row[f"host_by_part_s_{counting}"]
        assert set(parts) == {"prompt_fit", "render", "tokenize", "rest"} and all(v >= 0 for v in parts.values())
        assert row[f"host_s_{counting}"] >= sum(parts.values()) - 0.02
    assert "device_s" not in row  # 6 of the run's 100 goals: no share of its wall time to give


def test_a_replay_that_leaves_the_run_stops_and_names_the_episode(corpus, tiny_model_dir, tmp_path, single_torch_thread):
    """One recorded output fewer: the replayed episode asks for an output the run never made."""
    run = tmp_path / "run"
    shutil.copytree(RUN, run, ignore=shutil.ignore_patterns("evaluate_sft*", "*.md"))
    events = pq.read_table(run / "episode_events.parquet")
    rows = events.to_pylist()
    episode = "sft/MUL00004.json#0"
    last = max(i for i, r in enumerate(rows) if r["episode_id"] == episode and r["prompt_tokens"] is not None)
    kept = [r for i, r in enumerate(rows) if not (i >= last and r["episode_id"] == episode and r["actor"] == "agent")]
    pq.write_table(pa.Table.from_pylist(kept, schema=events.schema), run / "episode_events.parquet")
    bench = load_benchmark("eval_host")
    with pytest.raises(RuntimeError, match=r"sft/MUL00004\.json#0: the replay asks for an output the run did not record"):
        bench.main([str(run), "--model", str(tiny_model_dir), "--models", "sft", "--goals", "3", "--source", str(corpus)])


def test_a_run_folder_without_its_tables_is_refused(tmp_path, capsys):
    bench = load_benchmark("eval_host")
    (tmp_path / "evaluate.json").write_text("{}")
    assert bench.main([str(tmp_path)]) == 2
    assert "episodes.parquet is missing" in capsys.readouterr().err


def test_the_readme_gives_the_committed_replay():
    report = json.loads((ROOT / "reports" / "eval_host_cpu.json").read_text(encoding="utf-8"))
    assert report["run"] == RUN.name
    rows = {row["model"]: row for row in report["rows"]}
    assert all(r["identical_transcripts"] == r["episodes"] == r["same_verdicts"] == 100 for r in rows.values())
    assert all(r["same_prompts_counted_whole"] and r["run_counting"] == "whole" for r in rows.values())
    sft = rows["sft"]
    whole, pieces = sft["host_by_part_s_whole"], sft["host_by_part_s_pieces"]
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    stated = [
        f"**Where the SFT evaluation's {sft['run_wall_s']:.1f} s went**",
        f"host's share: **{sft['host_s_whole']:.2f} s** for the SFT model with the run's code (prompt fitting {whole['prompt_fit']:.2f} s:",
        f"rendering and tokenising {whole['render'] + whole['tokenize']:.2f} s; runner, user, tools and goal checker {whole['rest']:.2f} s)",
        f"spent about {sft['device_s']:.1f} s (more if the node's CPU is faster than this one), {sft['device_ms_per_step']:.1f} ms per sequential step",
        f"of the {sft['prompt_tokens']:,} prompt tokens of its {sft['calls']:,} calls, the episode cache reuses "
        f"{sft['reusable_tokens']:,} and {sft['prefill_tokens']:,} are prefilled.",
        f"the same prompts, token for token, in all {sum(r['calls'] for r in rows.values()):,} calls of the three replays, "
        f"and the SFT replay's host share falls to **{sft['host_s_pieces']:.2f} s** (prompt fitting {pieces['prompt_fit']:.2f} s).",
    ]
    missing = [line for line in stated if line not in readme]
    assert not missing, missing
