"""The agenda simulator, turn by turn, against a small hand-made database (conftest.ENTITIES)."""

from __future__ import annotations

import statistics

import pytest

from pipelines.errors import ConfigError
from pipelines.simulators import END_CONVERSATION, SimulatorSpec, AgendaSimulator, UserTurn

from .conftest import domain_goal, make_goal, run

RESTAURANT = domain_goal("restaurant", {"food": "indian", "pricerange": "moderate", "area": "north"}, reqt=("phone",))
HOTEL = domain_goal("hotel", {"type": "guesthouse", "area": "north", "stars": "4", "parking": "yes", "internet": "yes"},
                    book={"people": "2", "day": "friday", "stay": "3"})
TRAIN = domain_goal("train", {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "06:30"},
                    book={"people": "2"})
TAXI = domain_goal("taxi", {"departure": "the golden curry", "destination": "king's college", "leaveAt": "17:15"},
                   reqt=("car type", "phone"))
BOOKED_RESTAURANT = domain_goal("restaurant", {"food": "indian", "area": "north"}, book={"people": "3", "day": "sunday", "time": "19:30"})


def new_session(db, *domains, seed=0, config=SimulatorSpec(), message=()):
    return AgendaSimulator(db, config).session(make_goal(*domains, message=message), seed)


def say(session, text: str) -> UserTurn:
    return run(session.respond(text))


def informs(turn: UserTurn) -> dict[str, str]:
    return {act.slot: act.value for act in turn.acts if act.intent == "inform"}


def requests(turn: UserTurn) -> set[str]:
    return {act.slot for act in turn.acts if act.intent == "request"}


def accepted(turn: UserTurn) -> str | None:
    return informs(turn).get("Name") or informs(turn).get("Id")


# -- opening ---------------------------------------------------------------------------------


def test_opening_states_the_first_domain_and_one_or_two_of_its_constraints(tiny_db):
    act_to_slot = {"Food": "food", "Price": "pricerange", "Area": "area"}
    sizes = set()
    for seed in range(20):
        turn = run(new_session(tiny_db, RESTAURANT, HOTEL, seed=seed).opening())
        stated = informs(turn)
        assert not turn.end
        assert {act.domain for act in turn.acts if act.intent == "inform"} == {"restaurant"}
        assert 1 <= len(stated) <= 2
        for code, value in stated.items():
            assert RESTAURANT.info[act_to_slot[code]] == value
            assert value in turn.text
        assert "restaurant" in turn.text.lower()
        sizes.add(len(stated))
    assert sizes == {1, 2}, "the number of constraints in the opening should vary with the seed"


def test_the_first_domain_is_the_one_the_goal_message_introduces_first(tiny_db):
    # The official data lists goal domains alphabetically; the message says the order.
    message = ("You are looking for a <span class='emphasis'>place to stay</span>.",
               "You are also looking for a <span class='emphasis'>restaurant</span>. Use the constraints above.")
    turn = run(new_session(tiny_db, RESTAURANT, HOTEL, message=message).opening())
    assert {act.domain for act in turn.acts if act.intent == "inform"} == {"hotel"}


# -- clarification questions -----------------------------------------------------------------


