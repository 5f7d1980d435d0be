"""The artifact contract: what a Parquet artifact must look like.

An :class:`ArtifactSpec` declares an artifact's Arrow schema, its unique key, the Great
Expectations checks its rows must pass and the columns that must point at rows of another
artifact. Specs are plain data, checked for internal consistency when they are built, so
a typo in a column name fails at import time of the stage that declares it, not after a
long run. Running the checks is :mod:`pipelines.artifacts.validate`'s job.

Every spec implies, on top of what it declares:

* the table's columns and types equal the schema's (see ``check_schema``);
* every key column and every field declared ``nullable=False`` has no nulls;
* the key columns are unique together;
* the table has at least ``min_rows`` rows (every spec declares it, at least 1).

Expectations are referred to by Great Expectations' snake-case names
("expect_column_values_to_be_in_set") so that a spec reads like GX's documentation and
this module needs no GX import (GX takes seconds to import).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any, Iterable, Mapping

import pyarrow as pa

from pipelines.config import positive_int
from pipelines.errors import ConfigError

NOT_NULL = "expect_column_values_to_not_be_null"
IN_SET = "expect_column_values_to_be_in_set"
UNIQUE = "expect_column_values_to_be_unique"
COMPOUND_UNIQUE = "expect_compound_columns_to_be_unique"
LENGTH_BETWEEN = "expect_column_value_lengths_to_be_between"

# The kwargs through which a GX expectation names the columns it looks at.
_COLUMN_KWARGS = ("column", "column_A", "column_B")
_COLUMN_LIST_KWARGS = ("column_list",)

_EXPECTATION_TYPE = re.compile(r"^expect_[a-z0-9_]+$")


def is_scalar(data_type: pa.DataType) -> bool:
    """Whether a column of this type is one value per row (GX can only check those)."""
    if pa.types.is_dictionary(data_type):
        return is_scalar(data_type.value_type)
    return not pa.types.is_nested(data_type)


def _is_list(data_type: pa.DataType) -> bool:
    return pa.types.is_list(data_type) or pa.types.is_large_list(data_type)


@dataclass(frozen=True)
class Expectation:
    """One Great Expectations check: its snake-case class name and its keyword arguments."""

    type: str
    # Excluded from the hash because a mapping is not hashable; equality still compares it.
    kwargs: Mapping[str, Any] = field(default_factory=dict, hash=False)

    def __post_init__(self) -> None:
        if not _EXPECTATION_TYPE.match(self.type):
            raise ConfigError(
                f"expectation type {self.type!r} is not a GX expectation name in snake case "
                "(e.g. 'expect_column_values_to_not_be_null')"
            )
        # Read-only so that a spec shared between stages cannot be changed by one of them.
        object.__setattr__(self, "kwargs", MappingProxyType(dict(self.kwargs)))

    @property
    def columns(self) -> tuple[str, ...]:
        """The columns this expectation looks at; empty for table-level expectations."""
        names: list[str] = []
        for key in _COLUMN_KWARGS:
            if key in self.kwargs:
                names.append(self.kwargs[key])
        for key in _COLUMN_LIST_KWARGS:
            names.extend(self.kwargs.get(key, ()))
        return tuple(names)


@dataclass(frozen=True)
class Reference:
    """Referential integrity: every non-null value of ``column`` occurs in
    ``artifact.other_column`` (e.g. turns.dialogue_id -> dialogues.dialogue_id).

    Nulls are not checked here, as in GX's ``expect_column_values_to_be_in_set``; make the
    column a key or add ``not_null`` when a row must have a parent."""

    column: str
    artifact: str
    other_column: str

    def describe(self) -> str:
        return f"{self.column} -> {self.artifact}.{self.other_column}"


@dataclass(frozen=True)
class ArtifactSpec:
    """The contract of one artifact.

    ``name`` is how references and reports call it (and, by convention, the stem of its
    Parquet file); ``keys`` is its unique key, one column or several together;
    ``expectations`` are checks beyond the implied ones (see the module docstring).
    ``min_rows``: the fewest rows a valid artifact has (at least 1: an empty artifact is what
    an outage or a bad input leaves behind, never a result to publish)."""

    name: str
    schema: pa.Schema
    min_rows: int
    keys: tuple[str, ...] = ()
    expectations: tuple[Expectation, ...] = ()
    references: tuple[Reference, ...] = ()
    description: str = ""

    def __post_init__(self) -> None:
        # Accept any iterable from the author, store tuples so the spec stays immutable.
        for name in ("keys", "expectations", "references"):
            object.__setattr__(self, name, tuple(getattr(self, name)))
        if not self.name:
            raise ConfigError("an artifact spec needs a name")
        positive_int(self.min_rows, f"artifact spec {self.name!r}: min_rows")
        self._check_consistency()

    def _check_consistency(self) -> None:
        if len(set(self.schema.names)) != len(self.schema.names):
            raise self._error(f"the schema names a column twice: {', '.join(self.schema.names)}")
        if len(set(self.keys)) != len(self.keys):
            raise self._error(f"key {self.keys!r} names a column twice")
        for key in self.keys:
            self._require_scalar(key, "key")
        for expectation in self.expectations:
            for column in expectation.columns:
                self._check_expectation_column(expectation, column)
        for reference in self.references:
            self._require_scalar(reference.column, f"reference {reference.describe()}")

    def _check_expectation_column(self, expectation: Expectation, column: str) -> None:
        if expectation.type == LENGTH_BETWEEN and _is_list(self._require_column(column, expectation.type).type):
            # A list's length (e.g. a completion with at least one message): validate answers
            # it with Arrow's list lengths, bounds only.
            if not set(expectation.kwargs) <= {"column", "min_value", "max_value"}:
                raise self._error(f"{expectation.type}: on list column {column!r} it takes only min_value and max_value")
            return
        if expectation.type != NOT_NULL:
            self._require_scalar(column, expectation.type)
            return
        # Not-null (and a list's length, above) are the checks that nested columns get:
        # validate answers them with Arrow. Every other expectation goes through GX, which
        # needs one value per cell, and so do GX's options such as ``mostly``.
        nested = not is_scalar(self._require_column(column, expectation.type).type)
        if nested and set(expectation.kwargs) != {"column"}:
            raise self._error(f"{expectation.type}: on nested column {column!r} it takes no other arguments")

    def _require_column(self, column: str, where: str) -> pa.Field:
        if column not in self.schema.names:
            raise self._error(f"{where}: column {column!r} is not in the schema (columns: {', '.join(self.schema.names)})")
        return self.schema.field(column)

    def _require_scalar(self, column: str, where: str) -> None:
        data_type = self._require_column(column, where).type
        if not is_scalar(data_type):
            raise self._error(
                f"{where}: column {column!r} has nested type {data_type}; "
                "only not_null() (and length_between() on a list) may be put on list/map/struct columns"
            )

    def _error(self, message: str) -> ConfigError:
        return ConfigError(f"artifact spec {self.name!r}: {message}")

    def restricted_to(self, columns: Iterable[str]) -> "ArtifactSpec":
        """This spec over ``columns`` only: their fields, the key when all its columns are
        there, and the expectations and references that look at those columns alone. For a
        reader that takes a narrower file with an artifact's name (training reads a few
        columns); what it lacks is the reader's own check."""
        present = set(columns)
        return ArtifactSpec(
            name=self.name,
            schema=pa.schema([f for f in self.schema if f.name in present]),
            min_rows=self.min_rows,
            keys=self.keys if set(self.keys) <= present else (),
            expectations=tuple(e for e in self.expectations if set(e.columns) <= present),
            references=tuple(r for r in self.references if r.column in present),
            description=self.description,
        )

    @property
    def implied_expectations(self) -> tuple[Expectation, ...]:
        """Checks every artifact gets from its schema and key, without declaring them."""
        not_null_columns = list(self.keys)
        not_null_columns += [f.name for f in self.schema if not f.nullable and f.name not in self.keys]
        implied = [row_count_between(self.min_rows)]
        implied += [not_null(column) for column in not_null_columns]
        if self.keys:
            implied.append(unique(*self.keys))
        return tuple(implied)

    @property
    def suite(self) -> tuple[Expectation, ...]:
        """Implied then declared expectations, without repeats (a declared check that the
        key implies anyway would otherwise be reported twice)."""
        suite: list[Expectation] = []
        for expectation in self.implied_expectations + self.expectations:
            if expectation not in suite:
                suite.append(expectation)
        return tuple(suite)


