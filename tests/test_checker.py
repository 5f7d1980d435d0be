"""The goal checker (pipelines.env.checker): episodes made of real tool calls, graded."""

from __future__ import annotations

import pytest

from pipelines.env.checker import DomainResult, GoalResult, check_goal, inform_rate, success_rate
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.multiwoz.parse import parse_database, parse_goal
from pipelines.records import DialogAct

RAW_DB = {
    "restaurant": [
        {"id": "1", "name": "pizza express Fen Ditton", "food": "italian", "pricerange": "moderate", "area": "centre",
         "address": "jesus lane fen ditton", "phone": "01223324033", "postcode": "cb58ba", "type": "restaurant"},
        {"id": "2", "name": "pizza express", "food": "italian", "pricerange": "moderate", "area": "centre",
         "address": "regent street city centre", "phone": "01223324034", "postcode": "cb21db", "type": "restaurant"},
        {"id": "3", "name": "curry prince", "food": "indian", "pricerange": "moderate", "area": "east",
         "address": "451 newmarket road", "phone": "01223566388", "postcode": "cb58jj", "type": "restaurant"},
    ],
    "hotel": [
        {"id": "1", "name": "acorn guest house", "area": "north", "pricerange": "moderate", "type": "guesthouse", "stars": "4",
         "parking": "yes", "internet": "yes", "address": "154 chesterton road", "phone": "01223353888", "postcode": "cb41da",
         "price": {"single": "50"}},
        {"id": "2", "name": "the lensfield hotel", "area": "south", "pricerange": "expensive", "type": "hotel", "stars": "3",
         "parking": "yes", "internet": "yes", "address": "53-57 lensfield road", "phone": "01223355017", "postcode": "cb21en",
         "price": {"single": "65"}},
    ],
    "attraction": [
        {"id": "1", "name": "king's college", "area": "centre", "type": "college", "entrance fee": "free", "openhours": "?",
         "address": "king's parade", "phone": "01223331100", "postcode": "cb21st", "pricerange": "free"},
        {"id": "2", "name": "abbey pool", "area": "east", "type": "swimmingpool", "entrance fee": "?", "openhours": "?",
         "address": "pool way", "phone": "01223902088", "postcode": "cb58nt", "pricerange": "?"},
    ],
    "train": [
        {"trainID": "TR7075", "day": "monday", "departure": "cambridge", "destination": "london kings cross",
         "leaveAt": "05:00", "arriveBy": "05:51", "duration": "51 minutes", "price": "23.60 pounds"},
        {"trainID": "TR9999", "day": "monday", "departure": "cambridge", "destination": "london kings cross",
         "leaveAt": "09:00", "arriveBy": "09:51", "duration": "51 minutes", "price": "23.60 pounds"},
        {"trainID": "TR9999", "day": "friday", "departure": "ely", "destination": "cambridge",
         "leaveAt": "10:00", "arriveBy": "10:17", "duration": "17 minutes", "price": "4.40 pounds"},
    ],
    "taxi": [{"taxi_colors": ["black"], "taxi_types": ["toyota"], "taxi_phone": ["^[0-9]{10}$"]}],
    "police": [{"name": "Parkside Police Station", "address": "Parkside, Cambridge", "id": 0, "phone": "01223358966"}],
    "hospital": [
        {"department": "paediatric clinic", "id": 0, "phone": "01223217301"},
        {"department": "cardiology", "id": 1, "phone": "01223256233"},
    ],
}


@pytest.fixture(scope="module")
def db() -> Database:
    entities, taxi = {}, {}
    for domain, raw in RAW_DB.items():
        parsed, options = parse_database(domain, raw, f"{domain}_db.json")
        if domain == "taxi":
            taxi = options
        else:
            entities[domain] = parsed
    return Database(entities, taxi)


def goal(raw, dialogue_id="D1"):
    return parse_goal(dialogue_id, raw, "test")


RESTAURANT_GOAL = goal({
    "restaurant": {"info": {"food": "italian", "area": "centre"}, "book": {"people": "2", "day": "sunday", "time": "18:00"},
                   "reqt": ["phone", "postcode"]},
})
BOOK = {"name": "pizza express", "people": 2, "day": "sunday", "time": "18:00"}


