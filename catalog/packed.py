"""Data files that may be stored compressed: ``X.json`` or ``X.json.xz`` / ``X.json.gz`` alike.

The data vendored under ``vendor/`` (τ-bench, the real MultiWOZ val dialogues and database,
issue 30) keeps every JSON file xz-compressed, so that each stays well under 5 MB; the same
loaders read an uncompressed copy (``../shared/data/...``, a MultiWOZ release) unchanged.
A name is looked up as given first, then with each suffix of :data:`COMPRESSED`; the errors
name the file as asked for, and the strictness is :func:`catalog.io.read_json`'s.
"""

from __future__ import annotations

import gzip
import lzma
from pathlib import Path
from typing import Any

from pipelines.errors import DataError
from catalog.io import decode_text, parse_json, read_text as _read_plain_text

COMPRESSED = (".xz", ".gz")


def resolve(path: Path | str) -> Path | None:
    """The file that holds ``path``: itself, or ``path`` + ``.xz`` / ``.gz``; None if none exists."""
    path = Path(path)
    for candidate in (path, *(path.with_name(path.name + suffix) for suffix in COMPRESSED)):
        if candidate.is_file():
            return candidate
    return None


def exists(path: Path | str) -> bool:
    return resolve(path) is not None


def require(path: Path | str) -> Path:
    """``path`` as asked for (its compressed form may be what exists); DataError when neither is."""
    if resolve(path) is None:
        raise DataError(str(path), "file not found (nor " + ", ".join(f"{Path(path).name}{s}" for s in COMPRESSED) + ")")
    return Path(path)


def logical_glob(folder: Path | str, pattern: str) -> list[Path]:
    """The files of ``folder`` matching ``pattern`` (e.g. ``*_db.json``), stored plain or
    compressed, each named without its compression suffix, sorted; a name stored twice counts once."""
    folder = Path(folder)
    names = {p.name for p in folder.glob(pattern) if p.is_file()}
    for suffix in COMPRESSED:
        names |= {p.name[: -len(suffix)] for p in folder.glob(pattern + suffix) if p.is_file()}
    return [folder / name for name in sorted(names)]


def read_bytes(path: Path | str) -> bytes:
    """The file's bytes, decompressed when it is stored as ``.xz`` / ``.gz``."""
    actual = resolve(require(path))
    assert actual is not None
    try:
        if actual.suffix == ".xz":
            return lzma.decompress(actual.read_bytes())
        if actual.suffix == ".gz":
            return gzip.decompress(actual.read_bytes())
        return actual.read_bytes()
    except (lzma.LZMAError, gzip.BadGzipFile, EOFError) as error:
        raise DataError(str(actual), f"cannot decompress: {error}") from None
    except OSError as error:
        raise DataError(str(actual), f"cannot read: {error.strerror or error}") from None


def read_text(path: Path | str) -> str:
    """The (decompressed) file's text, decoded as strict UTF-8."""
    actual = resolve(require(path))
    assert actual is not None
    if actual.suffix not in COMPRESSED:
        return _read_plain_text(actual)
    return decode_text(read_bytes(actual), str(actual))


def read_json(path: Path | str) -> Any:
    """The decoded JSON document of ``path`` or its compressed form (strict, as :func:`catalog.io.read_json`)."""
    actual = resolve(require(path))
    return parse_json(read_text(actual), str(actual))
