"""Auto-Prompt's greedy search (Algorithm 1) on a toy extraction task whose best prompt is
known: a deterministic "model" that does what the prompt it reads says."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.learn_to_ask.autoprompt import (
    Prompt,
    RulesProposer,
    calibrate,
    calibrated,
    extraction_f1,
    negative_mse,
)

CALIBRATION = ["I need 3 tickets", "Two adults and 1 child", "A table for 4 at 7"]
ANCHORS = [[("tickets", "3")], [("adults", "Two"), ("children", "1")], [("people", "4"), ("time", "7")]]
BEST_F1 = 8 / 9  # numbers as JSON: 4 of the 5 anchor values, nothing wrong
SEED = Prompt("Extract the words.")
REWORDINGS = ["Extract the words.", "Extract the numbers.", "Summarise the request."]
RULES = ["Answer with JSON only.", "Be brief."]
BEST = Prompt("Extract the numbers.", rules=("Answer with JSON only.",))


def toy_model(prompt: str, text: str) -> str:
    """Reads the prompt: numbers or words, JSON only when a rule says so, and prose about
    the task whenever the prompt says to be brief (a rule that hurts)."""
    found = re.findall(r"\d+", text) if "numbers" in prompt else re.findall(r"[A-Za-z]+", text)[:1]
    if "Summarise" in prompt:
        found = []
    if "JSON only" not in prompt:
        return "Here you go: " + ", ".join(found)
    if "Be brief" in prompt:
        return "ok"
    return json.dumps({"info": [{"field": "x", "value": v} for v in found]})


def extract_score(prompt: Prompt) -> float:
    predicted = []
    for text in CALIBRATION:
        reply = toy_model(prompt.render(), text)
        try:
            predicted.append([(i["field"], i["value"]) for i in json.loads(reply)["info"]])
        except (json.JSONDecodeError, KeyError, TypeError):
            predicted.append(None)  # a failed extraction extracts nothing
    return extraction_f1(predicted, ANCHORS)


def test_the_search_finds_the_known_best_prompt_and_records_its_lineage():
    proposer = RulesProposer(REWORDINGS, rules=RULES, seed=0)
    history = calibrate("extract", SEED, proposer.propose, extract_score, iterations=3, k=2)
    best = calibrated(history)
    assert best.prompt == BEST and best.score == pytest.approx(BEST_F1)
    assert extract_score(SEED) == 0.0
    # Every other single-rule prompt scores below it: the search found the known optimum.
    for instruction in REWORDINGS:
        for rules in ((), ("Answer with JSON only.",), ("Be brief.",), tuple(RULES)):
            if Prompt(instruction, rules=rules) != BEST:
                assert extract_score(Prompt(instruction, rules=rules)) < BEST_F1
    # Lineage: the seed first; every other candidate's parent was the selected prompt before it.
    assert history[0].mutation == "seed" and history[0].parent_id is None and history[0].selected
    selected_ids = {history[0].prompt_id}
    for iteration in (1, 2, 3):
        round_ = [c for c in history if c.iteration == iteration]
        assert {c.parent_id for c in round_} <= selected_ids
        assert sum(c.selected for c in round_) == 1
        selected_ids |= {c.prompt_id for c in round_ if c.selected}
    # The selected score never goes down.
    picks = [c.score for c in history if c.selected]
    assert picks == sorted(picks)


def test_the_search_is_deterministic_and_a_tie_keeps_the_current_prompt():
    proposer = RulesProposer(REWORDINGS, rules=RULES, seed=3)
    first = calibrate("extract", SEED, proposer.propose, extract_score, iterations=4, k=1)
    again = calibrate("extract", SEED, proposer.propose, extract_score, iterations=4, k=1)
    assert [(c.prompt_id, c.score, c.mutation) for c in first] == [(c.prompt_id, c.score, c.mutation) for c in again]
    # Nothing beats a perfect prompt: the next iterations keep it.
    history = calibrate("extract", BEST, proposer.propose, extract_score, iterations=2, k=3)
    assert calibrated(history).prompt == BEST
    assert [c.mutation for c in history if c.selected] == ["seed", "kept", "kept"]


def test_each_prompt_runs_its_pipeline_once():
    calls: list[str] = []

    def counted(prompt: Prompt) -> float:
        calls.append(prompt.prompt_id)
        return extract_score(prompt)

    proposer = RulesProposer(REWORDINGS, rules=RULES)
    calibrate("extract", SEED, proposer.propose, counted, iterations=5, k=10)
    assert len(calls) == len(set(calls))


def test_proposer_mutations_are_single_steps():
    proposer = RulesProposer(REWORDINGS, examples=[("I need 2", '{"info": []}')], rules=RULES)
    prompt = Prompt("Extract the words.", examples=(("x", "y"),), rules=("Be brief.",))
    kinds = [m for m, _ in proposer.variations(prompt)]
    assert kinds == ["reword", "reword", "add_example", "drop_example", "add_rule", "drop_rule"]
    assert "[Example 1]\nx\n[Expected Output]\ny" in prompt.render() and "- Be brief." in prompt.render()
    assert len(proposer.propose(prompt, 3, 1)) == 3 and proposer.propose(prompt, 3, 1) == proposer.propose(prompt, 3, 1)


def test_grader_track_score_is_negative_mse():
    assert negative_mse([1.0, 0.5], [1.0, 0.5]) == 0.0
    assert negative_mse([0.0, None], [1.0, 0.0]) == -1.0
    with pytest.raises(ValueError):
        negative_mse([], [])
