"""File I/O shared by the stages, the flows and the benchmarks: strict reading, atomic writing,
artifact publishing.

Reading is strict so that bad input fails at the file that is bad, with a message naming
it: text must be UTF-8, JSON must parse and must not repeat a key (the stdlib silently
keeps the last value, which hides merge accidents in hand-edited data).

Writing is atomic: a file is written under a temporary name in its own directory, which
keeps it on the same filesystem, and renamed into place with ``os.replace``. A reader, or
DVC, sees either the previous file or the complete new one, never a torn write.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
from pathlib import Path
from typing import IO, Any, Callable, Mapping, Sequence, TypeVar

import pyarrow as pa
import pyarrow.parquet as pq
import yaml

from pipelines.registry import artifact_specs
from pipelines.artifacts.spec import ArtifactSpec
from pipelines.artifacts.validate import SchemaDiff, ValidationReport, check_schema, check_table, validate
from pipelines.errors import ConfigError, DataError, ValidationFailed
from pipelines.files import FILE_MODE, make_directories, remove_stale_staging, staging_path
from pipelines.secrets import refuse_secrets

PARQUET_COMPRESSION = "zstd"

T = TypeVar("T")


# --- Reading --------------------------------------------------------------------------------


def read_text(path: Path | str) -> str:
    """The file's text, decoded as strict UTF-8."""
    return decode_text(_read_bytes(path), str(path))


