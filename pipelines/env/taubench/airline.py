"""τ-bench's 14 airline tools, re-implemented from their schemas (``tools.json``), the policy
(``wiki.md``) and the recorded outputs of τ-bench's own tools (``ground_truth_replay.json``).

Same contract as the retail tools: ``f(data, **kwargs) -> str``. Where τ-bench's behaviour is
odd it is kept, because the ground truth was produced with it: a new reservation is always
``HATHAT`` (then ``HATHAU``, ``HATHAV``) created at ``2024-05-15T15:00:00``; booking does not
take seats off the flights; certificates are named ``certificate_3221322`` onwards; a
missing reservation is reported as "user not found" by ``get_reservation_details``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

from pipelines.env.taubench.common import calculate, think, transfer_to_human_agents

NEW_RESERVATION_IDS = ("HATHAT", "HATHAU", "HATHAV")
NEW_RESERVATION_CREATED_AT = "2024-05-15T15:00:00"
CERTIFICATE_IDS = (3221322, 3221323, 3221324)
INSURANCE_PER_PASSENGER = 30
NONFREE_BAGGAGE_PRICE = 50

AIRPORTS = {
    "SFO": "San Francisco", "JFK": "New York", "LAX": "Los Angeles", "ORD": "Chicago", "DFW": "Dallas",
    "DEN": "Denver", "SEA": "Seattle", "ATL": "Atlanta", "MIA": "Miami", "BOS": "Boston", "PHX": "Phoenix",
    "IAH": "Houston", "LAS": "Las Vegas", "MCO": "Orlando", "EWR": "Newark", "CLT": "Charlotte",
    "MSP": "Minneapolis", "DTW": "Detroit", "PHL": "Philadelphia", "LGA": "LaGuardia",
}


def _price_segment(data: Any, flight: dict[str, Any], cabin: str, n_passengers: int) -> str | None:
    """Fill in a requested segment's price, origin and destination, or say why it cannot be flown."""
    flight_number = flight["flight_number"]
    if flight_number not in data["flights"]:
        return f"Error: flight {flight_number} not found"
    flight_data = data["flights"][flight_number]
    if flight["date"] not in flight_data["dates"]:
        return f"Error: flight {flight_number} not found on date {flight['date']}"
    on_date = flight_data["dates"][flight["date"]]
    if on_date["status"] != "available":
        return f"Error: flight {flight_number} not available on date {flight['date']}"
    if on_date["available_seats"][cabin] < n_passengers:
        return f"Error: not enough seats on flight {flight_number}"
    flight["price"] = on_date["prices"][cabin]
    flight["origin"] = flight_data["origin"]
    flight["destination"] = flight_data["destination"]
    return None


def book_reservation(
    data: Any,
    user_id: str,
    origin: str,
    destination: str,
    flight_type: str,
    cabin: str,
    flights: list,
    passengers: list,
    payment_methods: list,
    total_baggages: int,
    nonfree_baggages: int,
    insurance: str,
) -> str:
    reservations, users = data["reservations"], data["users"]
    if user_id not in users:
        return "Error: user not found"
    user = users[user_id]
    reservation_id = next((i for i in NEW_RESERVATION_IDS if i not in reservations), NEW_RESERVATION_IDS[-1])
    reservation = {
        "reservation_id": reservation_id,
        "user_id": user_id,
        "origin": origin,
        "destination": destination,
        "flight_type": flight_type,
        "cabin": cabin,
        "flights": copy.deepcopy(flights),
        "passengers": copy.deepcopy(passengers),
        "payment_history": copy.deepcopy(payment_methods),
        "created_at": NEW_RESERVATION_CREATED_AT,
        "total_baggages": total_baggages,
        "nonfree_baggages": nonfree_baggages,
        "insurance": insurance,
    }
    total_price = 0
    for flight in reservation["flights"]:
        error = _price_segment(data, flight, cabin, len(passengers))
        if error is not None:
            return error
        total_price += flight["price"] * len(passengers)
    if insurance == "yes":
        total_price += INSURANCE_PER_PASSENGER * len(passengers)
    total_price += NONFREE_BAGGAGE_PRICE * nonfree_baggages
    for payment in payment_methods:
        payment_id, amount = payment["payment_id"], payment["amount"]
        if payment_id not in user["payment_methods"]:
            return f"Error: payment method {payment_id} not found"
        method = user["payment_methods"][payment_id]
        if method["source"] in ("gift_card", "certificate") and method["amount"] < amount:
            return f"Error: not enough balance in payment method {payment_id}"
    paid = sum(payment["amount"] for payment in payment_methods)
    if paid != total_price:
        return f"Error: payment amount does not add up, total price is {total_price}, but paid {paid}"
    for payment in payment_methods:
        payment_id, amount = payment["payment_id"], payment["amount"]
        method = user["payment_methods"][payment_id]
        if method["source"] == "gift_card":
            method["amount"] -= amount
        elif method["source"] == "certificate":  # a certificate is used up whatever is left on it
            del user["payment_methods"][payment_id]
    reservations[reservation_id] = reservation
    user["reservations"].append(reservation_id)
    return json.dumps(reservation)


