"""File I/O shared by the stages: strict reading, atomic writing, artifact publishing.

Reading is strict so that bad input fails at the file that is bad, with a message naming
it: text must be UTF-8, JSON must parse and must not repeat a key (the stdlib silently
keeps the last value, which hides merge accidents in hand-edited data).

Writing is atomic: a file is written under a temporary name in its own directory, which
keeps it on the same filesystem, and renamed into place with ``os.replace``. A reader, or
DVC, sees either the previous file or the complete new one, never a torn write.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import sys
import uuid
from pathlib import Path
from typing import IO, Any, Callable, Mapping, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipelines.artifacts.spec import ArtifactSpec
from pipelines.artifacts.validate import SchemaDiff, ValidationReport, check_schema, validate
from pipelines.errors import AskflowError, ConfigError, DataError, ValidationFailed

PARQUET_COMPRESSION = "zstd"

T = TypeVar("T")


# --- Reading --------------------------------------------------------------------------------


def read_text(path: Path | str) -> str:
    """The file's text, decoded as strict UTF-8."""
    data = _read_bytes(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(str(path), f"not valid UTF-8: {error.reason} at byte {error.start} (line {line})") from None


def read_json(path: Path | str) -> Any:
    """The decoded JSON document; DataError for anything that is not strict JSON."""
    text = read_text(path)
    try:
        return json.loads(text, object_pairs_hook=functools.partial(_object_without_duplicates, str(path)))
    except json.JSONDecodeError as error:
        raise DataError(str(path), f"invalid JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None


def read_params(section: str, path: Path | str = "params.yaml") -> dict[str, Any]:
    """One top-level section of params.yaml, as a dict (a copy: stages may change it)."""
    try:
        text = read_text(path)
    except DataError as error:
        raise ConfigError(str(error)) from None
    try:
        params = yaml.safe_load(text)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if section not in params:
        raise ConfigError(f"{path}: no section {section!r} (sections: {', '.join(map(str, params)) or 'none'})")
    values = params[section]
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping, got {type(values).__name__}")
    return dict(values)


def _read_bytes(path: Path | str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except OSError as error:
        raise DataError(str(path), f"cannot read: {error.strerror or error}") from None


def _object_without_duplicates(source: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj: dict[str, Any] = {}
    for key, value in pairs:
        if key in obj:
            raise DataError(source, f"duplicate key {key!r} in a JSON object")
        obj[key] = value
    return obj


# --- Writing --------------------------------------------------------------------------------


def write_json_atomic(path: Path | str, obj: Any) -> None:
    """Write ``obj`` as indented UTF-8 JSON. NaN and infinity are refused (ValueError): they
    are not JSON, and DVC's metrics reader rejects them."""
    text = json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False) + "\n"
    path = Path(path)
    temp = _write_temp(path, lambda file: file.write(text.encode("utf-8")))
    try:
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)  # gone already once renamed


#: Where the stages write their wall times and throughputs. Not a DVC output or metric and
#: ignored by git: these figures depend on the machine and its load, and everything DVC hashes
#: must depend on the inputs only (``dvc metrics diff`` between identical runs prints nothing).
TIMINGS_DIR = Path("reports/timings")


def write_timings(stage: str, figures: Mapping[str, Any], directory: Path | str | None = None) -> Path:
    """Write one stage's machine-dependent figures (seconds, items per second) to
    ``reports/timings/<stage>.json`` (or ``directory``); returns the path."""
    path = Path(directory if directory is not None else TIMINGS_DIR) / f"{stage}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, {"stage": stage, **figures})
    return path


def write_text_atomic(path: Path | str, text: str) -> None:
    """Write ``text`` as UTF-8 through a temporary file beside ``path`` and a rename."""
    path = Path(path)
    temp = _write_temp(path, lambda file: file.write(text.encode("utf-8")))
    try:
        os.replace(temp, path)
    finally:
        temp.unlink(missing_ok=True)


def publish(
    outputs: Mapping[Path, tuple[pa.Table, ArtifactSpec]], report_path: Path | None = None
) -> dict[str, Any]:
    """Validate every table against its spec and, only if all pass, write them all.

    Each table is first conformed to its spec's schema (columns reordered, types cast;
    DataError naming the column when that is impossible). References resolve to the
    tables being published, by artifact name, else to ``<artifact>.parquet`` already
    published in the same directory. Tables are validated before anything is written, so
    a failing suite leaves every previous artifact untouched; then each is written to a
    temporary file beside its target and all are renamed into place.

    The report (``{"success", "artifacts": {name: {"path", **ValidationReport.to_dict()}}}``)
    is returned and, when ``report_path`` is given, written as JSON whether or not the
    suites pass. A failure raises ValidationFailed carrying the readable text of every
    failed report.
    """
    tables: dict[str, tuple[Path, pa.Table, ArtifactSpec]] = {}
    for path, (table, spec) in outputs.items():
        path = Path(path)
        if spec.name in tables:
            raise ConfigError(f"artifact {spec.name!r} is published twice: {tables[spec.name][0]} and {path}")
        tables[spec.name] = (path, _conform(table, spec, path), spec)

    reports: dict[str, ValidationReport] = {}
    for name, (path, table, spec) in tables.items():
        related = _related_tables(spec, path, tables)
        reports[name] = validate(table, spec, related)

    summary = {
        "success": all(report.success for report in reports.values()),
        "artifacts": {name: {"path": str(tables[name][0]), **report.to_dict()} for name, report in reports.items()},
    }
    if summary["success"]:
        _write_all_atomic({path: table for path, table, _ in tables.values()})
    if report_path is not None:
        write_json_atomic(report_path, summary)
    if not summary["success"]:
        failed = [report for report in reports.values() if not report.success]
        raise ValidationFailed(", ".join(r.artifact for r in failed), "\n\n".join(r.to_text() for r in failed))
    return summary


def _conform(table: pa.Table, spec: ArtifactSpec, path: Path) -> pa.Table:
    """``table`` with exactly the spec's columns, in its order and of its types."""
    diff = check_schema(table, spec)
    if diff.missing or diff.extra:
        # Type differences are left out: the cast below may well resolve them.
        problems = SchemaDiff(missing=diff.missing, extra=diff.extra).lines()
        raise DataError(str(path), f"columns do not match artifact {spec.name!r}: " + "; ".join(problems))
    columns = []
    for field in spec.schema:
        column = table.column(field.name)
        try:
            columns.append(column.cast(field.type))
        except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as error:
            raise DataError(str(path), f"cannot cast {column.type} to {field.type}: {error}", field=field.name) from None
    # from_arrays rather than Table.cast: cast refuses nulls in a non-nullable field with a
    # bare ValueError, whereas the suite's implied not-null check reports them readably.
    return pa.Table.from_arrays(columns, schema=spec.schema)


def _related_tables(
    spec: ArtifactSpec, path: Path, publishing: Mapping[str, tuple[Path, pa.Table, ArtifactSpec]]
) -> dict[str, pa.Table]:
    related: dict[str, pa.Table] = {}
    for reference in spec.references:
        name = reference.artifact
        if name in related or name == spec.name:
            continue
        if name in publishing:
            related[name] = publishing[name][1]
            continue
        published = path.parent / f"{name}.parquet"
        if not published.exists():
            raise ConfigError(
                f"artifact {spec.name!r} references {name!r}, which is not being published with it "
                f"and not found at {published}"
            )
        columns = sorted({r.other_column for r in spec.references if r.artifact == name})
        try:
            related[name] = pq.read_table(published, columns=columns)
        except (OSError, pa.ArrowInvalid) as error:
            raise DataError(str(published), f"cannot read column(s) {', '.join(columns)}: {error}") from None
    return related


def _write_all_atomic(tables: Mapping[Path, pa.Table]) -> None:
    """Write every table to a temporary file, then rename them all. A failure while writing
    leaves every target as it was; only a crash between two renames can publish some."""
    temps: list[tuple[Path, Path]] = []
    try:
        for path, table in tables.items():
            temps.append((_write_temp(path, functools.partial(_write_parquet, table)), path))
        for temp, path in temps:
            os.replace(temp, path)
    finally:
        for temp, _ in temps:
            temp.unlink(missing_ok=True)  # gone already once renamed


def _write_parquet(table: pa.Table, file: IO[bytes]) -> None:
    pq.write_table(table, file, compression=PARQUET_COMPRESSION)


def _write_temp(path: Path, write: Callable[[IO[bytes]], Any]) -> Path:
    """Write through ``write`` into a new hidden file beside ``path``; return its path.

    The name is made here and opened with "x" rather than taken from mkstemp, whose 0600
    mode would survive the rename and make artifacts unreadable to other users."""
    path.parent.mkdir(parents=True, exist_ok=True)
    temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:12]}.tmp")
    try:
        with open(temp, "xb") as file:
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the data must be on disk before the rename is
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


# --- Entry points ---------------------------------------------------------------------------


def main_wrapper(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a stage's entry point: an askflow error (DataError, ValidationFailed,
    ConfigError) is printed as ``error: <message>`` on stderr and exits with status 1,
    without a traceback since the message already says what and where. Any other
    exception is a bug and keeps its traceback."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        try:
            return fn(*args, **kwargs)
        except AskflowError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None

    return run


def replace_directory(staging: Path, target: Path) -> None:
    """Swap a fully written ``staging`` directory in for ``target`` (a directory, or nothing):
    readers see the old directory or the new one, never a half-written mix."""
    backup = None
    if target.exists():
        backup = target.with_name(f".{target.name}.old")
        shutil.rmtree(backup, ignore_errors=True)
        os.replace(target, backup)
    os.replace(staging, target)
    if backup is not None:
        shutil.rmtree(backup, ignore_errors=True)
