"""Ambiguity points: underspecification where the goal splits the candidates, referential
ambiguity where a phrase has several antecedents, and never plain slot filling."""

from __future__ import annotations

from pipelines.multiwoz.ontology import TIME_SLOTS, values_match
from pipelines.records import Dialogue, DomainGoal, Goal, frozen_dict
from pipelines.speaker.ambiguity import (
    REFERENTIAL,
    SEARCH,
    SLOT_FILLING,
    TAXI,
    UNDERSPECIFICATION,
    Booking,
    discriminating_values,
    find_ambiguity_points,
    referential_day_or_people,
    taxi_direction,
)


def _dialogue(*domains: DomainGoal) -> Dialogue:
    # No turns: the walk falls back on the goal's order, as for a source without belief states.
    return Dialogue("TEST.json", Goal("TEST.json", tuple(domains)), ())


def test_underspecification_points_are_real_splits_of_the_candidates(speaker_corpus, database):
    points = [p for d in speaker_corpus.dialogues for p in find_ambiguity_points(d, database)]
    under = [p for p in points if p.type == UNDERSPECIFICATION]
    assert under, "the corpus has search points"
    for point in under:
        goal = next(d for d in speaker_corpus.dialogues if d.dialogue_id == point.dialogue_id).goal.get(point.domain)
        candidates = database.search(point.domain, point.known)
        assert point.n_candidates == len(candidates) > 1
        for slot in point.slots:
            wanted = goal.info[slot]
            assert slot not in point.known and slot not in SLOT_FILLING.get(point.domain, ())
            assert any(not values_match(slot, wanted, e.get(slot)) for e in candidates), "the goal must rule some candidate out"
            assert any(values_match(slot, wanted, e.get(slot)) for e in candidates), "and keep some"
            if slot not in TIME_SLOTS:
                assert wanted in point.candidates[slot] and len(point.candidates[slot]) > 1
        # What the user states is part of the goal.
        assert all(values_match(s, goal.info[s], v) for s, v in point.known.items())


def test_slot_filling_is_never_ambiguity(database):
    train = database.entities("train")[0]
    goal = DomainGoal("train", frozen_dict({
        "departure": train.get("departure"), "destination": train.get("destination"), "day": train.get("day"), "leaveAt": "20:00",
    }))
    known = {"departure": train.get("departure"), "destination": train.get("destination")}
    split = discriminating_values("train", database.search("train", known), goal.info, known)
    assert set(split) == {"leaveAt"}, "the travel day is the request, not a preference to clarify"


def test_a_named_venue_or_a_fully_determined_request_has_no_search_point(database):
    venue = database.entities("restaurant")[0]
    named = _dialogue(DomainGoal("restaurant", frozen_dict({"name": venue.name})))
    assert find_ambiguity_points(named, database) == []
    assert discriminating_values("restaurant", [venue], {"area": venue.get("area")}, {}) == {}


def test_withheld_point_when_the_seed_said_everything_at_once(database):
    venue = database.entities("hotel")[0]
    goal = DomainGoal("hotel", frozen_dict({"area": venue.get("area"), "pricerange": venue.get("pricerange")}))
    (point,) = find_ambiguity_points(_dialogue(goal), database)
    assert (point.type, point.action, point.origin) == (UNDERSPECIFICATION, SEARCH, "withheld")
    assert len(point.known) < 2 and point.slots


def test_same_day_reference_is_ambiguous_only_between_different_days():
    earlier = [Booking("hotel", {"day": "monday", "people": "2"}), Booking("restaurant", {"day": "friday", "people": "2"})]
    slot, readings = referential_day_or_people({"day": "friday", "people": "2"}, earlier)
    assert slot == "day" and {r.label for r in readings} == {"the hotel booking", "the restaurant booking"}
    assert referential_day_or_people({"people": "2"}, earlier) is None, "both bookings agree on the party size"
    assert referential_day_or_people({"day": "sunday"}, earlier) is None, "no earlier booking is on that day"
    assert referential_day_or_people({"day": "monday"}, earlier[:1]) is None, "a single antecedent is no ambiguity"


def test_referential_points_in_a_goal(database):
    hotel, restaurant = database.entities("hotel")[0], database.entities("restaurant")[0]
    train = database.entities("train")[0]
    dialogue = _dialogue(
        DomainGoal("hotel", frozen_dict({"name": hotel.name}), book=frozen_dict({"people": "2", "day": "monday", "stay": "2"})),
        DomainGoal("restaurant", frozen_dict({"name": restaurant.name}), book=frozen_dict({"people": "4", "day": "friday", "time": "19:00"})),
        DomainGoal("train", frozen_dict({
            "departure": train.get("departure"), "destination": train.get("destination"), "day": "monday", "leaveAt": "08:00",
        }), book=frozen_dict({"people": "4"})),
        DomainGoal("taxi", frozen_dict({"departure": restaurant.name, "destination": hotel.name, "leaveAt": "22:00"})),
    )
    points = {(p.domain, p.action, p.type): p for p in find_ambiguity_points(dialogue, database)}
    day = points[("train", SEARCH, REFERENTIAL)]
    assert day.slots == ("day",) and day.goal_values == {"day": "monday"} and set(day.candidates["day"]) == {"monday", "friday"}
    people = points[("train", "book", REFERENTIAL)]
    assert people.goal_values == {"people": "4"} and people.n_candidates == 2
    taxi = points[("taxi", TAXI, REFERENTIAL)]
    assert taxi.slots == ("departure", "destination") and len(taxi.antecedents) == 2
    assert taxi.antecedents[0].values == {"departure": hotel.name, "destination": restaurant.name}, "order of mention"


def test_taxi_direction_needs_both_ends_discussed():
    venues = [("hotel", "the gonville hotel"), ("restaurant", "pizza hut")]
    assert taxi_direction({"departure": "pizza hut", "destination": "gonville hotel"}, venues) is not None
    assert taxi_direction({"departure": "pizza hut", "destination": "kings college"}, venues) is None