@pytest.mark.parametrize(
    "goal, question, slot, value",
    [
        (RESTAURANT, "Sure. What price range are you looking for?", "Price", "moderate"),
        (RESTAURANT, "Which part of town would you like to eat in?", "Area", "north"),
        (RESTAURANT, "What type of cuisine would you like?", "Food", "indian"),
        (HOTEL, "How many stars should it have?", "Stars", "4"),
        (HOTEL, "Do you need free parking?", "Parking", "yes"),
        (HOTEL, "Will you need wifi?", "Internet", "yes"),
        (HOTEL, "Would you prefer a hotel or a guesthouse?", "Type", "guesthouse"),
        (HOTEL, "How many people will be staying?", "People", "2"),
        (HOTEL, "How many nights?", "Stay", "3"),
        (HOTEL, "What day will you arrive?", "Day", "friday"),
        (TRAIN, "What day will you be travelling?", "Day", "monday"),
        (TRAIN, "Where will you be departing from?", "Depart", "cambridge"),
        (TRAIN, "Where are you heading to?", "Dest", "london kings cross"),
        (TRAIN, "What time would you like to leave?", "Leave", "06:30"),
        (TAXI, "What time do you want to be picked up?", "Leave", "17:15"),
        (TAXI, "Where should the taxi take you?", "Dest", "king's college"),
        (BOOKED_RESTAURANT, "For what time would you like the table?", "Time", "19:30"),
    ],
)
def test_a_question_about_a_goal_slot_is_answered_with_the_goals_value(tiny_db, goal, question, slot, value):
    session = new_session(tiny_db, goal)
    run(session.opening())
    turn = say(session, question)
    assert informs(turn).get(slot) == value, turn
    if value not in ("yes", "no"):  # flags are said in words: "with free parking"
        assert value in turn.text


def test_questions_about_slots_the_goal_is_silent_on_get_no_preference(tiny_db):
    goal = domain_goal("restaurant", {"food": "indian", "area": "north"})
    session = new_session(tiny_db, goal)
    run(session.opening())
    turn = say(session, "Do you have a price range in mind?")
    assert informs(turn) == {"Price": "dontcare"}
    assert "price range" in turn.text.lower()
    turn = say(session, "Any particular restaurant you'd like?")
    assert informs(turn) == {"Name": "dontcare"}
    # Several slots at once: the known ones answered, the unknown one waved through.
    turn = say(session, "What area and price range would you like?")
    assert informs(turn) == {"Area": "north", "Price": "dontcare"}


@pytest.mark.parametrize(
    "area, expected, present, absent",
    [
        ("north", "north", "north", "centre"),  # one of the candidates
        ("east", "east", "east", None),  # neither: the user says what it wants instead
        (None, "dontcare", None, None),  # silent: either is fine
    ],
)
def test_candidate_questions_are_answered_from_the_goal(tiny_db, area, expected, present, absent):
    info = {"food": "indian", **({"area": area} if area else {})}
    session = new_session(tiny_db, domain_goal("restaurant", info))
    run(session.opening())
    turn = say(session, "I have several indian places. Would you prefer the north or the centre?")
    assert informs(turn).get("Area") == expected, turn
    if present:
        assert present in turn.text
    if absent:
        assert absent not in turn.text


def test_a_lone_candidate_counts_as_a_question_about_its_slot(tiny_db):
    session = new_session(tiny_db, domain_goal("restaurant", {"food": "indian", "area": "north"}))
    run(session.opening())
    assert informs(say(session, "Are you looking for something in the centre?")).get("Area") == "north"
    silent = new_session(tiny_db, domain_goal("hotel", {"area": "north"}))
    run(silent.opening())
    assert informs(say(silent, "Would you like a hotel or a guesthouse?")).get("Type") == "dontcare"


# -- offers --------------------------------------------------------------------------------------


def test_an_offer_breaking_unstated_constraints_reveals_them_and_is_not_accepted(tiny_db):
    goal = domain_goal("hotel", {"area": "north", "parking": "yes", "pricerange": "moderate"})
    session = new_session(tiny_db, goal, seed=3)
    opening = run(session.opening())
    turn = say(session, "How about alexander bed and breakfast? It's a cheap guesthouse in the centre.")
    assert accepted(turn) is None
    # Every violated constraint is said: the unstated ones revealed, the stated ones repeated.
    assert informs(turn) == {"Area": "north", "Parking": "yes", "Price": "moderate"}
    assert set(informs(opening)) < set(informs(turn))
    turn = say(session, "Then I recommend acorn guest house in the north.")
    assert accepted(turn) == "acorn guest house"


