"""The evaluation's reports: DVC metrics (JSON), a markdown table in the style of SpeakRL's
table 2 with 95 % confidence intervals, the significant differences between models, and the
rows of the success-vs-turns plot."""

from __future__ import annotations

from typing import Any, Mapping, Sequence


def _pm(score: Mapping[str, Any] | None, digits: int, percent: bool = False) -> str:
    """``mean [low, high]`` (the 95 % interval over goals), or ``mean ± std`` over the seeded
    runs when the score has no interval."""
    if score is None:
        return "–"
    scale = 100.0 if percent else 1.0
    if score.get("ci95_low") is not None:
        low, high = score["ci95_low"], score["ci95_high"]
        return f"{score['mean'] * scale:.{digits}f} [{low * scale:.{digits}f}, {high * scale:.{digits}f}]"
    return f"{score['mean'] * scale:.{digits}f} ± {score['std'] * scale:.{digits}f}"


#: (metric, column title, digits, percent) of the main table, in order.
COLUMNS: tuple[tuple[str, str, int, bool], ...] = (
    ("success", "Success (%)", 1, True),
    ("turns", "Turns", 2, False),
    ("inform_rate", "Inform (%)", 1, True),
    ("book_rate", "Book (%)", 1, True),
    ("request_rate", "Request (%)", 1, True),
    ("clarifications_per_dialogue", "Questions / dialogue", 2, False),
    ("over_asking_per_dialogue", "Needless questions / dialogue", 2, False),
    ("discriminating_share", "Discriminating (%)", 1, True),
    ("malformed_per_dialogue", "Malformed / dialogue", 2, False),
    ("standard_success", "Standard success (%)", 1, True),
    ("standard_inform_rate", "Standard inform (%)", 1, True),
)


