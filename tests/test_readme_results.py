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


def test_readme_reading_of_the_speakrl_table_gives_the_committed_figures():
    import json

    sft = json.loads((REPO / "reports" / "train" / "sft.json").read_text(encoding="utf-8"))
    played = json.loads((REPO / "reports" / "eval.json").read_text(encoding="utf-8"))["models"]["sft"]
    well_formed = sft["eval"]["after"]["speaker_sft"]["generation"]["well_formed"]
    text = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    assert (f"SFT's held-out outputs are well-formed {well_formed:.2f} of the time, but in dialogue it writes "
            f"{played['malformed_per_dialogue']['mean']:.2f} malformed outputs per dialogue (and asks "
            f"{played['clarifications_per_dialogue']['mean']:.2f} questions)") in text
