"""The τ-bench environment on a hand-made retail domain: τ-bench's answers, errors as text,
cheap independent forks, the fingerprint and the reward."""

from __future__ import annotations

import json
import random

from pipelines.env.taubench import TauEnvironment, replay, tau_reward
from pipelines.env.taubench.data import TOOL_FUNCTIONS


def test_cancel_refunds_a_gift_card_at_once_and_records_the_refund(mini_retail):
    env = TauEnvironment(mini_retail)
    assert env.call("find_user_id_by_name_zip", {"first_name": "ann", "last_name": "LEE", "zip": "78701"}) == "ann_lee_1"
    order = json.loads(env.call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}))
    assert order["status"] == "cancelled" and order["cancel_reason"] == "no longer needed"
    assert order["payment_history"][-1] == {"transaction_type": "refund", "amount": 40.0, "payment_method_id": "gift_card_1"}
    user = json.loads(env.call("get_user_details", {"user_id": "ann_lee_1"}))
    assert user["payment_methods"]["gift_card_1"]["balance"] == 49.0
    assert env.call("cancel_pending_order", {"order_id": "#W1", "reason": "no longer needed"}) == (
        "Error: non-pending order cannot be cancelled"
    )
    assert sorted(env.database.changed_records()) == ["orders", "users"]


def test_modify_items_changes_duplicates_one_by_one_and_charges_the_difference(mini_retail):
    env = TauEnvironment(mini_retail)
    out = env.call(
        "modify_pending_order_items",
        {"order_id": "#W1", "item_ids": ["1001", "1001"], "new_item_ids": ["1002", "1003"], "payment_method_id": "credit_card_1"},
    )
    assert out == "Error: new item 1003 not found or available"
    assert env.call(
        "modify_pending_order_items",
        {"order_id": "#W1", "item_ids": ["1001", "1001"], "new_item_ids": ["1002", "1002"], "payment_method_id": "gift_card_1"},
    ) == "Error: insufficient gift card balance to pay for the new item"  # 11.0 due, 9 on the card
    order = json.loads(
        env.call(
            "modify_pending_order_items",
            {"order_id": "#W1", "item_ids": ["1001"], "new_item_ids": ["1002"], "payment_method_id": "gift_card_1"},
        )
    )
    assert [item["item_id"] for item in order["items"]] == ["1002", "1001"]
    assert order["status"] == "pending (item modified)"
    assert order["payment_history"][-1] == {"transaction_type": "payment", "amount": 5.5, "payment_method_id": "gift_card_1"}
    assert json.loads(env.call("get_user_details", {"user_id": "ann_lee_1"}))["payment_methods"]["gift_card_1"]["balance"] == 3.5


def test_invalid_calls_answer_error_text_and_never_raise(mini_retail):
    env = TauEnvironment(mini_retail)
    cases = {
        ("no_such_tool", json.dumps({})): "Error: unknown tool 'no_such_tool'",
        ("get_order_details", json.dumps({})): "Error: get_order_details() missing 1 required positional argument: 'order_id'",
        ("get_order_details", json.dumps({"order_id": "#W1", "x": 1})): "Error: get_order_details() got an unexpected keyword argument 'x'",
        ("get_order_details", json.dumps({"order_id": 7})): "Error: argument 'order_id' must be string, got integer",
        ("return_delivered_order_items", json.dumps({"order_id": "#W2", "item_ids": "1001", "payment_method_id": "credit_card_1"})):
            "Error: argument 'item_ids' must be array, got string",
        ("calculate", json.dumps({"expression": "9 ** 9 ** 9 ** 9"})): "Error: exponent",
        ("calculate", json.dumps({"expression": "import os"})): "Error: invalid characters in expression",
    }
    for (name, kwargs), expected in cases.items():
        assert env.call(name, json.loads(kwargs)).startswith(expected), (name, kwargs)
    assert env.call("get_order_details", ["#W1"]) == "Error: arguments must be an object, got array"
    assert env.error_count == len(cases) + 1
    assert env.database.changed_records() == {}


