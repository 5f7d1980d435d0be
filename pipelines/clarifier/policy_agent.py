"""An offline τ-bench agent that does not know the answer: :class:`TauPolicyAgent`.

It is built from the domain's name alone and sees, each step, only what a model agent sees:
the dialogue (the user's turns and its own), its tool calls with their results. It never
receives a task, so the ground-truth actions and outputs are out of its reach by
construction (``tests/taubench/test_clarifier_honest.py`` checks both). It follows the
retail policy (``wiki.md``) as a script:

1. authenticate: ask for the email, or the name and zip code (a user id the user states is
   checked through ``get_user_details``), and look the user id up with the value the *user*
   said;
2. read the user's profile, then the orders the user named, else every order of the profile;
3. read the request from the user's words: which items (the product names the user said)
   are to be cancelled, returned, exchanged or modified (the nearest such verb before the
   item), the cancellation reason (``no longer needed`` / ``ordered by mistake``, else it
   asks), the new variant of an item to exchange or modify (the available variant of the same
   product whose options the user named, keeping the options the user did not mention), the
   payment method (a gift card or PayPal the user named, else the order's original one);
4. ask for what it lacks (which items, the reason, the order id), state each write and ask
   for an explicit yes before it (the policy's confirmation), make it, and end.

Airline: it checks the user id the user states and cancels a reservation whose id the user
gives; every other airline request it declines (it cannot search or price flights). It has no
give-up timer: it stops when it has done what it understood or when the user does not know what
it needs (asked twice for the same detail without an answer). So its pass@1 is a lower bound
of what an agent that does not know the answer can do here, and a Clarifier can help it only by
getting the user to say something this script reads.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Mapping

from pipelines.episodes.agents import ActionAgent, AgentContext
from pipelines.episodes.formats import AgentAction, AgentFormat, FunctionCallingFormat

ASK_IDENTITY = "To get started, could you tell me your email address, or your name and zip code?"
ASK_USER_ID = "Could you tell me your user id?"
ASK_REQUEST = "What would you like me to help with? Please describe the items involved."
ASK_REASON = "What is the reason for the cancellation: no longer needed, or ordered by mistake?"
ASK_RESERVATION = "Which reservation is it? Please tell me the reservation id."
CONFIRM = "Before I go ahead: I will {what}. Do you confirm (yes/no)?"
DONE = "All done: {what}. Is there anything else?"
NOTHING = "I'm sorry, I could not find anything I can do for this request with what I know."
_VERBS = {"cancel": "cancel", "return": "return", "exchange": "exchange", "swap": "exchange", "modify": "modify",
          "change": "modify", "upgrade": "modify", "downgrade": "modify", "switch": "modify"}
_YES = re.compile(r"\b(yes|yeah|yep|sure|go ahead|please do|confirm)\b", re.IGNORECASE)
_NO = re.compile(r"\b(no|don't|do not|wait|stop|not now)\b", re.IGNORECASE)
_DONT_KNOW = re.compile(r"\b(don't know|do not know|don't remember|do not remember|not sure)\b", re.IGNORECASE)


@dataclass
class _Seen:
    """What the agent knows at one step, read from the context alone."""

    user_text: str
    last_user: str
    asked: list[str]  # the agent's own texts, in order
    calls: list[tuple[str, dict[str, Any], Any]]  # (name, arguments, output or None on error)
    done: set[str] = field(default_factory=set)  # json keys of calls made

    def called(self, name: str, arguments: Mapping[str, Any]) -> bool:
        return _key(name, arguments) in self.done

    def output(self, name: str, **match: Any) -> Any:
        for call_name, arguments, output in self.calls:
            if call_name == name and all(arguments.get(k) == v for k, v in match.items()) and output is not None:
                return output
        return None

    def times_asked(self, text: str) -> int:
        return sum(1 for said in self.asked if said == text)


def _key(name: str, arguments: Mapping[str, Any]) -> str:
    return name + json.dumps(dict(arguments), sort_keys=True)


def _seen(context: AgentContext) -> _Seen:
    users = [str(m.get("content") or "") for m in context.messages if m.get("role") == "user"]
    asked = [str(m.get("content") or "") for m in context.messages if m.get("role") == "assistant" and m.get("content")]
    calls = []
    for _, call in context.calls:
        observation = call.observation or {}
        output = observation.get("output") if "error" not in observation else None
        calls.append((call.name, dict(call.arguments), output))
    seen = _Seen("\n".join(users), users[-1] if users else "", asked, calls)
    seen.done = {_key(name, arguments) for name, arguments, _ in calls}
    return seen


def _words(text: str) -> set[str]:
    return set(re.findall(r"[a-z0-9]+", text.lower().replace("t-shirt", "tshirt")))


def _mentions(item_name: str, text: str) -> list[int]:
    """Where the user's text names the product (its last word, singular or plural)."""
    head = item_name.lower().replace("t-shirt", "tshirt").split()[-1]
    lowered = text.lower().replace("t-shirt", "tshirt").replace("t shirt", "tshirt")
    return [m.start() for m in re.finditer(rf"\b{re.escape(head)}(?:e?s)?\b", lowered)]


