"""τ-bench's 16 retail tools, re-implemented from their schemas (``tools.json``), the policy
(``wiki.md``) and the recorded outputs of τ-bench's own tools (``ground_truth_replay.json``).

Each tool is ``f(data, **kwargs) -> str``, exactly τ-bench's contract: a JSON string, a plain
answer (a user id, "Transfer successful") or an ``"Error: ..."`` string. Checks run in
τ-bench's order, so that a call breaking several rules gets τ-bench's error. ``data`` is a
:class:`~pipelines.env.taubench.database.TauDatabase` (or plain dicts): ``data[t][key]`` is a
record this call may change, ``data[t].values()`` is read-only.
"""

from __future__ import annotations

import json
from typing import Any

from pipelines.env.taubench.common import calculate, think, transfer_to_human_agents

CANCEL_REASONS = ("no longer needed", "ordered by mistake")


def _order_in(orders: Any, order_id: str, status: str, verb: str) -> Any:
    """The order if it exists and has ``status``, else τ-bench's error text for ``verb``."""
    if order_id not in orders:
        return "Error: order not found"
    order = orders[order_id]
    if order["status"] != status:
        return f"Error: non-{status} order cannot be {verb}"
    return order


def _count_missing(order: dict[str, Any], item_ids: list[str]) -> str | None:
    """The first requested item id that the order holds fewer times than requested."""
    all_item_ids = [item["item_id"] for item in order["items"]]
    for item_id in item_ids:
        if item_ids.count(item_id) > all_item_ids.count(item_id):
            return item_id
    return None


def _price_difference(products: Any, order: dict[str, Any], item_ids: list[str], new_item_ids: list[str]) -> float | str:
    """The summed price change of swapping each item for its new variant, or an error."""
    diff_price = 0
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        item = [item for item in order["items"] if item["item_id"] == item_id][0]
        variants = products[item["product_id"]]["variants"]
        if not (new_item_id in variants and variants[new_item_id]["available"]):
            return f"Error: new item {new_item_id} not found or available"
        diff_price += variants[new_item_id]["price"] - item["price"]
    return diff_price


def cancel_pending_order(data: Any, order_id: str, reason: str) -> str:
    orders = data["orders"]
    order = _order_in(orders, order_id, "pending", "cancelled")
    if isinstance(order, str):
        return order
    if reason not in CANCEL_REASONS:
        return "Error: invalid reason"
    refunds = []
    for payment in order["payment_history"]:
        payment_id = payment["payment_method_id"]
        refunds.append({"transaction_type": "refund", "amount": payment["amount"], "payment_method_id": payment_id})
        if "gift_card" in payment_id:  # a gift card is refunded at once
            method = data["users"][order["user_id"]]["payment_methods"][payment_id]
            method["balance"] = round(method["balance"] + payment["amount"], 2)
    order["status"] = "cancelled"
    order["cancel_reason"] = reason
    order["payment_history"].extend(refunds)
    return json.dumps(order)


def _item_swap(
    data: Any, order_id: str, status: tuple[str, str], item_ids: list, new_item_ids: list, payment_method_id: str, *, rounded: bool
) -> tuple[dict, float, dict] | str:
    """The checks an exchange and an item modification share, in τ-bench's order: the order in
    ``status`` (required status, verb), the items, the price difference, the payment method.
    ``rounded``: exchanges round the difference before the balance check, modifications do not."""
    products, users = data["products"], data["users"]
    order = _order_in(data["orders"], order_id, *status)
    if isinstance(order, str):
        return order
    missing = _count_missing(order, item_ids)
    if missing is not None:
        return f"Error: {missing} not found"
    if len(item_ids) != len(new_item_ids):
        return "Error: the number of items to be exchanged should match"
    diff_price = _price_difference(products, order, item_ids, new_item_ids)
    if isinstance(diff_price, str):
        return diff_price
    methods = users[order["user_id"]]["payment_methods"]
    if payment_method_id not in methods:
        return "Error: payment method not found"
    return order, round(diff_price, 2) if rounded else diff_price, methods[payment_method_id]


def exchange_delivered_order_items(data: Any, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str) -> str:
    checked = _item_swap(data, order_id, ("delivered", "exchanged"), item_ids, new_item_ids, payment_method_id, rounded=True)
    if isinstance(checked, str):
        return checked
    order, diff_price, method = checked
    if method["source"] == "gift_card" and method["balance"] < diff_price:
        return "Error: insufficient gift card balance to pay for the price difference"
    order["status"] = "exchange requested"
    order["exchange_items"] = sorted(item_ids)
    order["exchange_new_items"] = sorted(new_item_ids)
    order["exchange_payment_method_id"] = payment_method_id
    order["exchange_price_difference"] = diff_price
    return json.dumps(order)


def find_user_id_by_email(data: Any, email: str) -> str:
    for user_id, profile in data["users"].items():
        if profile["email"].lower() == email.lower():
            return user_id
    return "Error: user not found"


def find_user_id_by_name_zip(data: Any, first_name: str, last_name: str, zip: str) -> str:  # noqa: A002 (τ-bench's name)
    for user_id, profile in data["users"].items():
        if (
            profile["name"]["first_name"].lower() == first_name.lower()
            and profile["name"]["last_name"].lower() == last_name.lower()
            and profile["address"]["zip"] == zip
        ):
            return user_id
    return "Error: user not found"


def get_order_details(data: Any, order_id: str) -> str:
    orders = data["orders"]
    return json.dumps(orders[order_id]) if order_id in orders else "Error: order not found"


