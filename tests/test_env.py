"""The SpeakRL tool environment (pipelines.env.tools) and gold-dialogue replay (pipelines.env.replay)."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.env.checker import check_goal, success_rate
from pipelines.env.replay import gold_tool_calls, replay
from pipelines.env.tools import TOOL_NAMES, TOOL_SCHEMAS, Database, ToolEnvironment, tool_schemas
from pipelines.multiwoz.embedded import generate_corpus
from pipelines.multiwoz.ontology import parse_time
from pipelines.multiwoz.parse import parse_database, parse_dialogue, parse_dialogues, parse_goal
from pipelines.records import ToolCall

DB_FILES = ("restaurant", "hotel", "attraction", "train", "taxi", "police", "hospital")


def _venue(id_, name, **attributes):
    return {"id": id_, "name": name, "address": f"{id_} some street", "phone": f"0122300000{id_}", "postcode": f"cb{id_}aa", **attributes}


def _train(train_id, day, departure, destination, leave, arrive, price="23.60 pounds"):
    return {"trainID": train_id, "day": day, "departure": departure, "destination": destination, "leaveAt": leave,
            "arriveBy": arrive, "duration": "51 minutes", "price": price}


SMALL_DB = {
    "restaurant": [
        _venue("1", "pizza express Fen Ditton", food="italian", pricerange="moderate", area="centre", type="restaurant"),
        _venue("2", "pizza express", food="italian", pricerange="moderate", area="centre", type="restaurant"),
        _venue("3", "the golden curry", food="indian", pricerange="expensive", area="centre", type="restaurant"),
        _venue("4", "curry prince", food="indian", pricerange="moderate", area="east", type="restaurant"),
        _venue("5", "nandos", food="portuguese", pricerange="cheap", area="south", type="restaurant"),
        _venue("6", "la margherita", food="italian", pricerange="cheap", area="west", type="restaurant"),
    ],
    "hotel": [
        _venue("1", "acorn guest house", area="north", pricerange="moderate", type="guesthouse", stars="4", parking="yes",
               internet="yes", price={"single": "50", "double": "75"}, takesbookings="yes"),
        _venue("2", "the lensfield hotel", area="south", pricerange="expensive", type="hotel", stars="3", parking="yes",
               internet="yes", price={"single": "60", "double": "90"}, takesbookings="yes"),
        _venue("3", "alexander bed and breakfast", area="centre", pricerange="cheap", type="guesthouse", stars="4",
               parking="no", internet="yes", price={"single": "40"}, takesbookings="yes"),
    ],
    "attraction": [
        _venue("1", "king's college", area="centre", type="college", **{"entrance fee": "free", "openhours": "?", "pricerange": "free"}),
        _venue("2", "abbey pool", area="east", type="swimmingpool", **{"entrance fee": "?", "openhours": "?", "pricerange": "?"}),
    ],
    "train": [
        _train("TR0001", "monday", "cambridge", "london kings cross", "05:00", "05:51"),
        _train("TR0002", "monday", "cambridge", "london kings cross", "07:00", "07:51"),
        _train("TR0004", "monday", "cambridge", "london kings cross", "09:30", "10:21"),
        _train("TR0003", "monday", "cambridge", "london kings cross", "09:00", "09:51"),
        _train("TR0005", "monday", "cambridge", "london kings cross", "11:00", "11:51"),
        # The real timetable reuses ids across days.
        _train("TR0003", "tuesday", "peterborough", "cambridge", "06:10", "07:00", price="16.50 pounds"),
    ],
    "taxi": [{"taxi_colors": ["black", "grey"], "taxi_types": ["toyota", "skoda"], "taxi_phone": ["^[0-9]{10}$"]}],
    "police": [{"name": "Parkside Police Station", "address": "Parkside, Cambridge", "id": 0, "phone": "01223358966"}],
    "hospital": [{"department": "paediatric clinic", "id": 0, "phone": "01223217301"}],
}


def _build(raw_by_domain) -> Database:
    entities, taxi_options = {}, {}
    for domain, raw in raw_by_domain.items():
        parsed, options = parse_database(domain, raw, f"{domain}_db.json")
        if domain == "taxi":
            taxi_options = options
        else:
            entities[domain] = parsed
    return Database(entities, taxi_options)


@pytest.fixture(scope="module")
def small_db() -> Database:
    return _build(SMALL_DB)


@pytest.fixture(scope="module")
def real_db(real_raw_db) -> Database:  # real_raw_db (conftest): vendor/multiwoz_db
    missing = [d for d in DB_FILES if d not in real_raw_db]
    if missing:
        pytest.skip(f"MultiWOZ database lacks {', '.join(missing)}")
    return _build({d: real_raw_db[d] for d in DB_FILES})


def _goal(raw, dialogue_id="D1"):
    return parse_goal(dialogue_id, raw, "test")


# --------------------------------------------------------------------------------------
# Schemas
# --------------------------------------------------------------------------------------


def test_schemas_cover_table_4_with_enums():
    by_name = {s["function"]["name"]: s["function"] for s in TOOL_SCHEMAS}
    assert set(by_name) == set(TOOL_NAMES) == {
        "query_restaurant", "book_restaurant", "query_hotel", "book_hotel", "query_attraction",
        "query_train", "buy_train_ticket", "book_taxi",
    }
    assert all(s["type"] == "function" for s in TOOL_SCHEMAS)
    params = {name: set(f["parameters"]["properties"]) for name, f in by_name.items()}
    assert params["query_restaurant"] == {"area", "pricerange", "food", "name"}
    assert params["book_restaurant"] == {"name", "people", "day", "time", "pricerange", "stars", "type"}
    assert params["query_hotel"] == {"area", "internet", "name", "parking", "pricerange", "stars", "type"}
    assert params["book_hotel"] == {"name", "people", "day", "stay"}
    assert params["query_attraction"] == {"area", "name", "type"}
    assert params["query_train"] == {"arriveBy", "day", "departure", "destination", "leaveAt", "trainID"}
    assert params["buy_train_ticket"] == params["query_train"] | {"people"}
    assert params["book_taxi"] == {"arriveBy", "departure", "destination", "leaveAt"}
    assert by_name["book_hotel"]["parameters"]["required"] == ["name", "people", "day", "stay"]
    hotel = by_name["query_hotel"]["parameters"]["properties"]
    assert hotel["area"]["enum"] == ["centre", "north", "south", "east", "west"]
    assert hotel["pricerange"]["enum"] == ["cheap", "moderate", "expensive"]
    assert hotel["type"]["enum"] == ["hotel", "guesthouse"]
    assert "sunday" in by_name["book_hotel"]["parameters"]["properties"]["day"]["enum"]
    json.dumps(TOOL_SCHEMAS)  # serialisable as is


def test_tool_schemas_returns_a_private_copy():
    copy = tool_schemas()
    copy[0]["function"]["name"] = "changed"
    assert TOOL_SCHEMAS[0]["function"]["name"] == "query_restaurant"


# --------------------------------------------------------------------------------------
# Queries
# --------------------------------------------------------------------------------------


def test_query_restaurant_filters_normalised_values(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("query_restaurant", {"food": "Italian", "area": "CENTRE"})
    assert result["count"] == 2
    assert [r["name"] for r in result["results"]] == ["pizza express Fen Ditton", "pizza express"]
    assert "id" not in result["results"][0] and "location" not in result["results"][0]
    assert env.state.queries[-1].count == 2
    assert env.state.queries[-1].entity_ids == ("1", "2")


def test_query_finds_names_regardless_of_case_apostrophes_and_the(small_db):
    env = ToolEnvironment(small_db)
    assert [r["name"] for r in env.call("query_restaurant", {"name": "pizza express fen ditton"})["results"]] == ["pizza express Fen Ditton"]
    assert env.call("query_attraction", {"name": "King's College"})["count"] == 1
    assert env.call("query_attraction", {"name": "KINGS COLLEGE"})["count"] == 1
    assert env.call("query_hotel", {"name": "lensfield hotel"})["results"][0]["name"] == "the lensfield hotel"
    assert env.call("query_restaurant", {"name": "pizza palace"}) == {"count": 0, "results": []}


def test_query_ignores_dontcare_and_empty_values(small_db):
    env = ToolEnvironment(small_db)
    everything = env.call("query_restaurant", {})
    assert everything["count"] == 6 and len(everything["results"]) == 5  # at most 5 shown
    assert env.call("query_restaurant", {"area": "dontcare", "food": "", "pricerange": None}) == everything


def test_query_hotel_takes_the_goal_slots_table_4_omits(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("query_hotel", {"stars": 4, "type": "guesthouse", "parking": "yes"})
    assert [r["name"] for r in result["results"]] == ["acorn guest house"]
    assert result["results"][0]["price.single"] == "50"


def test_query_train_compares_times_not_strings(small_db):
    env = ToolEnvironment(small_db)
    # As strings "11:00" < "9:15": a string filter would drop TR0005.
    result = env.call("query_train", {"leaveAt": "9:15", "day": "monday", "departure": "Cambridge", "destination": "London King's Cross"})
    assert [(r["trainID"], r["leaveAt"]) for r in result["results"]] == [("TR0004", "09:30"), ("TR0005", "11:00")]
    # Departure order even though the database lists TR0004 before TR0003.
    result = env.call("query_train", {"leaveAt": "08:00", "day": "monday"})
    assert [r["trainID"] for r in result["results"]] == ["TR0003", "TR0004", "TR0005"]


def test_query_train_arrive_by_lists_latest_arrival_first(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("query_train", {"arriveBy": "10:30", "day": "monday", "departure": "cambridge"})
    assert [r["arriveBy"] for r in result["results"]] == ["10:21", "09:51", "07:51", "05:51"]


# --------------------------------------------------------------------------------------
# Bookings
# --------------------------------------------------------------------------------------


def test_book_restaurant_records_a_normalised_booking(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("book_restaurant", {"name": "Pizza Express Fen Ditton", "people": "2", "day": "Sunday", "time": "6:30"}, turn=3)
    assert re.fullmatch(r"[A-Z0-9]{8}", result["reference"])
    assert result["name"] == "pizza express Fen Ditton"
    booking = env.state.bookings[-1]
    assert booking.success and booking.domain == "restaurant" and booking.entity_id == "1"
    assert booking.name == "pizza express Fen Ditton" and booking.turn == 3
    assert dict(booking.arguments) == {"name": "pizza express fen ditton", "people": "2", "day": "sunday", "time": "06:30"}
    assert booking.reference == result["reference"]
    assert env.state.calls[-1].turn == 3 and env.state.calls[-1].ok


def test_book_restaurant_checks_optional_values_against_the_venue(small_db):
    env = ToolEnvironment(small_db)
    ok = env.call("book_restaurant", {"name": "nandos", "people": 1, "day": "monday", "time": "12:00", "pricerange": "cheap", "type": "restaurant"})
    assert "reference" in ok
    wrong_price = env.call("book_restaurant", {"name": "nandos", "people": 1, "day": "monday", "time": "12:00", "pricerange": "expensive"})
    assert "pricerange" in wrong_price["error"]
    no_stars = env.call("book_restaurant", {"name": "nandos", "people": 1, "day": "monday", "time": "12:00", "stars": "4"})
    assert "stars" in no_stars["error"]
    assert len(env.state.bookings) == 1 and env.state.error_count == 2


def test_book_hotel(small_db):
    env = ToolEnvironment(small_db)
    result = env.call(ToolCall("book_hotel", {"name": "acorn guest house", "people": 3, "day": "friday", "stay": "2"}))
    assert set(result) == {"reference", "name", "people", "day", "stay"}
    assert env.state.successful_bookings("hotel")[0].arguments["stay"] == "2"


INVALID_CALLS = [
    ("no_such_tool", {}, "unknown tool"),
    ("query_hotel", {"colour": "red"}, "no parameter colour"),
    ("book_hotel", {"name": "acorn guest house", "people": 2, "day": "friday"}, "needs stay"),
    ("query_hotel", {"area": ["north", "south"]}, "single value"),
    ("query_restaurant", {"food": {"name": "italian"}}, "single value"),
    ("query_train", {"leaveAt": "after nine"}, "HH:MM"),
    ("book_taxi", {"departure": "a", "destination": "b", "leaveAt": "25:00"}, "HH:MM"),
    ("query_hotel", {"area": "downtown"}, "area must be one of"),
    ("book_hotel", {"name": "the ritz", "people": 2, "day": "friday", "stay": 1}, "no hotel called"),
    ("buy_train_ticket", {"trainID": "TR9999", "people": 1}, "no train"),
    ("book_restaurant", {"name": "nandos", "people": 0, "day": "monday", "time": "12:00"}, "whole number"),
    ("book_restaurant", {"name": "nandos", "people": -2, "day": "monday", "time": "12:00"}, "whole number"),
    ("book_restaurant", {"name": "nandos", "people": "two", "day": "monday", "time": "12:00"}, "whole number"),
    ("book_restaurant", {"name": "nandos", "people": 2.5, "day": "monday", "time": "12:00"}, "whole number"),
    ("book_restaurant", {"name": "nandos", "people": True, "day": "monday", "time": "12:00"}, "single value"),
    ("book_restaurant", {"name": "nandos", "people": 2, "day": "someday", "time": "12:00"}, "day must be one of"),
    ("book_taxi", {"departure": "a", "destination": "b"}, "leaveAt or arriveBy"),
    ("query_hotel", "area=north", "arguments must be an object"),
]


@pytest.mark.parametrize("tool,arguments,message", INVALID_CALLS)
def test_invalid_calls_answer_an_error_and_are_counted(small_db, tool, arguments, message):
    env = ToolEnvironment(small_db)
    result = env.call(tool, arguments)
    assert set(result) == {"error"} and message in result["error"]
    assert env.state.error_count == 1 and len(env.state.calls) == 1
    assert env.state.calls[0].error == result["error"]
    assert env.state.bookings == [] and env.state.queries == []


def test_fail_book_values_are_unavailable_and_book_values_work(small_db):
    goal = _goal({"restaurant": {"info": {"food": "italian"}, "fail_book": {"day": "saturday"},
                                 "book": {"people": "2", "day": "sunday", "time": "18:00"}}})
    env = ToolEnvironment(small_db, goal)
    refused = env.call("book_restaurant", {"name": "pizza express", "people": 2, "day": "Saturday", "time": "18:00"})
    assert refused["unavailable"] is True and "no availability" in refused["error"]
    assert not env.state.bookings[-1].success and env.state.bookings[-1].reference is None
    assert "saturday" in env.state.bookings[-1].reason
    assert "reference" in env.call("book_restaurant", {"name": "pizza express", "people": 2, "day": "sunday", "time": "18:00"})
    assert len(env.state.successful_bookings("restaurant")) == 1
    # Without a goal nothing is unavailable; other domains are unaffected.
    assert "reference" in ToolEnvironment(small_db).call("book_restaurant", {"name": "pizza express", "people": 2, "day": "saturday", "time": "18:00"})
    assert "reference" in env.call("book_hotel", {"name": "acorn guest house", "people": 2, "day": "saturday", "stay": 1})


def test_fail_book_needs_every_value_to_match(small_db):
    goal = _goal({"hotel": {"info": {"area": "north"}, "fail_book": {"day": "friday", "stay": "3"}, "book": {"day": "friday", "stay": "2"}}})
    env = ToolEnvironment(small_db, goal)
    assert env.call("book_hotel", {"name": "acorn guest house", "people": 1, "day": "friday", "stay": 3}).get("unavailable")
    assert "reference" in env.call("book_hotel", {"name": "acorn guest house", "people": 1, "day": "friday", "stay": 2})


def test_buy_train_ticket_returns_price_and_resolves_reused_ids(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("buy_train_ticket", {"trainID": "tr0003", "people": 2, "day": "tuesday"})
    assert result["trainID"] == "TR0003" and result["price"] == "16.50 pounds" and result["total price"] == "33.00 pounds"
    assert env.state.bookings[-1].entity.get("day") == "tuesday"
    assert dict(env.state.bookings[-1].details) == {"price": "16.50 pounds", "total price": "33.00 pounds"}
    # Without a day, the TR0003 the agent was last shown is the one bought.
    env.call("query_train", {"departure": "cambridge", "leaveAt": "08:30"})
    env.call("buy_train_ticket", {"trainID": "TR0003", "people": 1})
    assert env.state.bookings[-1].entity.get("day") == "monday"
    wrong = env.call("buy_train_ticket", {"trainID": "TR0004", "people": 1, "departure": "ely"})
    assert "does not match" in wrong["error"]


def test_book_taxi_draws_car_and_phone_from_the_options(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("book_taxi", {"departure": "Pizza Express", "destination": "king's college", "arriveBy": "18:00"})
    color, make = result["car type"].split()
    assert color in ("black", "grey") and make in ("toyota", "skoda")
    assert re.fullmatch(r"[0-9]{10}", result["phone"]) and re.fullmatch(r"[A-Z0-9]{8}", result["reference"])
    booking = env.state.successful_bookings("taxi")[0]
    assert booking.entity is None and booking.details["car type"] == result["car type"]
    assert booking.arguments["destination"] == "kings college"
    no_taxis = ToolEnvironment(Database({"restaurant": []})).call("book_taxi", {"departure": "a", "destination": "b", "leaveAt": "10:00"})
    assert "no taxis" in no_taxis["error"]


def test_references_are_deterministic(small_db):
    calls = [
        ("book_hotel", {"name": "acorn guest house", "people": 2, "day": "friday", "stay": 2}),
        ("book_taxi", {"departure": "a", "destination": "b", "leaveAt": "10:00"}),
        ("book_hotel", {"name": "acorn guest house", "people": 2, "day": "friday", "stay": 2}),
    ]

    def run(seed):
        env = ToolEnvironment(small_db, seed=seed)
        return [env.call(name, args) for name, args in calls]

    first, again, other_seed = run(0), run(0), run(1)
    assert first == again
    assert first[0]["reference"] != first[2]["reference"]  # same arguments, later booking
    assert [r["reference"] for r in first] != [r["reference"] for r in other_seed]


def test_fork_is_independent_and_shares_the_database(small_db):
    env = ToolEnvironment(small_db, seed=7)
    env.call("query_hotel", {"area": "north"})
    fork = env.fork()
    assert fork.database is env.database and fork.state.database is env.database
    fork.call("book_hotel", {"name": "acorn guest house", "people": 2, "day": "friday", "stay": 2})
    assert len(env.state.calls) == 1 and env.state.bookings == []
    assert len(fork.state.calls) == 2 and len(fork.state.bookings) == 1
    # Both continue from the same history, so the same booking gets the same reference.
    same = env.call("book_hotel", {"name": "acorn guest house", "people": 2, "day": "friday", "stay": 2})
    assert same["reference"] == fork.state.bookings[0].reference
    assert len(fork.state.calls) == 2


def test_returned_observations_are_the_callers_own(small_db):
    env = ToolEnvironment(small_db)
    result = env.call("query_hotel", {"area": "north"})
    result["results"].clear()
    assert len(env.state.calls[0].observation["results"]) == 1


def test_call_rejects_a_tool_call_with_extra_arguments(small_db):
    with pytest.raises(TypeError):
        ToolEnvironment(small_db).call(ToolCall("query_hotel", {}), {"area": "north"})


def test_database_rejects_entities_under_the_wrong_domain(small_db):
    with pytest.raises(ValueError, match="listed under"):
        Database({"hotel": small_db.entities("restaurant")})


# --------------------------------------------------------------------------------------
# Real MultiWOZ database
# --------------------------------------------------------------------------------------


@pytest.mark.real_data
def test_real_db_queries(real_db):
    env = ToolEnvironment(real_db)
    kings = env.call("query_attraction", {"name": "King's College"})
    assert kings["count"] == 1 and kings["results"][0]["name"] == "king's college"
    pizza = env.call("query_restaurant", {"name": "pizza express fen ditton"})
    assert [r["name"] for r in pizza["results"]] == ["pizza express Fen Ditton"]
    cheap_north = env.call("query_hotel", {"area": "north", "pricerange": "cheap"})
    assert cheap_north["count"] >= 1 and all(r["area"] == "north" and r["pricerange"] == "cheap" for r in cheap_north["results"])


@pytest.mark.real_data
def test_real_db_train_times_are_times(real_db):
    env = ToolEnvironment(real_db)
    result = env.call("query_train", {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "9:00"})
    leaves = [parse_time(r["leaveAt"]) for r in result["results"]]
    assert result["count"] >= 5 and all(t >= 9 * 60 for t in leaves) and leaves == sorted(leaves)
    assert result["count"] == sum(
        1 for e in real_db.entities("train")
        if e.get("departure") == "cambridge" and e.get("destination") == "london kings cross"
        and e.get("day") == "monday" and parse_time(e.get("leaveAt")) >= 9 * 60
    )
    by_arrival = env.call("query_train", {"destination": "cambridge", "day": "friday", "arriveBy": "10:00"})
    arrivals = [parse_time(r["arriveBy"]) for r in by_arrival["results"]]
    assert arrivals and all(t <= 10 * 60 for t in arrivals) and arrivals == sorted(arrivals, reverse=True)


@pytest.mark.real_data
def test_real_db_bookings(real_db):
    env = ToolEnvironment(real_db)
    assert "reference" in env.call("book_restaurant", {"name": "Pizza Express Fen Ditton", "people": 4, "day": "friday", "time": "19:15"})
    assert "reference" in env.call("book_hotel", {"name": "acorn guest house", "people": 2, "day": "monday", "stay": 3})
    train = env.call("query_train", {"departure": "cambridge", "destination": "ely", "day": "sunday", "leaveAt": "10:00"})["results"][0]
    ticket = env.call("buy_train_ticket", {"trainID": train["trainID"], "people": 2, "day": "sunday"})
    assert ticket["trainID"] == train["trainID"] and ticket["price"] == train["price"]
    taxi = env.call("book_taxi", {"departure": "acorn guest house", "destination": "pizza express", "leaveAt": "18:00"})
    color, make = taxi["car type"].split()
    assert color in real_db.taxi_options["taxi_colors"] and make in real_db.taxi_options["taxi_types"]
    assert env.state.error_count == 0 and len(env.state.successful_bookings()) == 4


# --------------------------------------------------------------------------------------
# Replay of gold dialogues
# --------------------------------------------------------------------------------------

_EMPTY_BELIEF = {
    "restaurant": {"book": {"booked": [], "people": "", "day": "", "time": ""}, "semi": {"food": "", "pricerange": "", "name": "not mentioned", "area": ""}},
    "hotel": {"book": {"booked": [], "people": "", "day": "", "stay": ""}, "semi": {"name": "", "area": "", "parking": "", "pricerange": "", "stars": "", "internet": "", "type": ""}},
    "attraction": {"book": {"booked": []}, "semi": {"type": "", "name": "", "area": ""}},
    "train": {"book": {"booked": [], "people": ""}, "semi": {"leaveAt": "", "destination": "", "day": "", "arriveBy": "", "departure": ""}},
    "taxi": {"book": {"booked": []}, "semi": {"leaveAt": "", "destination": "", "departure": "", "arriveBy": ""}},
    "police": {"book": {"booked": []}, "semi": {}},
    "hospital": {"book": {"booked": []}, "semi": {"department": ""}},
}
_RESTAURANT_SEMI = {"food": "italian", "pricerange": "moderate", "area": "centre"}
_RESTAURANT_BOOK = {"people": "2", "day": "sunday", "time": "18:00"}
_TRAIN_SEMI = {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "09:15"}
_TAXI_SEMI = {"departure": "pizza express fen ditton", "destination": "kings college", "leaveAt": "20:00"}


def _metadata(**domains):
    """A system turn's belief state: ``domain=(semi, book, booked)`` over empty defaults."""
    belief = json.loads(json.dumps(_EMPTY_BELIEF))
    for domain, (semi, book, booked) in domains.items():
        belief[domain]["semi"].update(semi)
        belief[domain]["book"].update(book, booked=booked)
    return belief


