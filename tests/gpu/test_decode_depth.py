"""The README's account of the GPU evaluation's speed is the committed partial H100 run's:
its decode-depth figures are computed from that run's episode tables
(``benchmarks/decode_depth.py``), not typed in."""

from __future__ import annotations

from tests.benchmark_support import ROOT, flat, load_benchmark


def _benchmark():
    return load_benchmark("decode_depth")


def test_the_readme_gives_the_committed_runs_decode_depth():
    bench = _benchmark()
    rows = {row["model"]: row for row in bench.depth_table(bench.DEFAULT, [1, 6], 5.0)}
    sft, zero = rows["sft"], rows["zero_shot"]
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    stated = [
        f"come to {sft['steps'][1]:,} such sequential steps ({sft['calls']:,} agent calls, {sft['tokens']:,} tokens) "
        f"and took {sft['wall_s']:.1f} s: {sft['ms_per_step']:.1f} ms a step;",
        f"zero-shot, {zero['steps'][1]:,} steps in {zero['wall_s']:.1f} s: {zero['ms_per_step']:.1f} ms.",
        f"{sft['steps'][6]:,} steps with 6 parts, about {sft['predicted_dialogues_per_s'][6]:.1f} dialogues/s predicted",
        f"below the longest dialogue ({sft['longest_dialogue']:,} tokens)",
        f"5 dialogues/s needs at most {sft['ms_per_step_for_target'][1]:.1f} ms a step",
    ]
    missing = [line for line in stated if line not in readme]
    assert not missing, missing
    params = " ".join(line.strip().lstrip("#").strip() for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines())
    assert f"{sft['steps'][1]:,} sequential steps" in params and f"6 processes: {sft['steps'][6]:,} steps" in params


def test_the_lockstep_model_explains_the_measured_wall_times():
    """Wall time per sequential step is the same for two models whose batches and replies
    differ (zero-shot: 459 calls, SFT: 1,315): the step, not the work in it, is the cost."""
    bench = _benchmark()
    rows = {row["model"]: row for row in bench.depth_table(bench.DEFAULT, [1], 5.0)}
    assert rows["zero_shot"]["calls"] * 2 < rows["sft"]["calls"]
    assert abs(rows["zero_shot"]["ms_per_step"] - rows["sft"]["ms_per_step"]) < 0.05 * rows["sft"]["ms_per_step"]