def cancel_reservation(data: Any, reservation_id: str) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        return "Error: reservation not found"
    reservation = reservations[reservation_id]
    refunds = [{"payment_id": p["payment_id"], "amount": -p["amount"]} for p in reservation["payment_history"]]
    reservation["payment_history"].extend(refunds)
    reservation["status"] = "cancelled"
    return json.dumps(reservation)


def get_reservation_details(data: Any, reservation_id: str) -> str:
    reservations = data["reservations"]
    return json.dumps(reservations[reservation_id]) if reservation_id in reservations else "Error: user not found"


def get_user_details(data: Any, user_id: str) -> str:
    users = data["users"]
    return json.dumps(users[user_id]) if user_id in users else "Error: user not found"


def list_all_airports(data: Any) -> str:
    return json.dumps(AIRPORTS)


def _flight_on(flight: dict[str, Any], date: str) -> dict[str, Any]:
    result = {k: v for k, v in flight.items() if k != "dates"}
    result.update(flight["dates"][date])
    return result


def search_direct_flight(data: Any, origin: str, destination: str, date: str) -> str:
    results = []
    for flight in data["flights"].values():
        if flight["origin"] == origin and flight["destination"] == destination:
            if date in flight["dates"] and flight["dates"][date]["status"] == "available":
                results.append(_flight_on(flight, date))
    return json.dumps(results)


def search_onestop_flight(data: Any, origin: str, destination: str, date: str) -> str:
    flights = list(data["flights"].values())
    results = []
    for first in flights:
        if first["origin"] != origin:
            continue
        for second in flights:
            if second["destination"] != destination or first["destination"] != second["origin"]:
                continue
            # A first leg arriving after midnight ("+1") connects on the next day.
            date2 = f"2024-05-{int(date[-2:]) + 1}" if "+1" in first["scheduled_arrival_time_est"] else date
            if first["scheduled_arrival_time_est"] > second["scheduled_departure_time_est"]:
                continue
            if date in first["dates"] and date2 in second["dates"]:
                if first["dates"][date]["status"] == "available" and second["dates"][date2]["status"] == "available":
                    leg1 = _flight_on(first, date)
                    leg1["date"] = date
                    # τ-bench fills the second leg's status, seats and prices from the first
                    # leg's date, even when it flies the next day.
                    leg2 = _flight_on(second, date)
                    leg2["date"] = date2
                    results.append([leg1, leg2])
    return json.dumps(results)


def send_certificate(data: Any, user_id: str, amount: float) -> str:
    users = data["users"]
    if user_id not in users:
        return "Error: user not found"
    user = users[user_id]
    for number in CERTIFICATE_IDS:
        payment_id = f"certificate_{number}"
        if payment_id not in user["payment_methods"]:
            user["payment_methods"][payment_id] = {"source": "certificate", "amount": amount, "id": payment_id}
            return f"Certificate {payment_id} added to user {user_id} with amount {amount}."
    # τ-bench returns None here; a string keeps every observation text.
    return f"Error: user {user_id} already has {len(CERTIFICATE_IDS)} new certificates"


