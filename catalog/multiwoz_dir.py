"""Read and write a MultiWOZ directory in the official layout.

Layout read (MultiWOZ 2.1-2.4 releases)::

    <dir>/data.json                 {dialogue_id: {"goal": ..., "log": [...]}}
    <dir>/db/<domain>_db.json       (or <dir>/<domain>_db.json, or a separate db directory)
    <dir>/testListFile.json         optional, one dialogue id per line (also read under the
    <dir>/valListFile.json          other names releases and ConvLab use: testListFile.txt,
                                    testListFile; valListFile.txt, valListFile, devListFile.*)

``data.json`` and the ``<domain>_db.json`` files may be stored compressed (``data.json.xz``,
``restaurant_db.json.xz``, as in ``vendor/multiwoz_val`` and ``vendor/multiwoz_db``):
:mod:`catalog.packed` reads both. The embedded corpus is written in exactly this layout
(uncompressed) and read back by the same code.
"""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path
from typing import Any

from pipelines.errors import DataError
from pipelines.multiwoz.ontology import DB_DOMAINS
from pipelines.multiwoz.parse import parse_database, parse_dialogues, parse_split_list, unknown_split_ids
from pipelines.records import SPLITS, TEST, TRAIN, VAL, Corpus, Entity
from pipelines.files import ordinary_permissions, replace_directory, staging_directory
from catalog.io import read_text
from catalog.packed import exists, logical_glob, read_json

TASK_DB_DOMAINS = ("restaurant", "hotel", "attraction", "train", "taxi")
SPLIT_FILES = ((TEST, "testListFile.json"), (VAL, "valListFile.json"))
#: Every name a split list has in the MultiWOZ releases (2.0-2.4: ``.json``; 2.1's zip and
#: ConvLab's copies: ``.txt`` or no extension), in the order they are looked for.
SPLIT_LIST_NAMES = {
    TEST: ("testListFile.json", "testListFile.txt", "testListFile"),
    VAL: ("valListFile.json", "valListFile.txt", "valListFile", "devListFile.json", "devListFile.txt", "devListFile"),
}


def find_split_lists(root: Path, strict: bool = False) -> dict[str, Path | None]:
    """The split list of each split under any of its names (:data:`SPLIT_LIST_NAMES`). Two
    lists of one split that disagree are an error; a missing one is a warning (an error with
    ``strict``) saying what its dialogues become."""
    found: dict[str, Path | None] = {}
    for split, names in SPLIT_LIST_NAMES.items():
        paths = [root / name for name in names if (root / name).is_file()]
        if len(paths) > 1:
            lists = {path: parse_split_list(read_text(path), str(path)) for path in paths}
            first = paths[0]
            for path in paths[1:]:
                if sorted(lists[path]) != sorted(lists[first]):
                    raise DataError(str(path), f"a second {split} split list that differs from {first.name}; keep one")
        found[split] = paths[0] if paths else None
    missing = [split for split, path in found.items() if path is None]
    if missing:
        names = ", ".join(SPLIT_LIST_NAMES[split][0] for split in missing)
        message = (f"no {' or '.join(missing)} split list ({names} or its other names): every dialogue becomes train"
                   if len(missing) == len(found) else f"no {missing[0]} split list ({names} or its other names): "
                   f"no dialogue is {missing[0]}")
        if strict:
            raise DataError(str(root), message)
        print(f"warning: {root}: {message}", file=sys.stderr)
    return found
SHOW_IDS = 5  # how many unknown split ids a message names


def find_db_dir(root: Path) -> Path:
    for candidate in (root / "db", root):
        if exists(candidate / "restaurant_db.json"):
            return candidate
    raise DataError(str(root), "no database found: expected db/<domain>_db.json or <domain>_db.json files")


def load_database(db_dir: Path) -> tuple[dict[str, list[Entity]], dict[str, tuple[str, ...]]]:
    """Every ``<domain>_db.json`` in ``db_dir``. The task domains must be present; a file for
    a domain MultiWOZ does not have is an error, not something to skip silently."""
    entities: dict[str, list[Entity]] = {}
    taxi_options: dict[str, tuple[str, ...]] = {}
    for path in logical_glob(db_dir, "*_db.json"):
        domain = path.name[: -len("_db.json")]
        if domain not in DB_DOMAINS:
            raise DataError(str(path), f"unknown domain {domain!r} (known: {', '.join(DB_DOMAINS)})")
        records, options = parse_database(domain, read_json(path), str(path))
        if domain == "taxi":
            taxi_options = dict(options)
        else:
            entities[domain] = records
    for domain in TASK_DB_DOMAINS:
        if domain != "taxi" and domain not in entities:
            raise DataError(str(db_dir / f"{domain}_db.json"), "file not found (required database)")
    return entities, taxi_options