def _verb_before(text: str, position: int) -> str | None:
    """The request verb nearest before ``position`` in the same sentence."""
    lowered = text.lower()
    start = max(lowered.rfind(".", 0, position), lowered.rfind("\n", 0, position)) + 1
    best, verb = -1, None
    for word, kind in _VERBS.items():
        for m in re.finditer(rf"\b{word}", lowered[start:position]):
            if m.start() > best:
                best, verb = m.start(), kind
    return verb


class TauPolicyAgent(ActionAgent):
    """See the module docstring. ``domain``: ``retail`` or ``airline``; nothing else."""

    def __init__(self, domain: str, fmt: AgentFormat | None = None, *, name: str = "tau_policy"):
        if domain not in ("retail", "airline"):
            raise ValueError(f"the policy agent plays retail or airline, got {domain!r}")
        self.domain = domain
        self.format = fmt or FunctionCallingFormat()
        self.name = name

    def actions(self, context: AgentContext) -> list[AgentAction]:
        seen = _seen(context)
        return self._airline(seen) if self.domain == "airline" else self._retail(seen)

    # ----------------------------------------------------------------- shared steps

    @staticmethod
    def _ask(seen: _Seen, question: str) -> list[AgentAction]:
        """Ask once more, or stop when asked twice already or the user said it does not know."""
        if seen.times_asked(question) >= 2 or (seen.asked and seen.asked[-1] == question and _DONT_KNOW.search(seen.last_user)):
            return [AgentAction.respond(NOTHING), AgentAction.end()]
        return [AgentAction.respond(question)]

    @staticmethod
    def _write(seen: _Seen, name: str, arguments: dict[str, Any], what: str) -> list[AgentAction] | None:
        """The next step towards one write: confirm, then call; None once made or refused."""
        if seen.called(name, arguments):
            return None
        question = CONFIRM.format(what=what)
        if seen.asked and seen.asked[-1] == question:
            if _YES.search(seen.last_user) and not re.match(r"\s*no\b", seen.last_user, re.IGNORECASE):
                return [AgentAction.tool_call(name, arguments)]
            if _NO.search(seen.last_user):
                return None
        if seen.times_asked(question) >= 2:
            return None
        return [AgentAction.respond(question)]

    @staticmethod
    def _user_id(seen: _Seen) -> str | None:
        for name in ("find_user_id_by_email", "find_user_id_by_name_zip"):
            for call_name, _, output in seen.calls:
                if call_name == name and isinstance(output, str):
                    return output
        for call_name, arguments, output in seen.calls:
            if call_name == "get_user_details" and isinstance(output, dict):
                return arguments.get("user_id")
        return None

    # ----------------------------------------------------------------- retail

    def _retail(self, seen: _Seen) -> list[AgentAction]:
        user_id = self._user_id(seen)
        if user_id is None:
            step = self._identify(seen)
            if step is not None:
                return step
            return self._ask(seen, ASK_IDENTITY)
        profile = seen.output("get_user_details", user_id=user_id)
        if profile is None:
            if not seen.called("get_user_details", {"user_id": user_id}):
                return [AgentAction.tool_call("get_user_details", {"user_id": user_id})]
            return [AgentAction.respond(NOTHING), AgentAction.end()]
        named = [o for o in ("#W" + m for m in re.findall(r"#?W(\d{7})\b", seen.user_text)) if o in profile.get("orders", [])]
        to_read = list(dict.fromkeys(named)) or list(profile.get("orders", []))
        for order_id in to_read:
            if not seen.called("get_order_details", {"order_id": order_id}):
                return [AgentAction.tool_call("get_order_details", {"order_id": order_id})]
        orders = [o for o in (seen.output("get_order_details", order_id=i) for i in to_read) if isinstance(o, dict)]
        plan = self._retail_plan(seen, profile, orders, bool(named))
        if plan is None:
            if not seen.times_asked(ASK_REQUEST):
                return [AgentAction.respond(ASK_REQUEST)]
            return [AgentAction.respond(NOTHING), AgentAction.end()]
        if not plan:  # nothing it can do from what it was told: ask once what the request is
            if not seen.times_asked(ASK_REQUEST):
                return [AgentAction.respond(ASK_REQUEST)]
            return [AgentAction.respond(NOTHING), AgentAction.end()]
        made = []
        for step in plan:
            if isinstance(step, list):  # a question or a product look-up before a write
                return step
            name, arguments, what = step
            action = self._write(seen, name, arguments, what)
            if action is not None:
                return action
            if seen.called(name, arguments):
                made.append(what)
        return [AgentAction.respond(DONE.format(what="; ".join(made)) if made else NOTHING), AgentAction.end()]

    def _identify(self, seen: _Seen) -> list[AgentAction] | None:
        for email in re.findall(r"[\w.+-]+@[\w-]+\.[\w.]+\w", seen.user_text):
            if not seen.called("find_user_id_by_email", {"email": email}):
                return [AgentAction.tool_call("find_user_id_by_email", {"email": email})]
        name = re.search(r"\b(?:I'm|I am|name is)\s+([A-Z][a-z]+)\s+([A-Z][a-z]+)", seen.user_text)
        zip_code = re.search(r"\b\d{5}\b", seen.user_text)
        if name and zip_code:
            arguments = {"first_name": name.group(1), "last_name": name.group(2), "zip": zip_code.group(0)}
            if not seen.called("find_user_id_by_name_zip", arguments):
                return [AgentAction.tool_call("find_user_id_by_name_zip", arguments)]
        for user_id in re.findall(r"\b[a-z]+_[a-z]+_\d+\b", seen.user_text):
            if not seen.called("get_user_details", {"user_id": user_id}):
                return [AgentAction.tool_call("get_user_details", {"user_id": user_id})]
        return None

    def _retail_plan(self, seen: _Seen, profile: Mapping[str, Any], orders: list[Mapping[str, Any]], named: bool) -> list | None:
        """The writes the user's words ask for, each (tool, arguments, what), or a question /
        look-up (a list of actions) where one is needed first; None: no request understood."""
        text = seen.user_text
        wanted: dict[str, dict[str, list]] = {}  # order id -> verb -> items
        for order in orders:
            for item in order.get("items", []):
                for position in _mentions(item.get("name", ""), text):
                    verb = _verb_before(text, position)
                    if verb is not None:
                        wanted.setdefault(order["order_id"], {}).setdefault(verb, [])
                        if item not in wanted[order["order_id"]][verb]:
                            wanted[order["order_id"]][verb].append(item)
        lowered = text.lower()
        if named and not wanted:  # an order named for cancellation, no item: the whole order
            verb = next((kind for word, kind in _VERBS.items() if re.search(rf"\b{word}", lowered)), None)
            if verb == "cancel":
                for order in orders:
                    wanted[order["order_id"]] = {verb: list(order.get("items", []))}
        if re.search(r"cancel (?:all|every)[a-z ]*pending", lowered):
            for order in orders:
                if order.get("status") == "pending":
                    wanted.setdefault(order["order_id"], {})["cancel"] = list(order.get("items", []))
        if not wanted:
            return None
        plan: list = []
        by_id = {o["order_id"]: o for o in orders}
        for order_id, verbs in wanted.items():
            order = by_id[order_id]
            status = order.get("status")
            payment = self._payment(text, profile, order)
            if "cancel" in verbs and status == "pending":
                reason = "ordered by mistake" if "mistake" in lowered else ("no longer needed" if re.search(r"no longer|don't need|not need", lowered) else None)
                if reason is None:
                    if seen.times_asked(ASK_REASON) >= 1 and not (seen.asked and seen.asked[-1] == ASK_REASON):
                        continue
                    plan.append(self._ask(seen, ASK_REASON))
                    return plan
                plan.append(("cancel_pending_order", {"order_id": order_id, "reason": reason}, f"cancel order {order_id} ({reason})"))
            if "return" in verbs and status == "delivered":
                items = [i["item_id"] for i in verbs["return"]]
                plan.append(("return_delivered_order_items", {"order_id": order_id, "item_ids": items, "payment_method_id": payment},
                             f"return items {', '.join(items)} of order {order_id}, refund to {payment}"))
            change = "exchange" if status == "delivered" else "modify" if status == "pending" else None
            if change and (verbs.get("exchange") or verbs.get("modify")):
                items = verbs.get("exchange", []) + [i for i in verbs.get("modify", []) if i not in verbs.get("exchange", [])]
                olds, news = [], []
                for item in items:
                    product = seen.output("get_product_details", product_id=item["product_id"])
                    if product is None:
                        if not seen.called("get_product_details", {"product_id": item["product_id"]}):
                            plan.append([AgentAction.tool_call("get_product_details", {"product_id": item["product_id"]})])
                            return plan
                        continue
                    new = _variant(item, product, text)
                    if new is not None:
                        olds.append(item["item_id"])
                        news.append(new)
                if olds:
                    tool = "exchange_delivered_order_items" if change == "exchange" else "modify_pending_order_items"
                    plan.append((tool, {"order_id": order_id, "item_ids": olds, "new_item_ids": news, "payment_method_id": payment},
                                 f"{change} items {', '.join(olds)} of order {order_id} for {', '.join(news)}, paying with {payment}"))
        return plan

    @staticmethod
    def _payment(text: str, profile: Mapping[str, Any], order: Mapping[str, Any]) -> str:
        methods = dict(profile.get("payment_methods") or {})
        lowered = text.lower()
        for words, source in ((("gift card", "gc "), "gift_card"), (("paypal",), "paypal"), (("credit card",), "credit_card")):
            if any(w in lowered for w in words):
                ids = [i for i, m in methods.items() if m.get("source") == source]
                if len(ids) == 1:
                    return ids[0]
        history = order.get("payment_history") or [{}]
        return str(history[0].get("payment_method_id", next(iter(methods), "")))

    # ----------------------------------------------------------------- airline

    def _airline(self, seen: _Seen) -> list[AgentAction]:
        user_id = self._user_id(seen)
        if user_id is None:
            for candidate in re.findall(r"\b[a-z]+_[a-z]+_\d+\b", seen.user_text):
                if not seen.called("get_user_details", {"user_id": candidate}):
                    return [AgentAction.tool_call("get_user_details", {"user_id": candidate})]
            return self._ask(seen, ASK_USER_ID)
        profile = seen.output("get_user_details", user_id=user_id)
        lowered = seen.user_text.lower()
        if "cancel" not in lowered:
            return [AgentAction.respond(NOTHING), AgentAction.end()]
        ids = [r for r in re.findall(r"\b[A-Z0-9]{6}\b", seen.user_text) if r in (profile or {}).get("reservations", [])]
        if not ids:
            return self._ask(seen, ASK_RESERVATION)
        for reservation_id in dict.fromkeys(ids):
            if not seen.called("get_reservation_details", {"reservation_id": reservation_id}):
                return [AgentAction.tool_call("get_reservation_details", {"reservation_id": reservation_id})]
        made = []
        for reservation_id in dict.fromkeys(ids):
            if not _may_cancel(seen.output("get_reservation_details", reservation_id=reservation_id), lowered):
                continue
            arguments = {"reservation_id": reservation_id}
            step = self._write(seen, "cancel_reservation", arguments, f"cancel reservation {reservation_id}")
            if step is not None:
                return step
            if seen.called("cancel_reservation", arguments):
                made.append(f"cancelled reservation {reservation_id}")
        return [AgentAction.respond(DONE.format(what="; ".join(made)) if made else NOTHING), AgentAction.end()]


