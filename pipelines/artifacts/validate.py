"""Check a table against its :class:`ArtifactSpec` and say readably what is wrong.

Three kinds of check end up in one :class:`ValidationReport`:

* Schema: column names and types must equal the spec's (:func:`check_schema`). When they
  do not, the suite is not run, because its expectations assume the declared columns.
* Expectations run through Great Expectations 1.x on a pandas view of the table's scalar
  columns. Nested (list/map/struct) columns are left out of that view: GX's pandas engine
  hashes and compares cell values, which such cells break. The pandas view is pyarrow's
  default conversion, the dtypes GX is tested with (integer columns with nulls therefore
  show up as floats in examples).
* Not-null on nested columns and references are answered with Arrow and reported in the
  shape of GX's results. A reference is GX's ``expect_column_values_to_be_in_set`` with
  the parent's values as the set, but GX tests that row by row in Python (about 2 s for
  250k turns against 25k dialogue ids) where ``pc.is_in`` hashes in C (about 10 ms).
"""

from __future__ import annotations

import json
import logging
import math
import warnings
from contextlib import contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from reprlib import Repr
from typing import Any, Iterator, Mapping, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from pipelines.artifacts.spec import (
    COMPOUND_UNIQUE,
    IN_SET,
    LENGTH_BETWEEN,
    NOT_NULL,
    UNIQUE,
    ArtifactSpec,
    Expectation,
    Reference,
    is_scalar,
)
from pipelines.errors import ConfigError, DataError, ValidationFailed

MAX_EXAMPLES = 5
# GX samples this many unexpected values. More than MAX_EXAMPLES because a duplicate-key
# failure lists every copy of a value, and the report shows distinct values.
_GX_SAMPLE = 20
# GX returns results in its own order; this meta entry maps each back to the suite.
_INDEX = "askflow_index"

# Reports show kwargs such as a value_set of hundreds of names: keep each on one line.
_SHORT = Repr()
_SHORT.maxlist = _SHORT.maxtuple = _SHORT.maxset = _SHORT.maxdict = 8
_SHORT.maxstring = _SHORT.maxother = 60


# --- Schema ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class SchemaDiff:
    """How a table's columns differ from a spec's schema. Column order and the ``nullable``
    flag are not compared: publishing reorders columns, and nulls are checked on the data
    (a table built from Python values has every field nullable)."""

    missing: tuple[pa.Field, ...] = ()
    extra: tuple[pa.Field, ...] = ()
    mistyped: tuple[tuple[str, pa.DataType, pa.DataType], ...] = ()  # (column, expected, actual)

    @property
    def ok(self) -> bool:
        return not (self.missing or self.extra or self.mistyped)

    def lines(self) -> list[str]:
        return (
            [f"missing column {f.name!r} ({f.type})" for f in self.missing]
            + [f"unexpected column {f.name!r} ({f.type})" for f in self.extra]
            + [f"column {name!r}: expected {expected}, got {actual}" for name, expected, actual in self.mistyped]
        )

    def to_text(self) -> str:
        return "\n".join(self.lines())

    def to_dict(self) -> dict[str, Any]:
        return {
            "missing": {f.name: str(f.type) for f in self.missing},
            "extra": {f.name: str(f.type) for f in self.extra},
            "mistyped": {
                name: {"expected": str(expected), "actual": str(actual)} for name, expected, actual in self.mistyped
            },
        }


def check_schema(table: pa.Table | pa.Schema, spec: ArtifactSpec) -> SchemaDiff:
    actual = table if isinstance(table, pa.Schema) else table.schema
    return SchemaDiff(
        missing=tuple(f for f in spec.schema if f.name not in actual.names),
        extra=tuple(f for f in actual if f.name not in spec.schema.names),
        mistyped=tuple(
            (f.name, f.type, actual.field(f.name).type)
            for f in spec.schema
            if f.name in actual.names and not actual.field(f.name).type.equals(f.type)
        ),
    )


