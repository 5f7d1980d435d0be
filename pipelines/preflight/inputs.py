"""Training inputs checked by their declared schema, whatever the file is called.

Every source of a run (and the table it takes prompts from) is read and validated before
the Prefect server, the tokenizer or torch start (:func:`pipelines.preflight.preflight`
calls :func:`check_inputs`). The contract a file is checked by:

* ``schema: <artifact>`` on the source (``speaker_sft``, ``speaker_grpo``, ``speaker_dpo``,
  ``pir_traces``, ``josh_sft``, ``josh_kto``, ``l2a_train``, ``clarifier_*``, any name of
  :func:`~pipelines.registry.artifact_specs`): that artifact's schema and
  expectation suite, over the columns the file has, whatever its path. An unknown name is a
  ConfigError naming the key.
* no ``schema``, a file named like an artifact (``speaker_sft.parquet``): that artifact, as
  :func:`catalog.io.read_artifact` has always done (the name can add checks, never remove them).
* no ``schema``, any other name: the method's training contract (:func:`training_contract`),
  built for the source's layout (:data:`pipelines.training.data.METHOD_LAYOUTS`): the hold-out
  key is never null, ``step`` is a non-negative integer, ``kind`` is one of the kinds the
  training artifacts know, ``split`` is train or val, the message columns hold
  ``{role, content}`` lists, a KTO ``label`` is a boolean.

On top of any of these, what training itself needs: the layout's message columns (prompt,
completion, chosen, rejected) hold at least one message and a ``prompt_column`` /
``completion_column`` a non-empty text. A failure is a ValidationFailed naming the file,
the first bad record and its field (exit status 1 from the stage, no model written).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from pipelines.registry import artifact_specs
from pipelines.artifacts.spec import ArtifactSpec, Expectation, between, in_set, length_between, not_null
from pipelines.artifacts.validate import check_table
from pipelines.errors import ConfigError, DataError
from pipelines.records import TRAIN, VAL
from pipelines.training.config import SourceSpec, TrainConfig
from pipelines.training.data import _LAYOUT_COLUMNS, JOIN_COLUMN, PROMPTS, source_layout

#: The artifacts training reads; their ``kind`` values are the kinds a source may carry.
TRAINING_SCHEMAS: tuple[str, ...] = (
    "speaker_sft", "speaker_grpo", "speaker_dpo", "pir_traces", "josh_sft", "josh_kto", "l2a_train",
    "clarifier_sft", "clarifier_dpo", "clarifier_grpo",
)
#: Columns that hold conversations (``{role, content}`` message lists).
MESSAGE_COLUMNS: tuple[str, ...] = ("prompt", "completion", "chosen", "rejected", "messages")
_MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])
MESSAGES = pa.list_(_MESSAGE)


def check_schema_name(name: str | None, where: str) -> None:
    """ConfigError naming ``where`` (e.g. ``params.yaml train.sft.data.sources[0].schema``)
    for a name that is no artifact's."""
    if name is not None and name not in artifact_specs():
        raise ConfigError(f"{where}: unknown schema {name!r}; artifact schemas: {', '.join(sorted(artifact_specs()))}")


def declared_spec(source: SourceSpec) -> ArtifactSpec | None:
    """The artifact a source declares (``schema``), else the one its file is named after, else None."""
    specs = artifact_specs()
    if source.schema is not None:
        return specs[source.schema]
    return specs.get(Path(source.path).stem)


def known_kinds() -> tuple[str, ...]:
    """Every ``kind`` value a training artifact allows."""
    specs = artifact_specs()
    kinds: list[str] = []
    for name in TRAINING_SCHEMAS:
        for expectation in specs[name].expectations:
            if expectation.columns == ("kind",) and "value_set" in expectation.kwargs:
                kinds.extend(expectation.kwargs["value_set"])
    return tuple(dict.fromkeys(kinds))


def _is_messages(data_type: pa.DataType) -> bool:
    if not (pa.types.is_list(data_type) or pa.types.is_large_list(data_type)):
        return False
    item = data_type.value_type
    if not pa.types.is_struct(item):
        return False
    names = {item.field(i).name: item.field(i).type for i in range(item.num_fields)}
    return all(k in names and (pa.types.is_string(names[k]) or pa.types.is_large_string(names[k])) for k in ("role", "content"))


def _is_text(data_type: pa.DataType) -> bool:
    return pa.types.is_string(data_type) or pa.types.is_large_string(data_type)