def _payment_for_change(data: Any, reservation: dict[str, Any], payment_id: str, total_price: float) -> tuple[Any, str | None]:
    methods = data["users"][reservation["user_id"]]["payment_methods"]
    if payment_id not in methods:
        return None, "Error: payment method not found"
    method = methods[payment_id]
    if method["source"] == "certificate":
        return None, "Error: certificate cannot be used to update reservation"
    if method["source"] == "gift_card" and method["amount"] < total_price:
        return None, "Error: gift card balance is not enough"
    return method, None


def update_reservation_baggages(data: Any, reservation_id: str, total_baggages: int, nonfree_baggages: int, payment_id: str) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        return "Error: reservation not found"
    reservation = reservations[reservation_id]
    total_price = NONFREE_BAGGAGE_PRICE * max(0, nonfree_baggages - reservation["nonfree_baggages"])
    method, error = _payment_for_change(data, reservation, payment_id, total_price)
    if error is not None:
        return error
    reservation["total_baggages"] = total_baggages
    reservation["nonfree_baggages"] = nonfree_baggages
    if method["source"] == "gift_card":
        method["amount"] -= total_price
    if total_price != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total_price})
    return json.dumps(reservation)


def update_reservation_flights(data: Any, reservation_id: str, cabin: str, flights: list, payment_id: str) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        return "Error: reservation not found"
    reservation = reservations[reservation_id]
    n_passengers = len(reservation["passengers"])
    total_price = 0
    flights = copy.deepcopy(flights)
    for flight in flights:
        # A segment kept in the same cabin keeps its price: it is already paid for.
        kept = [
            f
            for f in reservation["flights"]
            if f["flight_number"] == flight["flight_number"] and f["date"] == flight["date"] and cabin == reservation["cabin"]
        ]
        if kept:
            flight["price"] = kept[0]["price"]
            flight["origin"] = kept[0]["origin"]
            flight["destination"] = kept[0]["destination"]
            total_price += flight["price"] * n_passengers
            continue
        error = _price_segment(data, flight, cabin, n_passengers)
        if error is not None:
            return error
        total_price += flight["price"] * n_passengers
    total_price -= sum(flight["price"] for flight in reservation["flights"]) * n_passengers
    method, error = _payment_for_change(data, reservation, payment_id, total_price)
    if error is not None:
        return error
    if method["source"] == "gift_card":
        method["amount"] -= total_price
    reservation["flights"] = flights
    if total_price != 0:
        reservation["payment_history"].append({"payment_id": payment_id, "amount": total_price})
    return json.dumps(reservation)


def update_reservation_passengers(data: Any, reservation_id: str, passengers: list) -> str:
    reservations = data["reservations"]
    if reservation_id not in reservations:
        return "Error: reservation not found"
    reservation = reservations[reservation_id]
    if len(passengers) != len(reservation["passengers"]):
        return "Error: number of passengers does not match"
    reservation["passengers"] = copy.deepcopy(passengers)
    return json.dumps(reservation)


AIRLINE_TOOLS = {
    "book_reservation": book_reservation,
    "calculate": calculate,
    "cancel_reservation": cancel_reservation,
    "get_reservation_details": get_reservation_details,
    "get_user_details": get_user_details,
    "list_all_airports": list_all_airports,
    "search_direct_flight": search_direct_flight,
    "search_onestop_flight": search_onestop_flight,
    "send_certificate": send_certificate,
    "think": think,
    "transfer_to_human_agents": transfer_to_human_agents,
    "update_reservation_baggages": update_reservation_baggages,
    "update_reservation_flights": update_reservation_flights,
    "update_reservation_passengers": update_reservation_passengers,
}