def get_product_details(data: Any, product_id: str) -> str:
    products = data["products"]
    return json.dumps(products[product_id]) if product_id in products else "Error: product not found"


def get_user_details(data: Any, user_id: str) -> str:
    users = data["users"]
    return json.dumps(users[user_id]) if user_id in users else "Error: user not found"


def list_all_product_types(data: Any) -> str:
    product_dict = {product["name"]: product["product_id"] for product in data["products"].values()}
    return json.dumps(dict(sorted(product_dict.items())))


def _address(address1: str, address2: str, city: str, state: str, country: str, zip: str) -> dict[str, str]:  # noqa: A002
    return {"address1": address1, "address2": address2, "city": city, "state": state, "country": country, "zip": zip}


def modify_pending_order_address(
    data: Any, order_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str  # noqa: A002
) -> str:
    orders = data["orders"]
    order = _order_in(orders, order_id, "pending", "modified")
    if isinstance(order, str):
        return order
    order["address"] = _address(address1, address2, city, state, country, zip)
    return json.dumps(order)


def modify_pending_order_items(data: Any, order_id: str, item_ids: list, new_item_ids: list, payment_method_id: str) -> str:
    checked = _item_swap(data, order_id, ("pending", "modified"), item_ids, new_item_ids, payment_method_id, rounded=False)
    if isinstance(checked, str):
        return checked
    order, diff_price, method = checked
    if method["source"] == "gift_card" and method["balance"] < diff_price:
        return "Error: insufficient gift card balance to pay for the new item"
    order["payment_history"].append(
        {
            "transaction_type": "payment" if diff_price > 0 else "refund",
            "amount": abs(diff_price),  # unrounded, as τ-bench records it
            "payment_method_id": payment_method_id,
        }
    )
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] - diff_price, 2)
    for item_id, new_item_id in zip(item_ids, new_item_ids):
        # The first item still carrying the old id: duplicates are changed one by one.
        item = [item for item in order["items"] if item["item_id"] == item_id][0]
        variant = data["products"][item["product_id"]]["variants"][new_item_id]
        item["item_id"] = new_item_id
        item["price"] = variant["price"]
        item["options"] = json.loads(json.dumps(variant["options"]))
    order["status"] = "pending (item modified)"
    return json.dumps(order)


def modify_pending_order_payment(data: Any, order_id: str, payment_method_id: str) -> str:
    orders = data["orders"]
    order = _order_in(orders, order_id, "pending", "modified")
    if isinstance(order, str):
        return order
    methods = data["users"][order["user_id"]]["payment_methods"]
    if payment_method_id not in methods:
        return "Error: payment method not found"
    history = order["payment_history"]
    if len(history) > 1 or history[0]["transaction_type"] != "payment":
        return "Error: there should be exactly one payment for a pending order"
    old_method_id = history[0]["payment_method_id"]
    if old_method_id == payment_method_id:
        return "Error: the new payment method should be different from the current one"
    amount = history[0]["amount"]
    method = methods[payment_method_id]
    if method["source"] == "gift_card" and method["balance"] < amount:
        return "Error: insufficient gift card balance to pay for the order"
    history.extend(
        [
            {"transaction_type": "payment", "amount": amount, "payment_method_id": payment_method_id},
            {"transaction_type": "refund", "amount": amount, "payment_method_id": old_method_id},
        ]
    )
    if method["source"] == "gift_card":
        method["balance"] = round(method["balance"] - amount, 2)
    if "gift_card" in old_method_id:
        old_method = methods[old_method_id]
        old_method["balance"] = round(old_method["balance"] + amount, 2)
    return json.dumps(order)


def modify_user_address(
    data: Any, user_id: str, address1: str, address2: str, city: str, state: str, country: str, zip: str  # noqa: A002
) -> str:
    users = data["users"]
    if user_id not in users:
        return "Error: user not found"
    user = users[user_id]
    user["address"] = _address(address1, address2, city, state, country, zip)
    return json.dumps(user)


def return_delivered_order_items(data: Any, order_id: str, item_ids: list, payment_method_id: str) -> str:
    orders = data["orders"]
    order = _order_in(orders, order_id, "delivered", "returned")
    if isinstance(order, str):
        return order
    if payment_method_id not in data["users"][order["user_id"]]["payment_methods"]:
        return "Error: payment method not found"
    if "gift_card" not in payment_method_id and payment_method_id != order["payment_history"][0]["payment_method_id"]:
        return "Error: payment method should be either the original payment method or a gift card"
    if _count_missing(order, item_ids) is not None:
        return "Error: some item not found"
    order["status"] = "return requested"
    order["return_items"] = sorted(item_ids)
    order["return_payment_method_id"] = payment_method_id
    return json.dumps(order)


RETAIL_TOOLS = {
    "calculate": calculate,
    "cancel_pending_order": cancel_pending_order,
    "exchange_delivered_order_items": exchange_delivered_order_items,
    "find_user_id_by_email": find_user_id_by_email,
    "find_user_id_by_name_zip": find_user_id_by_name_zip,
    "get_order_details": get_order_details,
    "get_product_details": get_product_details,
    "get_user_details": get_user_details,
    "list_all_product_types": list_all_product_types,
    "modify_pending_order_address": modify_pending_order_address,
    "modify_pending_order_items": modify_pending_order_items,
    "modify_pending_order_payment": modify_pending_order_payment,
    "modify_user_address": modify_user_address,
    "return_delivered_order_items": return_delivered_order_items,
    "think": think,
    "transfer_to_human_agents": transfer_to_human_agents,
}