#: The airline policy's "now" (wiki.md: "The current time is 2024-05-15 15:00:00 EST").
AIRLINE_NOW = "2024-05-15T15:00:00"


def _may_cancel(reservation: Any, user_text: str) -> bool:
    """The airline policy's cancellation rule, on what the agent read and the user said: within
    24 hours of booking, or business class, or insured with a health or weather reason; never
    once a segment has flown (the airline-cancelled-flight case it cannot check: no).

    >>> _may_cancel({"cabin": "business", "flights": [], "created_at": "2024-05-01T00:00:00"}, "")
    True
    >>> _may_cancel({"cabin": "economy", "insurance": "yes", "flights": [], "created_at": "2024-05-01T00:00:00"}, "i am sick")
    True
    >>> _may_cancel({"cabin": "economy", "insurance": "no", "flights": [], "created_at": "2024-05-01T00:00:00"}, "i am sick")
    False
    """
    from datetime import datetime, timedelta

    if not isinstance(reservation, Mapping):
        return False
    if any(isinstance(f, Mapping) and f.get("status") == "flown" for f in reservation.get("flights") or []):
        return False
    try:
        recent = datetime.fromisoformat(AIRLINE_NOW) - datetime.fromisoformat(str(reservation.get("created_at"))) <= timedelta(hours=24)
    except ValueError:
        recent = False
    covered = reservation.get("insurance") == "yes" and re.search(r"health|sick|unwell|ill\b|weather|storm|medical", user_text)
    return bool(recent or reservation.get("cabin") == "business" or covered)


def _variant(item: Mapping[str, Any], product: Mapping[str, Any], text: str) -> str | None:
    """The available variant of ``product`` the user's words ask for: each option the user
    named (a value word of the variant in the text) counts 2, each kept option 1, each other
    changed option -1; the best variant that changes something the user named, else None."""
    said = _words(text)
    current = dict(item.get("options") or {})
    best, best_score = None, None
    for variant in (product.get("variants") or {}).values():
        if not variant.get("available") or variant.get("item_id") == item.get("item_id"):
            continue
        score, named_change = 0, False
        for option, value in (variant.get("options") or {}).items():
            if value == current.get(option):
                score += 1
            elif _words(str(value)) and _words(str(value)) <= said:
                score += 2
                named_change = True
            else:
                score -= 1
        if named_change and (best_score is None or score > best_score):
            best, best_score = variant["item_id"], score
    return best