# --- Report ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExpectationResult:
    type: str
    description: str  # ``type(kwarg=value, ...)`` as shown in reports
    columns: tuple[str, ...]
    success: bool
    element_count: int | None = None
    unexpected_count: int | None = None
    unexpected_examples: tuple[Any, ...] = ()  # distinct values, JSON-ready
    observed_value: Any = None  # what table-level expectations (row count, ...) measured
    error: str | None = None  # why GX could not evaluate the expectation

    @property
    def column(self) -> str | None:
        """The column(s) checked, for display; None for table-level expectations."""
        return ", ".join(self.columns) or None

    def to_dict(self) -> dict[str, Any]:
        return {
            "type": self.type,
            "column": self.column,
            "description": self.description,
            "success": self.success,
            "element_count": self.element_count,
            "unexpected_count": self.unexpected_count,
            "unexpected_examples": list(self.unexpected_examples),
            "observed_value": self.observed_value,
            "error": self.error,
        }

    def to_text(self) -> str:
        if self.success:
            return f"ok      {self.description}"
        if self.error is not None:
            detail = f"could not be evaluated: {self.error}"
        elif self.unexpected_count is not None:
            detail = f"{self.unexpected_count:,} of {self.element_count or 0:,} rows unexpected"
            if self.unexpected_examples:
                detail += "; e.g. " + ", ".join(_SHORT.repr(v) for v in self.unexpected_examples)
        else:
            detail = f"observed {_SHORT.repr(self.observed_value)}"
        return f"FAILED  {self.description}: {detail}"


@dataclass(frozen=True)
class ValidationReport:
    artifact: str
    row_count: int
    schema: SchemaDiff
    results: tuple[ExpectationResult, ...]

    @property
    def success(self) -> bool:
        return self.schema.ok and all(result.success for result in self.results)

    @property
    def failures(self) -> tuple[ExpectationResult, ...]:
        return tuple(result for result in self.results if not result.success)

    def to_dict(self) -> dict[str, Any]:
        return {
            "artifact": self.artifact,
            "success": self.success,
            "row_count": self.row_count,
            "schema": self.schema.to_dict(),
            "results": [result.to_dict() for result in self.results],
        }

    def to_text(self) -> str:
        if not self.schema.ok:
            header = f"artifact {self.artifact!r}: columns do not match the spec (expectations not run)"
            lines = self.schema.lines()
        else:
            total, failed = len(self.results), len(self.failures)
            verdict = f"{failed} of {total} checks failed" if failed else f"all {total} checks passed"
            header = f"artifact {self.artifact!r} ({self.row_count:,} rows): {verdict}"
            lines = [result.to_text() for result in self.results]
        return "\n".join([header, *("  " + line for line in lines)])


# --- Validation -----------------------------------------------------------------------------


def validate(
    table: pa.Table, spec: ArtifactSpec, related: Mapping[str, pa.Table] | None = None
) -> ValidationReport:
    """Check ``table`` against ``spec``. ``related`` holds the artifacts that the spec's
    references point at, by artifact name (a spec may reference itself without it).

    Raises ConfigError when the spec cannot be run (unknown expectation, missing parent);
    a table that breaks the contract gives an unsuccessful report instead."""
    schema = check_schema(table, spec)
    if not schema.ok:
        return ValidationReport(spec.name, table.num_rows, schema, ())
    suite = spec.suite
    by_arrow = [e for e in suite if _is_nested_check(e, table.schema)]
    outcome = _run_gx_anywhere(table, [e for e in suite if e not in by_arrow], spec.name)
    outcome.update((e, _nested_by_arrow(table, e)) for e in by_arrow)
    results = [outcome[e] for e in suite]
    results += [_check_reference(table, spec, reference, related or {}) for reference in spec.references]
    return ValidationReport(spec.name, table.num_rows, schema, tuple(results))


