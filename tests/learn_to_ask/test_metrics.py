"""Learn-to-Ask's Table 1 proxy metrics (appendix F.6) on hand-built outputs."""

from __future__ import annotations

import math

import pytest

from pipelines.learn_to_ask.metrics import (
    METRICS,
    bootstrap,
    bootstrap_difference,
    counts_of,
    markdown_table,
    metrics_of,
    score_output,
)
from pipelines.rewards.learn_to_ask import L2AReward, RulesGrader

AREA = [{"field": "restaurant-area", "value": "north"}]
FOOD = [{"field": "restaurant-food", "value": "thai"}, {"field": "restaurant-area", "value": "north"}]

# (output, s*, I*): every branch of the scoring.
CASES = [
    ("What area would you like?", "continue", AREA),  # right CONTINUE, precise (R_a 1), one question
    ("How many people? And which day?", "continue", AREA),  # right CONTINUE, same domain (R_a 0.5), two questions
    ("Do you like trains?", "continue", AREA),  # right CONTINUE, irrelevant (R_a 0)
    ("<stop />", "continue", FOOD),  # wrong STOP
    ("<stop />", "stop", []),  # right STOP, exact token
    ("All done. <stop />", "stop", []),  # right STOP, not the bare token
    ("What food would you like?", "stop", []),  # wrong CONTINUE
]


def scored_cases():
    grader = RulesGrader()
    return [score_output(text, truth, info, grader) for text, truth, info in CASES]


def test_each_metric_is_its_appendix_f6_definition():
    m = metrics_of(scored_cases())
    # WA: R_a over the 3 right CONTINUEs (the wrong STOP on a CONTINUE sample is not in it).
    assert m["WA"] == pytest.approx((1.0 + 0.5 + 0.0) / 3)
    assert m["WA-GH"] == pytest.approx(1 / 3)
    assert m["WC"] == pytest.approx(3 / 4)  # 3 of 4 CONTINUE samples continued
    assert m["WS"] == pytest.approx(2 / 3)  # 2 of 3 STOP samples stopped
    assert m["AA"] == pytest.approx(5 / 7)
    # Omega: 1 + 0.5 + 1 (one question each... the third asks one) + 0 + 1 + 0 + 0
    assert m["FC"] == pytest.approx((1.0 + 0.5 + 1.0 + 0.0 + 1.0 + 0.0 + 0.0) / 7)
    rewards = [4.0, 1.0 + 2 * 0.5 + 0.5, 1.0 + 0.0 + 1.0, 0.0, 4.0, 3.0, 0.0]
    assert m["TR"] == pytest.approx(sum(rewards) / 7)


def test_total_reward_is_the_training_reward():
    reward = L2AReward(RulesGrader())
    expected = reward(["p"] * len(CASES), [c[0] for c in CASES], decision_truth=[c[1] for c in CASES], info_truth=[c[2] for c in CASES])
    assert [s.reward for s in scored_cases()] == expected


@pytest.mark.parametrize("metric,bad,good", [
    ("WA", ("Do you like trains?", "continue", AREA), ("What area would you like?", "continue", AREA)),
    ("WA-GH", ("How many people?", "continue", AREA), ("Which area?", "continue", AREA)),
    ("WC", ("<stop />", "continue", AREA), ("Which area?", "continue", AREA)),
    ("WS", ("Which area?", "stop", []), ("<stop />", "stop", [])),
    ("AA", ("Which area?", "stop", []), ("<stop />", "stop", [])),
    ("FC", ("Which area? Which food? Which day?", "continue", AREA), ("Which area?", "continue", AREA)),
    ("TR", ("Sure. <stop />", "stop", []), ("<stop />", "stop", [])),
])
def test_each_metric_can_fail(metric, bad, good):
    grader = RulesGrader()
    low = metrics_of([score_output(*bad, grader)])[metric]
    high = metrics_of([score_output(*good, grader)])[metric]
    assert low is not None and high is not None and low < high


