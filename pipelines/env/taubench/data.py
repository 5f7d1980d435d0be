"""τ-bench's task and database records, checked on the way in.

Raw JSON (as ``catalog.taubench_dir`` reads it) becomes :class:`TauTask` and :class:`TauDomain`
records here; anything malformed is a :class:`~pipelines.errors.DataError` naming the file,
the record and the field, never a ``KeyError`` from deep inside a tool.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from pipelines.env.taubench.airline import AIRLINE_TOOLS
from pipelines.env.taubench.database import TauBase
from pipelines.env.taubench.retail import RETAIL_TOOLS
from pipelines.errors import DataError

DOMAINS: tuple[str, ...] = ("retail", "airline")
TOOL_FUNCTIONS: Mapping[str, Mapping[str, Callable[..., str]]] = {"retail": RETAIL_TOOLS, "airline": AIRLINE_TOOLS}
TABLES: Mapping[str, tuple[str, ...]] = {"retail": ("orders", "products", "users"), "airline": ("flights", "reservations", "users")}
# Splits per domain, as τ-bench ships them.
SPLITS: Mapping[str, tuple[str, ...]] = {"retail": ("train", "dev", "test"), "airline": ("test",)}

# Fields a record must have for the tools to work on it: (name, JSON type). The key field,
# where a table has one, must equal the record's key.
_OBJ, _STR, _LIST, _NUM = "object", "string", "array", "number"
_RECORD_FIELDS: Mapping[tuple[str, str], tuple[tuple[str, str], ...]] = {
    ("retail", "orders"): (("order_id", _STR), ("user_id", _STR), ("items", _LIST), ("status", _STR), ("payment_history", _LIST)),
    ("retail", "products"): (("name", _STR), ("product_id", _STR), ("variants", _OBJ)),
    ("retail", "users"): (("name", _OBJ), ("address", _OBJ), ("email", _STR), ("payment_methods", _OBJ), ("orders", _LIST)),
    ("airline", "flights"): (
        ("flight_number", _STR), ("origin", _STR), ("destination", _STR),
        ("scheduled_departure_time_est", _STR), ("scheduled_arrival_time_est", _STR), ("dates", _OBJ),
    ),
    ("airline", "reservations"): (
        ("reservation_id", _STR), ("user_id", _STR), ("cabin", _STR), ("flights", _LIST), ("passengers", _LIST),
        ("payment_history", _LIST), ("total_baggages", _NUM), ("nonfree_baggages", _NUM),
    ),
    ("airline", "users"): (("name", _OBJ), ("payment_methods", _OBJ), ("reservations", _LIST)),
}
_KEY_FIELDS: Mapping[tuple[str, str], str] = {
    ("retail", "orders"): "order_id",
    ("retail", "products"): "product_id",
    ("airline", "flights"): "flight_number",
    ("airline", "reservations"): "reservation_id",
}


def json_type(value: Any) -> str:
    """The JSON-schema type name of a decoded JSON value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    if isinstance(value, list):
        return "array"
    if isinstance(value, dict):
        return "object"
    return type(value).__name__


def is_type(value: Any, expected: str) -> bool:
    """JSON-schema typing: an integer is a number too; a boolean is neither."""
    actual = json_type(value)
    return actual == expected or (expected == "number" and actual == "integer")


@dataclass(frozen=True)
class TauAction:
    """A ground-truth action: a tool name and its keyword arguments (decoded JSON)."""

    name: str
    kwargs: dict[str, Any]

    @property
    def kwargs_json(self) -> str:
        return json.dumps(self.kwargs, sort_keys=True, ensure_ascii=False)

    def __hash__(self) -> int:  # the kwargs dict is not hashable; its canonical JSON is
        return hash((self.name, self.kwargs_json))


@dataclass(frozen=True)
class TauTask:
    """One τ-bench task: who the user is, what they were told, what a correct agent does and
    what it must say. ``task_id`` is ``<domain>/<split>/<index>``."""

    domain: str
    split: str
    index: int
    user_id: str
    instruction: str
    actions: tuple[TauAction, ...]
    outputs: tuple[str, ...]
    annotator: str | None = None

    @property
    def task_id(self) -> str:
        return f"{self.domain}/{self.split}/{self.index}"

    # What the episode tables record of any goal (see pipelines.env.world).
    @property
    def dialogue_id(self) -> str:
        return self.task_id

    @property
    def domain_names(self) -> tuple[str, ...]:
        return (self.domain,)


@dataclass(frozen=True)
class TauDomain:
    """Everything of one domain: the shared database base, the tool schemas (OpenAI style, in
    ``tools.json``'s order), the policy text and the rules."""

    name: str
    base: TauBase
    tool_schemas: tuple[dict[str, Any], ...]
    wiki: str
    rules: tuple[str, ...] = ()
    tasks: Mapping[str, tuple[TauTask, ...]] = field(default_factory=dict)

    @property
    def tool_names(self) -> tuple[str, ...]:
        return tuple(schema["function"]["name"] for schema in self.tool_schemas)

    def schema(self, name: str) -> dict[str, Any] | None:
        return next((s for s in self.tool_schemas if s["function"]["name"] == name), None)

    def all_tasks(self) -> list[TauTask]:
        return [task for split in SPLITS[self.name] for task in self.tasks.get(split, ())]


def check_domain(domain: str, source: str) -> None:
    if domain not in DOMAINS:
        raise DataError(source, f"unknown τ-bench domain {domain!r} (known: {', '.join(DOMAINS)})")


