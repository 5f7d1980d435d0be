"""The artifact contract: specs, validation through Great Expectations, atomic publishing,
and the strict readers of catalog.io.

Performance sanity check (measured by hand on a 2-core container, not a timed test):
publishing 250,000 turns (the TURNS spec below, list<struct> acts column included) that
reference 25,000 dialogues took 2.3 s together with the dialogues, of which ~2 s is GX's
one-off import; publishing the turns again with the parent read back from disk took
0.26 s. The reference check (pc.is_in) takes ~10 ms, where GX's own
expect_column_values_to_be_in_set with the 25,000 ids as value_set takes ~1.8 s.
"""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.artifacts.spec import (
    ArtifactSpec,
    Expectation,
    Reference,
    between,
    in_set,
    length_between,
    not_null,
    row_count_between,
    unique,
)
from pipelines.artifacts.validate import check_schema, check_suite, validate
from pipelines.errors import ConfigError, DataError, ValidationFailed
from stages.entry import main_wrapper
from catalog.io import publish, read_json, read_params, read_text, write_json_atomic

ACT = pa.struct([("act", pa.string()), ("slot", pa.string()), ("value", pa.string())])

DIALOGUES = ArtifactSpec(
    name="dialogues",
    min_rows=1,
    schema=pa.schema(
        [
            pa.field("dialogue_id", pa.string(), nullable=False),
            pa.field("split", pa.string()),
            pa.field("domains", pa.list_(pa.string()), nullable=False),
        ]
    ),
    keys=("dialogue_id",),
    expectations=(in_set("split", ("train", "val", "test")),),
    description="one row per dialogue",
)

TURNS = ArtifactSpec(
    name="turns",
    min_rows=1,
    schema=pa.schema(
        [
            pa.field("dialogue_id", pa.string()),
            pa.field("index", pa.int32()),
            pa.field("speaker", pa.string()),
            pa.field("text", pa.string()),
            pa.field("acts", pa.list_(ACT)),
        ]
    ),
    keys=("dialogue_id", "index"),
    expectations=(in_set("speaker", ("user", "system")), between("index", 0, 200), length_between("text", 1)),
    references=(Reference("dialogue_id", "dialogues", "dialogue_id"),),
    description="one row per turn",
)


def dialogues_table(**overrides: list) -> pa.Table:
    columns = {
        "dialogue_id": ["SNG01", "SNG02", "MUL03"],
        "split": ["train", "val", "test"],
        "domains": [["hotel"], ["taxi"], ["hotel", "train"]],
    }
    return pa.table({**columns, **overrides})


def turns_table(**overrides: list) -> pa.Table:
    columns = {
        "dialogue_id": ["SNG01", "SNG01", "SNG02", "MUL03"],
        "index": pa.array([0, 1, 0, 0], pa.int32()),
        "speaker": ["user", "system", "user", "user"],
        "text": ["I need a hotel.", "Which area?", "Book a taxi.", "A train, please."],
        "acts": [[{"act": "Hotel-Inform", "slot": "type", "value": "hotel"}], None, [], None],
    }
    return pa.table({**columns, **overrides})


def failed(report, type_: str, column: str):
    """The one failed result of ``type_`` on ``column`` (fails the test if there is none)."""
    matches = [r for r in report.failures if r.type == type_ and r.column == column]
    assert len(matches) == 1, report.to_text()
    return matches[0]


# --- Specs ----------------------------------------------------------------------------------


def test_spec_implies_key_and_non_nullable_checks():
    assert DIALOGUES.implied_expectations == (row_count_between(1), not_null("dialogue_id"), not_null("domains"), unique("dialogue_id"))
    assert TURNS.implied_expectations == (row_count_between(1), not_null("dialogue_id"), not_null("index"), unique("dialogue_id", "index"))
    assert unique("a", "b") == Expectation("expect_compound_columns_to_be_unique", {"column_list": ("a", "b")})


def test_spec_suite_does_not_repeat_a_declared_implied_check():
    spec = ArtifactSpec("t", pa.schema([("id", pa.string())]), min_rows=1, keys=("id",), expectations=(not_null("id"),))
    assert spec.suite == (row_count_between(1), not_null("id"), unique("id"))