def _gold_dialogue_raw():
    restaurant_booked = [{"name": "pizza express Fen Ditton", "reference": "GOLDREF1"}]
    train_booked = [{"trainID": "TR0004", "reference": "GOLDREF2"}]
    taxi_booked = [{"phone": "07700900123", "type": "white honda"}]
    log = [
        ("I want a moderately priced italian restaurant in the centre.", None, None),
        ("Pizza Express Fen Ditton is a nice italian place in the centre.",
         _metadata(restaurant=(_RESTAURANT_SEMI, {}, [])), {"Restaurant-Recommend": [["Name", "pizza express Fen Ditton"]]}),
        ("Great, book it for 2 on sunday at 18:00 please, and what is the phone number?", None, None),
        ("Done! Reference number is : GOLDREF1. Their phone number is 01223 000001.",
         _metadata(restaurant=({**_RESTAURANT_SEMI, "name": "pizza express Fen Ditton"}, _RESTAURANT_BOOK, restaurant_booked)),
         {"Booking-Book": [["Ref", "GOLDREF1"]], "Restaurant-Inform": [["Phone", "01223000001"]]}),
        ("I also need a train to london kings cross on monday leaving after 9:15.", None, None),
        ("TR0004 leaves at 09:30 and takes 51 minutes. Shall I book it?",
         _metadata(restaurant=({**_RESTAURANT_SEMI, "name": "pizza express Fen Ditton"}, _RESTAURANT_BOOK, restaurant_booked),
                   train=(_TRAIN_SEMI, {}, [])),
         {"Train-Inform": [["Id", "TR0004"], ["Leave", "09:30"]]}),
        ("Yes, for 2 people.", None, None),
        ("Booked, the total fee is 47.20 GBP. Reference number is : GOLDREF2.",
         _metadata(restaurant=({**_RESTAURANT_SEMI, "name": "pizza express Fen Ditton"}, _RESTAURANT_BOOK, restaurant_booked),
                   train=(_TRAIN_SEMI, {"people": "2"}, train_booked)),
         {"Train-OfferBooked": [["Ref", "GOLDREF2"]]}),
        ("And a taxi from the restaurant to king's college at 20:00.", None, None),
        ("Booked a white honda, contact number 07700900123.",
         _metadata(restaurant=({**_RESTAURANT_SEMI, "name": "pizza express Fen Ditton"}, _RESTAURANT_BOOK, restaurant_booked),
                   train=(_TRAIN_SEMI, {"people": "2"}, train_booked), taxi=(_TAXI_SEMI, {}, taxi_booked)),
         {"Taxi-Inform": [["Car", "white honda"], ["Phone", "07700900123"]]}),
        ("Thanks, bye.", None, None),
        ("Goodbye!", {}, {"general-bye": [["none", "none"]]}),
    ]
    goal = {
        "restaurant": {"info": _RESTAURANT_SEMI, "book": _RESTAURANT_BOOK, "reqt": ["phone"]},
        "train": {"info": _TRAIN_SEMI, "book": {"people": "2"}, "reqt": ["duration"]},
        "taxi": {"info": _TAXI_SEMI, "reqt": ["car type", "phone"]},
        "message": ["..."],
    }
    turns = []
    for text, metadata, acts in log:
        turn = {"text": text, "metadata": metadata if metadata is not None else {}}
        if acts is not None:
            turn["dialog_act"] = acts
        turns.append(turn)
    return {"goal": goal, "log": turns}


