"""The README's first results block is the committed reports' headline rows, as ``make run``'s
summary prints them (issue 30, item 4)."""

from catalog import readme
from tests.conftest import REPO


def test_readme_results_block_is_generated_from_the_committed_reports():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    assert readme.current_block(text) == readme.block(REPO), "run `python -m catalog.readme` after make run"


def test_readme_training_seeds_block_is_generated_from_the_committed_seeds_tables():
    text = (REPO / "README.md").read_text(encoding="utf-8")
    block = readme.seeds_block(REPO)
    assert readme.current_block(text, readme.SEEDS_START, readme.SEEDS_END) == block, "run `python -m catalog.readme`"
    for name in ("eval_seeds", "pir_eval_seeds", "clarifier_eval_seeds"):  # the three tables the profile writes
        assert f"reports/training_seeds/{name}.md" in block
