"""The evaluation's reports: DVC metrics (JSON), a markdown table in the style of SpeakRL's
table 2, and the rows of the success-vs-turns plot."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def _pm(score: Mapping[str, float] | None, digits: int, percent: bool = False) -> str:
    if score is None:
        return "–"
    scale = 100.0 if percent else 1.0
    return f"{score['mean'] * scale:.{digits}f} ± {score['std'] * scale:.{digits}f}"


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """Method | Success (%) | Turns, mean ± std over the seeded runs, then the secondary
    rates (Avg@k means)."""
    lines = [
        "| Method | Success (%) | Turns | Inform (%) | Book (%) | Request (%) | Questions / dialogue | Discriminating (%) | Malformed / dialogue |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name, result in results.items():
        lines.append(
            f"| {name} | {_pm(result['success'], 1, True)} | {_pm(result['turns'], 2)} "
            f"| {_pm(result.get('inform_rate'), 1, True)} | {_pm(result.get('book_rate'), 1, True)} "
            f"| {_pm(result.get('request_rate'), 1, True)} | {_pm(result['clarifications_per_dialogue'], 2)} "
            f"| {_pm(result.get('discriminating_share'), 1, True)} | {_pm(result['malformed_per_dialogue'], 2)} |"
        )
    return "\n".join(lines)


def domain_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    domains = sorted({d for r in results.values() for d in r["domain_success"]})
    lines = ["| Method | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for name, result in results.items():
        cells = [_pm(result["domain_success"].get(d), 1, True) for d in domains]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_markdown(results: Mapping[str, Mapping[str, Any]], setup: Mapping[str, Any], notes: Sequence[str] = ()) -> str:
    k = max((r["runs"] for r in results.values()), default=0)
    parts = [
        "# Simulated collaborative evaluation",
        "",
        f"Avg@{k}: mean ± standard deviation over {k} seeded runs of {setup['goals']} held-out goals "
        f"({setup['split']} split) each, against the {setup['simulator']} user simulator, "
        f"at most {setup['max_exchanges']} agent turns; {setup['agent_format']} format, "
        f"{'greedy decoding' if not setup.get('temperature') else 'temperature ' + str(setup['temperature'])}.",
        "",
        markdown_table(results),
        "",
        "Success: every goal domain's offered entity fits the goal, bookings made with the goal's values "
        "(a reference the environment issued), requested attributes given. Turns: utterances, user and agent. "
        "Discriminating: questions the verifiable judge rates as asking for a goal constraint the user has not "
        "stated yet (and nothing already stated).",
        "",
        "## Success per domain (%)",
        "",
        domain_table(results),
    ]
    if notes:
        parts += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(parts) + "\n"


def plot_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per method for the success-vs-turns plot."""
    return [
        {"method": name, "success": r["success"]["mean"], "success_std": r["success"]["std"], "turns": r["turns"]["mean"], "turns_std": r["turns"]["std"]}
        for name, r in results.items()
    ]


def pattern_notes(results: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """What the table says about SpeakRL's pattern (clarification-trained models succeed
    more often than the base model; GRPO not worse than SFT), computed, not asserted."""
    notes = []
    if results and all(r["success"]["mean"] == 0.0 for r in results.values()):
        notes.append("No model completed a goal in any run (success 0 for every model): the comparison rests on "
                     "the partial rates (inform, request), the questions asked and the malformed outputs.")
    if "base" in results:
        base = results["base"]["success"]["mean"]
        for name in ("sft", "dpo", "kto", "grpo"):
            if name in results:
                delta = results[name]["success"]["mean"] - base
                notes.append(f"{name} vs base: success {delta * 100:+.1f} points, questions/dialogue "
                             f"{results[name]['clarifications_per_dialogue']['mean']:.2f} vs {results['base']['clarifications_per_dialogue']['mean']:.2f}")
    if "grpo" in results and "sft" in results:
        delta = results["grpo"]["success"]["mean"] - results["sft"]["success"]["mean"]
        notes.append(f"grpo vs sft: success {delta * 100:+.1f} points")
    return notes
