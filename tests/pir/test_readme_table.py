"""The README's PIR figures are the committed reports' (issue 27): the fidelity block is what
:func:`pipelines.pir.report.fidelity_markdown` generates from ``reports/pir.json``, and the
metrics table is ``reports/pir_eval.md``'s."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pipelines.pir.report import README_END, README_START, fidelity_markdown, readme_block, readme_with_fidelity

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _pir_section() -> str:
    start = README.index("### PIR: clarification insertion into reasoning traces")
    return README[start:README.index("## Learn-to-Ask", start)]


def test_the_readme_fidelity_table_is_the_committed_reports():
    report = json.loads((REPO / "reports/pir.json").read_text(encoding="utf-8"))
    assert README_START in _pir_section() and README_END in _pir_section()
    assert readme_block(README) == fidelity_markdown(report)
    # The headline the README names is the setting params.yaml fixed and the report used.
    head = report["fidelity"]["headline"]
    assert f"**{head['scope']} (headline)** | **{head['k_percent']:g}**" in readme_block(README)


def test_a_changed_report_changes_the_block_and_nothing_else():
    report = json.loads((REPO / "reports/pir.json").read_text(encoding="utf-8"))
    head = report["fidelity"]["headline"]
    cell = report["fidelity"]["sweep"][f"{head['k_percent']:g}"][head["scope"]]
    cell["precision"]["value"] = 0.999
    updated = readme_with_fidelity(README, report)
    assert readme_block(updated) != readme_block(README) and "0.999" in readme_block(updated)
    assert updated.split(README_START)[0] == README.split(README_START)[0]
    assert updated.split(README_END)[1] == README.split(README_END)[1]
    with pytest.raises(ValueError, match="marker"):
        readme_block("no markers here")


def test_the_readme_metrics_table_is_pir_evals():
    table = "\n".join(line for line in (REPO / "reports/pir_eval.md").read_text(encoding="utf-8").splitlines() if line.startswith("|"))
    assert table and table in _pir_section()


def test_the_readme_prose_quotes_the_report():
    report = json.loads((REPO / "reports/pir.json").read_text(encoding="utf-8"))
    fid = report["fidelity"]
    head = fid["headline"]
    diff = head["precision_minus_random"]
    offsets = fid["selected_offset_from_assumption"]
    section = " ".join(_pir_section().split())
    quoted = [
        f"per trace, k {head['k_percent']:g} %" if head["scope"] == "trace" else f"over the corpus, k {head['k_percent']:g} %",
        f"precision {head['precision']['value']:.3f} against {head['random_precision']['value']:.3f}",
        f"difference {diff['value']:+.3f} [{diff['ci95_low']:+.3f}, {diff['ci95_high']:+.3f}]".replace("-", "−"),
        f"mean {fid['mean_entropy']['assumption_steps']:.2f} vs {fid['mean_entropy']['other_steps']:.2f} nats",
        f"within a trace {fid['assumption_step_rank']['mean']:.2f}",
        f"of the {head['selected']} steps picked at the headline setting, {offsets['+1']} are that step (+1), "
        f"{offsets['-1']} the one before, {offsets['0']} the assumption step itself",
        f"the SFT data holds {report['insertions']} pairs, {report['insertions_at_assumption_steps']} after an assumption step "
        f"and {report['insertions_elsewhere']} ({100 * report['insertions_elsewhere'] / report['insertions']:.0f} %)",
        f"{report['traces']} embedded traces, {report['steps']:,} steps, {head['positives']} assumption steps",
    ]
    for text in quoted:
        assert text in section, text


def test_the_readme_training_prose_quotes_the_reports():
    grpo = json.loads((REPO / "reports/train/pir_grpo.json").read_text(encoding="utf-8"))
    sft = json.loads((REPO / "reports/train/pir_sft.json").read_text(encoding="utf-8"))
    evaluation = json.loads((REPO / "reports/pir_eval.json").read_text(encoding="utf-8"))["results"]
    signal = grpo["learning_signal"]
    section = " ".join(_pir_section().split())
    quoted = [
        f"learning_signal: {{groups: {signal['groups']}, zero_variance_groups: {signal['zero_variance_groups']}, no_signal: "
        f"{str(signal['no_signal']).lower()}}}",
        f"reward branch `wrong` {grpo['train']['reward_branches']['wrong']}/{grpo['train']['rollouts']['episodes']}",
        f"{grpo['train']['rollouts']['truncated']} of {grpo['train']['rollouts']['episodes']} stopped by the 1,024-token budget",
        f"→ {sft['train']['final_loss']:.2f} (token accuracy",
        f"asks inside its reasoning in {evaluation['pir_sft']['asked_conversations']} of {evaluation['pir_sft']['conversations']}",
        f"{sft['data']['sources']['pir_traces']['train']} train / {sft['data']['sources']['pir_traces']['heldout_rows']} val rows",
    ]
    for text in quoted:
        assert text in section, text