def check_table(table: pa.Table, spec: ArtifactSpec, path: Path | str, record_columns: Sequence[str] = ()) -> None:
    """Check a table read from ``path`` against ``spec`` over the columns it has
    (:meth:`ArtifactSpec.restricted_to`: a narrower training file), with the references
    whose artifact lies beside the file as ``<artifact>.parquet``. A failure raises
    ValidationFailed naming the file and the first bad record (by the spec's key, else
    ``record_columns``) and field, with the whole report."""
    path = Path(path)
    spec = spec.restricted_to(table.column_names)
    beside = {r.artifact for r in spec.references if r.artifact == spec.name or (path.parent / f"{r.artifact}.parquet").is_file()}
    spec = replace(spec, references=tuple(r for r in spec.references if r.artifact in beside))
    related: dict[str, pa.Table] = {}
    for reference in spec.references:
        if reference.artifact == spec.name or reference.artifact in related:
            continue
        parent = path.parent / f"{reference.artifact}.parquet"
        columns = sorted({r.other_column for r in spec.references if r.artifact == reference.artifact})
        try:
            related[reference.artifact] = pq.read_table(parent, columns=columns)
        except (OSError, pa.ArrowException, ValueError) as error:
            raise DataError(str(parent), f"cannot read column(s) {', '.join(columns)}: {error}") from None
    report = validate(table, spec, related)
    if report.success:
        return
    offence = locate(table, spec, report, record_columns)
    if offence is None:
        raise ValidationFailed(f"{spec.name} ({path})", report.to_text())
    raise ValidationFailed(f"{spec.name} ({path})", report.to_text(), record=offence.record, field=offence.field,
                           detail=offence.to_text())


def check_suite(spec: ArtifactSpec) -> None:
    """Build the spec's GX suite without running it: raises ConfigError for an expectation
    GX does not know or arguments it rejects. Meant for a spec's own unit test."""
    with _quiet_gx():
        _gx_expectations([e for e in spec.suite if not _is_nested_check(e, spec.schema)], spec.name)


def _is_nested_check(expectation: Expectation, schema: pa.Schema) -> bool:
    """Not-null or a length check on a list/map/struct column: answered with Arrow."""
    return expectation.type in (NOT_NULL, LENGTH_BETWEEN) and not is_scalar(schema.field(expectation.kwargs["column"]).type)


def _describe(expectation: Expectation) -> str:
    arguments = ", ".join(f"{key}={_SHORT.repr(value)}" for key, value in expectation.kwargs.items())
    return f"{expectation.type}({arguments})"


def _run_gx_anywhere(table: pa.Table, expectations: Sequence[Expectation], artifact: str) -> dict[Expectation, ExpectationResult]:
    """:func:`_run_gx` in ``make run``'s validation service when there is one (it pays GX's
    import once for every stage: :mod:`pipelines.artifacts.gx_service`), else here."""
    if not expectations:
        return {}
    from pipelines.artifacts.gx_service import validate_remotely

    scalar = table.select([f.name for f in table.schema if is_scalar(f.type)])  # what _run_gx reads
    remote = validate_remotely(scalar, expectations, artifact)
    return remote if remote is not None else _run_gx(table, expectations, artifact)


def _run_gx(table: pa.Table, expectations: Sequence[Expectation], artifact: str) -> dict[Expectation, ExpectationResult]:
    if not expectations:
        return {}  # and do not pay GX's import
    frame = table.select([f.name for f in table.schema if is_scalar(f.type)]).to_pandas()
    with _quiet_gx() as gx:
        from great_expectations.data_context.types.base import ProgressBarsConfig

        suite = gx.ExpectationSuite(name=artifact, expectations=_gx_expectations(expectations, artifact))
        context = gx.get_context(mode="ephemeral")
        context.variables.progress_bars = ProgressBarsConfig(globally=False, metric_calculations=False)
        batch = (
            context.data_sources.add_pandas("askflow")
            .add_dataframe_asset("table")
            .add_batch_definition_whole_dataframe("whole table")
            .get_batch(batch_parameters={"dataframe": frame})
        )
        outcome = batch.validate(suite, result_format={"result_format": "SUMMARY", "partial_unexpected_count": _GX_SAMPLE})
    results: dict[Expectation, ExpectationResult] = {}
    for gx_result in outcome.results:
        expectation = expectations[gx_result.expectation_config.meta[_INDEX]]
        results[expectation] = _from_gx(expectation, gx_result)
    return results


