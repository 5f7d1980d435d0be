"""benchmarks/kernel_fingerprint.py: per-kernel digests that tell where two machines' bytes part (issue 28)."""

from __future__ import annotations

import doctest
import json
import os
from pathlib import Path

import pytest

from tests.benchmark_support import load_benchmark

ROOT = Path(__file__).resolve().parents[1]
COMMITTED = sorted((ROOT / "reports" / "kernels").glob("*.json"))


def _benchmark():
    return load_benchmark("kernel_fingerprint")


def test_compare_names_the_blocks_that_differ():
    bench = _benchmark()
    assert doctest.testmod(bench).failed == 0
    a = {"blocks": {"inputs": "1", "exp": "2", "log": "3"}}
    assert bench.compare(a, a) == []
    assert bench.compare(a, {"blocks": {"inputs": "1", "exp": "9", "log": "3"}}) == ["exp"]
    assert bench.compare(a, {"blocks": {"inputs": "1"}}) == ["exp", "log"]  # a block the other machine lacks differs


@pytest.mark.slow
def test_the_portable_pin_gives_one_fingerprint_under_either_instruction_set_cap_and_the_default_another(monkeypatch):
    """On one machine: the pin's digests are the same twice and with MKL capped at AVX2 (what
    the ISA test checks on a whole bootstrap), the default kernels' differ from them (where the
    CPU has AVX2, whose vectorised kernels the default uses). Each committed fingerprint has
    every block the benchmark computes now, so a new machine's file compares block by block."""
    bench = _benchmark()
    pinned = bench.fingerprint("portable", 1)
    assert bench.compare(pinned, bench.fingerprint("portable", 1)) == []
    monkeypatch.setenv("MKL_ENABLE_INSTRUCTIONS", "AVX2")
    assert bench.compare(pinned, bench.fingerprint("portable", 1)) == []
    monkeypatch.delenv("MKL_ENABLE_INSTRUCTIONS")
    default = bench.fingerprint("default", 1)
    if "avx2" in default["machine"].get("flags", "").split() and not os.environ.get("ATEN_CPU_CAPABILITY"):
        assert "inputs" in bench.compare(pinned, default)  # even torch.randn's bytes follow the vectorised kernels
    assert COMMITTED, "reports/kernels/ holds no fingerprint"
    for path in COMMITTED:
        committed = json.loads(path.read_text(encoding="utf-8"))
        assert list(committed["blocks"]) == list(pinned["blocks"]), path
        assert committed["kernels"] in ("portable", "default") and committed["machine"]["vendor_id"], path


def test_sqrt_misses_counts_square_roots_off_the_ieee_result(monkeypatch):
    import torch

    bench = _benchmark()
    here = bench.sqrt_misses(1000)
    assert set(here) == {"float32", "float64"} and all(0 <= n <= 1000 for n in here.values())
    # Fault injection: a square root 0.1 % off everywhere is counted on every input.
    exact = torch.Tensor.sqrt
    monkeypatch.setattr(torch.Tensor, "sqrt", lambda t: exact(t) * 1.001)
    assert bench.sqrt_misses(1000) == {"float32": 1000, "float64": 1000}


@pytest.mark.skipif(os.environ.get("MKL_CBWR", "AUTO") != "AUTO", reason="this process runs another MKL branch")
def test_a_fresh_process_on_mkls_default_branch_counts_what_this_one_does():
    bench = _benchmark()
    assert bench.sqrt_by_branch("default", 1, ("AUTO",)) == {"AUTO": bench.sqrt_misses()}


def test_committed_fingerprints_of_this_torch_record_their_square_roots():
    """The files made since the count exists say how far their sqrt is from the IEEE result
    (README "Reliability": MKL's sqrt under the pin is where two vendors' bytes part)."""
    recorded = [json.loads(p.read_text(encoding="utf-8")) for p in COMMITTED]
    assert any("sqrt_misses_per_100k" in doc for doc in recorded)
    for doc in recorded:
        if "sqrt_misses_per_100k" in doc:
            assert set(doc["sqrt_misses_per_100k"]) == {"float32", "float64"}


@pytest.mark.slow
def test_numpys_matrix_products_follow_the_kernels_openblas_picks():
    """numpy's bundled OpenBLAS picks its kernels by CPU (an AMD Zen 5 got Haswell's where a Zen 4
    and an Intel Xeon got SkylakeX's: README "Reliability"); the fingerprint records the pick,
    and a forced pick (fault injection: ``OPENBLAS_CORETYPE``, two SSE-only kernel families any
    x86-64 CPU runs) parts the numpy block and no other."""
    bench = _benchmark()
    if bench.openblas_core() is None:
        pytest.skip("this numpy brings no OpenBLAS that names its kernels")
    nehalem = bench._fresh("--in-process", "portable", 1, OPENBLAS_CORETYPE="Nehalem")
    prescott = bench._fresh("--in-process", "portable", 1, OPENBLAS_CORETYPE="Prescott")
    assert nehalem["openblas_core"] == "Nehalem" and prescott["openblas_core"] == "Katmai"  # OpenBLAS's name for it
    assert bench.compare(nehalem, prescott) == ["numpy float kernels"]


_ADAMW_STEP = """
import hashlib, torch
from pipelines.kernels import adamw_options
torch.set_num_threads(1)
p = torch.nn.Parameter(torch.randn(576, 192, generator=torch.Generator().manual_seed(16)))
p.grad = torch.randn(576, 192, generator=torch.Generator().manual_seed(17))
optimizer = torch.optim.AdamW([p], lr=3e-3, weight_decay=0.01, **adamw_options())
for _ in range(3):
    optimizer.step()
print(hashlib.sha256(p.detach().numpy().tobytes()).hexdigest())
"""


def test_under_the_pin_adamw_takes_no_square_root_from_mkl():
    """The pin's AdamW (fused) gives the same bytes whichever code branch MKL runs: its
    square roots are ATen's, exact, so no vendor's approximation can reach them (README
    "Reliability"; torch's plain AdamW takes MKL's)."""
    import subprocess
    import sys

    from pipelines.kernels import kernel_environment

    def step(branch: str) -> str:
        env = {**os.environ, **kernel_environment("portable"), "MKL_CBWR": branch, "PYTHONPATH": str(ROOT)}
        result = subprocess.run([sys.executable, "-c", _ADAMW_STEP], env=env, capture_output=True, text=True, check=True)
        return result.stdout.strip()

    assert step("COMPATIBLE,STRICT") == step("AVX2,STRICT") == step("AUTO")
