"""Insertion by character offset, the rules inserter, the rules teacher's traces and bad
trace files."""

from __future__ import annotations

import json

import pytest

from pipelines.env.tools import Database
from pipelines.errors import ConfigError, DataError
from pipelines.pir.insertion import (
    NO_GROUNDED_QUESTION, Insertion, RulesInserter, Skipped, insert_pairs, insertion_messages, parse_round,
)
from pipelines.pir.traces import Ask, Trace, build_traces, split_steps, traces_from_records
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


def test_rules_inserter_asks_only_about_assumed_constraints():
    trace = Trace("t", "in", "s0\n\ns1\n\ns2", "out", "embedded", assumption_steps=(1,), asks={1: Ask("area", "Which area?", "The north.")})
    assert RulesInserter().insertions([trace], [(1, 2)]) == [[Insertion(1, "Which area?", "The north."), Skipped(2, NO_GROUNDED_QUESTION)]]
    with pytest.raises(ValueError, match="rules inserter needs askflow's embedded traces"):
        RulesInserter().insertions([Trace("f", "in", "s0", "out", "file.jsonl")], [(0,)])


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
        assert trace.assumption_steps and set(trace.asks) == set(trace.assumption_steps)
        for index in trace.assumption_steps:
            ask = trace.asks[index]
            if ask.slot != "departure":
                # The assumed value is the goal's, and the user never said it in the input.
                goal = next(d for d in small_corpus.dialogues if d.dialogue_id == trace.dialogue_id).goal
                value = goal.get(trace.trace_id.split(":")[1]).info[ask.slot]
                assert value in steps[index] and value.lower() in ask.answer.lower()
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
