"""Issue 29: the ``standard`` grading mode (the MultiWOZ standard evaluator's definitions,
pipelines/env/standard.py) beside the ``strict`` checker, the strict checker's careful
reading (facts derivable from what was said, spelling variants), and goal_inconsistent.
Hand-made dialogues over the invented database of tests/test_real_gold_replay.py."""

from __future__ import annotations

import pytest

from pipelines.env.standard import requestables
from pipelines.env.tools import same_name
from pipelines.episodes.causes import classify_problem, evidence, goal_inconsistency, offline_result
from pipelines.multiwoz.ontology import values_match
from tests.test_real_gold_replay import _belief, _database_with, _grade, _with_message


@pytest.fixture(scope="module")
def database():
    return _database_with()


def test_standard_requestables_are_the_evaluators_set():
    assert requestables("hotel", ["area", "phone", "parking"], books=False) == ("phone",)
    assert requestables("restaurant", ["address", "postcode"], books=True) == ("address", "postcode", "reference")
    assert requestables("train", ["duration", "price", "trainID"], books=True) == ("reference", "trainID")
    assert requestables("train", ["duration"], books=False) == ()
    assert requestables("taxi", ["car type", "phone"], books=False) == ("phone",)


def test_standard_mode_offered_venues_against_the_goals_venues(database):
    """The offer is every venue matching the system's state when it named one: a query for
    north chinese (lotus garden only) informs a goal of north chinese; a query for any
    north restaurant (more venues than the goal's) does not, whichever venue was named."""
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["phone", "area"]}}
    fitting = _with_message("STD01.json", goal, [], [
        ("A chinese place in the north ?", {}, {}),
        ("Lotus garden , phone 01223000222 .", _belief(restaurant=({"food": "chinese", "area": "north"}, {})), {}),
    ])
    result = _grade(fitting, database)
    assert (result.standard.inform, result.standard.success) == (True, True)
    assert result.standard.domain("restaurant").requestables == ("phone",)  # area is not a standard requestable
    broad = _with_message("STD02.json", goal, [], [
        ("A place in the centre ?", {}, {}),
        ("The copper kettle bistro , phone 01223000111 .", _belief(restaurant=({"area": "centre"}, {})), {}),
    ])
    result = _grade(broad, database)
    assert not result.standard.inform and not result.standard.success and not result.success


def test_standard_mode_counts_a_requestable_only_for_the_turns_active_domain(database):
    """The evaluator attributes a turn's requestables to the one domain whose state changed:
    the restaurant's phone given in the turn where the attraction's search began counts for
    the attraction, not the restaurant (strict mode reads it wherever it is said)."""
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["phone"]},
            "attraction": {"info": {"type": "museum"}, "reqt": []}}
    chinese = {"food": "chinese", "area": "north"}

    def dialogue(name: str, phone_turn: int):
        lotus = "Lotus garden" + (" , phone 01223000222 ." if phone_turn == 1 else " .")
        museum = "The old gaol museum" + (" ; lotus garden 's phone is 01223000222 ." if phone_turn == 3 else " .")
        return _with_message(name, goal, [], [
            ("A chinese place in the north ?", {}, {}),
            (lotus, _belief(restaurant=(chinese, {})), {}),
            ("And a museum ?", {}, {}),
            (museum, _belief(restaurant=(chinese, {}), attraction=({"type": "museum"}, {})), {}),
        ])

    said_with_its_search = _grade(dialogue("ACTIVE01.json", 1), database)
    assert said_with_its_search.standard.success and said_with_its_search.success
    said_with_another = _grade(dialogue("ACTIVE02.json", 3), database)
    assert said_with_another.success, said_with_another.reasons
    assert not said_with_another.standard.success
    assert said_with_another.standard.domain("restaurant").missing == ("phone",)