def restaurant_episode(db, booking=BOOK, tell_reference=True, tell_phone=True):
    """query (turn 1), book (turn 3); returns the state and the system texts, by turn."""
    env = ToolEnvironment(db, RESTAURANT_GOAL)
    env.call("query_restaurant", {"food": "italian", "area": "centre"}, turn=1)
    texts = [(1, "Pizza Express is a moderately priced italian place in the centre. Shall I book it?")]
    result = env.call("book_restaurant", booking, turn=3)
    said = "Booked!"
    if tell_reference:
        said += f" Your reference number is {result.get('reference')}."
    if tell_phone:
        said += " Their phone is 01223 324034 and the postcode is CB2 1DB."
    texts.append((3, said))
    return env.state, texts


def test_a_successful_episode_is_successful(db):
    state, texts = restaurant_episode(db)
    result = check_goal(RESTAURANT_GOAL, state, texts)
    restaurant = result.domain("restaurant")
    assert (restaurant.inform, restaurant.book, restaurant.request) == (True, True, True)
    assert restaurant.offered == "pizza express" and restaurant.reasons == ()
    assert result.success and result.inform
    assert result.as_dict() == {
        "dialogue_id": "D1", "success": True, "inform": True,
        "domains": [{"domain": "restaurant", "offered": "pizza express", "inform": True, "book": True, "request": True,
                     "success": True, "reasons": []}],
    }


@pytest.mark.parametrize(
    "change,reason",
    [
        ({"day": "saturday"}, "day saturday, the goal wants sunday"),
        ({"people": 3}, "people 3, the goal wants 2"),
        ({"time": "19:00"}, "time 19:00, the goal wants 18:00"),
    ],
)
def test_a_booking_with_wrong_details_fails(db, change, reason):
    state, texts = restaurant_episode(db, {**BOOK, **change})
    result = check_goal(RESTAURANT_GOAL, state, texts)
    restaurant = result.domain("restaurant")
    assert not result.success and restaurant.book is False and restaurant.inform is True
    assert any(reason in r for r in restaurant.reasons), restaurant.reasons


def test_booking_a_venue_that_violates_info_fails_inform_and_book(db):
    state, texts = restaurant_episode(db, {**BOOK, "name": "curry prince"})
    restaurant = check_goal(RESTAURANT_GOAL, state, texts).domain("restaurant")
    assert restaurant.offered == "curry prince"
    assert restaurant.inform is False and restaurant.book is False
    assert any("curry prince has food indian, the goal wants italian" in r for r in restaurant.reasons)
    assert any(r.startswith("booked curry prince has area east") for r in restaurant.reasons)


def test_a_reference_never_told_fails_book(db):
    state, texts = restaurant_episode(db, tell_reference=False)
    restaurant = check_goal(RESTAURANT_GOAL, state, texts).domain("restaurant")
    assert restaurant.book is False and restaurant.inform is True and restaurant.request is True
    assert any("never given to the user" in r for r in restaurant.reasons)


def test_a_reference_must_be_told_after_the_booking(db):
    state, texts = restaurant_episode(db, tell_reference=False)
    reference = state.bookings[-1].reference
    early = [(0, f"Maybe {reference}?"), *texts]  # before the booking's turn 3: a guess, not a report
    assert check_goal(RESTAURANT_GOAL, state, early).domain("restaurant").book is False
    assert check_goal(RESTAURANT_GOAL, state, [*texts, (5, f"Ref: {reference.lower()}")]).domain("restaurant").book is True


def test_a_missing_requested_attribute_fails_request(db):
    state, texts = restaurant_episode(db, tell_phone=False)
    texts.append((5, "The postcode is cb21db."))
    restaurant = check_goal(RESTAURANT_GOAL, state, texts).domain("restaurant")
    assert restaurant.request is False and restaurant.book is True
    assert restaurant.reasons == ("requested phone (01223324034) was never given",)


