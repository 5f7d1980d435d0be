"""The README's SpeakER section states the figures of the committed ``reports/speaker.json``."""

from __future__ import annotations

import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HEADING = "### SpeakER data for a policy that cannot see the goal, and CPU proxies"


def _section() -> str:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    start = text.index(HEADING)
    end = text.find("\n### ", start + len(HEADING))
    return " ".join(text[start:end if end > 0 else None].split())


def test_readme_speaker_section_matches_the_committed_audit():
    report = json.loads((ROOT / "reports" / "speaker.json").read_text(encoding="utf-8"))
    audit, contrast = report["audit"], report["contrast"]
    over, after = audit["over_asking"], audit["after_search"]
    replies = audit["after_question"]
    bookings = audit["bookings"]
    opened = after["open"]["ask"] + after["open"]["act"]
    stated = after["stated"]["ask"] + after["stated"]["act"]
    expected = [
        f"of {audit['questions']['total']:,} questions, {audit['questions']['absent_from_goal']} ask about a constraint the goal lacks",
        f"followed by an answer {replies['replies']['answer']:,} times and by \"no preference\" {replies['replies']['no_preference']:,} times",
        f"after all {replies['next_after_no_preference']['respond']:,} the agent recommends",
        f"({replies['requery_no_arguments_after_no_preference']} searches with no arguments)",
        *(f"{d} {b['dialogues_booked']}/{b['goal_dialogues']}" for d, b in bookings.items()),
        f"with {audit['tool_calls']['errors']} tool-call errors",
        f"{contrast['points']:,} contrasts of {contrast['underspecification_questions']:,} such questions, "
        f"{contrast['sft_rows']:,} SFT rows ({report['rows']['speaker_sft']:,} in all)",
        f"{over['asks_stated_slot']} of {audit['questions']['total']:,} questions ask about a slot the user stated",
        f"asks in {after['open']['ask']:,} of {opened:,} rows where a slot is open and in {after['stated']['ask']} of {stated:,} where every slot is stated",
        f"flag {over['asks_known_slot']:,} questions as asking a known slot and {over['nothing_open']:,} as asked with nothing open ({100 * over['share']:.1f} %)",
    ]
    section = _section()
    missing = [figure for figure in expected if figure not in section]
    assert not missing, missing
    assert over["asks_stated_slot"] == 0 and after["stated"]["ask"] == 0


def test_readme_gives_the_committed_slot_filling_correction_and_name_counts():
    whole = json.loads((ROOT / "reports" / "speaker.json").read_text(encoding="utf-8"))
    report = whole["clarifications"]
    readme = " ".join((ROOT / "README.md").read_text(encoding="utf-8").split())
    for figure in (f"{report['slot_filling']} such questions in `speaker_sft`", f"{report['corrected_offers']} such corrections in `speaker_sft`",
                   f"{report['forgotten_constraints']} such recoveries", f"{report['other_kind_first']} such misses",
                   f"{whole['act_here']['by_rejected']['dropped_slot']} such pairs (`act_here.by_rejected.dropped_slot`"):
        assert figure in readme, figure


def test_readme_speaker_section_matches_the_committed_proxy_check():
    runs = json.loads((ROOT / "reports" / "speaker_sft_check.json").read_text(encoding="utf-8"))["runs"]
    before, after = (runs[t]["eval"]["after"][f"speaker_sft_{t}"] for t in ("before", "after"))

    def pair(part: str, name: str) -> str:
        return f"{before[part][name]:.2f} -> {after[part][name]:.2f}"

    expected = [
        f"it asks {before['next_action']['n_questions']} time(s) before the change and {after['next_action']['n_questions']} after",
        f"over-asking {pair('generation', 'over_asking')} on {before['generation']['n_act_here']} and {after['generation']['n_act_here']} act-here rows",
        f"well-formed {pair('generation', 'well_formed')}",
        f"action-kind accuracy {pair('next_action', 'action_kind_accuracy')}",
        f"tool-name accuracy {pair('next_action', 'tool_name_accuracy')}",
        f"argument exact match {pair('next_action', 'argument_exact_match')}",
        f"{runs['after']['train']['steps']} steps on {runs['after']['data']['train_examples']:,} rows",
    ]
    section = _section()
    missing = [figure for figure in expected if figure not in section]
    assert not missing, missing


def test_readme_speaker_section_matches_the_committed_sft_proxies():
    """The before -> after table of benchmarks/sft_proxies.py's committed report."""
    runs = json.loads((ROOT / "reports" / "speaker_proxies_cpu.json").read_text(encoding="utf-8"))["runs"]

    def pair(run: str, name: str, digits: int = 2) -> str:
        proxies = runs[run]["proxies"]["speaker_sft"]
        return f"{proxies['before'][name]:.{digits}f} -> {proxies['after'][name]:.{digits}f}"

    section = _section()
    for run, label in (("base", "tiny `models/base`"), ("base_1000", "tiny `models/base`"), ("smollm2", "SmolLM2-135M-Instruct, LoRA r 16"),
                       ("smollm2_96", "SmolLM2-135M-Instruct, LoRA r 16")):
        settings, proxies = runs[run]["settings"], runs[run]["proxies"]["speaker_sft"]
        row = (f"| {label} | {settings['steps']} steps on {settings['train_rows']:,} rows")
        cells = (f"| {pair(run, 'well_formed')} | {pair(run, 'action_kind_accuracy')} | "
                 f"{pair(run, 'tool_name_accuracy')} (of {proxies['after']['n_tool_calls']}) | {pair(run, 'argument_exact_match')} | "
                 f"{proxies['before']['n_questions']} -> {proxies['after']['n_questions']} |")
        assert row in section, row
        assert cells in section, cells
        assert proxies["before"]["n"] == proxies["after"]["n"] == settings["heldout_rows"]
    for run in ("smollm2", "smollm2_96"):
        assert f"{runs[run]['settings']['steps']} steps on 2,000 rows ({runs[run]['wall_s'] / 60:.0f} min)" in section