def _gx_expectations(expectations: Sequence[Expectation], artifact: str) -> list[Any]:
    from great_expectations.exceptions import ExpectationNotFoundError
    from great_expectations.expectations.registry import get_expectation_impl

    built = []
    for index, expectation in enumerate(expectations):
        try:
            gx_class = get_expectation_impl(expectation.type)
        except ExpectationNotFoundError:
            raise ConfigError(f"artifact spec {artifact!r}: GX has no expectation {expectation.type!r}") from None
        try:
            gx_expectation = gx_class(**_gx_value(dict(expectation.kwargs)), meta={_INDEX: index})
        except (TypeError, ValueError) as error:  # pydantic's ValidationError is a ValueError
            raise ConfigError(f"artifact spec {artifact!r}: {_describe(expectation)}: {error}") from None
        built.append(gx_expectation)
    return built


def _gx_value(value: Any) -> Any:
    """Specs hold tuples (immutable); GX needs lists: a tuple ``column_list`` makes its
    column lookup fail at run time."""
    if isinstance(value, dict):
        return {key: _gx_value(item) for key, item in value.items()}
    if isinstance(value, (tuple, list)):
        return [_gx_value(item) for item in value]
    return value


@contextmanager
def _quiet_gx() -> Iterator[Any]:
    """Import GX and yield it with its logging and warnings silenced: GX logs at INFO about
    its ephemeral context and lets pandas warnings through, none of which is about the
    data, and a stage's output should be its own."""
    with _logging_at_error(["great_expectations"]):  # GX logs while it is being imported
        import great_expectations as gx
    # Every GX logger, not only the package's: GX sets some module loggers to INFO itself.
    names = [name for name in logging.root.manager.loggerDict if name.partition(".")[0] == "great_expectations"]
    with _logging_at_error(names), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield gx


@contextmanager
def _logging_at_error(names: Sequence[str]) -> Iterator[None]:
    loggers = [logging.getLogger(name) for name in names]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


def _from_gx(expectation: Expectation, gx_result: Any) -> ExpectationResult:
    result = gx_result.result or {}
    return ExpectationResult(
        type=expectation.type,
        description=_describe(expectation),
        columns=expectation.columns,
        success=bool(gx_result.success),
        element_count=result.get("element_count"),
        unexpected_count=result.get("unexpected_count"),
        unexpected_examples=_distinct_examples(result.get("partial_unexpected_list") or ()),
        observed_value=_plain(result.get("observed_value")),
        error=_exception_message(gx_result.exception_info or {}),
    )


def _exception_message(info: Mapping[str, Any]) -> str | None:
    """GX reports one exception as ``{"raised_exception": ..., "exception_message": ...}``
    and several (one per failed metric) as a mapping of such entries by metric id."""
    entries = [info] if "raised_exception" in info else list(info.values())
    messages = [entry.get("exception_message") for entry in entries if entry.get("raised_exception")]
    return "; ".join(dict.fromkeys(m for m in messages if m)) or None


def _distinct_examples(values: Sequence[Any]) -> tuple[Any, ...]:
    distinct: dict[str, Any] = {}
    for value in values:
        plain = _plain(value)
        distinct.setdefault(json.dumps(plain, sort_keys=True, default=str), plain)
        if len(distinct) == MAX_EXAMPLES:
            break
    return tuple(distinct.values())