def test_requested_attributes_may_come_from_dialog_acts(db):
    state, texts = restaurant_episode(db, tell_phone=False)
    acts = [DialogAct("Restaurant-Inform", "Phone", "01223324034"), DialogAct("Restaurant-Inform", "Post", "cb21db")]
    assert check_goal(RESTAURANT_GOAL, state, texts, acts).domain("restaurant").request is True
    # A request act, or an act of another domain, gives nothing.
    wrong = [DialogAct("Restaurant-Request", "Phone", "?"), DialogAct("Hotel-Inform", "Post", "cb41da")]
    assert check_goal(RESTAURANT_GOAL, state, texts, wrong).domain("restaurant").request is False


def test_a_refused_booking_then_the_backup_succeeds(db):
    fail_goal = goal({"restaurant": {"info": {"food": "italian"}, "fail_book": {"day": "saturday"},
                                     "book": {"people": "2", "day": "sunday", "time": "18:00"}}})
    env = ToolEnvironment(db, fail_goal)
    assert env.call("book_restaurant", {**BOOK, "day": "saturday"}, turn=1)["unavailable"]
    texts = [(1, "Sorry, pizza express is fully booked on saturday.")]
    first = check_goal(fail_goal, env.state, texts).domain("restaurant")
    assert first.book is False and first.reasons[-1] == "no successful restaurant booking (1 attempt(s) refused)"
    reference = env.call("book_restaurant", BOOK, turn=3)["reference"]
    texts.append((3, f"Sunday works: reference {reference}."))
    assert check_goal(fail_goal, env.state, texts).success


# --------------------------------------------------------------------------------------
# Offered venue without a booking
# --------------------------------------------------------------------------------------

ATTRACTION_GOAL = goal({"attraction": {"info": {"area": "centre"}, "reqt": ["entrance fee", "postcode"]}})


def test_offered_venue_from_a_query_the_system_named(db):
    env = ToolEnvironment(db)
    env.call("query_attraction", {"type": "college"}, turn=1)
    texts = [(1, "King's College is lovely, the entrance fee is free and the postcode is CB2 1ST.")]
    result = check_goal(ATTRACTION_GOAL, env.state, texts).domain("attraction")
    assert result.offered == "king's college" and result.inform and result.request and result.book is None


def test_a_named_venue_violating_info_fails_inform(db):
    env = ToolEnvironment(db)
    env.call("query_attraction", {"type": "swimmingpool"}, turn=1)
    texts = [(1, "Try abbey pool; I don't know the entrance fee. Postcode cb58nt.")]
    result = check_goal(ATTRACTION_GOAL, env.state, texts).domain("attraction")
    assert result.offered == "abbey pool" and result.inform is False
    assert result.reasons == ("abbey pool has area east, the goal wants centre",)
    # The unknown fee counts as given because the system talked about it.
    assert result.request is True


def test_an_unknown_attribute_not_talked_about_is_not_given(db):
    env = ToolEnvironment(db)
    env.call("query_attraction", {"name": "abbey pool"}, turn=1)
    result = check_goal(ATTRACTION_GOAL, env.state, [(1, "Abbey pool, postcode cb58nt.")]).domain("attraction")
    assert result.request is False and result.reasons[-1] == "requested entrance fee was never given"


def test_offered_venue_falls_back_to_a_database_name_in_the_texts(db):
    env = ToolEnvironment(db)  # no calls at all
    result = check_goal(ATTRACTION_GOAL, env.state, ["You could visit KINGS COLLEGE, entry is free, postcode cb21st."])
    assert result.domain("attraction").offered == "king's college" and result.success


def test_nothing_offered_fails_with_a_reason(db):
    result = check_goal(ATTRACTION_GOAL, ToolEnvironment(db).state, ["Hello, how can I help?"])
    attraction = result.domain("attraction")
    assert attraction.offered is None and attraction.inform is False and attraction.request is False
    assert "no attraction was offered" in attraction.reasons


