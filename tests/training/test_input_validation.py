"""Issue 19 item 4: training validates its Parquet inputs with their expectation suites before
use, and a damaged Parquet is a data error naming the file, never retried."""

from __future__ import annotations

import shutil
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from pipelines.errors import DataError, ValidationFailed
from catalog.io import read_artifact

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
    loads = [r for r in runs if r.name.startswith("load-datasets")]
    assert len(loads) == 1 and loads[0].run_count == 1, "a damaged file is not retried"
    assert not Path(config.output.model_dir).exists()

    pq.write_table(_step_minus_one(tiny_tables()["speaker_sft"]), path)
    state = train_sft(config, return_state=True)
    assert state.is_failed()
    with pytest.raises(ValidationFailed, match="step"):
        state.result()
    assert not Path(config.output.model_dir).exists()
