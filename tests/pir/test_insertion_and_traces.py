"""Insertion by character offset, the rules inserter, the rules teacher's traces and bad
trace files."""

from __future__ import annotations

import json

import pytest

from pipelines.env.tools import Database
from pipelines.errors import ConfigError, DataError
from pipelines.pir.insertion import Insertion, RulesInserter, insert_pairs, insertion_messages, parse_round
from pipelines.pir.traces import Trace, build_traces, committed_value, split_steps, traces_from_records
from stages.pir_augment import read_trace_file


def test_pairs_go_right_after_their_step_even_when_its_text_repeats():
    reasoning = "Check the list.\n\nCheck the list.\n\nPick one."
    out = insert_pairs(reasoning, [Insertion(2, "Q2?", "A2."), Insertion(1, "Q1?", "A1.")])
    assert out == (
        "Check the list.\n\nCheck the list.\n\n<asking>Q1?</asking>\n<response>A1.</response>\n\n"
        "Pick one.\n\n<asking>Q2?</asking>\n<response>A2.</response>"
    )
    # A first-match string replace (the released code) would put Q1 after the first step.
    assert out.index("<asking>Q1?") > out.index("Check the list.", 1) + len("Check the list.")
    # Removing the pairs gives back the original text.
    for pair in ("\n\n<asking>Q1?</asking>\n<response>A1.</response>", "\n\n<asking>Q2?</asking>\n<response>A2.</response>"):
        out = out.replace(pair, "")
    assert out == reasoning


def test_insertion_offsets_follow_irregular_breaks():
    reasoning = "  One.  \n \n\tTwo.\n\n\n\nThree."
    assert [reasoning[a:b] for a, b in split_steps(reasoning)] == ["One.", "Two.", "Three."]
    out = insert_pairs(reasoning, [Insertion(0, "Q?", "A.")])
    assert out.startswith("  One.\n\n<asking>Q?</asking>\n<response>A.</response>  \n \n\tTwo.")
    with pytest.raises(ValueError, match="out of range"):
        insert_pairs(reasoning, [Insertion(3, "Q?", "A.")])
    with pytest.raises(ValueError, match="more than one"):
        insert_pairs(reasoning, [Insertion(1, "Q?", "A."), Insertion(1, "Q?", "B.")])


_INPUT = "User: Can you find me a place to stay with free parking?\nDatabase (hotel): 25 matches. Values of the matches: area: centre, east, north."
_REASONING = ("So the user wants a place to stay with free parking.\n\nThe matches differ in area.\n\nI will look in the north.\n\n"
              "With that, 6 places to stay remain, amber inn among them.\n\nI'll suggest amber inn.")


def _trace(assumption_steps):
    return Trace("t", _INPUT, _REASONING, "Amber inn.", "embedded", assumption_steps=assumption_steps, domain="hotel",
                 user_goal={"parking": "yes", "area": "east"})


def test_the_rules_inserter_does_not_read_the_ground_truth():
    # The trace says its assumption step is 0 (the restatement); entropy picked step 2 (the
    # commitment to the north) and step 4: the questions go there, whatever the annotation.
    inserted = RulesInserter().insertions([_trace((0,))], [(2, 4)])[0]
    assert [i.step for i in inserted] == [2, 4] and all(isinstance(i, Insertion) for i in inserted)
    area, generic = inserted
    assert "area" in area.question.lower() or "part of town" in area.question.lower() or "where" in area.question.lower()
    assert "east" in area.answer.lower()  # the user answers from its goal, not from the step
    assert "amber inn" in generic.question and "no preference" in generic.answer  # misplaced: kept, as the method writes it
    # The same picks with the annotation anywhere else, or absent, give the same pairs.
    for truth in ((2,), (4,), (1, 3), None):
        assert RulesInserter().insertions([_trace(truth)], [(2, 4)]) == [inserted]
    augmented = insert_pairs(_REASONING, inserted)
    assert f"I will look in the north.\n\n<asking>{area.question}</asking>" in augmented
    assert f"I'll suggest amber inn.\n\n<asking>{generic.question}</asking>" in augmented


def test_the_rules_inserter_answers_from_the_users_goal():
    trace = _trace((2,))
    (stated, differ, committed, _, _), = RulesInserter().insertions([trace], [range(5)])
    assert stated.answer == "I don't know, I have no preference about that."  # its goal's values are not in the step's words
    assert "east" in differ.answer.lower() and "east" in committed.answer.lower()
    named = Trace("t", _INPUT, _REASONING, "x", "embedded", domain="hotel", user_goal={"name": "amber inn"})
    (remain,), = RulesInserter().insertions([named], [(3,)])
    assert remain.question.startswith("I was going to say") and remain.answer == "Yes, amber inn."
    no_area = Trace("t", _INPUT, _REASONING, "x", "embedded", domain="hotel", user_goal={"parking": "yes"})
    (committed,), = RulesInserter().insertions([no_area], [(2,)])
    assert "east" not in committed.answer and "north" not in committed.answer  # no value in its goal: no preference
    with pytest.raises(ValueError, match="rules inserter needs askflow's embedded traces"):
        RulesInserter().insertions([Trace("f", "in", "s0", "out", "file.jsonl")], [(0,)])
    with pytest.raises(ValueError, match="out of range"):
        RulesInserter().insertions([trace], [(9,)])