def test_the_longer_of_two_names_in_one_text_is_the_offered_one(db):
    restaurant_goal = goal({"restaurant": {"info": {"name": "pizza express fen ditton"}}})
    env = ToolEnvironment(db)
    env.call("query_restaurant", {"food": "italian"}, turn=1)
    result = check_goal(restaurant_goal, env.state, [(1, "How about Pizza Express Fen Ditton?")])
    assert result.domain("restaurant").offered == "pizza express Fen Ditton" and result.success
    # The most recently named venue wins over an earlier one.
    later = [(1, "How about Pizza Express Fen Ditton?"), (3, "Or rather pizza express, on regent street.")]
    result = check_goal(restaurant_goal, env.state, later)
    assert result.domain("restaurant").offered == "pizza express" and result.domain("restaurant").inform is False


def test_a_name_inside_a_longer_named_venue_outside_the_query_is_not_the_offer(db):
    # The query returned only "pizza express"; the system then named "pizza express fen
    # ditton", found elsewhere. The shorter name inside it is not an offer of its own.
    restaurant_goal = goal({"restaurant": {"info": {"area": "centre"}, "reqt": ["phone"]}})
    env = ToolEnvironment(db)
    env.call("query_restaurant", {"name": "pizza express"}, turn=1)
    texts = [(1, "Pizza Express Fen Ditton is a good choice, phone 01223324033.")]
    result = check_goal(restaurant_goal, env.state, texts).domain("restaurant")
    assert result.offered == "pizza express Fen Ditton"
    assert result.request is True


# --------------------------------------------------------------------------------------
# Trains and taxis
# --------------------------------------------------------------------------------------

TRAIN_GOAL = goal({"train": {"info": {"departure": "cambridge", "destination": "london kings cross", "day": "monday",
                                      "leaveAt": "08:30"},
                             "book": {"people": "3"}, "reqt": ["price", "arriveBy"]}})


def test_a_train_booking_is_graded_with_times_as_times(db):
    env = ToolEnvironment(db, TRAIN_GOAL)
    env.call("query_train", {"departure": "cambridge", "day": "monday", "leaveAt": "8:30"}, turn=1)
    ticket = env.call("buy_train_ticket", {"trainID": "TR9999", "people": 3}, turn=3)
    assert ticket["price"] == "23.60 pounds"  # the monday TR9999 the query showed, not friday's
    texts = [(1, "TR9999 leaves at 9:00 and arrives at 9:51."), (3, f"Booked, £23.60 each, reference {ticket['reference']}.")]
    result = check_goal(TRAIN_GOAL, env.state, texts)
    assert result.success, result.reasons
    assert result.domain("train").offered == "TR9999"


def test_a_train_leaving_too_early_fails(db):
    env = ToolEnvironment(db, TRAIN_GOAL)
    ticket = env.call("buy_train_ticket", {"trainID": "TR7075", "people": 3}, turn=1)
    texts = [(1, f"TR7075 at 05:00, arriving 05:51, 23.60 pounds. Reference {ticket['reference']}.")]
    train = check_goal(TRAIN_GOAL, env.state, texts).domain("train")
    assert train.inform is False and train.book is False and train.request is True
    assert "TR7075 has leaveAt 05:00, the goal wants 08:30" in train.reasons


TAXI_GOAL = goal({"taxi": {"info": {"departure": "the acorn guest house", "destination": "King's College", "leaveAt": "17:15"},
                           "reqt": ["car type", "phone"]}})


def taxi_episode(db, **change):
    env = ToolEnvironment(db)
    taxi = env.call("book_taxi", {"departure": "acorn guest house", "destination": "kings college", "leaveAt": "17:15", **change}, turn=1)
    return env.state, taxi


def test_a_taxi_booking_plus_car_and_phone_succeeds(db):
    state, taxi = taxi_episode(db)
    texts = [(1, f"A {taxi['car type']} will pick you up; contact number {taxi['phone']}.")]
    result = check_goal(TAXI_GOAL, state, texts).domain("taxi")
    assert (result.inform, result.book, result.request) == (None, True, True)
    assert result.offered == taxi["reference"]