def test_an_offer_of_another_venue_than_the_named_one_is_corrected(tiny_db):
    session = new_session(tiny_db, domain_goal("restaurant", {"name": "the nirala"}, reqt=("postcode",)))
    run(session.opening())
    turn = say(session, "Curry prince is a lovely indian place in the east.")
    assert informs(turn) == {"Name": "the nirala"} and "curry prince" not in turn.text.lower()
    turn = say(session, "Sorry! The Nirala is a moderate indian restaurant in the north.")
    assert accepted(turn) == "the nirala" and requests(turn) == {"Post"}


def test_a_train_is_checked_against_the_timetable(tiny_db):
    session = new_session(tiny_db, TRAIN)
    run(session.opening())
    turn = say(session, "TR0001 leaves cambridge at 05:00 and arrives in london kings cross at 05:51.")
    assert accepted(turn) is None and informs(turn).get("Leave") == "06:30"
    turn = say(session, "TR0002 leaves cambridge at 07:00 and arrives at 07:51. Shall I book it?")
    assert accepted(turn) == "TR0002" and informs(turn).get("People") == "2"
    assert say(session, "Booked! Your reference number is 8ABCDEF1.").end


# -- fail_info / fail_book -----------------------------------------------------------------------


def test_fail_info_is_asked_first_and_info_after_the_agent_finds_no_match(tiny_db):
    goal = domain_goal("restaurant", {"food": "italian", "area": "south"}, fail_info={"food": "italian", "area": "north"},
                       reqt=("phone",))
    session = new_session(tiny_db, goal)
    run(session.opening())
    assert informs(say(session, "Which area would you like?")) == {"Area": "north"}
    turn = say(session, "I'm sorry, there are no italian restaurants in the north.")
    assert informs(turn) == {"Area": "south"}
    turn = say(session, "Pizza hut is a moderately priced italian place in the south.")
    assert accepted(turn) == "pizza hut" and requests(turn) == {"Phone"}
    assert say(session, "Its phone number is 01223 330006.").end


def test_fail_info_switch_releases_constraints_the_final_goal_does_not_have(tiny_db):
    goal = domain_goal("attraction", {"type": "college"}, fail_info={"type": "college", "area": "east"})
    session = new_session(tiny_db, goal, seed=1)
    opening = run(session.opening())
    assert informs(opening) == {"Type": "college", "Area": "east"}
    turn = say(session, "Unfortunately there is nothing like that in the east.")
    assert informs(turn) == {"Area": "dontcare"}


def test_fail_book_is_tried_first_and_book_after_the_booking_fails(tiny_db):
    goal = domain_goal("restaurant", {"name": "the golden curry"}, book={"people": "2", "day": "friday", "time": "19:00"},
                       fail_book={"time": "20:00"})
    session = new_session(tiny_db, goal)
    run(session.opening())
    turn = say(session, "The golden curry is an expensive indian restaurant in the centre. Shall I book a table?")
    assert accepted(turn) == "the golden curry"
    assert informs(turn) == {"Name": "the golden curry", "People": "2", "Day": "friday", "Time": "20:00"}
    turn = say(session, "I'm sorry, the booking was unsuccessful: there is no availability at 20:00.")
    assert informs(turn) == {"Time": "19:00"} and not turn.end
    turn = say(session, "Done! Your reference number is K4TR9QZ2.")
    assert turn.end


def test_a_reference_counts_only_after_a_booking_request_or_when_called_one(tiny_db):
    goal = domain_goal("restaurant", {"name": "the golden curry"}, book={"people": "2", "day": "friday", "time": "19:00"})
    session = new_session(tiny_db, goal)
    run(session.opening())
    turn = say(session, "The golden curry is in the centre. ZX12AB34")
    assert not turn.end and informs(turn).get("Time") == "19:00"  # still asks for the booking
    assert say(session, "All set, ZX12AB34.").end


# -- requested attributes and the end ------------------------------------------------------------