def test_every_spec_declares_a_minimum_row_count_and_an_empty_table_fails():
    from pipelines.episodes.tables import SPECS as EPISODE_SPECS
    from pipelines.multiwoz.tables import SPECS as MULTIWOZ_SPECS
    from pipelines.speaker.tables import SPECS as SPEAKER_SPECS

    for spec in [*MULTIWOZ_SPECS.values(), *SPEAKER_SPECS.values(), *EPISODE_SPECS.values()]:
        assert spec.min_rows >= 1 and row_count_between(spec.min_rows) in spec.suite, spec.name
        related = {r.artifact: pa.table({r.other_column: pa.array([], pa.string())}) for r in spec.references}
        report = validate(spec.schema.empty_table(), spec, related)
        assert not report.success, f"an empty {spec.name} must fail its suite"
        assert failed(report, "expect_table_row_count_to_be_between", None).observed_value == 0
    with pytest.raises(TypeError):
        ArtifactSpec("t", pa.schema([("a", pa.int64())]))  # no min_rows: not a spec
    with pytest.raises(ConfigError, match="min_rows"):
        ArtifactSpec("t", pa.schema([("a", pa.int64())]), min_rows=0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"keys": ("nope",)}, "'turns': key: column 'nope' is not in the schema"),
        ({"keys": ("acts",)}, "key: column 'acts' has nested type list<"),
        ({"expectations": (in_set("acts", ["x"]),)}, "expect_column_values_to_be_in_set: column 'acts' has nested type"),
        ({"expectations": (between("nope", 0),)}, "expect_column_values_to_be_between: column 'nope' is not in the schema"),
        ({"references": (Reference("nope", "dialogues", "dialogue_id"),)}, "reference nope -> dialogues.dialogue_id: column 'nope'"),
        ({"expectations": (Expectation("expect_column_values_to_not_be_null", {"column": "acts", "mostly": 0.9}),)}, "takes no other"),
    ],
)
def test_spec_rejects_inconsistent_declarations(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ArtifactSpec("turns", TURNS.schema, min_rows=1, **kwargs)


def test_not_null_is_allowed_on_a_nested_column():
    spec = ArtifactSpec("turns", TURNS.schema, min_rows=1, expectations=(not_null("acts"),))
    report = validate(turns_table(), spec)
    assert failed(report, "expect_column_values_to_not_be_null", "acts").unexpected_count == 2


def test_expectation_type_must_be_snake_case_gx_name():
    with pytest.raises(ConfigError, match="snake case"):
        Expectation("ExpectColumnValuesToNotBeNull", {"column": "a"})


def test_check_suite_rejects_unknown_expectations_and_bad_arguments():
    check_suite(TURNS)
    unknown = ArtifactSpec("t", pa.schema([("a", pa.int64())]), min_rows=1, expectations=(Expectation("expect_magic", {"column": "a"}),))
    with pytest.raises(ConfigError, match="GX has no expectation 'expect_magic'"):
        check_suite(unknown)
    misspelt = ArtifactSpec(
        "t", pa.schema([("a", pa.int64())]), min_rows=1, expectations=(Expectation("expect_column_values_to_be_in_set", {"column": "a", "value_sett": [1]}),)
    )
    with pytest.raises(ConfigError, match="value_sett"):
        check_suite(misspelt)


# --- Validation -----------------------------------------------------------------------------


def test_valid_tables_pass_every_check(capfd):
    report = validate(turns_table(), TURNS, {"dialogues": dialogues_table()})
    assert report.success, report.to_text()
    assert len(report.results) == len(TURNS.suite) + 1  # + the reference
    assert report.to_text().startswith("artifact 'turns' (4 rows): all 8 checks passed")
    json.dumps(report.to_dict(), allow_nan=False)
    out, err = capfd.readouterr()
    assert out == "" and err == ""  # no GX progress bars or log lines


@pytest.mark.parametrize(
    ("table", "type_", "column", "count", "example"),
    [
        (turns_table(dialogue_id=["SNG01", None, "SNG02", "MUL03"]), "expect_column_values_to_not_be_null", "dialogue_id", 1, None),
        (turns_table(speaker=["user", "robot", "user", "user"]), "expect_column_values_to_be_in_set", "speaker", 1, "robot"),
        (turns_table(index=pa.array([0, 0, 0, 0], pa.int32())), "expect_compound_columns_to_be_unique", "dialogue_id, index", 2, {"dialogue_id": "SNG01", "index": 0}),
        (turns_table(dialogue_id=["SNG01", "SNG01", "SNG02", "GONE9"]), "expect_column_values_to_be_in_set", "dialogue_id", 1, "GONE9"),
        (turns_table(index=pa.array([0, 1, 0, 500], pa.int32())), "expect_column_values_to_be_between", "index", 1, 500),
        (turns_table(text=["hi", "", "yes", "no"]), "expect_column_value_lengths_to_be_between", "text", 1, ""),
    ],
    ids=["null-key", "outside-set", "duplicate-key", "dangling-reference", "out-of-range", "empty-text"],
)
def test_a_broken_table_fails_the_check_it_breaks(table, type_, column, count, example):
    report = validate(table, TURNS, {"dialogues": dialogues_table()})
    assert not report.success
    assert len(report.failures) == 1, report.to_text()
    result = failed(report, type_, column)
    assert (result.unexpected_count, result.element_count) == (count, 4)
    assert result.unexpected_examples == (example,)
    text = report.to_text()
    assert "1 of 8 checks failed" in text
    assert f"FAILED  {type_}(" in text and repr(column.split(", ")[0]) in text
    assert f"{count} of 4 rows unexpected; e.g. {example!r}" in text


def test_duplicate_single_key_lists_each_duplicate_once():
    table = dialogues_table(dialogue_id=["SNG01", "SNG01", "SNG01"])
    result = failed(validate(table, DIALOGUES), "expect_column_values_to_be_unique", "dialogue_id")
    assert result.unexpected_count == 3 and result.unexpected_examples == ("SNG01",)


def test_table_level_expectation_reports_what_it_observed():
    spec = ArtifactSpec("t", pa.schema([("a", pa.int64())]), min_rows=1, expectations=(row_count_between(10),))
    result = failed(validate(pa.table({"a": [1, 2]}), spec), "expect_table_row_count_to_be_between", None)
    assert result.observed_value == 2
    assert "observed 2" in result.to_text()


def test_gx_evaluation_errors_are_reported_not_raised():
    spec = ArtifactSpec("t", pa.schema([("s", pa.string())]), min_rows=1, expectations=(between("s", 0, 1),))
    result = failed(validate(pa.table({"s": ["a"]}), spec), "expect_column_values_to_be_between", "s")
    assert result.error and "could not be evaluated" in result.to_text()


def test_self_reference_needs_no_related_table():
    schema = pa.schema([("id", pa.string()), ("parent", pa.string())])
    spec = ArtifactSpec("tree", schema, min_rows=1, keys=("id",), references=(Reference("parent", "tree", "id"),))
    report = validate(pa.table({"id": ["a", "b"], "parent": [None, "x"]}), spec)
    result = failed(report, "expect_column_values_to_be_in_set", "parent")
    assert (result.unexpected_count, result.unexpected_examples) == (1, ("x",))  # the null is no dangling parent


def test_reference_to_an_artifact_not_given_is_a_config_error():
    with pytest.raises(ConfigError, match="references 'dialogues', which was not given"):
        validate(turns_table(), TURNS, {})


def test_schema_mismatch_is_reported_and_the_suite_skipped():
    table = turns_table().drop_columns(["text"]).set_column(1, "index", pa.array(["0", "1", "0", "0"]))
    table = table.append_column("extra", pa.array([1, 2, 3, 4]))
    diff = check_schema(table, TURNS)
    assert [f.name for f in diff.missing] == ["text"] and [f.name for f in diff.extra] == ["extra"]
    assert diff.mistyped == (("index", pa.int32(), pa.string()),)
    report = validate(table, TURNS, {"dialogues": dialogues_table()})
    assert not report.success and report.results == ()
    text = report.to_text()
    assert "missing column 'text' (string)" in text
    assert "unexpected column 'extra' (int64)" in text
    assert "column 'index': expected int32, got string" in text


# --- Publishing -----------------------------------------------------------------------------


def published(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


@pytest.fixture
def outdir(tmp_path: Path) -> Path:
    """A directory holding a previous, valid publication of both artifacts."""
    directory = tmp_path / "data" / "interim"
    publish({directory / "dialogues.parquet": (dialogues_table(), DIALOGUES), directory / "turns.parquet": (turns_table(), TURNS)})
    return directory


def test_publish_writes_zstd_parquet_with_the_spec_schema(tmp_path: Path):
    directory = tmp_path / "out"
    report_path = tmp_path / "reports" / "interim.json"
    # Types the spec declares narrower (index int64 -> int32) are cast on the way out.
    turns = turns_table().set_column(1, "index", pa.array([0, 1, 0, 0], pa.int64()))
    summary = publish(
        {directory / "turns.parquet": (turns, TURNS), directory / "dialogues.parquet": (dialogues_table(), DIALOGUES)},
        report_path,
    )
    assert summary["success"] is True
    assert sorted(p.name for p in directory.iterdir()) == ["dialogues.parquet", "turns.parquet"]
    written = pq.read_table(directory / "turns.parquet")
    assert written.schema.equals(TURNS.schema)
    assert written.equals(turns_table())
    assert pq.ParquetFile(directory / "turns.parquet").metadata.row_group(0).column(0).compression == "ZSTD"
    assert json.loads(report_path.read_text()) == summary
    assert summary["artifacts"]["turns"]["path"] == str(directory / "turns.parquet")


@pytest.mark.parametrize(
    ("broken", "expectation", "column"),
    [
        (turns_table(dialogue_id=["SNG01", None, "SNG02", "MUL03"]), "expect_column_values_to_not_be_null", "'dialogue_id'"),
        (turns_table(speaker=["user", "robot", "user", "user"]), "expect_column_values_to_be_in_set", "'speaker'"),
        (turns_table(index=pa.array([0, 0, 0, 0], pa.int32())), "expect_compound_columns_to_be_unique", "'dialogue_id', 'index'"),
        (turns_table(dialogue_id=["SNG01", "SNG01", "SNG02", "GONE9"]), "expect_column_values_to_be_in_set", "'dialogue_id'"),
    ],
    ids=["null-key", "outside-set", "duplicate-key", "dangling-reference"],
)
def test_failing_suite_leaves_previous_artifacts_untouched(outdir: Path, tmp_path: Path, broken, expectation, column):
    before = published(outdir)
    report_path = tmp_path / "report.json"
    new_dialogues = dialogues_table(split=["train", "train", "train"])  # valid, but must not land either
    with pytest.raises(ValidationFailed) as raised:
        publish({outdir / "dialogues.parquet": (new_dialogues, DIALOGUES), outdir / "turns.parquet": (broken, TURNS)}, report_path)
    assert published(outdir) == before  # byte-identical, and no temporary files left
    assert raised.value.artifact == "turns"
    message = str(raised.value)
    assert message.startswith("artifact 'turns' failed validation:")
    assert f"FAILED  {expectation}(" in message and column in message
    assert "rows unexpected" in message
    report = json.loads(report_path.read_text())
    assert report["success"] is False
    assert report["artifacts"]["dialogues"]["success"] is True
    assert [r["type"] for r in report["artifacts"]["turns"]["results"] if not r["success"]] == [expectation]


def test_reference_falls_back_to_the_published_parent(outdir: Path):
    publish({outdir / "turns.parquet": (turns_table(text=["a", "b", "c", "d"]), TURNS)})
    assert pq.read_table(outdir / "turns.parquet").column("text").to_pylist() == ["a", "b", "c", "d"]
    dangling = turns_table(dialogue_id=["SNG01", "SNG01", "SNG02", "GONE9"])
    with pytest.raises(ValidationFailed, match="value_set=dialogues.dialogue_id\\): 1 of 4 rows unexpected; e.g. 'GONE9'"):
        publish({outdir / "turns.parquet": (dangling, TURNS)})


def test_missing_parent_artifact_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="references 'dialogues', which is not being published"):
        publish({tmp_path / "turns.parquet": (turns_table(), TURNS)})
    assert list(tmp_path.iterdir()) == []


def test_uncastable_column_is_named(outdir: Path):
    before = published(outdir)
    bad = turns_table().set_column(1, "index", pa.array(["0", "one", "0", "0"]))
    with pytest.raises(DataError) as raised:
        publish({outdir / "turns.parquet": (bad, TURNS)})
    assert "turns.parquet, field 'index': cannot cast string to int32" in str(raised.value)
    assert published(outdir) == before


def test_missing_and_extra_columns_are_named(outdir: Path):
    bad = turns_table().drop_columns(["speaker"]).append_column("mood", pa.array(["ok"] * 4))
    with pytest.raises(DataError, match="missing column 'speaker' \\(string\\); unexpected column 'mood' \\(string\\)"):
        publish({outdir / "turns.parquet": (bad, TURNS)})


def test_nulls_in_a_non_nullable_field_fail_the_suite(outdir: Path):
    before = published(outdir)
    with pytest.raises(ValidationFailed, match="expect_column_values_to_not_be_null\\(column='domains'\\): 1 of 3"):
        publish({outdir / "dialogues.parquet": (dialogues_table(domains=[["hotel"], None, []]), DIALOGUES)})
    assert published(outdir) == before


def test_the_same_artifact_twice_is_a_config_error(tmp_path: Path):
    with pytest.raises(ConfigError, match="published twice"):
        publish({tmp_path / "a.parquet": (dialogues_table(), DIALOGUES), tmp_path / "b.parquet": (dialogues_table(), DIALOGUES)})


# --- Reading and writing files --------------------------------------------------------------


def test_read_json_reads_strict_json(tmp_path: Path):
    path = tmp_path / "ok.json"
    path.write_text('{"a": [1, {"b": "é"}], "c": {"a": 2}}', encoding="utf-8")
    assert read_json(path) == {"a": [1, {"b": "é"}], "c": {"a": 2}}


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b'{"a": 1,\n "b": }', "invalid JSON: Expecting value at line 2, column 7"),
        (b'{"goal": {"hotel": {}, "taxi": {}, "hotel": {"area": "north"}}}', "duplicate key 'hotel' in a JSON object"),
        (b'{"text": "caf\xe9"}', "not valid UTF-8: invalid continuation byte at byte 13 (line 1)"),
    ],
    ids=["invalid-json", "duplicate-key", "not-utf8"],
)
def test_read_json_errors_name_the_file(tmp_path: Path, content: bytes, message: str):
    path = tmp_path / "data.json"
    path.write_bytes(content)
    with pytest.raises(DataError) as raised:
        read_json(path)
    assert str(raised.value) == f"{path}: {message}"
    assert raised.value.source == str(path)