def markdown_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One row per method: every rate of :data:`COLUMNS` as Avg@k mean [95 % interval]."""
    lines = ["| Method | " + " | ".join(title for _, title, _, _ in COLUMNS) + " |", "|---|" + "---|" * len(COLUMNS)]
    for name, result in results.items():
        cells = [_pm(result.get(key), digits, percent) for key, _, digits, percent in COLUMNS]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def _p(p: float, statistics: Mapping[str, Any]) -> str:
    """A bootstrap p-value of 0 means below one in ``resamples``."""
    return f"p = {p:.3g}" if p > 0 else f"p < {1 / statistics['method']['resamples']:.2g}"


def significance_lines(statistics: Mapping[str, Any]) -> list[str]:
    """Per compared metric, the significant differences (or that there are none)."""
    formats = {key: (digits, percent, title) for key, title, digits, percent in COLUMNS}
    lines = []
    for key, rows in statistics["comparisons"].items():
        digits, percent, title = formats.get(key, (3, False, key))
        scale, unit = (100.0, " points") if percent else (1.0, "")
        found = [
            f"{r['a']} {'>' if r['difference'] > 0 else '<'} {r['b']} ({r['difference'] * scale:+.{digits}f}{unit}, "
            f"95 % CI [{r['ci95'][0] * scale:.{digits}f}, {r['ci95'][1] * scale:.{digits}f}], {_p(r['p_holm'], statistics)})"
            for r in rows if r["significant"]
        ]
        lines.append(f"{title}: " + ("; ".join(found) if found else f"no significant difference ({len(rows)} pair{'s' if len(rows) != 1 else ''})"))
    return lines


def first_seed_lines(statistics: Mapping[str, Any]) -> list[str]:
    """The differences each row's first training seed alone calls significant (the same
    resamples over goals), and which of them the pooled seeds keep.

    >>> row = {"a": "sft", "b": "grpo", "difference": 3.2, "significant": True}
    >>> first_seed_lines({"first_seed_only": {"turns": [row]}, "comparisons": {"turns": [{**row, "significant": False}]}})
    ['With the first seed alone 1 difference was significant; 0 of them hold over the training seeds: sft > grpo in turns (not over the seeds).']
    """
    titles = {key: title for key, title, _, _ in COLUMNS}
    pooled = {(key, r["a"], r["b"]): r["significant"] for key, rows in statistics["comparisons"].items() for r in rows}
    found = [(key, r) for key, rows in statistics["first_seed_only"].items() for r in rows if r["significant"]]
    kept = [pooled.get((key, r["a"], r["b"]), False) for key, r in found]
    listed = "; ".join(f"{r['a']} {'>' if r['difference'] > 0 else '<'} {r['b']} in {titles.get(key, key).lower()}"
                       f" ({'holds' if ok else 'not over the seeds'})" for (key, r), ok in zip(found, kept))
    return [f"With the first seed alone {len(found)} difference{'s were' if len(found) != 1 else ' was'} significant; "
            f"{sum(kept)} of them hold over the training seeds" + (f": {listed}." if found else ".")]


def domain_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    domains = sorted({d for r in results.values() for d in r["domain_success"]})
    lines = ["| Method | " + " | ".join(domains) + " |", "|---|" + "---|" * len(domains)]
    for name, result in results.items():
        cells = [_pm(result["domain_success"].get(d), 1, True) for d in domains]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def report_markdown(
    results: Mapping[str, Mapping[str, Any]],
    setup: Mapping[str, Any],
    notes: Sequence[str] = (),
    statistics: Mapping[str, Any] | None = None,
) -> str:
    k = max((r["runs"] for r in results.values()), default=0)
    method = (statistics or {}).get("method")
    trained = (method or {}).get("training_seeds") or {}
    spread = (
        f"[95 % confidence interval: percentile bootstrap over the {method['goals']} goals, {method['resamples']} "
        f"resamples, seed {method['seed']}]" if method else "± standard deviation over the runs"
    )
    if trained:
        spread = (f"[95 % confidence interval: percentile bootstrap over the {max(trained.values())} training seeds and then the "
                  f"{method['goals']} goals, {method['resamples']} resamples, seed {method['seed']}]")
    pooled = [name for name, n in trained.items() if n > 1]
    if pooled:  # runs per row = training seeds x evaluation seeds
        k = len(setup["seeds"])
    parts = [
        "# Simulated collaborative evaluation",
        "",
        *([f"Training seeds: {', '.join(pooled)} were each trained under {max(trained.values())} seeds and every seed's model "
           f"played the goals; a row pools them (its mean is over its runs, one per training seed and "
           f"evaluation seed), its interval and the paired tests resample the seeds (seed k with seed k) and then "
           "the goals, so they carry what a re-training moves. A row of one model (the untrained base) "
           "keeps its interval over goals.", ""] if pooled else []),
        f"Avg@{k}: mean over {k} seeded runs of {setup['goals']} held-out goals "
        f"({setup['split']} split) each {spread}, against the {setup['simulator']} user simulator, "
        f"at most {setup['max_exchanges']} agent turns; {setup['agent_format']} format, "
        f"{'greedy decoding' if not setup.get('temperature') else 'temperature ' + str(setup['temperature'])}.",
        "",
        markdown_table(results),
        "",
        "Success: every goal domain's offered entity fits the goal, bookings made with the goal's values "
        "(a reference the environment issued), requested attributes given. Turns: utterances, user and agent. "
        "Questions: clarification questions (the clarify rate). Needless questions (over-asking): questions that "
        "ask about a goal constraint the user has already stated, or asked when the user had already stated every "
        "constraint of the goal (nothing was left to ask). Discriminating: questions the verifiable judge rates as "
        "asking for a goal constraint the user has not stated yet (and nothing already stated). "
        "Standard success / inform: the MultiWOZ standard evaluator's definitions (pipelines/env/standard.py: "
        "the standard requestables, every offered venue fitting the goal in the database; taxi, police and hospital "
        "goals count as informed whatever was said, as in that evaluator), the figures the field's papers report; "
        "Success is askflow's strict checker.",
        "",
        "## Success per domain (%)",
        "",
        domain_table(results),
    ]
    if method:
        parts += [
            "",
            "## Significant differences",
            "",
            (f"Paired bootstrap over training seeds (seed k of one row with seed k of another; a row of one model keeps "
             f"its own) and then goals (the same {method['resamples']} resamples for every model): two-sided "
             if trained else f"Paired bootstrap over goals (the same {method['resamples']} goal resamples for every model): two-sided ")
            + f"p-value of each difference, Holm-adjusted over the {len(results) * (len(results) - 1) // 2} model pairs "
            f"of each metric; significant when below {method['alpha']}.",
            "",
            *[f"- {line}" for line in significance_lines(statistics)],
        ]
    if (statistics or {}).get("first_seed_only"):
        parts += ["", "## With one training seed", "", *[f"- {line}" for line in first_seed_lines(statistics)]]
    if pooled:
        parts += ["", "## Per training seed", "", seed_table(results)]
    if notes:
        parts += ["", "## Notes", "", *[f"- {n}" for n in notes]]
    return "\n".join(parts) + "\n"


def seed_table(results: Mapping[str, Mapping[str, Any]]) -> str:
    """One line per training seed of every pooled row: what each re-training scored alone."""
    titles = {key: (title, digits, percent) for key, title, digits, percent in COLUMNS}
    keys = next(iter(r["per_training_seed"].values() for r in results.values() if r.get("per_training_seed")))
    keys = [key for key in next(iter(keys)) if key in titles]
    lines = ["| Model | " + " | ".join(titles[key][0] for key in keys) + " |", "|---|" + "---|" * len(keys)]
    for result in results.values():
        for name, values in (result.get("per_training_seed") or {}).items():
            cells = ["–" if values[key] is None else f"{values[key] * (100.0 if titles[key][2] else 1.0):.{titles[key][1]}f}" for key in keys]
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_rows(results: Mapping[str, Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One row per method for the success-vs-turns plot."""
    return [
        {"method": name, "success": r["success"]["mean"], "success_std": r["success"]["std"], "turns": r["turns"]["mean"], "turns_std": r["turns"]["std"]}
        for name, r in results.items()
    ]


