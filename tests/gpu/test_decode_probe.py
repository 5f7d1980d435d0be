"""benchmarks/decode_probe.py's kernel table (``--kernels``): the static steps alone, by kernel
(a decode of N + 1 tokens less one of 1, so the prefill is not counted), on a CPU the ops'
CPU time."""

from __future__ import annotations

from tests.benchmark_support import load_benchmark


def test_the_kernel_table_counts_the_static_steps_without_the_prefill(tiny_model_dir, single_torch_thread):
    probe = load_benchmark("decode_probe")
    logged = []
    rows = probe.kernel_times(str(tiny_model_dir), 2, 24, 3, logged.append, top=5)
    assert [row["dtype"] for row in rows] == ["float32", "bfloat16"] and logged == rows
    for row in rows:
        assert row["steps"] == 3 and row["ms_per_step"] > 0 and 1 <= len(row["kernels"]) <= 5
        assert row["device_time"].startswith("cpu")
        shares = [kernel["share"] for kernel in row["kernels"]]
        assert shares == sorted(shares, reverse=True) and sum(shares) <= 1.0 + 1e-6
        # one matrix product per projection per layer per step, none of the prefill's
        matmuls = next(kernel for kernel in row["kernels"] if kernel["name"] in ("aten::mm", "aten::addmm", "aten::linear"))
        assert matmuls["calls_per_step"] > 0 and matmuls["calls_per_step"] == int(matmuls["calls_per_step"])
    from pipelines.episodes import decoding

    assert decoding._can_capture.__name__ == "_can_capture"  # restored after the probe
