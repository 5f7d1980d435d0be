"""Read a τ-bench data directory (``vendor/taubench`` layout, see its SOURCE.md)::

    <root>/<domain>/tools.json                tool schemas (OpenAI style)
    <root>/<domain>/wiki.md                   the policy
    <root>/<domain>/rules.json                extra rules (a list of strings)
    <root>/<domain>/<table>.json              orders/products/users, flights/reservations/users
    <root>/<domain>/tasks_<split>.json        train/dev/test (retail), test (airline)
    <root>/<domain>/ground_truth_replay.json  τ-bench's own outputs for the ground truth

Each JSON file may be stored compressed (``tasks_test.json.xz``, as in ``vendor/taubench``,
the default; ``../shared/data/taubench`` holds them plain): :mod:`catalog.packed` reads both.
Read in place, never copied. Every problem is a DataError naming file, record and field.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipelines.env.taubench.data import (
    SPLITS,
    TABLES,
    TauDomain,
    check_domain,
    parse_database,
    parse_rules,
    parse_tasks,
    parse_tool_schemas,
)
from pipelines.errors import DataError
from catalog.packed import exists, read_json, read_text, require

REPLAY_FILE = "ground_truth_replay.json"
DEFAULT_TAUBENCH = "vendor/taubench"  # in the repository (issue 30)


def taubench_root(params: Mapping[str, Any], where: str) -> Path:
    """The τ-bench directory of a params section; DataError with what to do when it is absent."""
    root = Path(params.get("taubench") or DEFAULT_TAUBENCH)
    if not (root / "retail").is_dir():
        raise DataError(
            str(root),
            f"τ-bench data not found (params.yaml {where}.taubench); the Clarifier stages need it: point "
            "taubench at a τ-bench directory, or leave clarifier.enable empty to keep them out of the pipeline",
        )
    return root


def domain_dir(root: Path | str, domain: str) -> Path:
    check_domain(domain, str(root))
    path = Path(root) / domain
    if not path.is_dir():
        raise DataError(str(path), "τ-bench domain directory not found")
    return path


def _require(path: Path) -> Path:
    """``path``, stored plain or compressed; DataError "file not found" when neither is."""
    return require(path)


def load_taubench_domain(root: Path | str, domain: str, splits: tuple[str, ...] | None = None) -> TauDomain:
    """The domain with its database, tools, policy and the tasks of ``splits`` (all by default)."""
    folder = domain_dir(root, domain)
    tools_path = _require(folder / "tools.json")
    schemas = parse_tool_schemas(read_json(tools_path), str(tools_path), domain)
    sources = {table: str(_require(folder / f"{table}.json")) for table in TABLES[domain]}
    base = parse_database({table: read_json(path) for table, path in sources.items()}, sources, domain)
    rules_path = folder / "rules.json"
    rules = parse_rules(read_json(rules_path), str(rules_path)) if exists(rules_path) else ()
    wiki = read_text(_require(folder / "wiki.md"))
    wanted = SPLITS[domain] if splits is None else splits
    tasks = {}
    for split in wanted:
        if split not in SPLITS[domain]:
            raise DataError(str(folder), f"unknown split {split!r} for {domain} (splits: {', '.join(SPLITS[domain])})")
        path = _require(folder / f"tasks_{split}.json")
        tasks[split] = parse_tasks(read_json(path), str(path), domain, split)
    return TauDomain(domain, base, schemas, wiki, rules, tasks)


def load_ground_truth_replay(root: Path | str, domain: str) -> list[dict[str, Any]]:
    """The raw replay records (checked by :func:`pipelines.env.taubench.conformance.check_conformance`)."""
    path = _require(domain_dir(root, domain) / REPLAY_FILE)
    raw = read_json(path)
    if not isinstance(raw, list):
        raise DataError(str(path), "must be a JSON list of replay records")
    return raw