def training_contract(method: str, layout: str, source: SourceSpec, schema: pa.Schema, holdout_key: str) -> ArtifactSpec:
    """The contract of a source declaring no artifact: a spec over the file's own columns
    (any other column is taken as it is) for ``method`` reading it in ``layout``."""
    fields: list[pa.Field] = []
    expectations: list[Expectation] = []
    used = set(_LAYOUT_COLUMNS[layout])
    for field in schema:
        name, actual = field.name, field.type
        if name == holdout_key:
            keep = _is_text(actual) or pa.types.is_integer(actual)
            fields.append(pa.field(name, actual if keep else pa.string(), nullable=False))
        elif name == JOIN_COLUMN:
            fields.append(pa.field(name, actual if pa.types.is_integer(actual) else pa.int32(), nullable=False))
            expectations.append(between(name, 0, None))
        elif name == "kind":
            fields.append(pa.field(name, actual if _is_text(actual) else pa.string(), nullable=False))
            expectations.append(in_set(name, known_kinds()))
        elif name == "split":
            fields.append(pa.field(name, actual if _is_text(actual) else pa.string()))
            expectations.append(in_set(name, (TRAIN, VAL)))
        elif name in MESSAGE_COLUMNS and (name in used or name in (source.prompt_column, source.completion_column)):
            fields.append(pa.field(name, actual if _is_messages(actual) else MESSAGES, nullable=False))
        elif name == "label" and "label" in used:
            fields.append(pa.field(name, pa.bool_(), nullable=False))
        else:
            fields.append(field)
    return ArtifactSpec(
        name=f"{method} source ({'+'.join(_LAYOUT_COLUMNS[layout])})",
        schema=pa.schema(fields),
        min_rows=1,
        expectations=tuple(expectations),
        description=f"what {method} needs of a source that declares no artifact schema",
    )


def _use_checks(spec: ArtifactSpec, layout: str, source: SourceSpec) -> ArtifactSpec:
    """``spec`` plus what training needs whatever the schema: a message or text in every
    row of the columns it reads."""
    names = spec.schema.names
    extra: list[Expectation] = []
    for column in dict.fromkeys([*_LAYOUT_COLUMNS[layout], source.prompt_column, source.completion_column]):
        if column is None or column not in names:
            continue
        data_type = spec.schema.field(column).type
        if not (pa.types.is_list(data_type) or _is_text(data_type)):
            continue
        extra += [not_null(column), length_between(column, 1)]
    expectations = tuple(dict.fromkeys([*spec.expectations, *extra]))
    return ArtifactSpec(spec.name, spec.schema, spec.min_rows, spec.keys, expectations, spec.references, spec.description)


def source_spec(method: str, source: SourceSpec, schema: pa.Schema, holdout_key: str) -> ArtifactSpec:
    """The spec a source's file is checked by (module docstring)."""
    layout = source_layout(method, source, schema.names, holdout_key)
    declared = declared_spec(source)
    if declared is not None:
        spec = declared.restricted_to(schema.names)
    else:
        spec = training_contract(method, layout, source, schema, holdout_key)
    return _use_checks(spec, layout, source)


def prompts_spec(path: str, schema: pa.Schema, holdout_key: str) -> ArtifactSpec:
    """The spec of a ``prompts_from`` table: its artifact when named like one, else the
    contract of a prompt-only source (key, step and prompt)."""
    source = SourceSpec(path)
    declared = declared_spec(source)
    if declared is not None:
        return _use_checks(declared.restricted_to(schema.names), PROMPTS, source)
    return _use_checks(training_contract("grpo", PROMPTS, source, schema, holdout_key), PROMPTS, source)


# Files already checked in this process, by (path, identity, spec): the stage checks its
# inputs before the flow starts and the flow's own preflight and loading find them checked.
_CHECKED: set[tuple] = set()


def _identity(path: str) -> tuple:
    stat = os.stat(path)
    return (os.path.realpath(path), stat.st_ino, stat.st_size, stat.st_mtime_ns)


def read_checked(path: str, spec_for, holdout_key: str) -> pa.Table:
    """The table at ``path``, validated by ``spec_for(schema)``; DataError for a file that
    is missing or not readable Parquet."""
    try:
        table = pq.read_table(path)
    except FileNotFoundError:
        raise DataError(str(path), "file not found") from None
    except (OSError, pa.ArrowException, ValueError) as error:
        raise DataError(str(path), f"not readable Parquet: {error}") from None
    spec = spec_for(table.schema)
    key = (_identity(path), spec)
    if key not in _CHECKED:
        check_table(table, spec, path, record_columns=(holdout_key, JOIN_COLUMN))
        _CHECKED.add(key)
    return table


def read_source(config: TrainConfig, source: SourceSpec) -> pa.Table:
    """A source's table, checked by its declared schema (module docstring)."""
    key = config.data.holdout.key
    return read_checked(source.path, lambda schema: source_spec(config.method, source, schema, key), key)


def read_prompts(config: TrainConfig, path: str) -> pa.Table:
    """A ``prompts_from`` table, checked."""
    key = config.data.holdout.key
    return read_checked(path, lambda schema: prompts_spec(path, schema, key), key)


def check_inputs(config: TrainConfig, sources: Sequence[SourceSpec] | None = None) -> None:
    """Every source (and ``prompts_from`` table) of ``config`` read and validated."""
    for index, source in enumerate(config.data.sources if sources is None else sources):
        check_schema_name(source.schema, f"{config.method}: data.sources[{index}].schema")
        read_source(config, source)
        if source.prompts_from is not None:
            read_prompts(config, source.prompts_from)


__all__ = [
    "MESSAGE_COLUMNS", "TRAINING_SCHEMAS", "check_inputs", "check_schema_name", "declared_spec", "known_kinds",
    "prompts_spec", "read_prompts", "read_source", "source_spec", "training_contract",
]
