"""What the rule-based user reads out of agent utterances, and how goals are shown to users."""

from __future__ import annotations

import pytest

from pipelines.simulators.goals import goal_instructions, pursuit_order, render_goal, strip_markup
from pipelines.simulators.understanding import AgentReader, read

from .conftest import domain_goal, make_goal


@pytest.fixture(scope="module")
def reader(tiny_db) -> AgentReader:
    return AgentReader(tiny_db)


@pytest.mark.parametrize(
    "domain, text, expected",
    [
        ("restaurant", "Great choice. What price range and area do you prefer?", {"pricerange": (), "area": ()}),
        ("restaurant", "Would you like the north or the centre?", {"area": ("north", "centre")}),
        ("restaurant", "I can do italian or indian food, which one?", {"food": ("italian", "indian")}),
        ("restaurant", "Should it be in the city center?", {"area": ("centre",)}),
        ("hotel", "Do you want 3 or 4 stars?", {"stars": ("3", "4")}),
        ("hotel", "Would you prefer a guest house or a hotel?", {"type": ("guesthouse", "hotel")}),
        ("hotel", "When are you checking in, and for how many nights?", {"day": (), "stay": ()}),
        ("train", "Where are you leaving from and when do you want to arrive?", {"departure": (), "arriveBy": ()}),
        ("train", "When would you like to travel?", {"leaveAt": (), "arriveBy": ()}),
        ("taxi", "Where will the taxi pick you up?", {"departure": ()}),
        # Not questions about slots: a statement, and an offer that happens to be a question.
        ("restaurant", "There are 3 cheap restaurants in the north.", {}),
        ("restaurant", "How about the nirala, a moderate indian place in the north?", {}),
    ],
)
def test_questions_about_slots_and_their_candidate_values(reader, domain, text, expected):
    assert reader.asked(read(text), domain) == expected


@pytest.mark.parametrize(
    "text, no_offer, no_book",
    [
        ("I'm sorry, there are no restaurants matching that.", True, False),
        ("Unfortunately I couldn't find anything like that.", True, False),
        ("There are no trains at that time.", True, False),
        ("I'm afraid the booking was unsuccessful.", False, True),
        ("Sorry, the hotel is fully booked on friday.", False, True),
        ("That table is not available at 19:00.", False, True),
        ("I found 3 matching restaurants.", False, False),
        ("Booking was successful.", False, False),
    ],
)
def test_failures_the_agent_reports(text, no_offer, no_book):
    reading = read(text)
    assert (reading.no_offer, reading.no_book) == (no_offer, no_book)


def test_references_train_ids_and_phone_numbers():
    reading = read("Booked TR1234 for you. Your reference number is : 1D67HNZO. Call 01223 351 880 with questions.")
    assert reading.references == ("1D67HNZO",)
    assert reading.train_ids == ("TR1234",)
    assert reading.phones == ("01223351880",)
    assert read("Your reference is ab12cd34.").references == ("AB12CD34",)
    # A word after "reference" is not a reference.
    assert read("The reference number is provided below.").references == ()
    assert read("All done.").says_reference is False


def test_named_entities_prefer_the_longest_name_and_skip_generic_words(reader):
    assert [e.name for e in reader.named(read("Try Pizza Hut City Centre."), "restaurant")] == ["pizza hut city centre"]
    assert [e.name for e in reader.named(read("Pizza hut or the Nirala?"), "restaurant")] == ["pizza hut", "the nirala"]
    assert [e.name for e in reader.named(read("Golden curry is nice."), "restaurant")] == ["the golden curry"]
    # "The place" is a nightclub; "a place to go" is not it.
    assert reader.named(read("Is there a place to go dancing?"), "attraction") == []
    assert [e.name for e in reader.named(read("The Place is a nightclub."), "attraction")] == ["the place"]
    trains = reader.named(read("TR0003 it is."), "train")
    assert {t.get("day") for t in trains} == {"monday", "tuesday"}  # ids repeat across days


def test_an_attribute_counts_as_given_when_its_value_is_said(reader):
    assert reader.gives(read("The postcode is CB2 1TN."), "postcode", "cb21tn")
    assert reader.gives(read("Call 01223 351880."), "phone", "01223351880")
    assert reader.gives(read("It takes 51 minutes."), "duration", "51 minutes")
    assert reader.gives(read("Tickets are 23.60 GBP."), "price", "23.60 pounds")
    assert reader.gives(read("It arrives at 7:51."), "arriveBy", "07:51")
    assert reader.gives(read("Yes, they have free wifi."), "internet", "yes")
    assert reader.gives(read("I don't know its entrance fee."), "entrance fee", "?")
    assert reader.gives(read("It is a guest house."), "type", "guesthouse")
    assert not reader.gives(read("The postcode is cb21tx."), "postcode", "cb21tn")
    assert not reader.gives(read("It arrives at 8:51."), "arriveBy", "07:51")


def test_taxi_details(reader):
    details = reader.taxi_details(read("A grey Skoda is booked, contact number 07123 456789."))
    assert details == {"car type": "grey skoda", "phone": "07123456789"}
    assert reader.taxi_details(read("What time do you want to leave?")) == {}


# -- goals -----------------------------------------------------------------------------------


def test_goal_messages_lose_their_markup():
    assert strip_markup("Its name is <span class='emphasis'>kettle&#x27;s yard</span> ") == "Its name is kettle's yard"
    goal = make_goal(domain_goal("hotel", {"area": "north"}), message=("You want a <span class='emphasis'>hotel</span>", " "))
    assert goal_instructions(goal) == ("You want a hotel",)


def test_goals_without_a_message_are_rendered_from_their_fields():
    goal = make_goal(
        domain_goal("restaurant", {"food": "italian", "area": "north"}, fail_info={"food": "indian", "area": "north"},
                    book={"people": "2", "day": "friday", "time": "19:00"}, fail_book={"time": "20:00"}, reqt=("phone",)),
        domain_goal("taxi", {"departure": "the nirala", "destination": "abbey pool", "arriveBy": "18:00"}, reqt=("car type",)),
    )
    text = " ".join(render_goal(goal))
    assert goal_instructions(goal) == render_goal(goal)
    for expected in ("a restaurant serving italian food in the north", "Start by asking for a restaurant serving indian food in the north",
                     "for 2 people on friday at 19:00", "Try booking at 20:00 first", "reference number", "phone number",
                     "You are also looking for a taxi from the nirala to abbey pool arriving by 18:00", "car type"):
        assert expected in text, expected


def test_pursuit_order_follows_the_message_with_whole_words():
    train = domain_goal("train", {"day": "monday"})
    restaurant = domain_goal("restaurant", {"food": "indian"})
    hotel = domain_goal("hotel", {"area": "north"})
    message = ("You are looking for a restaurant. If there is none, use the constraints above",  # "constraints" is no train
               "You are also looking for a place to stay.", "You also need a train.")
    order = pursuit_order(make_goal(train, hotel, restaurant, message=message))
    assert [d.domain for d in order] == ["restaurant", "hotel", "train"]
    assert [d.domain for d in pursuit_order(make_goal(train, hotel))] == ["train", "hotel"]  # no message: goal order