def load_multiwoz(root: Path | str, db_dir: Path | str | None = None, strict: bool = False) -> Corpus:
    """The corpus of a MultiWOZ directory. Tolerated by default, refused with ``strict``:
    unknown domain-goal fields (skipped, listed in ``Dialogue.ignored``) and split-list ids
    that name no dialogue of ``data.json`` (listed in ``Corpus.unknown_split_ids``, and
    a ``warning:`` line on stderr)."""
    root = Path(root)
    if not root.is_dir():
        raise DataError(str(root), "MultiWOZ directory not found")
    data_path = root / "data.json"
    lists = find_split_lists(root, strict)
    split_ids = {split: parse_split_list(read_text(path), str(path)) if path else [] for split, path in lists.items()}
    raw = read_json(data_path)
    dialogues = parse_dialogues(raw, str(data_path), split_ids["test"], split_ids["val"], strict=strict)
    _require_every_split(dialogues, data_path, split_ids, lists)
    unknown: dict[str, tuple[str, ...]] = {}
    for split, path in lists.items():
        ids = unknown_split_ids(split_ids[split], raw)
        if path is None or not ids:
            continue
        message = f"{len(ids)} dialogue id(s) not in {data_path}: {_first(ids)}"
        if strict:
            raise DataError(str(path), message, ids[0])
        print(f"warning: {path}: {message}", file=sys.stderr)
        unknown[path.name] = tuple(ids)
    entities, taxi_options = load_database(Path(db_dir) if db_dir else find_db_dir(root))
    splits = {d.dialogue_id: d.split for d in dialogues}
    return Corpus(
        source=str(root), dialogues=dialogues, entities=entities, splits=splits, taxi_options=taxi_options,
        unknown_split_ids=unknown,
    )


def _first(ids: list[str]) -> str:
    shown = ", ".join(ids[:SHOW_IDS])
    return shown + (f", ... ({len(ids) - SHOW_IDS} more)" if len(ids) > SHOW_IDS else "")


def _require_every_split(dialogues: list[Any], data_path: Path, split_ids: dict[str, list[str]], lists: dict[str, Path | None]) -> None:
    """No dialogue at all, no training dialogue, or a split list that names none of the
    dialogues: each would publish empty data downstream, so each stops the stage here."""
    if not dialogues:
        raise DataError(str(data_path), "no dialogues (an empty object): nothing to build from")
    counts = {split: 0 for split in SPLITS}
    for dialogue in dialogues:
        counts[dialogue.split] = counts.get(dialogue.split, 0) + 1
    if counts[TRAIN] == 0:
        raise DataError(str(data_path), "the train split is empty: every dialogue is listed for val or test")
    for split, path in lists.items():
        if split_ids[split] and counts[split] == 0:
            raise DataError(str(path), f"the {split} split is empty: none of its ids is in data.json")


def read_raw_database(db_dir: Path | str) -> dict[str, list[dict[str, Any]]]:
    """The raw JSON records of a database directory (for generating goals against it)."""
    db_dir = Path(db_dir)
    return {path.name[: -len("_db.json")]: read_json(path) for path in logical_glob(db_dir, "*_db.json")}


def write_multiwoz(corpus: dict[str, Any], target: Path | str) -> None:
    """Write ``generate_corpus`` output as an official-layout directory, atomically: the
    directory is built next to the target and swapped in, so a crash leaves the old one."""
    target = Path(target)
    staging = staging_directory(target)  # 0755, and so are new parents (mkdtemp's would be 0700)
    try:
        (staging / "db").mkdir()
        with open(staging / "data.json", "w", encoding="utf-8") as handle:
            json.dump(corpus["data"], handle, ensure_ascii=False, indent=1)
        for domain, records in corpus["db"].items():
            with open(staging / "db" / f"{domain}_db.json", "w", encoding="utf-8") as handle:
                json.dump(records, handle, ensure_ascii=False, indent=1)
        for split, filename in SPLIT_FILES:
            (staging / filename).write_text("".join(f"{i}\n" for i in corpus["splits"][split]), encoding="utf-8")
        ordinary_permissions(staging)
        replace_directory(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def held_out_world(source: str | Path, db_dir: str | Path | None, split: str, max_goals: int | None, where: str) -> tuple[Any, list[Any]]:
    """The database and the held-out goals a policy is evaluated on (the ``evaluate`` stage's
    flow and the GPU job's evaluation read them alike); ``where`` names the params section in
    the error when the split has no goal with tool domains."""
    from pipelines.env.tools import Database
    from pipelines.errors import ConfigError
    from pipelines.evaluation.play import held_out_goals

    corpus = load_multiwoz(Path(source), db_dir)
    goals = held_out_goals(corpus.dialogues, split, max_goals)
    if not goals:
        raise ConfigError(f"{where}: no dialogues of split {split!r} with tool domains in {source}")
    return Database(corpus.entities, corpus.taxi_options), goals
