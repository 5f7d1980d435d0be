"""A content-addressed on-disk cache of LLM responses.

The key of a response is the sha256 of the canonical JSON of what determines it: endpoint,
model, messages, sampling parameters, seed (and, where they apply, the number of choices,
the response schema and the tools). Credentials are never part of it: the client builds the key fields
itself and has no way to put a key in them.

Each record is one JSON file, ``<directory>/<key[:2]>/<key>.json``: the two-character shards
keep directories small, and one file per record means concurrent writers never contend for
a shared index. Files are written to a temporary name in the same directory and renamed into
place, so a reader (or a crash) never sees half a record. Records carry no timestamps: the
same request always produces the same bytes, which keeps the directory friendly to DVC.

Only the key is canonical (sorted keys): the response is stored in the order the server sent
it, so a cache hit returns exactly what the live call returned (tool-call arguments and parsed
JSON objects keep their key order). Format 1 stored responses with sorted keys; its records
are treated as missing.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import tempfile
import threading
from pathlib import Path
from typing import Any, Mapping

logger = logging.getLogger(__name__)

CACHE_FORMAT = 2


def canonical_json(value: Any) -> str:
    """One spelling per value: sorted keys, no insignificant whitespace, unicode kept as is.

    Non-JSON values (sets, objects) are rejected rather than stringified: a key that depends
    on a repr is a key that silently changes between runs."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _ordered_json(value: Any) -> str:
    """Compact JSON keeping every object's key order: what a response record is stored as."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def cache_key(fields: Mapping[str, Any]) -> str:
    return hashlib.sha256(canonical_json(dict(fields)).encode("utf-8")).hexdigest()


class ResponseCache:
    """Get and put response records by key fields. ``hits``/``misses``/``writes`` count what
    happened through this instance (``stats()`` returns them together)."""

    def __init__(self, directory: str | os.PathLike[str]):
        self.directory = Path(directory)
        self._lock = threading.Lock()
        self.hits = 0
        self.misses = 0
        self.writes = 0

    def path_for(self, key: str) -> Path:
        return self.directory / key[:2] / f"{key}.json"

    def get(self, fields: Mapping[str, Any]) -> dict[str, Any] | None:
        """The stored response for these key fields, or None."""
        key = cache_key(fields)
        record = self._read(key)
        if record is not None and canonical_json(record.get("key")) != canonical_json(dict(fields)):
            # Only a hand-edited or foreign file can get here; refuse it rather than trust it.
            logger.warning("cache record %s does not match its key; ignoring it", self.path_for(key))
            record = None
        with self._lock:
            if record is None:
                self.misses += 1
            else:
                self.hits += 1
        return None if record is None else record["response"]

    def contains(self, fields: Mapping[str, Any]) -> bool:
        """Whether a record exists, without counting a hit or a miss."""
        return self.path_for(cache_key(fields)).is_file()

    def put(self, fields: Mapping[str, Any], response: Mapping[str, Any]) -> Path:
        key = cache_key(fields)
        record = {"format": CACHE_FORMAT, "key": dict(fields), "response": dict(response)}
        path = self.path_for(key)
        path.parent.mkdir(parents=True, exist_ok=True)
        handle = tempfile.NamedTemporaryFile(
            "w", encoding="utf-8", dir=path.parent, prefix=f".{key[:8]}.", suffix=".tmp", delete=False
        )
        try:
            with handle:
                handle.write(_ordered_json(record))
            os.replace(handle.name, path)
        except BaseException:
            Path(handle.name).unlink(missing_ok=True)
            raise
        with self._lock:
            self.writes += 1
        return path

    def stats(self) -> dict[str, int]:
        with self._lock:
            return {"hits": self.hits, "misses": self.misses, "writes": self.writes}

    def _read(self, key: str) -> dict[str, Any] | None:
        path = self.path_for(key)
        try:
            text = path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return None
        try:
            record = json.loads(text)
        except json.JSONDecodeError:
            # Writes are atomic, so this is damage from outside; recompute and overwrite.
            logger.warning("cache record %s is not valid JSON; treating it as missing", path)
            return None
        if not isinstance(record, dict) or record.get("format") != CACHE_FORMAT or "response" not in record:
            logger.warning("cache record %s has an unknown layout; treating it as missing", path)
            return None
        return record

    def __repr__(self) -> str:
        return f"ResponseCache({str(self.directory)!r})"
