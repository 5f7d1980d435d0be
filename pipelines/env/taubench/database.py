"""τ-bench's database: named tables of JSON records, forked cheaply by copy on write.

Every episode of a domain shares one read-only base (the tables as loaded). An episode's
:class:`TauDatabase` keeps its own copies of the records it touched, so :meth:`TauDatabase.fork`
copies a dict of the touched records, not the database. Tools read and write through the
table views (``db["orders"]["#W0000000"]``), written in τ-bench's own dict style:

* ``table[key]`` gives the episode's private, mutable copy of the record (made on first access);
* ``table.values()`` / ``table.items()`` iterate the current records *read-only* (the searches
  and look-ups that scan a table must not copy all of it);
* ``table[key] = record`` adds or replaces a record.

τ-bench compares databases by a hash of the whole data; since every database of a domain
starts from the same base, :meth:`TauDatabase.fingerprint` hashes only the records that differ
from it, which is equal for two databases exactly when τ-bench's hashes are equal.
"""

from __future__ import annotations

import copy
import hashlib
import json
from typing import Any, Iterator, Mapping

# A record removed from a table (no τ-bench tool deletes records, but the overlay allows it).
_DELETED = object()
_ABSENT = object()  # not in the overlay


def canonical_json(value: Any) -> str:
    """Key order does not matter, list order does, and 5 differs from 5.0 — as in τ-bench's
    ``to_hashable`` (sorted dict items, lists as tuples, ``str`` of the result)."""
    return json.dumps(value, sort_keys=True, ensure_ascii=False, separators=(",", ":"))


class TauBase:
    """The read-only tables of one domain, shared by every database forked from it."""

    def __init__(self, tables: Mapping[str, Mapping[str, Any]]):
        self.tables: dict[str, dict[str, Any]] = {name: dict(records) for name, records in tables.items()}
        self._canonical: dict[tuple[str, str], str] = {}

    def canonical(self, table: str, key: str) -> str | None:
        records = self.tables[table]
        if key not in records:
            return None
        cached = self._canonical.get((table, key))
        if cached is None:
            cached = self._canonical[(table, key)] = canonical_json(records[key])
        return cached


class TableView:
    """One table of a :class:`TauDatabase`, in the dict style τ-bench's tools are written in."""

    def __init__(self, db: TauDatabase, name: str):
        self._db = db
        self._name = name

    def __contains__(self, key: object) -> bool:
        return isinstance(key, str) and self._db._current(self._name, key) is not None

    def __getitem__(self, key: str) -> Any:
        record = self._db._edit(self._name, key)
        if record is None:
            raise KeyError(key)
        return record

    def __setitem__(self, key: str, record: Any) -> None:
        self._db._put(self._name, key, record)

    def get(self, key: str, default: Any = None) -> Any:
        return self[key] if key in self else default

    def keys(self) -> Iterator[str]:
        return (key for key, _ in self.items())

    def values(self) -> Iterator[Any]:
        """Read-only: never modify what this yields (use ``table[key]`` to change a record)."""
        return (record for _, record in self.items())

    def items(self) -> Iterator[tuple[str, Any]]:
        """Read-only, in the base's order, records added by the episode last."""
        db, name = self._db, self._name
        base = db.base.tables[name]
        overlay = db._overlay
        for key, record in base.items():
            current = overlay.get((name, key), record)
            if current is not _DELETED:
                yield key, current
        for (table, key), record in list(overlay.items()):
            if table == name and key not in base and record is not _DELETED:
                yield key, record

    def __iter__(self) -> Iterator[str]:
        return self.keys()

    def __len__(self) -> int:
        return sum(1 for _ in self.items())


class TauDatabase:
    """One episode's database: the shared base plus the records this episode changed."""

    def __init__(self, base: TauBase):
        self.base = base
        self._overlay: dict[tuple[str, str], Any] = {}
        self._owned: set[tuple[str, str]] = set()  # overlay records no fork shares

    @property
    def table_names(self) -> tuple[str, ...]:
        return tuple(self.base.tables)

    def __getitem__(self, table: str) -> TableView:
        if table not in self.base.tables:
            raise KeyError(table)
        return TableView(self, table)

    def __contains__(self, table: object) -> bool:
        return table in self.base.tables

    def fork(self) -> TauDatabase:
        """An independent copy in O(records touched): both sides copy a shared record again
        before they next change it."""
        twin = TauDatabase(self.base)
        twin._overlay = dict(self._overlay)
        self._owned = set()
        return twin

    # -- record access -------------------------------------------------------------------

    def _current(self, table: str, key: str) -> Any:
        found = self._overlay.get((table, key), _ABSENT)
        if found is _ABSENT:
            return self.base.tables[table].get(key)
        return None if found is _DELETED else found

    def _edit(self, table: str, key: str) -> Any:
        slot = (table, key)
        if slot in self._owned:
            return self._overlay[slot]
        current = self._current(table, key)
        if current is None:
            return None
        mine = copy.deepcopy(current)
        self._overlay[slot] = mine
        self._owned.add(slot)
        return mine

    def _put(self, table: str, key: str, record: Any) -> None:
        if table not in self.base.tables:
            raise KeyError(table)
        self._overlay[(table, key)] = record
        self._owned.add((table, key))

    # -- comparison ----------------------------------------------------------------------

    def changed_records(self, exact: bool = False) -> dict[str, dict[str, Any]]:
        """``{table: {key: record}}`` of every record whose value differs from the base (a
        deleted record maps to None). By default values compare as data (9 == 9.0), as
        ``ground_truth_replay.json`` lists them; ``exact`` compares them as τ-bench's hash
        does, where a gift card balance turned from 9 into 9.0 is a change."""
        changed: dict[str, dict[str, Any]] = {}
        base = self.base.tables
        for (table, key), record in sorted(self._overlay.items()):
            if record is _DELETED:
                if key in base[table]:
                    changed.setdefault(table, {})[key] = None
                continue
            if exact:
                differs = canonical_json(record) != self.base.canonical(table, key)
            else:
                differs = key not in base[table] or record != base[table][key]
            if differs:
                changed.setdefault(table, {})[key] = copy.deepcopy(record)
        return changed

    def fingerprint(self) -> str:
        """A hash of the database that is equal for two databases of the same base exactly
        when their data are equal (τ-bench's data hash, up to the shared base)."""
        digest = hashlib.sha256()
        for table, records in self.changed_records(exact=True).items():
            for key, record in records.items():
                digest.update(canonical_json([table, key, record]).encode())
                digest.update(b"\n")
        return digest.hexdigest()

    def snapshot(self) -> dict[str, dict[str, Any]]:
        """The whole current data as plain dicts (a deep copy; for debugging and export)."""
        return {name: {key: copy.deepcopy(record) for key, record in self[name].items()} for name in self.table_names}
