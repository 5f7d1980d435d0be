"""The bf16-versus-float32 agreement figures that the README, params.yaml and the benchmark's
docstring quote are the committed run of benchmarks/batch_agreement.py."""

from __future__ import annotations

import json

from tests.benchmark_support import ROOT, flat


def test_the_quoted_agreement_figures_are_the_committed_run():
    report = json.loads((ROOT / "reports" / "batch_agreement_cpu.json").read_text(encoding="utf-8"))
    runs = {(run["dtype"], run["path"]): run for run in report["runs"]}
    eager, static, full = runs["bfloat16", "eager"], runs["bfloat16", "static"], runs["float32", "eager"]
    assert report["greedy"] and {run["goals"] for run in report["runs"]} == {report["goals"]}
    assert all(run["identical"] + len(run["differences"]) == run["goals"] for run in report["runs"])
    n = report["goals"]
    readme = flat((ROOT / "README.md").read_text(encoding="utf-8"))
    assert (f"agreed for {eager['identical']} of {n} test goals in bf16 and {full['identical']} of {n} in float32 "
            f"({report['exchanges']} exchanges, {report['max_new_tokens']} tokens;") in readme
    assert f"{static['identical']} of {n} in bf16 through the static steps the GPU runs" in readme
    params = flat(" ".join(line.strip().lstrip("#") for line in (ROOT / "params.yaml").read_text(encoding="utf-8").splitlines()))
    assert (f"{n} test goals, {report['exchanges']} exchanges, {report['max_new_tokens']} tokens) bf16 gave {eager['identical']} "
            f"of {n} identical ({static['identical']} of {n} through the static steps the GPU runs), float32 {full['identical']} of {n}") in params
    docstring = flat((ROOT / "benchmarks" / "batch_agreement.py").read_text(encoding="utf-8"))
    assert (f"bf16 eager {eager['identical']}/{n} identical, bf16 static {static['identical']}/{n}, "
            f"float32 eager {full['identical']}/{n}") in docstring