def test_wa_ignores_wrong_decisions_and_undefined_subsets_are_none():
    grader = RulesGrader()
    only_stops = [score_output("<stop />", "stop", [], grader)]
    m = metrics_of(only_stops)
    assert m["WA"] is None and m["WA-GH"] is None and m["WC"] is None and m["WS"] == 1.0
    wrong = [score_output("<stop />", "continue", AREA, grader), score_output("Which area?", "continue", AREA, grader)]
    assert metrics_of(wrong)["WA"] == 1.0  # the wrong STOP's question quality is not WA's business


def test_an_ungraded_answer_is_counted_and_left_out_not_scored_zero():
    grader = RulesGrader()
    scored = [score_output("Which area?", "continue", "not json", grader), score_output("Which area?", "continue", AREA, grader)]
    assert scored[0].reward is None and scored[0].reason == "malformed_reference"
    m = metrics_of(scored)
    assert m["WA"] == 1.0 and m["TR"] == 4.0 and m["WC"] == 1.0
    assert counts_of(scored) == {"samples": 2, "continue": 2, "stop": 0, "right_continue_graded": 1, "unscored": 1}
    with pytest.raises(ValueError, match="decision_truth"):
        score_output("Which area?", "maybe", AREA, grader)


def test_bootstrap_intervals_hold_the_estimate_and_pair_differences():
    scored = scored_cases() * 6
    point = metrics_of(scored)
    intervals = bootstrap(scored, resamples=300, seed=1)
    for name in METRICS:
        low, high = intervals[name]
        assert low <= point[name] <= high and low < high
    assert bootstrap(scored, resamples=300, seed=1) == intervals  # seeded
    # A policy that stops everywhere against one that never stops: WS +1 for sure, WC -1.
    grader = RulesGrader()
    truths = [("continue", AREA), ("stop", [])] * 5
    stopper = [score_output("<stop />", t, i, grader) for t, i in truths]
    asker = [score_output("Which area?", t, i, grader) for t, i in truths]
    diff = bootstrap_difference(stopper, asker, resamples=200)
    assert diff["WS"] == (1.0, 1.0) and diff["WC"] == (-1.0, -1.0) and diff["WA"] is None
    with pytest.raises(ValueError, match="differ in number"):
        bootstrap_difference(stopper, asker[:-1])


def test_markdown_table_has_a_row_per_model_and_dashes_for_undefined():
    scored = scored_cases()
    only_stop = [s for s in scored if s.truth == "stop"]
    table = markdown_table({
        "a": {"metrics": metrics_of(scored), "ci": bootstrap(scored, resamples=50), "counts": counts_of(scored)},
        "b": {"metrics": metrics_of(only_stop), "counts": counts_of(only_stop)},
    })
    lines = table.splitlines()
    assert lines[0].startswith("| Model | n | WA | WA-GH |") and len(lines) == 4
    assert lines[2].startswith("| a | 7 | 0.50 [") and lines[3].startswith("| b | 3 | - | - | - | 0.67 |")
    assert not any(math.isnan(v) for v in metrics_of(scored).values())


def test_content_is_graded_on_the_questions_only():
    from pipelines.learn_to_ask.metrics import QuestionGrader, questions
    from pipelines.rewards.learn_to_ask import l2a_questions

    tool_call = '<tool_call>\n{"name": "query_restaurant", "arguments": {"area": "north"}}\n</tool_call>'
    statement = "There are 4 restaurants in the north area. Which food would you like?"
    assert questions(statement) == ["Which food would you like?"] and questions(tool_call) == []
    rules, asked = RulesGrader(), QuestionGrader(RulesGrader())
    # The whole-text rules grader credits a tool call naming the slot (0.5: its "name" key reads
    # as a second slot, beyond I*_t); the question grader does not.
    assert score_output(tool_call, "continue", AREA, rules).content == 0.5
    assert score_output(tool_call, "continue", AREA, asked).content == 0.0
    assert score_output(tool_call, "continue", AREA, asked).reason == "no_question"
    # Only the question counts: it asks about food, the target is the area (same domain: 0.5).
    assert score_output(statement, "continue", AREA, asked).content == 0.5
    assert score_output(statement, "continue", FOOD, asked).content == 1.0
    # An empty reference stays ungraded (None), never 0.
    assert score_output(tool_call, "continue", [], asked).reward is None
    assert l2a_questions(["p"], [tool_call], decision_truth=["continue"], info_truth=[AREA]) == [1.0]