def _plain(value: Any) -> Any:
    """A JSON-ready copy of a value from GX or Arrow (numpy scalars, NaN/NA, timestamps)."""
    if isinstance(value, Mapping):
        return {str(key): _plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple, np.ndarray)):
        return [_plain(item) for item in value]
    if isinstance(value, np.generic):
        return _plain(value.item())
    if value is None or isinstance(value, (bool, int, str)):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else (None if math.isnan(value) else str(value))
    if pd.isna(value):  # pd.NA, pd.NaT
        return None
    if hasattr(value, "isoformat"):
        return value.isoformat()
    return str(value)


def _nested_by_arrow(table: pa.Table, expectation: Expectation) -> ExpectationResult:
    bad = _unexpected_mask(table, expectation)
    count = pc.sum(bad).as_py() or 0
    examples: tuple[Any, ...] = ()
    if count:
        values = table.column(expectation.kwargs["column"]).filter(bad)
        examples = _distinct_examples(values.slice(0, _GX_SAMPLE).to_pylist())
    return ExpectationResult(
        type=expectation.type,
        description=_describe(expectation),
        columns=expectation.columns,
        success=count == 0,
        element_count=table.num_rows,
        unexpected_count=count,
        unexpected_examples=examples,
    )


# --- Locating the first offending record -------------------------------------------------------


@dataclass(frozen=True)
class Offence:
    """The first row that breaks the first failed check of a report: its index, its record
    (the spec's key values, else the row number), the field and the value found there."""

    row: int | None
    record: str
    field: str | None
    value: Any
    check: str

    def to_text(self) -> str:
        return f"{self.check}: found {_SHORT.repr(self.value)}"


def locate(table: pa.Table, spec: ArtifactSpec, report: ValidationReport, record_columns: Sequence[str] = ()) -> Offence | None:
    """Where the report's first failure is in ``table``: the record and field to fix, for an
    error message (GX counts unexpected values but does not say which rows hold them).
    None when the report succeeded or the failure is not about rows (e.g. a row count).
    A record is named by the spec's key values, else by ``record_columns``'."""
    if report.success:
        return None
    keys = [k for k in (spec.keys or tuple(record_columns)) if k in table.column_names]
    diff = report.schema
    if diff.mistyped:
        name, expected, actual = diff.mistyped[0]
        row = 0 if table.num_rows else None
        value = table.column(name)[0].as_py() if row is not None else None
        return Offence(row, _record(table, keys, row), name, value, f"stored as {actual}, expected {expected}")
    if diff.missing or diff.extra:
        field = (diff.missing or diff.extra)[0]
        return Offence(None, "every row", field.name, None, diff.lines()[0])
    checks = list(spec.suite) + [None] * len(spec.references)
    for expectation, result in zip(checks, report.results):
        if result.success:
            continue
        if expectation is None:  # a reference
            reference = next(r for r in spec.references if r.column == result.columns[0])
            examples = set(map(json.dumps, result.unexpected_examples))
            column = table.column(reference.column).to_pylist()
            row = next((i for i, v in enumerate(column) if v is not None and json.dumps(_plain(v)) in examples), None)
        else:
            try:
                mask = _unexpected_mask(table, expectation)
            except (NotImplementedError, KeyError, pa.ArrowException):
                continue
            if mask is None:
                continue
            hits = pc.indices_nonzero(pc.fill_null(mask, False))
            row = hits[0].as_py() if len(hits) else None
        if row is None:
            continue
        field = result.columns[0] if len(result.columns) == 1 else ", ".join(result.columns)
        value = (table.column(result.columns[0])[row].as_py() if len(result.columns) == 1
                 else {c: table.column(c)[row].as_py() for c in result.columns})
        return Offence(row, _record(table, keys, row), field, value, result.description)
    return None


