"""Bad τ-bench files stop with a DataError naming the file, the record and the field."""

from __future__ import annotations

import copy
import json

import pytest

from pipelines.errors import DataError
from catalog.taubench_dir import load_ground_truth_replay, load_taubench_domain
from tests.taubench.conftest import mini_retail_tables, mini_retail_tasks, write_mini_retail


def test_the_mini_domain_loads_with_every_split(mini_retail):
    assert [len(mini_retail.tasks[s]) for s in ("train", "dev", "test")] == [2, 2, 2]
    assert mini_retail.tasks["dev"][1].task_id == "retail/dev/1"
    assert len(mini_retail.tool_names) == 16 and mini_retail.rules == ("Authenticate first.",)


def _task_error(tmp_path, tasks) -> DataError:
    root = write_mini_retail(tmp_path / "t", tasks=tasks)
    with pytest.raises(DataError) as caught:
        load_taubench_domain(root, "retail", splits=("test",))
    return caught.value


def _broken_task(edit) -> list:
    tasks = mini_retail_tasks()
    edit(tasks[1])
    return tasks


@pytest.mark.parametrize(
    ("tasks", "record", "field", "message"),
    [
        ('{"not": "a list"}', None, None, "must be a JSON list, got object"),
        ("[]", None, None, "no tasks"),
        (["a string"], "task 0", None, "a task must be an object, got string"),
        (_broken_task(lambda t: t.pop("instruction")), "task 1", "instruction", "must be a non-empty string (missing)"),
        (_broken_task(lambda t: t.update(user_id=7)), "task 1", "user_id", "must be a non-empty string (got integer 7)"),
        (_broken_task(lambda t: t.update(actions={})), "task 1", "actions", "must be a list of actions, got object"),
        (_broken_task(lambda t: t["actions"].append({"name": "refund_everything", "kwargs": {}})), "task 1",
         "actions[1].name", "unknown retail tool 'refund_everything'"),
        (_broken_task(lambda t: t["actions"][0].update(kwargs="#W2")), "task 1", "actions[0].kwargs",
         "must be an object of arguments, got string"),
        (_broken_task(lambda t: t.update(outputs=[40.0])), "task 1", "outputs", "must be a list of strings"),
    ],
)
def test_bad_task_files_name_file_record_and_field(tmp_path, tasks, record, field, message):
    error = _task_error(tmp_path, tasks)
    assert error.source.endswith("retail/tasks_test.json")
    assert (error.record, error.field) == (record, field)
    assert message in error.message
    assert str(error).startswith(error.source)


def test_invalid_json_is_named_with_its_line(tmp_path):
    error = _task_error(tmp_path, '[{"user_id": "a",\n "instruction": }]')
    assert error.source.endswith("tasks_test.json") and "invalid JSON" in error.message and "line 2" in error.message


@pytest.mark.parametrize(
    ("table", "edit", "record", "field", "message"),
    [
        ("orders", lambda t: t["#W1"].pop("status"), "#W1", "status", "missing"),
        ("orders", lambda t: t["#W2"].update(items="shirt"), "#W2", "items", "must be array, got string"),
        ("orders", lambda t: t["#W2"].update(order_id="#W9"), "#W2", "order_id", "differs from the record's key"),
        ("users", lambda t: t["ann_lee_1"].update(payment_methods=[]), "ann_lee_1", "payment_methods", "must be object"),
        ("products", lambda t: t.update({"200": "T-Shirt"}), "200", None, "a record must be an object, got string"),
        ("products", lambda t: t.clear(), None, None, "empty table"),
    ],
)
def test_bad_tables_name_file_record_and_field(tmp_path, table, edit, record, field, message):
    tables = copy.deepcopy(mini_retail_tables())
    edit(tables[table])
    root = write_mini_retail(tmp_path / "t", tables=tables)
    with pytest.raises(DataError) as caught:
        load_taubench_domain(root, "retail")
    error = caught.value
    assert error.source.endswith(f"retail/{table}.json")
    assert (error.record, error.field) == (record, field)
    assert message in error.message


def test_missing_files_and_unknown_names(tmp_path, mini_root):
    (mini_root / "retail" / "wiki.md").unlink()
    with pytest.raises(DataError, match=r"retail/wiki.md: file not found"):
        load_taubench_domain(mini_root, "retail")
    with pytest.raises(DataError, match="unknown τ-bench domain 'hotel'"):
        load_taubench_domain(mini_root, "hotel")
    with pytest.raises(DataError, match="unknown split 'val' for retail"):
        load_taubench_domain(write_mini_retail(tmp_path / "u"), "retail", splits=("val",))
    with pytest.raises(DataError, match="airline: τ-bench domain directory not found"):
        load_taubench_domain(mini_root, "airline")
    with pytest.raises(DataError, match="ground_truth_replay.json: file not found"):
        load_ground_truth_replay(mini_root, "retail")


def test_tool_schemas_must_match_the_implemented_tools(tmp_path):
    root = write_mini_retail(tmp_path / "t")
    path = root / "retail" / "tools.json"
    schemas = json.loads(path.read_text())
    path.write_text(json.dumps(schemas[1:]))
    with pytest.raises(DataError, match="tool\\(s\\) calculate not described"):
        load_taubench_domain(root, "retail")
    schemas.append(dict(schemas[0], function=dict(schemas[0]["function"], name="teleport")))
    path.write_text(json.dumps(schemas))
    with pytest.raises(DataError) as caught:
        load_taubench_domain(root, "retail")
    assert (caught.value.record, caught.value.field) == ("teleport", "function.name")


def test_a_replay_file_that_does_not_fit_the_tasks_is_refused(mini_retail, mini_root):
    from pipelines.env.taubench.conformance import check_conformance

    with pytest.raises(DataError) as caught:
        check_conformance(mini_retail, [{"split": "test", "task_index": 5, "calls": []}], "replay.json")
    assert (caught.value.record, caught.value.field) == ("replay 0", "task_index")
    # A replay whose calls are not the task's actions conforms to nothing.
    report = check_conformance(mini_retail, [{"split": "test", "task_index": 1, "calls": [], "changed_records": {}}])
    assert report.tasks_conforming == 0 and "not the task's actions" in report.failures[0]
