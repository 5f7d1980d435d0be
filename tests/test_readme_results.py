"""The README's first results block is the committed reports' headline rows, as ``make run``'s
summary prints them (issue 30, item 4)."""

from catalog import readme
from tests.conftest import REPO


def test_readme_results_block_is_generated_from_the_committed_reports():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.current_block(text) == readme.block(REPO), "run `python -m catalog.readme` after make run"
