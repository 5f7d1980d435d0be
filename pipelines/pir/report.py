"""The README's PIR fidelity table, generated from ``reports/pir.json`` (the ``fidelity``
section of :func:`pipelines.pir.pipeline.pir_metrics`): one row per scope and k, the configured
setting (the headline) marked, every figure with its 95 % bootstrap interval.

``python -m pipelines.pir.report [README.md] [reports/pir.json]`` rewrites the README's block
between :data:`README_START` and :data:`README_END`; ``tests/pir/test_readme_table.py`` checks
that the committed README holds exactly what this module generates from the committed report.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping

README_START = "<!-- pir-fidelity:start (generated from reports/pir.json: python -m pipelines.pir.report) -->"
README_END = "<!-- pir-fidelity:end -->"


def _cell(figure: Mapping[str, Any], signed: bool = False) -> str:
    value, low, high = figure["value"], figure["ci95_low"], figure["ci95_high"]
    if value is None:
        return "–"
    fmt = "{:+.3f}" if signed else "{:.3f}"
    interval = f" [{fmt.format(low)}, {fmt.format(high)}]" if low is not None and high is not None else ""
    return fmt.format(value) + interval


def fidelity_markdown(report: Mapping[str, Any]) -> str:
    """The fidelity table of a ``reports/pir.json``; KeyError when it has no fidelity check.

    >>> f = {"value": 0.2, "ci95_low": 0.1, "ci95_high": 0.3}
    >>> cell = {"selected": 4, "hits": 1, **{k: f for k in ("precision", "random_precision", "recall", "random_recall")},
    ...         "precision_minus_random": {"value": 0.0, "ci95_low": -0.1, "ci95_high": 0.1}}
    >>> report = {"teacher": "m", "traces": 2, "steps": 9, "fidelity": {"traces": 2, "headline": {"k_percent": 10.0, "scope": "trace"},
    ...           "sweep": {"10": {"trace": cell}}, "bootstrap": {"resamples": 50}}}
    >>> print(fidelity_markdown(report))
    | scope | k % | selected | hits | precision | random precision | precision − random | recall | random recall |
    |---|---|---|---|---|---|---|---|---|
    | **trace (headline)** | **10** | 4 | 1 | 0.200 [0.100, 0.300] | 0.200 [0.100, 0.300] | +0.000 [-0.100, +0.100] | 0.200 [0.100, 0.300] | 0.200 [0.100, 0.300] |
    <BLANKLINE>
    Teacher m, 2 traces, 9 steps; 95 % bootstrap intervals over traces (50 resamples); random: the expected value of a uniform pick of the same size.
    """
    fid = report["fidelity"]
    head = fid["headline"]
    lines = ["| scope | k % | selected | hits | precision | random precision | precision − random | recall | random recall |",
             "|---|---|---|---|---|---|---|---|---|"]
    for k, scopes in fid["sweep"].items():
        for scope, c in scopes.items():
            is_head = float(k) == float(head["k_percent"]) and scope == head["scope"]
            name, kk = (f"**{scope} (headline)**", f"**{k}**") if is_head else (scope, k)
            lines.append(f"| {name} | {kk} | {c['selected']} | {c['hits']} | {_cell(c['precision'])} | {_cell(c['random_precision'])} | "
                         f"{_cell(c['precision_minus_random'], signed=True)} | {_cell(c['recall'])} | {_cell(c['random_recall'])} |")
    lines += ["", f"Teacher {report['teacher']}, {fid['traces']} traces, {report['steps']} steps; 95 % bootstrap intervals over "
              f"traces ({fid['bootstrap']['resamples']} resamples); random: the expected value of a uniform pick of the same size."]
    return "\n".join(lines)


def readme_block(readme: str) -> str:
    """The text between the README's markers (ValueError naming the marker when one is missing)."""
    for marker in (README_START, README_END):
        if marker not in readme:
            raise ValueError(f"README.md: marker {marker!r} not found")
    return readme.split(README_START, 1)[1].split(README_END, 1)[0].strip("\n")


def readme_with_fidelity(readme: str, report: Mapping[str, Any]) -> str:
    """``readme`` with its block replaced by :func:`fidelity_markdown` of ``report``."""
    readme_block(readme)  # both markers present
    before, rest = readme.split(README_START, 1)
    after = rest.split(README_END, 1)[1]
    return f"{before}{README_START}\n{fidelity_markdown(report)}\n{README_END}{after}"


def main(argv: list[str]) -> None:
    readme_path = Path(argv[0] if argv else "README.md")
    report_path = Path(argv[1] if len(argv) > 1 else "reports/pir.json")
    report = json.loads(report_path.read_text(encoding="utf-8"))
    readme_path.write_text(readme_with_fidelity(readme_path.read_text(encoding="utf-8"), report), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