def _dialogue(raw=None):
    return parse_dialogue("GOLD1.json", raw or _gold_dialogue_raw(), "test", "train")


def test_gold_tool_calls_follow_the_annotations():
    calls = [(turn, call.name, dict(call.arguments)) for turn, call in gold_tool_calls(_dialogue())]
    assert calls == [
        (1, "query_restaurant", _RESTAURANT_SEMI),
        (3, "query_restaurant", {**_RESTAURANT_SEMI, "name": "pizza express Fen Ditton"}),
        (3, "book_restaurant", {"name": "pizza express Fen Ditton", **_RESTAURANT_BOOK}),
        (5, "query_train", _TRAIN_SEMI),
        (7, "buy_train_ticket", {"trainID": "TR0004", "people": "2",
                                 **{k: _TRAIN_SEMI[k] for k in ("day", "departure", "destination") if k in _TRAIN_SEMI}}),
        (9, "book_taxi", _TAXI_SEMI),
    ]


def test_replay_of_a_gold_dialogue_succeeds(small_db):
    dialogue = _dialogue()
    result = replay(dialogue, ToolEnvironment(small_db, dialogue.goal))
    assert [call.ok for _, call in result.calls] == [True] * 6
    assert result.state.error_count == 0 and len(result.state.successful_bookings()) == 3
    # The gold references and taxi were replaced by the environment's own.
    texts = dict(result.system_texts)
    restaurant_ref = result.state.successful_bookings("restaurant")[0].reference
    taxi = result.state.successful_bookings("taxi")[0]
    assert restaurant_ref in texts[3] and "GOLDREF1" not in texts[3]
    assert taxi.details["car type"] in texts[9] and taxi.details["phone"] in texts[9]
    assert any(a.slot == "Ref" and a.value == restaurant_ref for a in result.system_acts)
    graded = check_goal(dialogue.goal, result.state, result.system_texts, result.system_acts)
    assert graded.success, graded.reasons
    assert graded.domain("restaurant").offered == "pizza express Fen Ditton"
    assert graded.domain("train").offered == "TR0004"