def test_random_calls_never_raise_and_always_answer_text(mini_retail):
    rng = random.Random(3)
    values = ["#W1", "#W2", "1001", "1002", "ann_lee_1", "gift_card_1", "credit_card_1", "", "no longer needed", 3, 2.5, None,
              True, [], ["1001"], ["1001", "1001"], {"a": 1}, "1 / 0"]
    for _ in range(2000):
        env = TauEnvironment(mini_retail)
        name = rng.choice(list(TOOL_FUNCTIONS["retail"]))
        schema = mini_retail.schema(name)["function"]["parameters"]["properties"]
        kwargs = {p: rng.choice(values) for p in schema if rng.random() < 0.9}
        if rng.random() < 0.1:
            kwargs["unexpected"] = 1
        assert isinstance(env.call(name, kwargs), str)


def test_forks_are_independent_and_fingerprints_follow_the_data(mini_retail):
    env = TauEnvironment(mini_retail)
    env.call("get_order_details", {"order_id": "#W1"})  # a read copies the record but changes nothing
    untouched = TauEnvironment(mini_retail).database.fingerprint()
    assert env.database.fingerprint() == untouched
    twin = env.fork()
    twin.call("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"})
    assert json.loads(env.call("get_order_details", {"order_id": "#W1"}))["status"] == "pending"
    assert env.database.fingerprint() == untouched != twin.database.fingerprint()
    # Both sides of a fork keep copying before they write: the parent's change stays its own.
    grandchild = twin.fork()
    twin.call("modify_user_address", {"user_id": "ann_lee_1", "address1": "2 Elm", "address2": "", "city": "Austin",
                                      "state": "TX", "country": "USA", "zip": "78702"})
    assert json.loads(grandchild.call("get_user_details", {"user_id": "ann_lee_1"}))["address"]["zip"] == "78701"
    assert [len(e.calls) for e in (env, twin, grandchild)] == [2, 3, 3]
    # The same data reached another way has the same fingerprint.
    again = TauEnvironment(mini_retail)
    again.call("cancel_pending_order", {"order_id": "#W1", "reason": "ordered by mistake"})
    assert again.database.fingerprint() == grandchild.database.fingerprint()


def test_a_balance_turned_from_int_into_float_is_a_change_for_the_reward_only(mini_retail):
    env = TauEnvironment(mini_retail)
    env.call("modify_pending_order_items", {"order_id": "#W1", "item_ids": ["1001"], "new_item_ids": ["1001"], "payment_method_id": "gift_card_1"})
    assert "users" not in env.database.changed_records()  # 9.0 == 9 as data
    assert "ann_lee_1" in env.database.changed_records(exact=True)["users"]  # τ-bench's hash sees str(9.0) != str(9)


def test_reward_breakdown_on_the_mini_tasks(mini_retail):
    cancel, lookup = mini_retail.tasks["test"]
    env = replay(mini_retail, cancel.actions)
    assert tau_reward(env, cancel, ["Your refund of 40.0 went to your gift card."]).success
    missing_output = tau_reward(env, cancel, ["Cancelled."])
    assert (missing_output.reward, missing_output.database_ok, missing_output.outputs_ok) == (0.0, True, False)
    nothing = tau_reward(TauEnvironment(mini_retail), cancel, ["40.0"])
    assert nothing.actions_matched == (False, False) and nothing.mismatched_records == ("orders/#W1", "users/ann_lee_1")
    assert nothing.reasons() == (
        "database differs from the ground truth at orders/#W1, users/ann_lee_1",
        "0 of 2 ground-truth actions made with equal arguments",
    )
    # A read-only task: looking things up or not, the database is the ground truth's.
    assert tau_reward(TauEnvironment(mini_retail), lookup, []).success
    assert not tau_reward(env, lookup, []).success
