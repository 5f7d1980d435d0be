"""The README's JOSH round block, generated from ``reports/josh.json`` (stage josh: who
harvested, the harvest's counts) and ``reports/josh_eval.json`` (stage josh_evaluate: M, M'
and the template reference on the ToolWOZ test goals, with 95 % bootstrap intervals), and
stage josh_evaluate's own table (``reports/josh_eval.md``, :func:`evaluation_markdown`).

``python -m pipelines.josh.report [README.md] [reports/josh.json] [reports/josh_eval.json]``
rewrites the README's block between :data:`README_START` and :data:`README_END`;
``tests/test_josh_round.py`` checks that the committed README holds exactly what this module
generates from the committed reports.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.josh.config import RULES_LABEL

README_START = "<!-- josh-round:start (generated from reports/josh.json and reports/josh_eval.json: python -m pipelines.josh.report) -->"
README_END = "<!-- josh-round:end -->"


def _ci(value: float, interval: Sequence[float] | None) -> str:
    return f"{value:.3f} [{interval[0]:.3f}, {interval[1]:.3f}]" if interval else f"{value:.3f}"


def _interval(interval: Sequence[float] | None) -> str:
    return f"[{interval[0]:.3f}, {interval[1]:.3f}]" if interval else "n/a"


def evaluation_markdown(results: Mapping[str, Mapping[str, Any]], goals: int, seeds: Sequence[int],
                        round_report: Mapping[str, Any] | None = None, not_trained: Mapping[str, str] | None = None) -> str:
    """The table: one row per model (the rules row labelled as the template reference), the
    paper's two scores with their 95 % bootstrap intervals over goals; with a round, its
    harvest's counts and a row for each M' that had nothing to train on."""
    lines = [f"# ToolWOZ test goals ({goals} goals, seeds {list(seeds)}, agenda user)", ""]
    if round_report is not None:
        r = round_report
        lines += [f"Round: M = {r['start']} ({r['harvester']}, {r['harvester_role']}); self-improvement: "
                  f"{'yes' if r['self_improvement'] else 'no'}. Harvest: {r['goals']} trees, {r['nodes']} nodes, "
                  f"{r['successful_nodes']} nodes that met a goal API, {r['golden_paths']} golden paths, {r['sft_rows']} SFT rows, "
                  f"KTO {r['kto_rows']['desirable']} desirable / {r['kto_rows']['undesirable']} undesirable.", ""]
    lines += [
        "| model | avg reward [95% CI] | 100% success [95% CI] | api calls / ep | malformed / ep | rejected calls / ep |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    roles = {}
    if round_report is not None:
        roles = {round_report["start"]: " (M)", **{name: " (M')" for name in round_report.get("trained", ())}}
    for name, r in results.items():
        label = RULES_LABEL if name == "rules" else name + roles.get(name, "")
        lines.append(f"| {label} | {r['avg_reward']:.3f} {_interval(r.get('avg_reward_ci95'))} | "
                     f"{r['success_rate']:.3f} {_interval(r.get('success_rate_ci95'))} | {r['tool_calls_per_episode']:.2f} | "
                     f"{r['malformed_per_episode']:.2f} | {r['rejected_calls_per_episode']:.2f} |")
    for name, why in ((round_report or {}).get("not_trained") or {}).items():
        lines.append(f"| {name} (M') | {why} | | | | |")
    for name, why in (not_trained or {}).items():  # without a round
        lines.append(f"| {name} | {why} | | | | |")
    return "\n".join(lines) + "\n"


def round_markdown(harvest: Mapping[str, Any], evaluation: Mapping[str, Any]) -> str:
    """The harvest's counts and the test-goal table of one round.

    >>> harvest = {"agent": {"backend": "hf", "model_path": "models/base", "role": "policy M"}, "goals": 2, "nodes": 9,
    ...            "successful_nodes": 0, "golden_paths": 0, "sft_rows": 0, "kto_rows": {"desirable": 0, "undesirable": 0},
    ...            "test": {"goals": 2, "avg_reward": 0.0, "avg_reward_ci95": [0.0, 0.0], "success_rate": 0.0,
    ...                     "success_rate_ci95": [0.0, 0.0]}}
    >>> s = {"avg_reward": 0.5, "avg_reward_ci95": [0.25, 0.75], "success_rate": 0.5, "success_rate_ci95": [0.0, 1.0],
    ...      "malformed_per_episode": 0.0}
    >>> evaluation = {"goals": 2, "seeds": [0], "models": {"rules": s, "base": s}, "labels": {"rules": "rules: template harvester"},
    ...               "round": {"start": "base", "trained": ["josh_sft"], "not_trained": {"josh_sft": "not trained: 0 rows"}}}
    >>> print(round_markdown(harvest, evaluation))
    Harvest by M (models/base, policy M): 2 trees, 9 nodes, 0 nodes that met a goal API, 0 golden paths, 0 SFT rows, KTO 0 desirable / 0 undesirable; M on 2 test goals while harvesting (sampled, no branching): avg reward 0.000 [0.000, 0.000], 100 % success 0.000 [0.000, 0.000].
    <BLANKLINE>
    | model (2 test goals, seeds [0], greedy) | avg reward [95 % CI] | 100 % success [95 % CI] | malformed / ep |
    |---|---|---|---|
    | base = M | 0.500 [0.250, 0.750] | 0.500 [0.000, 1.000] | 0.00 |
    | josh_sft = M' | not trained: 0 rows | | |
    | rules: template harvester | 0.500 [0.250, 0.750] | 0.500 [0.000, 1.000] | 0.00 |
    """
    agent = harvest["agent"]
    harvester = agent.get("model_path") if agent.get("backend") == "hf" else agent.get("backend")
    test = harvest["test"]
    lines = [
        f"Harvest by {'M' if agent.get('backend') != 'rules' else 'the template harvester'} ({harvester}, {agent.get('role')}): "
        f"{harvest['goals']} trees, {harvest['nodes']} nodes, {harvest['successful_nodes']} nodes that met a goal API, "
        f"{harvest['golden_paths']} golden paths, {harvest['sft_rows']} SFT rows, KTO {harvest['kto_rows']['desirable']} desirable / "
        f"{harvest['kto_rows']['undesirable']} undesirable; M on {test['goals']} test goals while harvesting (sampled, no branching): "
        f"avg reward {_ci(test['avg_reward'], test.get('avg_reward_ci95'))}, "
        f"100 % success {_ci(test['success_rate'], test.get('success_rate_ci95'))}.",
        "",
        f"| model ({evaluation['goals']} test goals, seeds {list(evaluation['seeds'])}, greedy) | avg reward [95 % CI] | "
        "100 % success [95 % CI] | malformed / ep |",
        "|---|---|---|---|",
    ]
    models = evaluation["models"]
    round_ = evaluation.get("round") or {}
    start, trained = round_.get("start"), list(round_.get("trained") or [])
    not_trained = round_.get("not_trained") or {}

    def row(label: str, r: Mapping[str, Any]) -> str:
        return (f"| {label} | {_ci(r['avg_reward'], r.get('avg_reward_ci95'))} | {_ci(r['success_rate'], r.get('success_rate_ci95'))} | "
                f"{r['malformed_per_episode']:.2f} |")

    if start in models:
        lines.append(row(f"{start} = M", models[start]))
    for name in trained:
        lines.append(row(f"{name} = M'", models[name]) if name in models else f"| {name} = M' | {not_trained.get(name, 'not played')} | | |")
    for name, r in models.items():
        if name not in (start, *trained):
            lines.append(row(evaluation.get("labels", {}).get(name) or name, r))
    return "\n".join(lines)


def readme_block(readme: str) -> str:
    """What the README holds between the markers."""
    start = readme.index(README_START) + len(README_START)
    return readme[start:readme.index(README_END, start)].strip("\n")


def readme_with_round(readme: str, harvest: Mapping[str, Any], evaluation: Mapping[str, Any]) -> str:
    """``readme`` with the block between the markers replaced by the reports' figures."""
    head, rest = readme.split(README_START, 1)
    _, tail = rest.split(README_END, 1)
    return f"{head}{README_START}\n{round_markdown(harvest, evaluation)}\n{README_END}{tail}"


def main(argv: list[str]) -> None:
    readme = Path(argv[0] if argv else "README.md")
    harvest = json.loads(Path(argv[1] if len(argv) > 1 else "reports/josh.json").read_text(encoding="utf-8"))
    evaluation = json.loads(Path(argv[2] if len(argv) > 2 else "reports/josh_eval.json").read_text(encoding="utf-8"))
    readme.write_text(readme_with_round(readme.read_text(encoding="utf-8"), harvest, evaluation), encoding="utf-8")


if __name__ == "__main__":
    main(sys.argv[1:])