def test_replay_grades_a_reference_the_gold_system_never_told(small_db):
    raw = _gold_dialogue_raw()
    raw["log"][3]["text"] = "Done! Their phone number is 01223 000001."
    raw["log"][3]["dialog_act"] = {"Restaurant-Inform": [["Phone", "01223000001"]]}
    dialogue = _dialogue(raw)
    result = replay(dialogue, ToolEnvironment(small_db, dialogue.goal))
    graded = check_goal(dialogue.goal, result.state, result.system_texts, result.system_acts)
    assert not graded.success and graded.domain("restaurant").book is False
    assert any("never given to the user" in r for r in graded.domain("restaurant").reasons)


def test_partial_annotations_yield_fewer_calls_never_invented_values():
    raw = _gold_dialogue_raw()
    for turn in raw["log"]:
        turn["metadata"] = {}
    assert gold_tool_calls(_dialogue(raw)) == []

    raw = _gold_dialogue_raw()
    for turn in raw["log"][3:]:
        if turn["metadata"]:
            turn["metadata"]["restaurant"]["book"].update(people="", day="", time="")  # booked, but with what?
    calls = [(turn, call.name) for turn, call in gold_tool_calls(_dialogue(raw))]
    assert (3, "book_restaurant") not in calls
    assert (7, "buy_train_ticket") in calls and (9, "book_taxi") in calls


