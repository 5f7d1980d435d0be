"""Issue 19 item 4: training validates its Parquet inputs with their expectation suites before
use, and a damaged Parquet is a data error naming the file, never retried.

Issue 28 item 1: the checks follow the source's declared schema (``schema:``, else the
method's training contract), not the file's name; a bad row stops ``python -m stages.train``
before the Prefect server and the tokenizer start, naming file, record and field."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import ConfigError, DataError, ValidationFailed
from pipelines.training.config import SourceSpec
from pipelines.preflight.inputs import check_inputs
from catalog.io import read_artifact
from tests.conftest import REPO

from .conftest import tiny_config, tiny_tables

pytestmark = [pytest.mark.timeout(300)]


def _copy_data(tiny_data_dir: Path, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    shutil.copytree(tiny_data_dir, data)
    return data


def _rewrite_sft(data: Path, change) -> Path:
    path = data / "speaker_sft.parquet"
    pq.write_table(change(pq.read_table(path)), path)
    return path


def _damage_first_page(path: Path) -> None:
    """Overwrite the bytes after the leading magic: the first data page breaks, the footer
    (and so the schema) stays readable."""
    data = bytearray(path.read_bytes())
    data[8:72] = b"\xff" * 64
    path.write_bytes(bytes(data))


def _set_column(table: pa.Table, name: str, values: pa.Array) -> pa.Table:
    return table.set_column(table.schema.get_field_index(name), table.schema.field(name).with_type(values.type), values)


def _step_minus_one(table: pa.Table) -> pa.Table:
    steps = table["step"].to_pylist()
    return _set_column(table, "step", pa.array([-1, *steps[1:]], pa.int32()))


def _step_as_text(table: pa.Table) -> pa.Table:
    return _set_column(table, "step", pa.array([str(s) for s in table["step"].to_pylist()]))


def _unknown_kind(table: pa.Table) -> pa.Table:
    return table.append_column(pa.field("kind", pa.string(), nullable=False), pa.array(["teleport"] * table.num_rows))


@pytest.mark.parametrize(
    "change, message",
    [
        (_step_minus_one, r"FAILED\s+expect_column_values_to_be_between\(column='step', min_value=0\)"),
        (_step_as_text, r"column 'step': expected int32, got string"),
        (_unknown_kind, r"FAILED\s+expect_column_values_to_be_in_set\(column='kind'.*teleport"),
    ],
)
def test_a_training_input_breaking_its_suite_is_refused_naming_the_file(tiny_data_dir, tmp_path, change, message):
    path = _rewrite_sft(_copy_data(tiny_data_dir, tmp_path), change)
    with pytest.raises(ValidationFailed, match=message) as failure:
        read_artifact(path)
    assert str(path) in str(failure.value)


def test_an_empty_training_input_is_refused(tiny_data_dir, tmp_path):
    path = _rewrite_sft(_copy_data(tiny_data_dir, tmp_path), lambda t: t.slice(0, 0))
    with pytest.raises(ValidationFailed, match="expect_table_row_count_to_be_between"):
        read_artifact(path)


def test_a_corrupt_parquet_is_a_data_error_naming_the_file(tmp_path):
    path = tmp_path / "speaker_sft.parquet"
    pq.write_table(tiny_tables()["speaker_sft"], path)
    _damage_first_page(path)
    assert pq.read_schema(path).names  # what a schema-only preflight sees: nothing wrong

    with pytest.raises(DataError, match=rf"^{path}: not readable Parquet"):
        read_artifact(path)


def test_the_train_flow_fails_on_bad_input_without_retrying_or_publishing(
    prefect_api, single_torch_thread, tiny_model_dir, tiny_data_dir, tmp_path
):
    from prefect import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterId

    from flows.train import retry_on_transient, train_sft

    data = _copy_data(tiny_data_dir, tmp_path)
    path = data / "speaker_sft.parquet"
    _damage_first_page(path)
    config = tiny_config("sft", tiny_model_dir, data, tmp_path)

    state = train_sft(config, return_state=True)

    assert state.is_failed()
    with pytest.raises(DataError, match=str(path)) as failure:
        state.result()
    assert not retry_on_transient(None, None, type("S", (), {"data": failure.value})())
    with get_client(sync_client=True) as client:
        runs = client.read_task_runs(flow_run_filter=FlowRunFilter(id=FlowRunFilterId(any_=[state.state_details.flow_run_id])))
    # The inputs are read and validated by preflight (issue 28), before the tokenizer loads.
    failed = [r for r in runs if r.state is not None and r.state.is_failed()]
    assert [r.name.split("-")[0] for r in failed] == ["preflight"] and failed[0].run_count == 1, "a damaged file is not retried"
    assert not any(r.name.startswith(("load-tokenizer", "load-datasets")) for r in runs)
    assert not Path(config.output.model_dir).exists()

    pq.write_table(_step_minus_one(tiny_tables()["speaker_sft"]), path)
    state = train_sft(config, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValidationFailed, match="step"):
        state.result()
    assert not Path(config.output.model_dir).exists()


# --- Issue 28 item 1: by declared schema, whatever the file is called ---------------------------


def _sft_rows() -> list[dict]:
    """The tiny SFT rows with the artifact's ``kind`` column (clarify, then a tool call)."""
    rows = tiny_tables()["speaker_sft"].to_pylist()
    return [{**r, "kind": "clarify" if r["step"] == 0 else "tool_call"} for r in rows]