def _record(table: pa.Table, keys: Sequence[str], row: int | None) -> str:
    """``row 3 (dialogue_id='D001.json', step=1)``: the row number and its key values."""
    if row is None:
        return "no row"
    if not keys:
        return f"row {row}"
    values = ", ".join(f"{k}={_SHORT.repr(table.column(k)[row].as_py())}" for k in keys)
    return f"row {row} ({values})"


def _unexpected_mask(table: pa.Table, expectation: Expectation) -> pa.ChunkedArray | None:
    """A boolean per row: True where the row breaks ``expectation``, for the expectations
    whose meaning per row is plain (as GX has it: nulls are only not-null's business).
    None for one that is not about single rows."""
    kwargs = expectation.kwargs
    if expectation.type == NOT_NULL:
        return pc.is_null(table.column(kwargs["column"]))
    if expectation.type in (UNIQUE, COMPOUND_UNIQUE):
        columns = [kwargs["column"]] if expectation.type == UNIQUE else list(kwargs["column_list"])
        seen: set[str] = set()
        flags = []
        for values in zip(*(table.column(c).to_pylist() for c in columns)):
            key = json.dumps(_plain(list(values)), sort_keys=True)
            flags.append(key in seen and None not in values)
            seen.add(key)
        return pa.chunked_array([pa.array(flags, pa.bool_())])
    column = table.column(kwargs["column"]) if "column" in kwargs else None
    if column is None:
        return None
    if expectation.type == IN_SET:
        return pc.and_(pc.invert(pc.is_in(column, value_set=pa.array(list(kwargs["value_set"])).cast(column.type))), pc.is_valid(column))
    if expectation.type in ("expect_column_values_to_be_between", LENGTH_BETWEEN):
        if expectation.type == LENGTH_BETWEEN:
            nested = pa.types.is_list(column.type) or pa.types.is_large_list(column.type)
            column = pc.list_value_length(column) if nested else pc.utf8_length(column)
        bad = pa.scalar(False)
        if "min_value" in kwargs:
            bad = pc.or_(bad, pc.less(column, kwargs["min_value"]))
        if "max_value" in kwargs:
            bad = pc.or_(bad, pc.greater(column, kwargs["max_value"]))
        return pc.fill_null(bad, False)
    if expectation.type == "expect_column_values_to_match_regex":
        import re

        pattern = re.compile(kwargs["regex"])
        return pa.chunked_array([pa.array([v is not None and not pattern.search(v) for v in column.to_pylist()], pa.bool_())])
    return None


def _check_reference(
    table: pa.Table, spec: ArtifactSpec, reference: Reference, related: Mapping[str, pa.Table]
) -> ExpectationResult:
    parent = related.get(reference.artifact)
    if parent is None and reference.artifact == spec.name:
        parent = table
    if parent is None:
        given = ", ".join(sorted(related)) or "none"
        raise ConfigError(
            f"artifact {spec.name!r} references {reference.artifact!r}, which was not given (related artifacts: {given})"
        )
    if reference.other_column not in parent.column_names:
        raise ConfigError(
            f"reference {reference.describe()}: {reference.artifact!r} has no column {reference.other_column!r}"
        )
    child = table.column(reference.column)
    try:
        known = pc.unique(parent.column(reference.other_column)).cast(child.type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as error:
        raise ConfigError(f"reference {reference.describe()}: cannot compare the two columns' values: {error}") from None
    # Nulls are skipped, as GX's in-set check skips them; a child null is not dangling.
    dangling = child.filter(pc.invert(pc.is_in(child, value_set=known))).drop_null()
    return ExpectationResult(
        type=IN_SET,
        description=f"{IN_SET}(column={reference.column!r}, value_set={reference.artifact}.{reference.other_column})",
        columns=(reference.column,),
        success=len(dangling) == 0,
        element_count=table.num_rows,
        unexpected_count=len(dangling),
        unexpected_examples=tuple(_plain(v) for v in pc.unique(dangling)[:MAX_EXAMPLES].to_pylist()),
    )