def _verdict(statistics: Mapping[str, Any] | None, metric: str, a: str, b: str) -> str:
    """`` (significant, p = ...)`` / `` (not significant, ...)`` for models ``a`` and ``b``."""
    for row in (statistics or {}).get("comparisons", {}).get(metric, []):
        if {row["a"], row["b"]} == {a, b}:
            return f" ({'significant' if row['significant'] else 'not significant'}, {_p(row['p_holm'], statistics)})"
    return ""


def pattern_notes(results: Mapping[str, Mapping[str, Any]], statistics: Mapping[str, Any] | None = None) -> list[str]:
    """What the table says about SpeakRL's pattern (clarification-trained models succeed
    more often than the base model; GRPO not worse than SFT), computed, not asserted; with
    ``statistics``, whether each difference is significant (:func:`significance_lines`)."""
    notes = []
    if results and all(r["success"]["mean"] == 0.0 for r in results.values()):
        notes.append("No model completed a goal in any run (success 0 for every model): the comparison rests on "
                     "the partial rates (inform, request), the questions asked and the malformed outputs.")
    if "base" in results:
        base = results["base"]["success"]["mean"]
        for name in ("sft", "dpo", "kto", "grpo"):
            if name in results:
                delta = results[name]["success"]["mean"] - base
                notes.append(f"{name} vs base: success {delta * 100:+.1f} points{_verdict(statistics, 'success', name, 'base')}, "
                             f"questions/dialogue {results[name]['clarifications_per_dialogue']['mean']:.2f} vs "
                             f"{results['base']['clarifications_per_dialogue']['mean']:.2f}")
    if "grpo" in results and "sft" in results:
        delta = results["grpo"]["success"]["mean"] - results["sft"]["success"]["mean"]
        notes.append(f"grpo vs sft: success {delta * 100:+.1f} points{_verdict(statistics, 'success', 'grpo', 'sft')}")
    return notes
