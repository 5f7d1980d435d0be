"""README's Learn-to-Ask figures are the committed reports' (issue 27): the Table 1 block is
generated from reports/l2a.json and the Auto-Prompt figures from reports/calibrate.json."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO


def readme_block(name: str) -> str:
    text = (REPO / "README.md").read_text(encoding="utf-8")
    found = re.search(rf"<!-- {name}:begin -->\n(.*?)\n<!-- {name}:end -->", text, re.DOTALL)
    assert found, f"README.md has no {name} block"
    return found.group(1).strip()


def test_the_readme_learn_to_ask_table_is_the_report():
    from pipelines.evaluation.learn_to_ask import readme_block as generate

    report = json.loads((REPO / "reports/l2a.json").read_text(encoding="utf-8"))
    assert set(report["references"]) == {"expert", "catch_all"}  # every model row has its reference rows
    assert readme_block("l2a-table") == generate(report).strip()


def test_the_readme_auto_prompt_figures_are_the_report():
    from pipelines.learn_to_ask.calibration import readme_block as generate

    metrics = json.loads((REPO / "reports/calibrate.json").read_text(encoding="utf-8"))
    assert readme_block("l2a-autoprompt") == generate(metrics).strip()


def test_a_changed_figure_fails_the_comparison():
    from pipelines.evaluation.learn_to_ask import readme_block as generate

    report = json.loads((REPO / "reports/l2a.json").read_text(encoding="utf-8"))
    first = next(iter(report["models"]))
    report["models"][first]["metrics"]["WA"] = (report["models"][first]["metrics"]["WA"] or 0) + 0.5
    with pytest.raises(AssertionError):
        assert readme_block("l2a-table") == generate(report).strip()