def test_requested_attributes_are_asked_for_until_given(tiny_db):
    goal = domain_goal("hotel", {"type": "guesthouse", "area": "north"}, reqt=("phone", "postcode"))
    session = new_session(tiny_db, goal)
    run(session.opening())
    turn = say(session, "Acorn guest house is a 4 star guesthouse in the north.")
    assert accepted(turn) == "acorn guest house" and requests(turn) == {"Phone", "Post"}
    turn = say(session, "The phone number is 01223330011.")
    assert requests(turn) == {"Post"} and not turn.end
    turn = say(session, "Wrong hotel, sorry: the postcode of the lensfield hotel is cb129zz.")
    assert requests(turn) == {"Post"} and not turn.end
    turn = say(session, "The postcode is CB11 9ZZ.")
    assert turn.end


def test_the_user_ends_only_when_every_sub_goal_is_done(tiny_db):
    restaurant = domain_goal("restaurant", {"name": "the golden curry"}, reqt=("postcode",))
    attraction = domain_goal("attraction", {"type": "college"}, reqt=("entrance fee",))
    session = new_session(tiny_db, restaurant, attraction, TAXI)
    run(session.opening())
    script = [
        ("The golden curry serves indian food in the centre.", {"Post"}),
        ("Its postcode is cb19zz.", set()),  # restaurant done: the attraction comes up
        ("King's college is in the centre.", {"Fee"}),
        ("Admission is free.", set()),  # attraction done: the taxi comes up
        ("When would you like to leave?", set()),
    ]
    for agent, expected_requests in script:
        turn = say(session, agent)
        assert not turn.end, (agent, turn)
        assert requests(turn) == expected_requests, (agent, turn)
    turn = say(session, "Your taxi is booked: a black toyota. The driver will call from 07123456789 if needed.")
    assert turn.end and session.done
    assert END_CONVERSATION not in turn.text and turn.text
    assert [act.act for act in turn.acts][-1] == "general-bye"
    assert say(session, "Anything else?").end  # an ended user stays ended


def test_the_user_gives_up_after_repeated_agent_failure(tiny_db):
    session = new_session(tiny_db, domain_goal("attraction", {"type": "college"}))
    run(session.opening())
    turns = [say(session, "Sorry, could you repeat that?") for _ in range(4)]
    assert [t.end for t in turns] == [False, False, False, True]
    assert not session.done

    patient = new_session(tiny_db, domain_goal("attraction", {"type": "college"}), config=SimulatorSpec(max_stalled_turns=2))
    run(patient.opening())
    assert [say(patient, "Hmm.").end for _ in range(2)] == [False, True]


def test_progress_resets_the_count_of_failed_turns(tiny_db):
    session = new_session(tiny_db, domain_goal("restaurant", {"food": "indian", "area": "north"}, reqt=("phone", "postcode")),
                          config=SimulatorSpec(max_stalled_turns=2))
    run(session.opening())
    assert not say(session, "Hmm.").end  # at most the first turn without progress
    assert not say(session, "The nirala is in the north.").end  # progress: an offer
    assert not say(session, "Hmm.").end  # stalled once
    assert not say(session, "The phone is 01223330003.").end  # progress: an attribute
    assert not say(session, "Hmm.").end  # stalled once
    assert say(session, "Hmm.").end  # twice in a row


# -- determinism, forks, phrasing ---------------------------------------------------------------

SCRIPT = (
    "What area would you like?",
    "Do you have a price range in mind?",
    "The nirala is a moderate indian restaurant in the north.",
    "The phone number is 01223330003.",
)


def transcript(session) -> list[tuple[str, tuple, bool]]:
    turns = [run(session.opening())] + [say(session, text) for text in SCRIPT]
    return [(t.text, t.acts, t.end) for t in turns]


def test_sessions_are_deterministic_for_a_seed_and_vary_across_seeds(tiny_db):
    simulator = AgendaSimulator(tiny_db)
    goal = make_goal(RESTAURANT)
    first = transcript(simulator.session(goal, seed=11))
    assert first == transcript(simulator.session(goal, seed=11))
    assert first[-1][2], "the script completes the goal"
    others = {tuple(text for text, _, _ in transcript(simulator.session(goal, seed=s))) for s in range(8)}
    assert len(others) >= 6, "phrasing should differ between seeds"