def _with(rows: list[dict], index: int, **changes) -> list[dict]:
    return [*rows[:index], {**rows[index], **changes}, *rows[index + 1:]]


# (rows, record, field): each breaks one rule; written as a user would (pyarrow's default
# types: int64 step, nullable struct fields), under a name that is no artifact's.
CORRUPT = {
    "neg_step": (lambda rows: _with(rows, 0, step=-1), "dialogue_id='D000.json', step=-1", "step"),
    "null_kind": (lambda rows: _with(rows, 2, kind=None), "dialogue_id='D001.json', step=0", "kind"),
    "null_dialogue": (lambda rows: _with(rows, 3, dialogue_id=None), "dialogue_id=None, step=1", "dialogue_id"),
    "step_text": (lambda rows: [{**r, "step": str(r["step"])} for r in rows], "dialogue_id='D000.json', step='0'", "step"),
    "rm_rf_kind": (lambda rows: _with(rows, 5, kind="rm -rf"), "dialogue_id='D002.json', step=1", "kind"),
    "empty_completion": (lambda rows: _with(rows, 7, completion=[]), "dialogue_id='D003.json', step=1", "completion"),
}


def _stage(tmp_path: Path, model_dir: Path, source: dict) -> subprocess.CompletedProcess:
    params = {"train": {"holdout": {"fraction": 0.2}, "sft": {
        "model": {"path": str(model_dir)},
        "data": {"sources": [source], "compact_prompts": False, "max_history_messages": 2},
        "optim": {"max_steps": 1, "batch_size": 4, "max_length": 320},
        "eval": {"max_examples": 2, "max_new_tokens": 4, "before": False},
    }}}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(params))
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    env.pop("PREFECT_API_URL", None)
    return subprocess.run([sys.executable, "-m", "stages.train", "sft"], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.mark.parametrize("case", sorted(CORRUPT))
def test_a_corrupt_source_under_any_name_stops_the_stage_before_training(tiny_model_dir, tmp_path, case):
    change, record, field = CORRUPT[case]
    path = tmp_path / "data" / "corrupt" / f"{case}.parquet"
    path.parent.mkdir(parents=True)
    pq.write_table(pa.Table.from_pylist(change(_sft_rows())), path)

    proc = _stage(tmp_path, tiny_model_dir, {"path": f"data/corrupt/{case}.parquet"})

    assert proc.returncode == 1, proc.stdout[-2000:] + proc.stderr[-2000:]
    first = proc.stderr.strip().splitlines()[0]
    assert first.startswith("error: artifact 'sft source (prompt+completion) (data/corrupt/") and f"{case}.parquet)" in first
    assert f"record row " in first and f"({record})" in first and f"field {field!r}" in first, first
    assert not (tmp_path / "models").exists() and not (tmp_path / "reports").exists()
    assert not (tmp_path / ".prefect").exists()  # failed before the Prefect server started


def test_a_declared_schema_is_checked_whatever_the_name(tiny_model_dir, tiny_data_dir, tmp_path):
    from pipelines.speaker.tables import SPECS

    config = tiny_config("sft", tiny_model_dir, tiny_data_dir, tmp_path)

    def check(path: Path, **source) -> None:
        check_inputs(replace(config, data=replace(config.data, sources=(SourceSpec(str(path), **source),))))

    # A clarifier kind is a kind the training contract knows, not a SpeakER one: declared
    # speaker_sft, the file is checked by speaker_sft's suite.
    typed = SPECS["speaker_sft"].restricted_to([*_sft_rows()[0]]).schema
    mine = tmp_path / "mine.parquet"
    pq.write_table(pa.Table.from_pylist(_with(_sft_rows(), 4, kind="ask"), schema=typed), mine)
    check(mine)
    with pytest.raises(ValidationFailed, match=r"speaker_sft \(.*mine.parquet\)' failed validation: record row 4 .*field 'kind'"):
        check(mine, schema="speaker_sft")

    # Named after one artifact, declared as another: the declared one decides.
    named = tmp_path / "speaker_grpo.parquet"
    pq.write_table(pa.Table.from_pylist(_sft_rows(), schema=typed), named)
    check(named, schema="speaker_sft")
    with pytest.raises(ValidationFailed, match=r"unexpected column 'completion'"):
        check(named)  # by its name: speaker_grpo has no completion

    # The training use is checked under a declared schema too (the artifact allows [] messages).
    empty = tmp_path / "empty.parquet"
    pq.write_table(pa.Table.from_pylist(_with(_sft_rows(), 1, completion=[]), schema=typed), empty)
    with pytest.raises(ValidationFailed, match=r"field 'completion'.*found \[\]"):
        check(empty, schema="speaker_sft")


def test_an_unknown_schema_is_a_config_error_naming_the_key(tiny_model_dir, tiny_data_dir):
    from stages import train as stage

    params = {"holdout": {"fraction": 0.2}, "sft": {
        "model": {"path": str(tiny_model_dir)},
        "data": {"sources": [{"path": str(tiny_data_dir / "speaker_sft.parquet"), "schema": "speaker_stf"}]},
    }}
    with pytest.raises(ConfigError, match=r"params.yaml train.sft.data.sources\[0\].schema: unknown schema 'speaker_stf'; artifact schemas: .*speaker_sft"):
        stage.train_config("sft", params)


def test_preference_and_prompt_tables_are_checked_by_contract(tiny_model_dir, tmp_path):
    dpo = tiny_tables()["speaker_dpo"].to_pylist()
    path = tmp_path / "pairs.parquet"
    pq.write_table(pa.Table.from_pylist(_with(dpo, 2, rejected=[])), path)
    config = tiny_config("dpo", tiny_model_dir, tmp_path, tmp_path)
    config = replace(config, data=replace(config.data, sources=(SourceSpec(str(path)),)))
    with pytest.raises(ValidationFailed, match=r"dpo source \(prompt\+chosen\+rejected\).*record row 2 \(dialogue_id='D001.json', step=0\), field 'rejected'"):
        check_inputs(config)

    # GRPO's prompts_from table, under another name, with a negative step.
    grpo = tmp_path / "rewards.parquet"
    prompts = tmp_path / "chat_prompts.parquet"
    pq.write_table(tiny_tables()["speaker_grpo"], grpo)
    pq.write_table(pa.Table.from_pylist(_with(_sft_rows(), 6, step=-2)), prompts)
    config = tiny_config("grpo", tiny_model_dir, tmp_path, tmp_path)
    config = replace(config, data=replace(config.data, sources=(SourceSpec(str(grpo), prompts_from=str(prompts)),)))
    with pytest.raises(ValidationFailed, match=r"chat_prompts.parquet\)' failed validation: record row 6 .*field 'step'"):
        check_inputs(config)