def test_a_taxi_at_the_wrong_time_or_without_its_phone_fails(db):
    state, taxi = taxi_episode(db, leaveAt="16:45")
    texts = [(1, f"A {taxi['car type']}; contact number {taxi['phone']}.")]
    result = check_goal(TAXI_GOAL, state, texts).domain("taxi")
    assert result.book is False and result.reasons == ("taxi booked with leaveAt 16:45, the goal wants 17:15",)
    assert [(p.kind, p.slot, p.expected, p.got) for p in result.problems] == [("taxi_value", "leaveAt", "17:15", "16:45")]
    # leaveAt means "leave at or after", as for trains: "the taxi should leave after 17:15".
    state, taxi = taxi_episode(db, leaveAt="17:45")
    assert check_goal(TAXI_GOAL, state, [(1, f"A {taxi['car type']}; contact number {taxi['phone']}.")]).domain("taxi").book is True

    state, taxi = taxi_episode(db)
    result = check_goal(TAXI_GOAL, state, [(1, f"A {taxi['car type']} is on its way.")]).domain("taxi")
    assert result.book is True and result.request is False
    assert result.reasons == (f"requested phone ({taxi['phone']}) was never given",)

    result = check_goal(TAXI_GOAL, ToolEnvironment(db).state, ["Sure."]).domain("taxi")
    assert result.book is False and result.request is False and "no taxi was booked" in result.reasons


# --------------------------------------------------------------------------------------
# Police, hospital, several domains, aggregates
# --------------------------------------------------------------------------------------


def test_police_and_hospital_are_graded_on_their_static_entities(db):
    static_goal = goal({"police": {"reqt": ["phone", "postcode"]},
                        "hospital": {"info": {"department": "cardiology"}, "reqt": ["phone"]}})
    state = ToolEnvironment(db).state
    good = ["Parkside Police Station: 01223358966. I don't have their postcode.",
            "The cardiology department's number is 01223 256233."]
    result = check_goal(static_goal, state, good)
    assert result.success, result.reasons
    assert result.domain("police").offered == "Parkside Police Station" and result.domain("police").inform is None
    assert result.domain("hospital").offered == "cardiology" and result.domain("hospital").inform is True

    bad = check_goal(static_goal, state, ["The police are at Parkside.", "The paediatric clinic is on 01223217301."])
    assert bad.domain("police").request is False
    assert bad.domain("hospital").inform is False and bad.domain("hospital").request is False


def test_every_domain_must_succeed(db):
    both = goal({**{"restaurant": {"info": {"food": "italian", "area": "centre"},
                                   "book": {"people": "2", "day": "sunday", "time": "18:00"}, "reqt": ["phone", "postcode"]}},
                 "attraction": {"info": {"area": "centre"}}})
    state, texts = restaurant_episode(db)
    result = check_goal(both, state, texts)
    assert result.domain("restaurant").success and not result.domain("attraction").success
    assert not result.success and result.reasons == ("attraction: no attraction was offered",)


def test_plain_string_texts_are_numbered_by_position(db):
    state, texts = restaurant_episode(db)  # booking at turn 3
    plain = [text for _, text in texts]  # the reference is now in text number 1, before turn 3
    assert check_goal(RESTAURANT_GOAL, state, plain).domain("restaurant").book is False
    assert check_goal(RESTAURANT_GOAL, state, ["", "", "", *plain]).success


def test_aggregates():
    ok = GoalResult("a", (DomainResult("hotel", "x", True, True, True),))
    bad_book = GoalResult("b", (DomainResult("hotel", "x", True, False, None, ("no booking",)),))
    bad_inform = GoalResult("c", (DomainResult("hotel", "y", False, None, None, ("wrong area",)),))
    results = [ok, bad_book, bad_inform]
    assert success_rate(results) == pytest.approx(1 / 3)
    assert inform_rate(results) == pytest.approx(2 / 3)
    assert success_rate([]) == 0.0 and inform_rate([]) == 0.0
    assert GoalResult("empty", ()).success


def test_a_venue_named_without_its_article_is_offered(db):
    hotel_goal = goal({"hotel": {"info": {"area": "south"}, "reqt": ["postcode"]}})
    named = check_goal(hotel_goal, ToolEnvironment(db).state, ["Lensfield Hotel is in the south, postcode CB2 1EN."])
    assert named.domain("hotel").offered == "the lensfield hotel" and named.success