def decode_text(data: bytes, source: str) -> str:
    """``data`` decoded as strict UTF-8; DataError naming ``source`` and the line otherwise."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data.count(b"\n", 0, error.start) + 1
        raise DataError(source, f"not valid UTF-8: {error.reason} at byte {error.start} (line {line})") from None


def read_json(path: Path | str) -> Any:
    """The decoded JSON document; DataError for anything that is not strict JSON (also
    NaN, Infinity, a repeated key, or nesting deeper than the parser's recursion limit)."""
    return parse_json(read_text(path), str(path))


def parse_json(text: str, source: str) -> Any:
    """``text`` as strict JSON (:func:`read_json`); the errors name ``source``."""
    try:
        return json.loads(
            text,
            object_pairs_hook=functools.partial(_object_without_duplicates, source),
            parse_constant=functools.partial(_not_json, source),
        )
    except json.JSONDecodeError as error:
        raise DataError(source, f"invalid JSON: {error.msg} at line {error.lineno}, column {error.colno}") from None
    except RecursionError:
        raise DataError(source, "invalid JSON: nested too deeply") from None


def read_jsonl(path: Path | str) -> list[tuple[str, Any]]:
    r"""The records of a JSON Lines file as ``("line N", value)``, blank lines skipped, each
    line strict JSON as :func:`read_json` reads it; a DataError names the file and the line.

    >>> import tempfile; f = Path(tempfile.mkdtemp()) / "x.jsonl"
    >>> _ = f.write_text('{"a": 1}\n\n[2]\n'); read_jsonl(f)
    [('line 1', {'a': 1}), ('line 3', [2])]
    >>> _ = f.write_text('{"a": 1}\n{"a": NaN}\n'); read_jsonl(f)
    Traceback (most recent call last):
    ...
    pipelines.errors.DataError: .../x.jsonl, record 'line 2': invalid JSON: NaN is not a JSON value
    """
    source = str(path)
    records: list[tuple[str, Any]] = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        where = f"line {number}"
        try:
            records.append((where, json.loads(line, object_pairs_hook=functools.partial(_object_without_duplicates, source),
                                              parse_constant=functools.partial(_not_json, source))))
        except json.JSONDecodeError as error:
            raise DataError(source, f"invalid JSON: {error.msg} at column {error.colno}", where) from None
        except DataError as error:  # a repeated key or NaN: say which line
            raise DataError(source, error.message, where) from None
    return records


def _not_json(source: str, constant: str) -> Any:
    # The stdlib reads NaN and Infinity, which are not JSON and break every consumer later.
    raise DataError(source, f"invalid JSON: {constant} is not a JSON value")


class _UniqueKeyLoader(getattr(yaml, "CSafeLoader", yaml.SafeLoader)):  # type: ignore[misc]
    """YAML's safe loader, refusing a key repeated in one mapping: PyYAML keeps the last
    value silently, so an edit lower in the file would quietly override the setting above.
    libyaml's parser where PyYAML was built with it: the pure-Python one takes ~0.3 s per
    read of params.yaml, and every stage reads it several times."""

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict:
        seen: dict[Any, Any] = {}
        for key_node, _ in node.value:
            key = self.construct_object(key_node, deep=True)
            if key in seen:
                raise yaml.constructor.ConstructorError(
                    "while constructing a mapping", node.start_mark,
                    f"duplicate key {key!r} (first at line {seen[key].line + 1})", key_node.start_mark,
                )
            seen[key] = key_node.start_mark
        return super().construct_mapping(node, deep=deep)


def read_parquet(path: Path | str, columns: list[str] | None = None) -> pa.Table:
    """The table (or some of its columns); DataError naming the file for one that is missing
    or not readable Parquet. A damaged file fails the same way every time: it is a data
    error, never something to retry as if the disk or the network had hiccupped."""
    try:
        return pq.read_table(path, columns=columns)
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except (OSError, pa.ArrowException, ValueError) as error:
        raise DataError(str(path), f"not readable Parquet: {error}") from None


def read_artifact(path: Path | str, spec: ArtifactSpec | None = None, *, record_columns: Sequence[str] = ()) -> pa.Table:
    """Read an input artifact and validate it with its expectation suite before any use.

    ``spec``: the contract the caller declares for the file, whatever its name (a training
    source's ``schema:``, an evaluation stage's input); None takes the spec named by the
    file's stem (``speaker_sft.parquet`` -> ``speaker_sft``), and a file askflow does not
    publish has none and is only read: a reader of inputs that may be named anything passes
    ``spec``. A file with fewer columns than its artifact (training data) is checked over
    the columns it has (``ArtifactSpec.restricted_to``); references are checked against the
    referenced artifact when it lies beside the file. A failing suite raises
    ValidationFailed naming the file, the first bad record (its key values, or
    ``record_columns``') and field."""
    path = Path(path)
    table = read_parquet(path)
    spec = spec if spec is not None else artifact_specs().get(path.stem)
    if spec is not None:
        check_table(table, spec, path, record_columns)
    return table


def read_params(section: str, path: Path | str = "params.yaml", *, required: bool = True) -> dict[str, Any] | None:
    """One top-level section of params.yaml, as a dict (a copy: stages may change it); None
    for an absent section that is not ``required``."""
    try:
        text = read_text(path)
    except DataError as error:
        raise ConfigError(str(error)) from None
    try:
        params = yaml.load(text, Loader=_UniqueKeyLoader)  # noqa: S506 (a SafeLoader)
    except yaml.YAMLError as error:
        raise ConfigError(f"{path}: invalid YAML: {error}") from None
    if not isinstance(params, dict):
        raise ConfigError(f"{path}: expected a mapping of sections at the top level")
    if section not in params and not required:
        return None
    if section not in params:
        raise ConfigError(f"{path}: no section {section!r} (sections: {', '.join(map(str, params)) or 'none'})")
    values = params[section]
    if not isinstance(values, dict):
        raise ConfigError(f"{path}: section {section!r} must be a mapping, got {type(values).__name__}")
    # DVC copies a stage's params into dvc.lock and its run cache once the stage succeeds:
    # a secret anywhere in the section stops the stage first.
    refuse_secrets(values, f"{path} {section}")
    return dict(values)


def _read_bytes(path: Path | str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except OSError as error:
        raise DataError(str(path), f"cannot read: {error.strerror or error}") from None


def _object_without_duplicates(source: str, pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)  # in C: a third of a corpus load went to a Python loop over every key
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise DataError(source, f"duplicate key {key!r} in a JSON object")
            seen.add(key)
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
    make_directories(path.parent)
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
    outputs: Mapping[Path, tuple[pa.Table, ArtifactSpec]],
    report_path: Path | None = None,
    notes: Mapping[str, Any] | None = None,
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
    suites pass; ``notes`` (e.g. what the loader tolerated in the input) are added to it.
    A failure raises ValidationFailed carrying the readable text of every failed report.
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
        **(notes or {}),
    }
    if summary["success"]:
        _write_all_atomic({path: table for path, table, _ in tables.values()})
    if report_path is not None:
        write_json_atomic(report_path, summary)
    if not summary["success"]:
        failed = [report for report in reports.values() if not report.success]
        raise ValidationFailed(", ".join(r.artifact for r in failed), "\n\n".join(r.to_text() for r in failed))
    return summary


def publish_empty(path: Path | str, table: pa.Table, spec: ArtifactSpec) -> None:
    """Write ``table``, which has no rows, conformed to ``spec``'s columns and types: a stage's
    declared output when it has nothing to publish and its report says so (e.g. JOSH's SFT /
    KTO tables after a harvest without golden paths, so that DVC's outs exist and no earlier
    rows stay behind). Not a result: the only check it fails is ``min_rows`` (every spec's
    >= 1); every other expectation holds of no rows. A table with rows is an error: publish it."""
    path = Path(path)
    if table.num_rows:
        raise ConfigError(f"publish_empty({path}): the table has {table.num_rows} rows; publish() validates tables with rows")
    _write_all_atomic({path: _conform(table, spec, path)})


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

    The name is made here and opened with "x" rather than taken from mkstemp; the file gets
    mode ``FILE_MODE`` (0644) whatever the umask, which the rename keeps (and new parent
    directories 0755). It carries this process's id: temporary files of ``path`` left by a
    killed writer are removed first."""
    make_directories(path.parent)
    remove_stale_staging(path)
    temp = staging_path(path)
    try:
        with open(temp, "xb") as file:
            os.fchmod(file.fileno(), FILE_MODE)
            write(file)
            file.flush()
            os.fsync(file.fileno())  # the data must be on disk before the rename is
    except BaseException:
        temp.unlink(missing_ok=True)
        raise
    return temp


def directory_sha256(root: Path) -> str:
    """A content hash of a directory: every file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()