# --- Builders for the common expectations -------------------------------------------------


def not_null(column: str) -> Expectation:
    return Expectation(NOT_NULL, {"column": column})


def in_set(column: str, values: Iterable[Any]) -> Expectation:
    return Expectation(IN_SET, {"column": column, "value_set": tuple(values)})


def unique(*columns: str) -> Expectation:
    """One column: its values are unique. Several: their combination is unique."""
    if not columns:
        raise ConfigError("unique() needs at least one column")
    if len(columns) == 1:
        return Expectation(UNIQUE, {"column": columns[0]})
    return Expectation(COMPOUND_UNIQUE, {"column_list": tuple(columns)})


def between(column: str, low: Any = None, high: Any = None) -> Expectation:
    """Values within ``[low, high]``; a bound left as None is open."""
    return Expectation("expect_column_values_to_be_between", _bounds(column, low, high))


def length_between(column: str, low: int | None = None, high: int | None = None) -> Expectation:
    """String (or, on a list column, list) lengths within ``[low, high]``;
    ``length_between(col, 1)`` means non-empty. Nulls are not checked."""
    return Expectation(LENGTH_BETWEEN, _bounds(column, low, high))


def matches(column: str, regex: str) -> Expectation:
    return Expectation("expect_column_values_to_match_regex", {"column": column, "regex": regex})


def row_count_between(low: int | None = None, high: int | None = None) -> Expectation:
    return Expectation("expect_table_row_count_to_be_between", _bounds(None, low, high))


def _bounds(column: str | None, low: Any, high: Any) -> dict[str, Any]:
    if low is None and high is None:
        raise ConfigError(f"a between-check{f' on {column!r}' if column else ''} needs at least one bound")
    kwargs: dict[str, Any] = {} if column is None else {"column": column}
    if low is not None:
        kwargs["min_value"] = low
    if high is not None:
        kwargs["max_value"] = high
    return kwargs