def test_a_turn_without_metadata_defers_to_the_next_annotated_one():
    raw = _gold_dialogue_raw()
    raw["log"][3]["metadata"] = {}
    calls = [(turn, call.name) for turn, call in gold_tool_calls(_dialogue(raw))]
    # Queries first within a turn, then bookings.
    assert calls[:4] == [(1, "query_restaurant"), (5, "query_restaurant"), (5, "query_train"), (5, "book_restaurant")]


@pytest.mark.real_data
def test_real_db_episode_is_graded(real_db):
    goal = _goal({"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "sunday", "leaveAt": "10:00"},
                            "book": {"people": "2"}, "reqt": ["price"]},
                  "attraction": {"info": {"name": "king's college"}, "reqt": ["entrance fee"]}})
    env = ToolEnvironment(real_db, goal)
    train = env.call("query_train", {"departure": "cambridge", "destination": "ely", "day": "sunday", "leaveAt": "10:00"}, turn=1)["results"][0]
    ticket = env.call("buy_train_ticket", {"trainID": train["trainID"], "people": 2}, turn=3)
    texts = [(1, f"{train['trainID']} leaves at {train['leaveAt']}."), (3, f"Booked at {ticket['price']} each, reference {ticket['reference']}."),
             (5, "King's College is free to enter.")]
    result = check_goal(goal, env.state, texts)
    assert result.success, result.reasons
    assert result.domain("attraction").offered == "king's college"  # found in the database, no query made


def test_replayed_embedded_corpus_dialogues_all_succeed():
    corpus = generate_corpus(40, seed=11)
    database = _build(corpus["db"])
    graded, bookings = [], 0
    for dialogue in parse_dialogues(corpus["data"], "data.json"):
        result = replay(dialogue, ToolEnvironment(database, dialogue.goal))
        assert result.state.error_count == 0, dialogue.dialogue_id
        bookings += len(result.state.successful_bookings())
        graded.append(check_goal(dialogue.goal, result.state, result.system_texts, result.system_acts))
    failures = {g.dialogue_id: g.reasons for g in graded if not g.success}
    assert success_rate(graded) == 1.0, failures
    assert bookings >= 20  # the corpus books in most dialogues: the references were really checked
