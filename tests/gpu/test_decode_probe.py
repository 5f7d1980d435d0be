"""benchmarks/decode_probe.py's kernel table (``--kernels``): the static steps alone, by kernel
(a decode of N + 1 tokens less one of 1, so the prefill is not counted), on a CPU the ops'
CPU time."""

from __future__ import annotations

from tests.benchmark_support import load_benchmark


def test_the_kernel_table_counts_the_static_steps_without_the_prefill(tiny_model_dir, single_torch_thread):
    probe = load_benchmark("decode_probe")
    logged = []
    # The top 20 by time: on a busy CPU the tiny model's few matrix products can fall below a
    # top 5 (a clean-clone run of d0f4fd2 did not list them there), and the test needs them listed.
    rows = probe.kernel_times(str(tiny_model_dir), 2, 24, 3, logged.append, top=20)
    assert [row["dtype"] for row in rows] == ["float32", "bfloat16"] and logged == rows
    for row in rows:
        assert row["steps"] == 3 and row["ms_per_step"] > 0 and 1 <= len(row["kernels"]) <= 20
        assert row["device_time"].startswith("cpu")
        shares = [kernel["share"] for kernel in row["kernels"]]
        assert shares == sorted(shares, reverse=True) and sum(shares) <= 1.0 + 1e-6
        # one matrix product per projection per layer per step, none of the prefill's
        matmuls = next(kernel for kernel in row["kernels"] if kernel["name"] in ("aten::mm", "aten::addmm", "aten::linear"))
        assert matmuls["calls_per_step"] > 0 and matmuls["calls_per_step"] == int(matmuls["calls_per_step"])
    from pipelines.episodes import decoding

    cuda = type("Device", (), {"type": "cuda"})()
    assert decoding._can_capture(cuda) or decoding.GRAPH_ERRORS  # capture allowed again after the probe


def test_the_step_cost_model_recovers_a_known_split():
    """Points made from fixed 2 ms + 10 us a row + 5 ns a row and position: the fit gives them back."""
    probe = load_benchmark("decode_probe")
    points = [{"rows": rows, "positions": positions, "ms_per_step": 2.0 + 0.010 * rows + 5e-6 * rows * positions}
              for rows in (32, 64, 128) for positions in (565, 1065, 1565)]
    model = probe.step_cost_model(points)
    assert model["fixed_ms"] == 2.0 and model["per_row_us"] == 10.0 and model["per_row_and_position_ns"] == 5.0
    assert all(abs(r) < 1e-6 for r in model["residual_ms"])


def test_the_grid_times_every_batch_in_both_dtypes(tiny_model_dir, single_torch_thread):
    probe = load_benchmark("decode_probe")
    logged = []
    figures = probe.grid_times(str(tiny_model_dir), [2, 4], [16, 32], 3, logged.append)
    assert [f["dtype"] for f in figures] == ["float32", "bfloat16"] and len(logged) == 2 * (4 + 1)
    for figure in figures:
        assert [(p["rows"], p["prompt_tokens"], p["positions"]) for p in figure["points"]] == [
            (2, 16, 20), (4, 16, 20), (2, 32, 36), (4, 32, 36)]
        assert all(p["ms_per_step"] > 0 for p in figure["points"]) and not figure["cuda_graphs"]
        assert set(figure["model"]) == {"fixed_ms", "per_row_us", "per_row_and_position_ns", "residual_ms"}
        assert len(figure["model"]["residual_ms"]) == 4


def test_the_step_table_times_each_attention_and_the_static_steps_get_theirs_back(tiny_model_dir, single_torch_thread):
    """Part 1: every dtype x (matmul, packed, repeated with CUDA graphs; packed without); each
    attention is the static steps' for its rows only, and their own (packed SDPA) after."""
    probe = load_benchmark("decode_probe")
    from pipelines.episodes import continuous, decoding

    used = []
    real = continuous.grouped_matmul_attention

    def counting(*args, **kwargs):
        used.append(1)
        return real(*args, **kwargs)

    logged = []
    own = decoding._packed_attention
    from transformers import AttentionInterface

    continuous._registered("matmul")
    AttentionInterface.register(continuous.ATTENTIONS["matmul"], counting)
    try:
        rows = probe.step_times(str(tiny_model_dir), 2, 16, 2, logged.append)
    finally:
        AttentionInterface.register(continuous.ATTENTIONS["matmul"], real)
    assert [(r["dtype"], r["attention"], r["static"]) for r in rows] == [
        (dtype, attention, static) for dtype in ("float32", "bfloat16")
        for attention, static in (("matmul", True), ("packed", True), ("repeated", True), ("packed", False))]
    assert all(r["ms_per_step"] == r["ms_per_step"] and r["prefill_ms"] > 0 for r in rows) and logged == rows
    assert used  # the matmul rows attended by matrix products
    assert decoding._packed_attention is own
