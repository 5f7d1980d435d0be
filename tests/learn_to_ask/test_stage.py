"""Stage ``hindsight``: chat-log input validated like every input (file, record and field
named; exit 1; no partial artifact), a real run on a chat log, and a real DVC run that is
idempotent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from catalog.io import read_artifact
from tests.conftest import REPO

GOOD = [
    {"session_id": "s1", "goal": "medication for a cough", "split": "train", "messages": [
        {"role": "user", "content": "I have a cough.", "info": [{"field": "symptom", "value": "cough"}]},
        {"role": "assistant", "content": "Do you have a fever?"},
        {"role": "user", "content": "No.", "info": [{"field": "fever", "value": "absent"}]},
        {"role": "assistant", "content": "Take an expectorant."},
    ]},
    {"session_id": "s2", "messages": [
        {"role": "user", "content": "A table for two.", "info": [{"field": "people", "value": "2"}]},
        {"role": "assistant", "content": "Which day?"},
        {"role": "user", "content": "Friday.", "info": [{"field": "day", "value": "friday"}]},
        {"role": "assistant", "content": "Booked."},
    ]},
]


def jsonl(records) -> str:
    return "".join(json.dumps(r) + "\n" for r in records)


def run_stage(root: Path, source: str, text: str, **section) -> subprocess.CompletedProcess:
    (root / source).write_text(text, encoding="utf-8")
    params = {
        "llm": {"cache_dir": "cache", "roles": {"extractor": {"backend": "rules"}}},
        "hindsight": {"source": source, "format": "chat_log", "stop_when": "no_info",
                      "output": "out/l2a_samples.parquet", "metrics": "out/hindsight.json", **section},
    }
    (root / "params.yaml").write_text(yaml.safe_dump(params), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    return subprocess.run([sys.executable, "-m", "stages.hindsight"], cwd=root, env=env, capture_output=True, text=True, timeout=300)


def test_a_chat_log_becomes_validated_samples_and_metrics(tmp_path):
    proc = run_stage(tmp_path, "logs.jsonl", jsonl(GOOD))
    assert proc.returncode == 0, proc.stderr
    table = read_artifact(tmp_path / "out/l2a_samples.parquet")  # runs the l2a_samples suite
    rows = {(r["session_id"], r["turn"]): r for r in table.to_pylist()}
    assert rows[("s1", 1)]["info_truth"] == [{"field": "fever", "value": "absent"}]
    assert rows[("s1", 1)]["decision_truth"] == "continue" and rows[("s1", 3)]["decision_truth"] == "stop"
    assert rows[("s2", 1)]["split"] is None and rows[("s1", 1)]["split"] == "train"
    assert len(rows[("s1", 3)]["context"]) == 3
    train = read_artifact(tmp_path / "out/l2a_train.parquet").to_pylist()  # the l2a_train suite
    assert [(r["dialogue_id"], r["step"]) for r in train] == [("s1", 1), ("s1", 3), ("s2", 1), ("s2", 3)]
    assert train[0]["prompt"][0]["role"] == "system" and train[0]["prompt"][1:] == rows[("s1", 1)]["context"]
    assert train[0]["completion"] == [{"role": "assistant", "content": "Do you have a fever?"}]
    assert train[1]["completion"] == [{"role": "assistant", "content": "<stop />"}] and train[1]["decision_truth"] == "stop"
    metrics = json.loads((tmp_path / "out/hindsight.json").read_text())
    assert metrics["sessions"] == 2 and metrics["kept"] == 4 and metrics["decisions"] == {"continue": 2, "stop": 2}
    # A JSON array of the same sessions is the same data.
    proc = run_stage(tmp_path, "logs.json", json.dumps(GOOD), output="out/again.parquet")
    assert proc.returncode == 0, proc.stderr
    assert pq.read_table(tmp_path / "out/again.parquet").equals(pq.read_table(tmp_path / "out/l2a_samples.parquet"))


def _replace(record: dict, path: list, value) -> dict:
    record = json.loads(json.dumps(record))
    target = record
    for key in path[:-1]:
        target = target[key]
    if value is KeyError:
        del target[path[-1]]
    else:
        target[path[-1]] = value
    return record


BAD = {
    "not_json": ("logs.jsonl", jsonl(GOOD[:1]) + "{oops\n", "logs.jsonl, record 'line 2': invalid JSON"),
    "no_session_id": ("logs.jsonl", jsonl([_replace(GOOD[0], ["session_id"], KeyError)]), "record 'line 1', field 'session_id': missing required field"),
    "bad_role": ("logs.jsonl", jsonl([_replace(GOOD[0], ["messages", 1, "role"], "doctor")]),
                 "record 's1', field 'messages[1].role': role must be one of ['user', 'assistant'], got 'doctor'"),
    "no_content": ("logs.jsonl", jsonl([_replace(GOOD[0], ["messages", 2, "content"], KeyError)]), "record 's1', field 'messages[2].content': missing required field"),
    "bad_info": ("logs.jsonl", jsonl([_replace(GOOD[0], ["messages", 2, "info", 0], {"field": "fever"})]), "record 's1', field 'messages[2].info[0]'"),
    "info_on_assistant": ("logs.jsonl", jsonl([_replace(GOOD[0], ["messages", 1, "info"], [])]), "field 'messages[1].info': only a user message reveals information"),
    "unknown_field": ("logs.jsonl", jsonl([_replace(GOOD[0], ["patient"], "x")]), "record 's1', field 'patient': unknown field(s)"),
    "bad_split": ("logs.jsonl", jsonl([_replace(GOOD[0], ["split"], "dev")]), "record 's1', field 'split'"),
    "duplicate": ("logs.jsonl", jsonl([GOOD[0], GOOD[0]]), "record 's1', field 'session_id': repeats the session_id of line 1"),
    "empty": ("logs.jsonl", "\n", "logs.jsonl: no sessions"),
    "not_an_array": ("logs.json", json.dumps(GOOD[0]), "logs.json: expected a JSON array of sessions"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_chat_logs_exit_1_naming_file_record_field_and_publish_nothing(tmp_path, case):
    source, text, message = BAD[case]
    proc = run_stage(tmp_path, source, text)
    assert proc.returncode == 1
    assert proc.stderr.startswith("error: ") and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "out").exists()


def test_a_bad_input_leaves_the_previous_artifact_untouched(tmp_path):
    assert run_stage(tmp_path, "logs.jsonl", jsonl(GOOD)).returncode == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    proc = run_stage(tmp_path, "logs.jsonl", jsonl([GOOD[0], _replace(GOOD[1], ["messages"], [])]))
    assert proc.returncode == 1 and "record 's2', field 'messages'" in proc.stderr
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


def test_missing_source_and_bad_params_are_errors(tmp_path):
    (tmp_path / "params.yaml").write_text(yaml.safe_dump({"hindsight": {
        "source": "nope.jsonl", "format": "chat_log", "output": "o.parquet", "metrics": "m.json"}}))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "stages.hindsight"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "error: nope.jsonl: file not found" in proc.stderr
    for section, message in (({"stop_when": "never"}, "hindsight.stop_when"), ({"format": "csv"}, "hindsight.format"),
                             ({"max_sessions": 0}, "hindsight.max_sessions")):
        proc = run_stage(tmp_path, "logs.jsonl", jsonl(GOOD), **section)
        assert proc.returncode == 1 and message in proc.stderr, proc.stderr


def test_an_llm_extractor_must_decode_greedily(tmp_path):
    from pipelines.errors import ConfigError
    from stages.hindsight import extractor_backend

    with pytest.raises(ConfigError, match="llm.roles.extractor.sampling.temperature"):
        extractor_backend({"roles": {"extractor": {"backend": "hf", "model_path": "models/smollm2", "sampling": {"temperature": 0.7}}}})
    assert extractor_backend(None).kind == "rules"


@pytest.mark.slow
def test_dvc_repro_hindsight_on_the_embedded_corpus_is_idempotent(tmp_path):
    from tests.test_dvc_pipeline import _run, pipeline_project, shrink

    project = pipeline_project(tmp_path / "project", shrink)
    first = _run([sys.executable, "-m", "dvc", "repro", "hindsight"], project)
    assert "Running stage 'corpus'" in first.stdout and "Running stage 'hindsight'" in first.stdout
    table = read_artifact(project / "data/processed/l2a/l2a_samples.parquet")
    train = read_artifact(project / "data/processed/l2a/l2a_train.parquet")
    assert "test" not in set(train.column("split").to_pylist()) and 0 < train.num_rows < table.num_rows
    metrics = json.loads((project / "reports/hindsight.json").read_text())
    assert metrics["sessions"] == 60 and metrics["extractor"] == "rules" and metrics["kept"] == table.num_rows
    assert metrics["decisions"]["continue"] > 0 and metrics["decisions"]["stop"] >= 60  # every last turn stops
    second = _run([sys.executable, "-m", "dvc", "repro", "hindsight"], project)
    assert "Running stage" not in second.stdout
    assert "Data and pipelines are up to date" in second.stdout


def test_test_split_and_dropped_samples_stay_out_of_the_training_rows():
    from pipelines.learn_to_ask.hindsight import RulesExtractor, hindsight_samples
    from pipelines.learn_to_ask.logs import parse_chat_logs
    from pipelines.learn_to_ask.tables import train_table

    sessions = parse_chat_logs([("line 1", GOOD[0]), ("line 2", {**GOOD[1], "split": "test"})], "logs.jsonl")
    samples = hindsight_samples(sessions, RulesExtractor(), "no_user_reply")
    train = train_table(samples, "system").to_pylist()
    assert {r["dialogue_id"] for r in train} == {"s1"} and all(r["split"] == "train" for r in train)