def test_llm_insertion_prompt_and_reply_parsing():
    trace = Trace("t", "Find a hotel.", "It should be cheap.\n\nI pick the north.\n\nDone.", "Alpha lodge.", "f")
    messages = insertion_messages(trace, 1, [Insertion(0, "Budget?", "Cheap.")])
    assert "single round of interactive Assistant–User dialogue" in messages[0]["content"]
    user = messages[1]["content"]
    assert "I pick the north." in user and "Done." not in user.split("final answer:")[0]
    assert "Assistant: Budget?\nUser: Cheap." in user and user.endswith("final answer:\nAlpha lodge.")
    assert parse_round("Assistant: Which area?\nUser: North.") == ("Which area?", "North.")
    assert parse_round("User: North.") is None


def test_rules_teacher_marks_the_steps_that_assume_an_unstated_constraint(small_corpus):
    database = Database(small_corpus.entities, small_corpus.taxi_options)
    traces = build_traces(small_corpus.dialogues, database, seed=0)
    assert traces and len({t.trace_id for t in traces}) == len(traces)
    assert build_traces(small_corpus.dialogues, database, seed=0) == traces  # deterministic
    assert len(build_traces(small_corpus.dialogues, database, seed=0, max_traces=3)) == 3
    splits = {d.dialogue_id: d.split for d in small_corpus.dialogues}
    for trace in traces:
        assert splits[trace.dialogue_id] != "test"
        steps = [trace.reasoning[a:b] for a, b in split_steps(trace.reasoning)]
        assert trace.assumption_steps and trace.user_goal and trace.domain
        goal = next(d for d in small_corpus.dialogues if d.dialogue_id == trace.dialogue_id).goal
        for index in trace.assumption_steps:
            slot, value = committed_value(steps[index])
            if slot != "departure":
                # The assumed value is the goal's, and the user never said it in the input.
                assert goal.get(trace.domain).info[slot] == value == trace.user_goal[slot]
                assert "User: " in trace.input and value not in trace.input.split("\n")[0]


@pytest.mark.parametrize(
    ("records", "message"),
    [
        ([{"input": "x", "reasoning_content": "r", "content": "c"}, {"input": "x", "content": "c"}], "record '#1', field 'reasoning_content': missing"),
        ([{"id": "q7", "input": "x", "reasoning_content": 3, "content": "c"}], "record 'q7', field 'reasoning_content': expected a string, got int"),
        ([{"id": "q7", "input": "x", "reasoning_content": " \n\n ", "content": "c"}], "record 'q7', field 'reasoning_content': no reasoning step"),
        (["not an object"], "record '#0': expected an object"),
        ([{"id": "a", "input": "x", "reasoning_content": "r", "content": "c"}] * 2, "record 'a', field 'id': id 'a' repeats"),
        ([], "no records"),
    ],
)
def test_bad_records_name_the_file_record_and_field(records, message):
    with pytest.raises(DataError) as error:
        traces_from_records(records, "traces.jsonl")
    assert str(error.value).startswith("traces.jsonl") and message in str(error.value)


def test_trace_files_in_every_layout(tmp_path):
    record = {"id": "r1", "input": "Find x.", "reasoning_content": "a\n\nb", "content": "x"}
    (tmp_path / "t.jsonl").write_text(json.dumps(record) + "\n\n" + json.dumps({**record, "id": "r2"}) + "\n")
    (tmp_path / "t.json").write_text(json.dumps([record]))
    assert [t.trace_id for t in read_trace_file(tmp_path / "t.jsonl")] == ["r1", "r2"]
    assert read_trace_file(tmp_path / "t.json")[0].steps == [(0, 1), (3, 4)]
    (tmp_path / "bad.jsonl").write_text(json.dumps(record) + "\n{oops\n")
    with pytest.raises(DataError, match=r"bad.jsonl, record 'line 2': invalid JSON"):
        read_trace_file(tmp_path / "bad.jsonl")
    (tmp_path / "obj.json").write_text(json.dumps(record))
    with pytest.raises(DataError, match="expected a JSON array"):
        read_trace_file(tmp_path / "obj.json")
    with pytest.raises(DataError, match="file not found"):
        read_trace_file(tmp_path / "missing.jsonl")
    with pytest.raises(ConfigError, match=".jsonl, .json or .parquet"):
        read_trace_file(tmp_path / "t.csv")
