"""τ-bench fixtures: the real data when present, and a small hand-made retail domain."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any

import pytest

from pipelines.env.taubench.data import TOOL_FUNCTIONS
from tests.conftest import REPO

#: τ-bench in the repository (xz-compressed JSON, issue 30): the tests read it on every machine.
TAUBENCH = REPO / "vendor" / "taubench"


@pytest.fixture(scope="session")
def taubench_root() -> Path:
    return TAUBENCH


@pytest.fixture(scope="session")
def retail(taubench_root):
    from catalog.taubench_dir import load_taubench_domain

    return load_taubench_domain(taubench_root, "retail")


@pytest.fixture(scope="session")
def airline(taubench_root):
    from catalog.taubench_dir import load_taubench_domain

    return load_taubench_domain(taubench_root, "airline")


def schema_of(domain: str, name: str) -> dict[str, Any]:
    """A tool schema in tools.json's shape, from the implementation's signature (the fixture
    has no tools.json to copy; list arguments are arrays of strings, the rest strings)."""
    parameters = list(inspect.signature(TOOL_FUNCTIONS[domain][name]).parameters.values())[1:]
    properties = {
        p.name: {"type": "array", "items": {"type": "string"}} if p.annotation in (list, "list") else {"type": "string"}
        for p in parameters
    }
    return {
        "type": "function",
        "function": {"name": name, "description": name, "parameters": {"type": "object", "properties": properties, "required": [p.name for p in parameters]}},
    }


def _order(order_id: str, user_id: str, status: str, items: list[dict], payment: str, amount: float) -> dict:
    return {
        "order_id": order_id,
        "user_id": user_id,
        "address": {"address1": "1 Main St", "address2": "", "city": "Austin", "country": "USA", "state": "TX", "zip": "78701"},
        "items": items,
        "fulfillments": [],
        "status": status,
        "payment_history": [{"transaction_type": "payment", "amount": amount, "payment_method_id": payment}],
    }


def mini_retail_tables() -> dict[str, dict[str, Any]]:
    shirt = {"name": "T-Shirt", "product_id": "100", "item_id": "1001", "price": 20.0, "options": {"color": "blue"}}
    return {
        "products": {
            "100": {
                "name": "T-Shirt",
                "product_id": "100",
                "variants": {
                    "1001": {"item_id": "1001", "options": {"color": "blue"}, "available": True, "price": 20.0},
                    "1002": {"item_id": "1002", "options": {"color": "red"}, "available": True, "price": 25.5},
                    "1003": {"item_id": "1003", "options": {"color": "green"}, "available": False, "price": 19.0},
                },
            }
        },
        "users": {
            "ann_lee_1": {
                "name": {"first_name": "Ann", "last_name": "Lee"},
                "address": {"address1": "1 Main St", "address2": "", "city": "Austin", "country": "USA", "state": "TX", "zip": "78701"},
                "email": "ann@example.com",
                "payment_methods": {
                    "gift_card_1": {"source": "gift_card", "balance": 9, "id": "gift_card_1"},
                    "credit_card_1": {"source": "credit_card", "brand": "visa", "last_four": "1234", "id": "credit_card_1"},
                },
                "orders": ["#W1", "#W2"],
            }
        },
        "orders": {
            "#W1": _order("#W1", "ann_lee_1", "pending", [dict(shirt), dict(shirt)], "gift_card_1", 40.0),
            "#W2": _order("#W2", "ann_lee_1", "delivered", [dict(shirt)], "credit_card_1", 20.0),
        },
    }


def mini_retail_tasks() -> list[dict[str, Any]]:
    return [
        {
            "user_id": "ann_lee_1",
            "instruction": "You are Ann Lee in 78701. Cancel order #W1, you no longer need it. Ask how much was refunded.",
            "actions": [
                {"name": "find_user_id_by_name_zip", "kwargs": {"first_name": "Ann", "last_name": "Lee", "zip": "78701"}},
                {"name": "cancel_pending_order", "kwargs": {"order_id": "#W1", "reason": "no longer needed"}},
            ],
            "outputs": ["40.0"],
        },
        {
            "user_id": "ann_lee_1",
            "instruction": "You are Ann Lee (ann@example.com). You only want to know the status of order #W2.",
            "actions": [{"name": "get_order_details", "kwargs": {"order_id": "#W2"}}],
            "outputs": [],
        },
    ]


def write_mini_retail(root: Path, tasks: Any = None, tables: dict[str, Any] | None = None) -> Path:
    """A τ-bench directory with a hand-made retail domain; ``tasks``/``tables`` override."""
    folder = root / "retail"
    folder.mkdir(parents=True, exist_ok=True)
    schemas = [schema_of("retail", name) for name in TOOL_FUNCTIONS["retail"]]
    (folder / "tools.json").write_text(json.dumps(schemas), encoding="utf-8")
    (folder / "wiki.md").write_text("# Retail agent policy\n\nAuthenticate the user first.\n", encoding="utf-8")
    (folder / "rules.json").write_text(json.dumps(["Authenticate first."]), encoding="utf-8")
    for name, records in (tables or mini_retail_tables()).items():
        (folder / f"{name}.json").write_text(json.dumps(records), encoding="utf-8")
    task_list = mini_retail_tasks() if tasks is None else tasks
    for split in ("train", "dev", "test"):
        text = task_list if isinstance(task_list, str) else json.dumps(task_list)
        (folder / f"tasks_{split}.json").write_text(text, encoding="utf-8")
    return root


@pytest.fixture
def mini_root(tmp_path) -> Path:
    return write_mini_retail(tmp_path / "taubench")


@pytest.fixture
def mini_retail(mini_root):
    from catalog.taubench_dir import load_taubench_domain

    return load_taubench_domain(mini_root, "retail")
