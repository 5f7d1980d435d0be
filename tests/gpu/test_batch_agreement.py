"""The bf16-versus-float32 agreement figures that the README, params.yaml and the benchmark's
docstring quote are the committed run of benchmarks/batch_agreement.py."""

from __future__ import annotations

import json

from tests.benchmark_support import ROOT, flat


def _quoting() -> tuple[str, str, str]:
    """The README, params.yaml's comments and the benchmark's docstring, each on one line."""
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    params = flat(" ".join(line.strip().lstrip("#") for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()))
    return readme, params, flat((ROOT / "benchmarks" / "batch_agreement.py").read_text(encoding="utf-8"))


def test_the_quoted_agreement_figures_are_the_committed_run():
    report = json.loads((ROOT / "reports" / "batch_agreement_cpu.json").read_text(encoding="utf-8"))
    runs = {(run["dtype"], run["path"]): run for run in report["runs"]}
    eager, static, full = runs["bfloat16", "eager"], runs["bfloat16", "static"], runs["float32", "eager"]
    assert report["greedy"] and {run["goals"] for run in report["runs"]} == {report["goals"]}
    assert all(run["identical"] + len(run["differences"]) == run["goals"] for run in report["runs"])
    n = report["goals"]
    readme, params, docstring = _quoting()
    assert (f"agreed for {eager['identical']} of {n} test goals in bf16 and {full['identical']} of {n} in float32 "
            f"({report['exchanges']} exchanges, {report['max_new_tokens']} tokens;") in readme
    assert f"{static['identical']} of {n} in bf16 through the static steps the GPU runs" in readme
    assert (f"{n} test goals, {report['exchanges']} exchanges, {report['max_new_tokens']} tokens) bf16 gave {eager['identical']} "
            f"of {n} identical ({static['identical']} of {n} through the static steps the GPU runs), float32 {full['identical']} of {n}") in params
    assert (f"bf16 eager {eager['identical']}/{n} identical, bf16 static {static['identical']}/{n}, "
            f"float32 eager {full['identical']}/{n}") in docstring


def test_the_quoted_gpu_agreement_figures_are_the_committed_runs():
    """The H200 figures the README, params.yaml and the probe's own README quote: the
    batch_agreement probe's report and the speakrl run's unbatched_check."""
    folder = ROOT / "reports" / "gpu" / "2026-11-30_nvidia-h200_batch_agreement"
    report = json.loads((folder / "batch_agreement_gpu.json").read_text(encoding="utf-8"))
    runs = {(run["dtype"], run.get("setting")): run for run in report["runs"]}
    bf16, exact, full, tf32 = (runs[key] for key in (("bfloat16", None), ("bfloat16", "exact-reduction"),
                                                     ("float32", None), ("float32", "tf32")))
    n = report["goals"]
    assert report["device"] == "NVIDIA H200" and report["greedy"] and all(run["path"] == "static" for run in runs.values())
    assert exact["differences"] == bf16["differences"]  # the same goals, the same text: the setting changes nothing
    readme, params, docstring = _quoting()
    assert (f"bf16 {bf16['identical']} of {n} identical, the same {n - bf16['identical']} goals with the same text when cuBLAS "
            f"must keep split-K sums in float32; float32 {full['identical']} of {n}; TF32 {tf32['identical']} of {n}.") in readme
    assert (f"bf16 {bf16['identical']} of {n} with or without bf16 split-K sums, float32 {full['identical']} of {n}, "
            f"TF32 {tf32['identical']} of {n}.") in params
    assert (f"bf16 {bf16['identical']}/{n}, bf16 exact-reduction {exact['identical']}/{n}, float32 {full['identical']}/{n}, "
            f"float32 tf32 {tf32['identical']}/{n}.") in docstring
    own = flat((folder / "README.md").read_text(encoding="utf-8"))
    for run, label in ((bf16, "PyTorch's default (bf16 split-K partial sums allowed)"), (full, "default (no TF32)")):
        assert f"| {label} | {'**' if run is full else ''}{run['identical']} / {n}{'**' if run is full else ''} |" in own

    check = json.loads((ROOT / "reports" / "gpu" / "2026-11-30_nvidia-h200_speakrl_222527" / "unbatched_check.json").read_text())
    sft = check["models"]["sft"]
    half, full32 = sft["bfloat16"], sft["float32"]
    assert check["dtype"] == "bfloat16" and half["batched"]["by"] == "the evaluation"
    changed = check["success_changed_between_dtypes"]["sft"]
    assert (f"{half['identical']} of {half['dialogues']} goals in bf16 and {full32['identical']} of {full32['dialogues']} in float32 "
            f"({full32['batched']['dialogues_per_s']:.2f} dialogues/s, the same {100 * full32['batched']['success']:.0f} % success, "
            f"the verdict moved on {changed} of 100 goals)") in readme
    assert half["batched"]["success"] == full32["batched"]["success"]
    assert (f"{half['batched']['dialogues_per_s']:.2f} dialogues/s after SFT, but {half['identical']} of {half['dialogues']} SFT "
            f"transcripts one at a time equal to the batched one; float32: {full32['batched']['dialogues_per_s']:.2f} dialogues/s, "
            f"{full32['identical']} of {full32['dialogues']} (same {100 * full32['batched']['success']:.0f} % success; the verdict "
            f"moved on {changed} of 100 goals)") in params