def parse_tasks(raw: Any, source: str, domain: str, split: str) -> tuple[TauTask, ...]:
    """Tasks from a ``tasks_<split>.json`` list; a record is named by its index in the file."""
    check_domain(domain, source)
    if not isinstance(raw, list):
        raise DataError(source, f"a task file must be a JSON list, got {json_type(raw)}")
    if not raw:
        raise DataError(source, "no tasks (an empty list)")
    tools = TOOL_FUNCTIONS[domain]
    tasks = []
    for index, record in enumerate(raw):
        where = f"task {index}"
        if not isinstance(record, dict):
            raise DataError(source, f"a task must be an object, got {json_type(record)}", where)
        for name in ("user_id", "instruction"):
            value = record.get(name)
            if not isinstance(value, str) or not value.strip():
                got = "missing" if name not in record else f"got {json_type(value)} {value!r}"[:80]
                raise DataError(source, f"must be a non-empty string ({got})", where, name)
        actions_raw = record.get("actions")
        if not isinstance(actions_raw, list):
            raise DataError(source, f"must be a list of actions, got {json_type(actions_raw)}", where, "actions")
        actions = []
        for k, action in enumerate(actions_raw):
            at = f"actions[{k}]"
            if not isinstance(action, dict):
                raise DataError(source, f"an action must be an object, got {json_type(action)}", where, at)
            name = action.get("name")
            if name not in tools:
                raise DataError(source, f"unknown {domain} tool {name!r} (tools: {', '.join(tools)})", where, f"{at}.name")
            kwargs = action.get("kwargs")
            if not isinstance(kwargs, dict):
                raise DataError(source, f"must be an object of arguments, got {json_type(kwargs)}", where, f"{at}.kwargs")
            actions.append(TauAction(name, kwargs))
        outputs = record.get("outputs", [])
        if not isinstance(outputs, list) or not all(isinstance(o, str) for o in outputs):
            raise DataError(source, f"must be a list of strings, got {json.dumps(outputs)[:80]}", where, "outputs")
        annotator = record.get("annotator")
        tasks.append(
            TauTask(
                domain, split, index, record["user_id"], record["instruction"], tuple(actions), tuple(outputs),
                None if annotator is None else str(annotator),
            )
        )
    return tuple(tasks)


def parse_tool_schemas(raw: Any, source: str, domain: str) -> tuple[dict[str, Any], ...]:
    """The ``tools.json`` list; every tool askflow implements must be described exactly once,
    and nothing else."""
    check_domain(domain, source)
    if not isinstance(raw, list):
        raise DataError(source, f"must be a JSON list of tool schemas, got {json_type(raw)}")
    seen: dict[str, int] = {}
    for index, schema in enumerate(raw):
        where = f"tool {index}"
        function = schema.get("function") if isinstance(schema, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise DataError(source, "expected {'type': 'function', 'function': {'name': ...}}", where, "function.name")
        parameters = function.get("parameters")
        if not isinstance(parameters, dict) or not isinstance(parameters.get("properties"), dict):
            raise DataError(source, "parameters must be a JSON schema object with properties", function["name"], "parameters")
        if function["name"] in seen:
            raise DataError(source, "tool described twice", function["name"], "function.name")
        seen[function["name"]] = index
    implemented = set(TOOL_FUNCTIONS[domain])
    unknown = sorted(set(seen) - implemented)
    if unknown:
        raise DataError(source, f"no implementation for tool(s) {', '.join(unknown)}", unknown[0], "function.name")
    missing = sorted(implemented - set(seen))
    if missing:
        raise DataError(source, f"tool(s) {', '.join(missing)} not described")
    return tuple(raw)


def parse_database(raw_tables: Mapping[str, Any], sources: Mapping[str, str], domain: str) -> TauBase:
    """The domain's tables (``{table: {key: record}}``); ``sources`` names each table's file."""
    for table in TABLES[domain]:
        source = sources.get(table, table)
        if table not in raw_tables:
            raise DataError(source, f"missing {domain} table {table!r}")
        records = raw_tables[table]
        if not isinstance(records, dict):
            raise DataError(source, f"a table must be a JSON object keyed by id, got {json_type(records)}")
        if not records:
            raise DataError(source, "empty table")
        key_field = _KEY_FIELDS.get((domain, table))
        for key, record in records.items():
            if not isinstance(record, dict):
                raise DataError(source, f"a record must be an object, got {json_type(record)}", key)
            for name, kind in _RECORD_FIELDS[(domain, table)]:
                if name not in record:
                    raise DataError(source, "missing", key, name)
                if not is_type(record[name], kind):
                    raise DataError(source, f"must be {kind}, got {json_type(record[name])}", key, name)
            if key_field is not None and record[key_field] != key:
                raise DataError(source, f"{record[key_field]!r} differs from the record's key {key!r}", key, key_field)
    return TauBase({table: raw_tables[table] for table in TABLES[domain]})


def parse_rules(raw: Any, source: str) -> tuple[str, ...]:
    if not isinstance(raw, list) or not all(isinstance(rule, str) for rule in raw):
        raise DataError(source, "must be a JSON list of strings")
    return tuple(raw)


def task_by_id(tasks: Sequence[TauTask], task_id: str) -> TauTask:
    found = next((task for task in tasks if task.task_id == task_id), None)
    if found is None:
        raise KeyError(task_id)
    return found