def test_standard_mode_taxi_is_matched_and_needs_only_its_phone(database):
    goal = {"taxi": {"info": {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:00"}, "reqt": ["car type", "phone"]}}
    semi = {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:00"}
    dialogue = _with_message("STD03.json", goal, [], [
        ("A taxi from lotus garden to riverside lido at 09:00 .", {}, {}),
        ("Booked , contact number 07000111222 .", _belief(taxi=(semi, {"booked": [{"phone": "07000111222", "type": "red skoda"}]})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.standard.success and result.standard.domain("taxi").requestables == ("phone",)


def test_strict_a_duration_from_both_times_and_an_area_from_the_address(database):
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}, "reqt": ["duration"]},
            "attraction": {"info": {"type": "museum"}, "reqt": ["area", "type"]}}
    train = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}
    museum = {"type": "museum"}
    dialogue = _with_message("CAREFUL01.json", goal, [], [
        ("A train to ely on monday after 10:00 , how long is it ?", {}, {}),
        ("TR1002 leaves at 10:05 and arrives at 10:22 .", _belief(train=(train, {})), {}),
        ("I would also like to visit a museum . Where is it ?", {}, {}),
        ("The old gaol museum is on 5 castle street .", _belief(train=(train, {}), attraction=(museum, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    # Without the arrival time the duration is not known.
    unknown = _with_message("CAREFUL02.json", {"train": goal["train"]}, [], [
        ("A train to ely on monday after 10:00 , how long is it ?", {}, {}),
        ("TR1002 leaves at 10:05 .", _belief(train=(train, {})), {}),
    ])
    assert [(p.kind, p.slot) for p in _grade(unknown, database).problems] == [("request_not_given", "duration")]


def test_strict_a_flag_asked_about_is_not_a_flag_asked_for(database):
    goal = {"hotel": {"info": {"type": "guesthouse", "area": "east"}, "reqt": ["parking"]}}
    hotel = {"type": "guesthouse", "area": "east"}
    asked_for = _with_message("FLAG01.json", goal, [], [
        ("I need a guesthouse in the east with free parking .", {}, {}),
        ("Willow guest house is a guesthouse in the east .", _belief(hotel=(hotel, {})), {}),
    ])
    assert offline_result(asked_for, database).success  # graded with the user's turns, as episodes are
    asked_about = _with_message("FLAG02.json", goal, [], [
        ("A guesthouse in the east ? Do they have free parking ?", {}, {}),
        ("Willow guest house is a guesthouse in the east .", _belief(hotel=(hotel, {})), {}),
    ])
    assert not offline_result(asked_about, database).success


def test_spelling_variants_of_names_and_a_qualified_food():
    assert same_name("fenditton", "fen ditton") and same_name("christ college", "christ's college")
    assert same_name("churchills college", "churchill college")
    assert not same_name("clare hall", "clare college")
    assert values_match("food", "european", "modern european")
    assert not values_match("food", "modern european", "european")


def test_goal_inconsistent_same_day_as_another_booking(database):
    """The train should be "on the same day as the restaurant booking" (monday), but the
    goal's own train day is tuesday; the human booked the monday train."""
    goal = {"restaurant": {"info": {"name": "copper kettle bistro"}, "book": {"people": "2", "day": "monday", "time": "18:00"}},
            "train": {"info": {"departure": "cambridge", "destination": "ely", "day": "tuesday", "leaveAt": "09:00"}, "book": {"people": "2"}}}
    message = ["You are looking for a particular restaurant . Its name is called copper kettle bistro",
               "Once you find the restaurant you want to book a table for 2 people at 18:00 on monday",
               "You are also looking for a train . The train should leave after 09:00 and should be on the same day as the restaurant booking",
               "Once you find the train you want to make a booking for the same group of people"]
    booked_restaurant = ({"name": "copper kettle bistro"}, {"people": "2", "day": "monday", "time": "18:00",
                                                           "booked": [{"name": "the copper kettle bistro", "reference": "AB12CD34"}]})
    train = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:00"}
    dialogue = _with_message("INCONS01.json", goal, message, [
        ("The copper kettle bistro for 2 at 18:00 on monday .", {}, {}),
        ("Booked , reference AB12CD34 .", _belief(restaurant=booked_restaurant), {}),
        ("And a train to ely after 09:00 the same day , for 2 .", {}, {}),
        ("TR1001 leaves at 09:05 , booked , reference EF56GH78 .",
         _belief(restaurant=booked_restaurant, train=(train, {"people": "2", "booked": [{"trainID": "TR1001", "reference": "EF56GH78"}]})), {}),
    ])
    assert dialogue.goal.get("train").references == {"day": ("restaurant", "day")}
    assert goal_inconsistency(dialogue.goal, "train", "day")[:3] == ("tuesday", "restaurant", "monday")
    problems = [p for p in offline_result(dialogue, database).problems if p.slot == "day"]
    assert problems
    for problem in problems:
        cause = classify_problem(problem, dialogue, database)
        assert cause == "goal_inconsistent"
        assert "same as the restaurant day" in evidence(problem, cause, dialogue)["missing"]


def test_strict_a_train_offered_before_a_search_for_another_route_is_withdrawn(database):
    """"No, from ely to cambridge": the cambridge-ely train named before the new search is
    no longer the offer, and a time no train of the new route has offers none."""
    goal = {"train": {"info": {"departure": "ely", "destination": "cambridge", "day": "monday", "leaveAt": "10:00"}, "reqt": ["trainID"]}}
    dialogue = _with_message("WITHDRAWN01.json", goal, [], [
        ("A train to ely on monday after 10:00 ?", {}, {}),
        ("TR1002 leaves at 10:05 .", _belief(train=({"destination": "ely", "day": "monday", "leaveAt": "10:00"}, {})), {}),
        ("No , from ely to cambridge .", {}, {}),
        ("The only one leaves at 12:00 .", _belief(train=({"departure": "ely", "destination": "cambridge", "day": "monday", "leaveAt": "10:00"}, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.domain("train").offered is None
    assert [p.kind for p in result.problems][:1] == ["not_offered"]
