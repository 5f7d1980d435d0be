"""catalog.io.read_jsonl: the one JSON Lines reader (Learn-to-Ask chat logs, Auto-Prompt anchors,
PIR traces): strict JSON per line, and a bad line named by file and line number."""

from __future__ import annotations

import doctest

import pytest

import catalog.io
from catalog.io import read_jsonl
from pipelines.errors import DataError


def test_the_docstring_examples_run() -> None:
    assert doctest.testmod(catalog.io, optionflags=doctest.ELLIPSIS).failed == 0


@pytest.mark.parametrize("text, message", [
    ('{"a": 1}\n{oops\n', "record 'line 2': invalid JSON: Expecting property name enclosed in double quotes at column 2"),
    ('\n\n{"a": 1, "a": 2}\n', "record 'line 3': duplicate key 'a' in a JSON object"),
    ('[Infinity]\n', "record 'line 1': invalid JSON: Infinity is not a JSON value"),
])
def test_a_bad_line_is_named(tmp_path, text: str, message: str) -> None:
    path = tmp_path / "logs.jsonl"
    path.write_text(text)
    with pytest.raises(DataError) as error:
        read_jsonl(path)
    assert str(error.value) == f"{path}, {message}"


def test_records_keep_their_line_numbers(tmp_path) -> None:
    path = tmp_path / "ok.jsonl"
    path.write_text('{"x": 1}\n   \n"s"\n')
    assert read_jsonl(path) == [("line 1", {"x": 1}), ("line 3", "s")]
