"""Test-split leakage: no training artifact may hold a dialogue of the test split.

The test split is for evaluation only. A stage that writes or reads training data calls
:func:`check_no_test_dialogues` with the corpus' test dialogue ids; the first leaked id
stops it with a :class:`~pipelines.errors.DataError` naming the artifact, the record and
the field, and how many rows and dialogues leak.

>>> check_no_test_dialogues({"speaker_sft": ["a", "b"]}, {"c"})
>>> check_no_test_dialogues({"speaker_sft": ["a", "c", "c"]}, {"c"})
Traceback (most recent call last):
...
pipelines.errors.DataError: speaker_sft, record 'c', field 'dialogue_id': 2 row(s) of 1 test-split dialogue(s) in a training artifact; the test split is for evaluation only
"""

from __future__ import annotations

from typing import AbstractSet, Iterable, Mapping

from pipelines.errors import DataError


def find_test_dialogues(artifacts: Mapping[str, Iterable[str]], test_ids: AbstractSet[str]) -> dict[str, dict[str, int]]:
    """{artifact: {test dialogue id: rows}} for every artifact holding test-split dialogues."""
    leaks: dict[str, dict[str, int]] = {}
    for name, ids in artifacts.items():
        found: dict[str, int] = {}
        for dialogue_id in ids:
            if dialogue_id in test_ids:
                found[dialogue_id] = found.get(dialogue_id, 0) + 1
        if found:
            leaks[name] = found
    return leaks


def check_no_test_dialogues(artifacts: Mapping[str, Iterable[str]], test_ids: AbstractSet[str], field: str = "dialogue_id") -> None:
    """Raise DataError when any artifact (name -> its dialogue ids, one per row) holds a
    test-split dialogue id."""
    leaks = find_test_dialogues(artifacts, test_ids)
    for name, found in leaks.items():
        first = min(found)
        raise DataError(
            name,
            f"{sum(found.values())} row(s) of {len(found)} test-split dialogue(s) in a training artifact; "
            "the test split is for evaluation only",
            record=first,
            field=field,
        )


__all__ = ["check_no_test_dialogues", "find_test_dialogues"]