def test_a_fork_is_independent_of_its_parent(tiny_db):
    simulator = AgendaSimulator(tiny_db)
    goal = make_goal(RESTAURANT)
    parent = simulator.session(goal, seed=4)
    run(parent.opening())
    say(parent, SCRIPT[0])
    child = parent.fork()
    assert say(child, "The nirala is a moderate indian restaurant in the north.").acts  # the child accepts an offer
    say(child, "The phone number is 01223330003.")
    assert child.done and not parent.done
    # The parent goes on exactly as a session that never forked.
    twin = simulator.session(goal, seed=4)
    run(twin.opening())
    say(twin, SCRIPT[0])
    for text in SCRIPT[1:]:
        assert say(parent, text) == say(twin, text)


def test_noise_never_touches_values(tiny_db):
    simulator = AgendaSimulator(tiny_db, SimulatorSpec(verbosity="verbose", noise=1.0))
    goal = make_goal(BOOKED_RESTAURANT)
    agent = ("What price range?", "The nirala is in the north. Shall I book it?", "Booked, reference number 1234ABCD.")
    changed = 0
    for seed in range(30):
        session = simulator.session(goal, seed=seed)
        turns = [run(session.opening())] + [say(session, text) for text in agent]
        clean = AgendaSimulator(tiny_db, SimulatorSpec(verbosity="verbose")).session(goal, seed=seed)
        changed += run(clean.opening()).text != turns[0].text
        for turn in turns:
            for act in turn.acts:
                if act.intent == "inform" and act.value not in ("dontcare", "yes", "no", "none"):
                    assert act.value in turn.text, (act, turn.text)
    assert changed >= 10, "noise 1.0 should change most openings"


def test_verbosity_changes_how_much_is_said(tiny_db):
    def mean_length(verbosity: str) -> float:
        simulator = AgendaSimulator(tiny_db, SimulatorSpec(verbosity=verbosity))
        lengths = [len(" ".join(text for text, _, _ in transcript(simulator.session(make_goal(RESTAURANT), seed=s))))
                   for s in range(10)]
        return statistics.mean(lengths)

    assert mean_length("terse") < mean_length("normal") < mean_length("verbose")


@pytest.mark.parametrize("fields", [{"verbosity": "chatty"}, {"noise": 1.5}, {"noise": -0.1}, {"max_stalled_turns": 0},
                                    {"max_stalled_turns": True}])
def test_bad_agenda_configuration_is_rejected(fields):
    with pytest.raises(ConfigError):
        SimulatorSpec(**fields)


@pytest.mark.parametrize("time_slot", ["leaveAt", "arriveBy"])
def test_the_taxi_questions_speaker_teaches_are_answered_by_the_agenda_user(tiny_db, time_slot):
    # SpeakER's slot-filling questions (pipelines.speaker.phrasing.taxi_slot_question) are what
    # a trained agent asks the evaluation's user: each must get the goal's value back.
    import random

    from pipelines.speaker.phrasing import taxi_slot_question

    values = {"departure": "the golden curry", "destination": "king's college", time_slot: "17:15"}
    acts = {"departure": "Depart", "destination": "Dest", "leaveAt": "Leave", "arriveBy": "Arrive"}
    asked = 0
    for seed in range(12):
        session = new_session(tiny_db, domain_goal("taxi", values), seed=seed)
        opening = run(session.opening())
        missing = [s for s in values if acts[s] not in informs(opening)]
        _, question = taxi_slot_question(random.Random(seed), ["time" if s == time_slot else s for s in missing])
        answer = informs(say(session, question))
        assert {s: answer.get(acts[s]) for s in missing} == {s: values[s] for s in missing}, (opening.text, question, answer)
        asked += 1
    assert asked == 12