def test_read_json_missing_file(tmp_path: Path):
    with pytest.raises(DataError) as raised:
        read_json(tmp_path / "nope.json")
    assert str(raised.value) == f"{tmp_path / 'nope.json'}: file not found"


def test_read_text_is_strict_utf8(tmp_path: Path):
    path = tmp_path / "a.txt"
    path.write_bytes("ok\n".encode() + b"\xff")
    with pytest.raises(DataError, match=r"a\.txt: not valid UTF-8: invalid start byte at byte 3 \(line 2\)"):
        read_text(path)


def test_read_params(tmp_path: Path):
    path = tmp_path / "params.yaml"
    path.write_text("prepare:\n  seed: 7\n  splits: [train, val]\ntrain: {}\n")
    assert read_params("prepare", path) == {"seed": 7, "splits": ["train", "val"]}
    with pytest.raises(ConfigError, match="no section 'evaluate' \\(sections: prepare, train\\)"):
        read_params("evaluate", path)
    with pytest.raises(ConfigError, match="file not found"):
        read_params("prepare", tmp_path / "missing.yaml")
    path.write_text("prepare: [1, 2\n")
    with pytest.raises(ConfigError, match="invalid YAML"):
        read_params("prepare", path)


def test_write_json_atomic_replaces_the_file_and_leaves_no_temp(tmp_path: Path):
    path = tmp_path / "metrics" / "m.json"
    write_json_atomic(path, {"accuracy": 0.5})
    write_json_atomic(path, {"accuracy": 0.75, "name": "é"})
    assert read_json(path) == {"accuracy": 0.75, "name": "é"}
    with pytest.raises(ValueError):
        write_json_atomic(path, {"accuracy": float("nan")})
    assert read_json(path) == {"accuracy": 0.75, "name": "é"}
    assert [p.name for p in path.parent.iterdir()] == ["m.json"]


def test_main_wrapper_turns_askflow_errors_into_exit_status_1(capsys):
    @main_wrapper
    def stage(path: str) -> int:
        raise DataError(path, "bad record", record="SNG01")

    with pytest.raises(SystemExit) as raised:
        stage("in.json")
    assert raised.value.code == 1
    assert capsys.readouterr().err == "error: in.json, record 'SNG01': bad record\n"


def test_main_wrapper_keeps_other_exceptions_and_return_values():
    assert main_wrapper(lambda: 3)() == 3

    @main_wrapper
    def buggy() -> None:
        raise KeyError("bug")

    with pytest.raises(KeyError):
        buggy()
