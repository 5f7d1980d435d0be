"""Gold replay of real MultiWOZ dialogues: one hand-written dialogue per cause of
disagreement (real data.json layout, invented venues and values), so that each fix stays
fixed, and the full check on the 999 real validation dialogues when they are present."""

from __future__ import annotations


import pytest

from pipelines.env.checker import Reason, check_goal
from pipelines.env.replay import gold_tool_calls, replay
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.episodes import EpisodeSpec, ReplayAgent, get_format, run_episodes_sync
from pipelines.episodes.causes import CAUSES, classify, classify_problem, offline_result
from pipelines.multiwoz.ontology import norm_value
from pipelines.multiwoz.parse import parse_database, parse_dialogue
from pipelines.simulators.agenda import AgendaSimulator
from pipelines.simulators.goals import pursuit_order, reference_order
from tests.conftest import REAL_VAL_DIR

# -- an invented database in the official layout ---------------------------------------

_RAW_DB = {
    "restaurant": [
        {"id": "1", "name": "the copper kettle bistro", "food": "british", "pricerange": "moderate", "area": "centre",
         "address": "12 saint mary's lane", "phone": "01223000111", "postcode": "cb21aa"},
        {"id": "2", "name": "lotus garden", "food": "chinese", "pricerange": "cheap", "area": "north",
         "address": "3 fen road", "phone": "01223000222", "postcode": "cb43bb"},
    ],
    "hotel": [
        {"id": "1", "name": "willow guest house", "type": "guesthouse", "pricerange": "moderate", "area": "east", "internet": "yes",
         "parking": "yes", "stars": "4", "address": "8 mill road", "phone": "01223000333", "postcode": "cb13cc"},
    ],
    "attraction": [
        {"id": "1", "name": "riverside lido", "type": "swimmingpool", "area": "north", "entrance fee": "?",
         "address": "1 lido walk", "phone": "01223000444", "postcode": "cb43dd"},
        {"id": "2", "name": "meadow pool", "type": "swimmingpool", "area": "north", "entrance fee": "free",
         "address": "22 meadow lane", "phone": "01223000555", "postcode": "cb43ee"},
        {"id": "3", "name": "old gaol museum", "type": "museum", "area": "centre", "entrance fee": "free",
         "address": "5 castle street", "phone": "01223000666", "postcode": "cb30ff"},
    ],
    "train": [
        {"trainID": "TR1001", "day": "monday", "departure": "cambridge", "destination": "ely", "leaveAt": "09:05",
         "arriveBy": "09:22", "duration": "17 minutes", "price": "4.40 pounds"},
        {"trainID": "TR1001", "day": "monday", "departure": "ely", "destination": "cambridge", "leaveAt": "11:05",
         "arriveBy": "11:22", "duration": "17 minutes", "price": "4.40 pounds"},
        {"trainID": "TR1002", "day": "monday", "departure": "cambridge", "destination": "ely", "leaveAt": "10:05",
         "arriveBy": "10:22", "duration": "17 minutes", "price": "10.10 pounds"},
    ],
}


@pytest.fixture(scope="module")
def database() -> Database:
    entities = {domain: parse_database(domain, records, f"{domain}_db.json")[0] for domain, records in _RAW_DB.items()}
    _, taxi = parse_database("taxi", [{"taxi_colors": ["red"], "taxi_types": ["skoda"], "taxi_phone": ["^07\\d{9}$"]}], "taxi_db.json")
    return Database(entities, taxi)


# -- dialogues in the data.json layout -----------------------------------------------------


def _belief(**domains) -> dict:
    """A system turn's ``metadata``: {domain: (semi, book)} for the domains given."""
    return {domain: {"semi": dict(semi), "book": {"booked": [], **book}} for domain, (semi, book) in domains.items()}


def _dialogue(dialogue_id: str, goal: dict, turns: list[tuple[str, dict, dict]]):
    """``turns``: (text, metadata, dialog_act) per turn, user and system alternating; a user
    turn's metadata is ``{}`` as in the release."""
    log = [{"text": text, "metadata": metadata, "dialog_act": acts} for text, metadata, acts in turns]
    return parse_dialogue(dialogue_id, {"goal": {**goal, "message": []}, "log": log}, "data.json", "val")


def _grade(dialogue, database):
    result = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    return check_goal(dialogue.goal, result.state, result.system_texts, None)


def _attraction_by_name(system_text: str):
    goal = {"attraction": {"info": {"name": "riverside lido"}, "reqt": ["phone", "address"]}}
    semi = {"name": "riverside lido", "type": "", "area": ""}
    return _dialogue("NAMED01.json", goal, [
        ("What is the phone number and address of riverside lido ?", {}, {}),
        (system_text, _belief(attraction=(semi, {})), {"Attraction-Inform": [["Phone", "01223000444"]]}),
    ])


# -- one test per cause ----------------------------------------------------------------------


def test_value_normalisation_real_spellings_of_database_values(database):
    """MultiWOZ's tokenised texts split possessives, say "moderately priced" and "10.1 GBP"."""
    assert norm_value("saint mary 's lane") == norm_value("saint mary's lane") == "saint marys lane"
    goal = {"restaurant": {"info": {"food": "british", "area": "centre"}, "reqt": ["address", "pricerange"]},
            "train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}, "reqt": ["price"]}}
    restaurant = {"food": "british", "area": "centre", "pricerange": "", "name": ""}
    train = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00", "arriveBy": ""}
    dialogue = _dialogue("VALUE01.json", goal, [
        ("A british place in the centre ?", {}, {}),
        ("The Copper Kettle Bistro is moderately priced , on saint mary 's lane .", _belief(restaurant=(restaurant, {})), {}),
        ("And a train to ely on monday after 10:00 , how much ?", {}, {}),
        ("TR1002 leaves at 10:05 , the fare is 10.1 GBP .", _belief(restaurant=(restaurant, {}), train=(train, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons


def test_value_normalisation_a_name_followed_by_its_possessive(database):
    """"Lotus Garden 's number" names lotus garden, although "king 's" reads as "kings"."""
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["phone"]}}
    semi = {"food": "chinese", "area": "north", "name": "", "pricerange": ""}
    dialogue = _dialogue("VALUE02.json", goal, [
        ("A chinese place in the north ?", {}, {}),
        ("Lotus Garden 's number is 01223 000222 .", _belief(restaurant=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("restaurant").offered == "lotus garden"


def test_booking_semantics_venue_named_with_a_generic_word_and_reused_train_ids(database):
    """A belief's "copper kettle bistro restaurant" is the database's "the copper kettle
    bistro"; TR1001 runs both ways on Monday and the belief's route picks the train."""
    goal = {"restaurant": {"info": {"name": "copper kettle bistro"}, "book": {"people": "2", "day": "monday", "time": "18:00"}},
            "train": {"info": {"departure": "ely", "destination": "cambridge", "day": "monday", "leaveAt": "11:00"},
                      "book": {"people": "2"}}}
    booked_restaurant = ({"name": "copper kettle bistro restaurant"},
                         {"people": "2", "day": "monday", "time": "18:00", "booked": [{"name": "copper kettle bistro restaurant", "reference": "AB12CD34"}]})
    train_semi = {"departure": "ely", "destination": "cambridge", "day": "monday", "leaveAt": "11:00"}
    booked_train = (train_semi, {"people": "2", "booked": [{"trainID": "TR1001", "reference": "EF56GH78"}]})
    dialogue = _dialogue("BOOK01.json", goal, [
        ("Book the copper kettle bistro for 2 at 18:00 on monday .", {}, {}),
        ("Done , the reference is AB12CD34 .", _belief(restaurant=booked_restaurant), {}),
        ("I also need a train from ely to cambridge on monday after 11:00 for 2 .", {}, {}),
        ("TR1001 is booked , reference EF56GH78 .", _belief(restaurant=booked_restaurant, train=booked_train), {}),
    ])
    calls = gold_tool_calls(dialogue)
    ticket = next(call for _, call in calls if call.name == "buy_train_ticket")
    assert ticket.arguments["departure"] == "ely"
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    state = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0)).state
    assert state.successful_bookings("train")[0].entity.get("departure") == "ely"


def test_requested_attributes_of_a_venue_looked_up_by_name_but_never_named_again(database):
    """Asked about a venue by name, a real system answers with its number and address alone."""
    dialogue = _attraction_by_name("Their number is 01223000444 and they are at 1 lido walk .")
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("attraction").offered == "riverside lido"


def test_multi_entity_offer_is_the_venue_whose_details_follow(database):
    """Two venues offered together; the postcode the system then gives says which one it is."""
    goal = {"attraction": {"info": {"type": "swimmingpool", "area": "north"}, "reqt": ["postcode"]}}
    semi = {"type": "swimmingpool", "area": "north", "name": ""}
    dialogue = _dialogue("MULTI01.json", goal, [
        ("A swimming pool in the north ?", {}, {}),
        ("There is riverside lido and meadow pool .", _belief(attraction=(semi, {})), {}),
        ("Good , what is the postcode ?", {}, {}),
        ("It is cb43ee .", _belief(attraction=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("attraction").offered == "meadow pool"


def test_train_offered_by_its_departure_time(database):
    """"I have a train leaving at 10:05" offers the shown train that leaves then."""
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}, "reqt": ["duration"]}}
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}
    dialogue = _dialogue("TIME01.json", goal, [
        ("A train to ely on monday after 09:30 ?", {}, {}),
        ("I have a train leaving at 10:05 , it takes 17 minutes .", _belief(train=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("train").offered == "TR1002"


def test_cross_domain_reference_and_db_mismatch_are_classified(database):
    dialogue = _attraction_by_name("Their number is 01223000444 .")
    wrong_place = Reason("taxi_value", "taxi", "taxi booked with destination lotus palace, the goal wants riverside lido",
                         "destination", "riverside lido", "lotus palace")
    assert classify_problem(wrong_place, dialogue, database) == "cross_domain_refs"
    twelve_hours = Reason("booked_info_mismatch", "train", "booked TR1002 has leaveAt 15:30, the goal wants 03:30", "leaveAt", "03:30", "15:30")
    assert classify_problem(twelve_hours, dialogue, database) == "value_normalisation"
    # The human told a postcode no venue of this database has: the dataset's database differs.
    goal = {"attraction": {"info": {"name": "old gaol museum"}, "reqt": ["postcode"]}}
    differing = _dialogue("DB01.json", goal, [
        ("Where is the old gaol museum ?", {}, {}),
        ("Old gaol museum , postcode cb99zz .", _belief(attraction=({"name": "old gaol museum"}, {})), {"Attraction-Inform": [["Post", "cb99zz"]]}),
    ])
    problem = offline_result(differing, database).problems[0]
    assert (problem.kind, problem.slot, problem.got) == ("request_not_given", "postcode", "cb30ff")
    assert classify_problem(problem, differing, database) == "db_mismatch"


def test_replay_agent_limits_domains_in_the_reference_users_order(database):
    """The goal message may introduce the domains in another order than the real user took
    them up; a gold replay's simulator follows the real user."""
    goal = {"attraction": {"info": {"type": "museum", "area": "centre"}, "reqt": ["postcode"]},
            "restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["phone"]}}
    restaurant = {"food": "chinese", "area": "north", "name": "", "pricerange": ""}
    attraction = {"type": "museum", "area": "centre", "name": ""}
    dialogue = _dialogue("ORDER01.json", goal, [
        ("A chinese restaurant in the north please .", {}, {"Restaurant-Inform": [["Food", "chinese"], ["Area", "north"]]}),
        ("Lotus garden , phone 01223000222 .", _belief(restaurant=(restaurant, {})), {}),
        ("Also a museum in the centre , its postcode ?", {}, {"Attraction-Inform": [["Type", "museum"]]}),
        ("Old gaol museum , postcode cb30ff .", _belief(restaurant=(restaurant, {}), attraction=(attraction, {})), {}),
        ("Thanks , bye .", {}, {}),
        ("Goodbye .", _belief(restaurant=(restaurant, {}), attraction=(attraction, {})), {}),
    ])
    assert [d.domain for d in pursuit_order(dialogue.goal)] == ["attraction", "restaurant"]
    assert [d.domain for d in reference_order(dialogue.goal, dialogue)] == ["restaurant", "attraction"]
    episode = run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)[0]
    assert episode.success, episode.result.reasons


def test_genuine_human_failure_is_classified_with_evidence(database):
    """The human system never told the requested duration (neither text nor dialog acts)."""
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}, "reqt": ["duration"]}}
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}
    dialogue = _dialogue("HUMAN01.json", goal, [
        ("A train to ely on monday after 09:30 ? How long is it ?", {}, {}),
        ("TR1002 leaves at 10:05 .", _belief(train=(semi, {})), {"Train-Inform": [["Id", "TR1002"]]}),
    ])
    episode = run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)[0]
    assert not episode.success
    cause, reasons = classify(episode, dialogue, database)
    assert cause == "human_failure"
    assert any("duration" in reason for reason in reasons)


def _database_with(**extra) -> Database:
    """The invented database plus ``extra`` records per domain."""
    raw = {domain: records + extra.get(domain, []) for domain, records in _RAW_DB.items()}
    entities = {domain: parse_database(domain, records, f"{domain}_db.json")[0] for domain, records in raw.items()}
    _, taxi = parse_database("taxi", [{"taxi_colors": ["red"], "taxi_types": ["skoda"], "taxi_phone": ["^07\\d{9}$"]}], "taxi_db.json")
    return Database(entities, taxi)


def test_value_normalisation_belief_spellings_of_database_values():
    """Real belief states write "night club", "multiple sports" (the database: "mutliple
    sports"), "portugese" and parking "free"; the environment queries the database's spelling."""
    database = _database_with(attraction=[
        {"id": "9", "name": "the velvet cellar", "type": "nightclub", "area": "centre", "entrance fee": "5 pounds",
         "address": "4 cellar row", "phone": "01223000777", "postcode": "cb21gg"},
        {"id": "10", "name": "fenland sports hall", "type": "mutliple sports", "area": "east", "entrance fee": "?",
         "address": "9 track road", "phone": "01223000888", "postcode": "cb15hh"},
    ])
    from pipelines.env.tools import same_name

    assert same_name("cafe uno", "caffe uno", shortened=True)  # a taxi's "cafe uno" is the database's "caffe uno"
    environment = ToolEnvironment(database)
    assert environment.call("query_attraction", {"type": "night club"})["count"] == 1
    assert environment.call("query_attraction", {"type": "multiple sports"})["count"] == 1
    assert environment.call("query_hotel", {"parking": "free", "area": "east"})["count"] == 1
    goal = {"attraction": {"info": {"type": "nightclub", "area": "centre"}, "reqt": ["postcode"]}}
    semi = {"type": "night club", "area": "centre", "name": ""}
    dialogue = _dialogue("VALUE03.json", goal, [
        ("A night club in the centre , with its postcode ?", {}, {}),
        ("Try the velvet cellar , postcode cb21gg .", _belief(attraction=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("attraction").offered == "the velvet cellar"


def test_multi_entity_offer_beyond_the_five_results_shown():
    """A query of seven museums shows five; the human system, who sees them all, offers the
    seventh. An older query's venue named earlier is not the offer."""
    museums = [{"id": str(20 + n), "name": f"gallery number {word}", "type": "museum", "area": "centre", "entrance fee": "free",
                "address": f"{n} gallery walk", "phone": f"0122300090{n}", "postcode": f"cb2{n}jj"}
               for n, word in enumerate(("one", "two", "three", "four", "five", "six"), start=1)]
    database = _database_with(attraction=museums)
    goal = {"attraction": {"info": {"type": "museum", "area": "centre"}, "reqt": ["postcode"]}}
    pools = {"type": "swimmingpool", "area": "north", "name": ""}
    museum = {"type": "museum", "area": "centre", "name": ""}
    dialogue = _dialogue("MULTI02.json", goal, [
        ("A swimming pool in the north ?", {}, {}),
        ("Riverside lido is in the north .", _belief(attraction=(pools, {})), {}),
        ("No , a museum in the centre then .", {}, {}),
        ("Gallery number six is lovely , postcode cb26jj .", _belief(attraction=(museum, {})), {}),
    ])
    state = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0)).state
    assert state.queries[-1].count == 7 and "gallery number six" not in {e.name for e in state.queries[-1].results}
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("attraction").offered == "gallery number six"


def _with_message(dialogue_id: str, goal: dict, message: list[str], turns: list[tuple[str, dict, dict]]):
    log = [{"text": text, "metadata": metadata, "dialog_act": acts} for text, metadata, acts in turns]
    return parse_dialogue(dialogue_id, {"goal": {**goal, "message": message}, "log": log}, "data.json", "val")


def test_cross_domain_reference_taxi_arrives_by_the_booked_time(database):
    """The goal's taxi arriveBy (17:00) is the restaurant backup time its generator
    expected; the message says "by the booked time", and the table was booked at 18:00."""
    goal = {"restaurant": {"info": {"food": "british", "area": "centre"}, "book": {"people": "2", "day": "monday", "time": "18:00", "invalid": True}},
            "taxi": {"info": {"arriveBy": "17:00"}, "reqt": ["phone"]}}
    message = ["Once you find the <span class='emphasis'>restaurant</span> you want to book a table for 2 people at 18:00 on monday",
               "If the booking fails how about 17:00",
               "You want to make sure it arrives the restaurant by the booked time"]
    restaurant = ({"food": "british", "area": "centre", "name": "copper kettle bistro"},
                  {"people": "2", "day": "monday", "time": "18:00", "booked": [{"name": "copper kettle bistro", "reference": "AB12CD34"}]})
    taxi_semi = {"departure": "lotus garden", "destination": "copper kettle bistro", "arriveBy": "18:00", "leaveAt": ""}
    taxi = (taxi_semi, {"booked": [{"phone": "07000111222", "type": "red skoda"}]})
    dialogue = _with_message("REF01.json", goal, message, [
        ("A british place in the centre for 2 at 18:00 on monday .", {}, {}),
        ("The copper kettle bistro is booked , reference AB12CD34 .", _belief(restaurant=restaurant), {}),
        ("And a taxi from lotus garden to get there by 18:00 .", {}, {}),
        ("A red skoda , phone 07000111222 .", _belief(restaurant=restaurant, taxi=taxi), {}),
    ])
    assert dialogue.goal.get("taxi").references == {"arriveBy": ("restaurant", "time")}
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    # Without the booking the goal's own value stands, and 18:00 is too late for it.
    unbooked = _with_message("REF02.json", goal, message, [
        ("A taxi from lotus garden to the copper kettle bistro by 18:00 .", {}, {}),
        ("A red skoda , phone 07000111222 .", _belief(taxi=taxi), {}),
    ])
    problems = _grade(unbooked, database).domain("taxi").problems
    assert ("taxi_value", "arriveBy", "17:00", "18:00") in [(p.kind, p.slot, p.expected, p.got) for p in problems]


def test_booking_semantics_taxi_leave_after_and_the_taxi_told(database):
    """"Leave after 09:00" is met by a taxi at 09:15; a later ``booked`` record the system
    never told about (real annotations add them) does not hide the taxi it did tell."""
    goal = {"taxi": {"info": {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:00"}, "reqt": ["phone", "car type"]}}
    semi = {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:15", "arriveBy": ""}
    told = (semi, {"booked": [{"phone": "07000333444", "type": "grey skoda"}]})
    again = (semi, {"booked": [{"phone": "07000555666", "type": "red skoda"}]})
    dialogue = _dialogue("TAXI01.json", goal, [
        ("A taxi from lotus garden to riverside lido after 09:00 , 09:15 is fine .", {}, {}),
        ("A gray Skoda will come , contact 0 7000 - 333 - 444 .", _belief(taxi=told), {}),
        ("Thanks , bye .", {}, {}),
        ("Goodbye .", _belief(taxi=again), {}),
    ])
    state = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0)).state
    assert len(state.successful_bookings("taxi")) == 2
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("taxi").offered == state.successful_bookings("taxi")[0].reference


def test_requested_attributes_said_in_words(database):
    """"A four star guesthouse", "no entry fee", an address from its street on: the checker
    and the simulated user share one matcher (pipelines.multiwoz.text.states)."""
    from pipelines.multiwoz.text import TextView, states
    from pipelines.simulators.understanding import AgentReader, read

    understanding = AgentReader(database)
    for text, slot, value in [("It is a four star guesthouse .", "stars", "4"), ("It has a zero star rating .", "stars", "0"),
                              ("Meadow pool , with no entry fee .", "entrance fee", "free"),
                              ("It does n't charge an entrance fee .", "entrance fee", "free"),
                              ("Camboats is a boating attraction .", "type", "boat"),
                              ("It is on 13 magdalene street .", "address", "cafe jello gallery, 13 magdalene street")]:
        assert states(TextView.of(text), slot, value), (text, slot)
        assert understanding.gives(read(text), slot, value), (text, slot)
    assert states(TextView.of("The cost is not listed , call them ."), "entrance fee", "?")
    assert states(TextView.of("I do n't have price info on either of them ."), "entrance fee", "?")
    assert not states(TextView.of("The total fee is 80.8 GBP payable at the station ."), "entrance fee", "?")
    assert states(TextView.of("Neither park has an entrance fee ."), "entrance fee", "free")
    assert not states(TextView.of("No , the fee is 5 pounds ."), "entrance fee", "free")
    assert not states(TextView.of("There are two options ."), "stars", "2")
    assert not states(TextView.of("Yes , it is ."), "internet", "yes")


def _taxi_after(dialogue_id: str, user_text: str):
    goal = {"taxi": {"info": {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "22:30"}, "reqt": ["phone"]}}
    semi = {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "", "arriveBy": "22:30"}
    return _dialogue(dialogue_id, goal, [
        (user_text, {}, {}),
        ("I have booked your taxi , contact number 07000111333 .", _belief(taxi=(semi, {"booked": [{"phone": "07000111333", "type": "red skoda"}]})), {}),
    ])


def test_annotation_error_and_human_failure_told_apart_by_the_users_words(database):
    """The belief records arriveBy 22:30 for a goal leaving after 22:30: a wrong annotation
    when the user said "after 22:30", the human user's own mistake when they said "arrive"."""
    for dialogue, cause in [(_taxi_after("ANNOT01.json", "A taxi from lotus garden to riverside lido , I need it after 22:30 ."), "annotation_error"),
                            (_taxi_after("ANNOT02.json", "A taxi from lotus garden to riverside lido , I must arrive by 22:30 ."), "human_failure")]:
        episode = run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)[0]
        assert not episode.success
        assert classify(episode, dialogue, database)[0] == cause, dialogue.dialogue_id


def test_value_normalisation_times_recorded_as_said(database):
    """Real belief states hold "5:45pm", "8pm" or "after 15:45"; the replayed call states HH:MM."""
    from pipelines.multiwoz.ontology import spoken_time

    assert [spoken_time(v) for v in ("5:45pm", "8pm", "after 15:45", "12am", "9", "after lunch")] == [1065, 1200, 945, 0, None, None]
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}, "reqt": ["duration"]}}
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "9:30am"}
    dialogue = _dialogue("TIME02.json", goal, [
        ("A train to ely on monday after half past nine ?", {}, {}),
        ("TR1002 leaves at 10:05 , it takes 17 minutes .", _belief(train=(semi, {})), {}),
    ])
    assert gold_tool_calls(dialogue)[0][1].arguments["leaveAt"] == "09:30"
    assert _grade(dialogue, database).success


def test_multi_entity_offer_train_by_time_fitting_the_goal(database):
    """A query without a day shows the same train time on several days; "arrives at 10:22
    on monday" offers the goal's day's train, not the first shown."""
    tuesday = {"trainID": "TR2002", "day": "tuesday", "departure": "cambridge", "destination": "ely", "leaveAt": "10:05",
               "arriveBy": "10:22", "duration": "17 minutes", "price": "10.10 pounds"}
    database = _database_with(train=[tuesday])
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "tuesday", "arriveBy": "11:00"}, "reqt": ["price"]}}
    semi = {"departure": "cambridge", "destination": "ely", "arriveBy": "11:00"}
    dialogue = _dialogue("TIME03.json", goal, [
        ("A train to ely arriving by 11:00 , on tuesday . How much is it ?", {}, {}),
        ("The latest arrives at 10:22 on a tuesday , 10.10 pounds .", _belief(train=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("train").offered == "TR2002"


def test_classification_of_untaken_domains_and_unnamed_answers(database):
    """A dialogue that never takes a goal domain up is the human user's failure, not the
    replay's; "Yes , they do ." to "free parking ?" answers without naming the attribute,
    which the checker (reading the system's side) cannot hear: requested_attributes."""
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["phone"]},
            "hotel": {"info": {"type": "guesthouse", "area": "east"}, "reqt": ["parking"]}}
    restaurant = {"food": "chinese", "area": "north", "name": "", "pricerange": ""}
    untaken = _dialogue("HUMAN02.json", goal, [
        ("A chinese place in the north ?", {}, {}),
        ("Lotus garden , phone 01223000222 .", _belief(restaurant=(restaurant, {}), hotel=({}, {})), {}),
    ])
    problems = offline_result(untaken, database).problems
    assert [(p.kind, p.domain) for p in problems] == [("not_offered", "hotel"), ("request_without_offer", "hotel")]
    assert {classify_problem(p, untaken, database) for p in problems} == {"human_failure"}
    hotel = {"type": "guesthouse", "area": "east", "name": ""}
    unnamed = _dialogue("REQT01.json", {"hotel": goal["hotel"]}, [
        ("A guesthouse in the east ? Do they have free parking ?", {}, {}),
        ("Willow guest house . Yes , they do .", _belief(hotel=(hotel, {})), {"Hotel-Inform": [["Name", "willow guest house"], ["Parking", "none"]]}),
    ])
    problems = offline_result(unnamed, database).problems
    assert [(p.kind, p.slot) for p in problems] == [("request_not_given", "parking")]
    assert classify_problem(problems[0], unnamed, database) == "requested_attributes"


def test_requested_attributes_a_flag_answered_yes(database):
    """"Do they have free parking ?" - "Yes , they do .": the checker and the simulated user
    both take the yes as the flag given."""
    goal = {"hotel": {"info": {"type": "guesthouse", "area": "east"}, "reqt": ["parking"]}}
    hotel = {"type": "guesthouse", "area": "east", "name": ""}
    dialogue = _dialogue("REQT02.json", goal, [
        ("A guesthouse in the east please .", {}, {}),
        ("Willow guest house is a guesthouse in the east .", _belief(hotel=(hotel, {})), {}),
        ("Do they have free parking ?", {}, {}),
        ("Yes , they do .", _belief(hotel=(hotel, {})), {}),
    ])
    result = offline_result(dialogue, database)
    assert result.success, result.reasons
    replayed = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    assert not check_goal(dialogue.goal, replayed.state, replayed.system_texts, None).success  # without the question
    episode = run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)[0]
    assert episode.success, (episode.result.reasons, [e.text for e in episode.events if e.text])
    session = AgendaSimulator(database).session(dialogue.goal, 0)
    session.opening_turn()
    assert "parking?" in session.reply("Willow guest house is a guesthouse in the east .").text
    assert session.reply("Yes , they do .").end  # heard: nothing left to ask


def test_requested_attributes_a_ticket_price_stated_as_the_total(database):
    """"The total fee is 30.3 GBP" for 3 tickets states a price of 10.10 pounds each."""
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"},
                      "book": {"people": "3"}, "reqt": ["price"]}}
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}
    booked = (semi, {"people": "3", "booked": [{"trainID": "TR1002", "reference": "TT11TT22"}]})
    dialogue = _dialogue("PRICE01.json", goal, [
        ("Three tickets to ely on monday after 09:30 , and the price please .", {}, {}),
        ("Booked on TR1002 , the total fee is 30.3 GBP , reference TT11TT22 .", _belief(train=booked), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons


def test_classification_booking_acts_say_nothing_about_trains(database):
    """A restaurant booking's "Booking-Book Time 12:00" is not a train's duration told: the
    duration never given is the human system's failure."""
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "book": {"people": "2", "day": "monday", "time": "12:00"}},
            "train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}, "reqt": ["duration"]}}
    restaurant = ({"food": "chinese", "area": "north", "name": "lotus garden"},
                  {"people": "2", "day": "monday", "time": "12:00", "booked": [{"name": "lotus garden", "reference": "AB12CD34"}]})
    train = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:30"}
    dialogue = _dialogue("HUMAN03.json", goal, [
        ("Lotus garden for 2 on monday at 12:00 .", {}, {}),
        ("Booked , reference AB12CD34 .", _belief(restaurant=restaurant), {"Booking-Book": [["Ref", "AB12CD34"], ["Time", "12:00"]]}),
        ("And a train to ely on monday after 09:30 , how long is it ?", {}, {}),
        ("TR1002 leaves at 10:05 .", _belief(restaurant=restaurant, train=(train, {})), {"Train-Inform": [["Id", "TR1002"]]}),
    ])
    problems = offline_result(dialogue, database).problems
    assert [(p.kind, p.slot) for p in problems] == [("request_not_given", "duration")]
    assert classify_problem(problems[0], dialogue, database) == "human_failure"


def test_requested_attributes_an_unknown_fee_answered_not_known(database):
    """"How much is the entrance fee ?" - "I am unsure of that , sorry .": the database does
    not know it either ("?"), so that is the answer, for the checker and the simulated user."""
    goal = {"attraction": {"info": {"name": "riverside lido"}, "reqt": ["entrance fee"]}}
    semi = {"name": "riverside lido", "type": "", "area": ""}
    dialogue = _dialogue("REQT03.json", goal, [
        ("Tell me about riverside lido .", {}, {}),
        ("Riverside lido is a swimming pool in the north .", _belief(attraction=(semi, {})), {}),
        ("How much is the entrance fee ?", {}, {}),
        ("I am unsure of that , sorry .", _belief(attraction=(semi, {})), {}),
    ])
    assert offline_result(dialogue, database).success
    replayed = replay(dialogue, ToolEnvironment(database, dialogue.goal, seed=0))
    assert not check_goal(dialogue.goal, replayed.state, replayed.system_texts, None).success  # without the question
    session = AgendaSimulator(database).session(dialogue.goal, 0)
    session.opening_turn()
    asked = session.reply("Riverside lido is a swimming pool in the north .").text
    assert "entrance fee" in asked and asked.rstrip().endswith("?")
    assert session.reply("I am unsure of that , sorry .").end


def _episode(dialogue, database):
    return run_episodes_sync([EpisodeSpec.from_dialogue(dialogue)], ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database), database)[0]


def test_replay_agent_limits_a_booked_train_id_from_another_days_timetable():
    """The wizard booked TR2001, Tuesday's 10:05 to Ely, for a Monday belief: with the
    database, the replay books the belief's train leaving at that time (TR1002)."""
    database = _database_with(train=[{"trainID": "TR2001", "day": "tuesday", "departure": "cambridge", "destination": "ely",
                                      "leaveAt": "10:05", "arriveBy": "10:22", "duration": "17 minutes", "price": "10.10 pounds"}])
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}, "book": {"people": "2"}}}
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}
    dialogue = _dialogue("TTBL01.json", goal, [
        ("Two tickets to ely on monday after 10:00 please .", {}, {}),
        ("Booked on the 10:05 , reference TT33TT44 .", _belief(train=(semi, {"people": "2", "booked": [{"trainID": "TR2001", "reference": "TT33TT44"}]})), {}),
    ])
    assert gold_tool_calls(dialogue)[-1][1].arguments["trainID"] == "TR2001"  # without the database: as annotated
    assert gold_tool_calls(dialogue, database)[-1][1].arguments["trainID"] == "TR1002"
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert _episode(dialogue, database).success


def test_replay_agent_limits_booking_values_annotated_later_or_before(database):
    """A hotel booked with "people": "none" that a later belief of the same record states;
    a restaurant rebooked elsewhere "for the same party" with every book value "none"."""
    goal = {"hotel": {"info": {"name": "willow guest house"}, "book": {"people": "2", "day": "monday", "stay": "3"}}}
    hotel = {"name": "willow guest house"}
    record = {"name": "willow guest house", "reference": "HH11HH22"}
    later = _dialogue("LATER01.json", goal, [
        ("Willow guest house for the two of us , 3 nights from monday .", {}, {}),
        ("Booked , reference HH11HH22 .", _belief(hotel=(hotel, {"people": "none", "day": "monday", "stay": "3", "booked": [record]})), {}),
        ("Thanks , bye .", {}, {}),
        ("Goodbye .", _belief(hotel=(hotel, {"people": "2", "day": "monday", "stay": "3", "booked": [record]})), {}),
    ])
    [(turn, booking)] = [(turn, call) for turn, call in gold_tool_calls(later) if call.name == "book_hotel"]
    assert (turn, booking.arguments["people"]) == (1, "2")  # made at its own turn, with the later belief's value
    assert _episode(later, database).success
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "book": {"people": "2", "day": "monday", "time": "18:00"}}}
    first = ({"name": "copper kettle bistro"}, {"people": "2", "day": "monday", "time": "18:00",
                                                "booked": [{"name": "the copper kettle bistro", "reference": "RR11RR22"}]})
    again = ({"food": "chinese", "area": "north"}, {"people": "none", "day": "none", "time": "none",
                                                    "booked": [{"name": "the copper kettle bistro", "reference": "RR11RR22"},
                                                               {"name": "lotus garden", "reference": "RR33RR44"}]})
    rebooked = _dialogue("LATER02.json", goal, [
        ("The copper kettle bistro for 2 , monday at 18:00 .", {}, {}),
        ("Booked , reference RR11RR22 .", _belief(restaurant=first), {}),
        ("Sorry , I wanted chinese in the north , cancel that and book one for us instead .", {}, {}),
        ("Lotus garden is booked instead , reference RR33RR44 .", _belief(restaurant=again), {}),
    ])
    result = _grade(rebooked, database)
    assert result.success, result.reasons
    assert result.domain("restaurant").offered == "lotus garden"


def test_simulator_a_reference_before_any_offer_is_another_domains(database):
    """The agent confirms the restaurant after the user moved on to the hotel: that
    reference books nothing of the hotel, which the user still asks to book once offered."""
    dialogue = _dialogue("SIM01.json", {"hotel": {"info": {"name": "willow guest house"}, "book": {"people": "2", "day": "monday", "stay": "3"}}}, [])
    session = AgendaSimulator(database).session(dialogue.goal, 0)
    session.opening_turn()
    assert not session.reply("Booking was successful . Reference number is : AB12CD34 .").end
    turn = session.reply("Willow guest house is a guesthouse on 8 mill road . Shall I book it ?")
    assert not turn.end and "book" in turn.text.lower(), turn.text


def test_simulator_a_booking_for_another_party_size_is_corrected(database):
    """"Booked ... for 1 person" for a party of six: the user asks for its own party size
    (as the real user did) instead of taking the reference; "6 tickets" is then taken."""
    goal = {"train": {"info": {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "10:00"}, "book": {"people": "6"}}}
    dialogue = _dialogue("PARTY01.json", goal, [])
    session = AgendaSimulator(database).session(dialogue.goal, 0)
    session.opening_turn()
    turn = session.reply("TR1002 leaves at 10:05 . I have booked it for 1 person , your reference number is AB12CD34 .")
    assert not turn.end and "6 people" in turn.text, turn.text
    assert session.reply("I 've changed it to 6 tickets , the reference number is now CD34EF56 .").end


def test_multi_entity_offer_a_train_id_beyond_the_shown_five_said_after_a_shown_time():
    """"They run until 10:05" says a shown train's time in passing; "TR3001 leaves at 05:05"
    then offers a train beyond the five shown, which the checker grades."""
    trains = [{"trainID": f"TR300{n}", "day": "monday", "departure": "ely", "destination": "cambridge", "leaveAt": f"{4 + n:02d}:05",
               "arriveBy": f"{4 + n:02d}:22", "duration": "17 minutes", "price": "4.40 pounds"} for n in range(1, 7)]
    database = _database_with(train=trains)
    goal = {"train": {"info": {"departure": "ely", "destination": "cambridge", "day": "monday", "arriveBy": "11:00"}, "reqt": ["trainID"]}}
    semi = {"departure": "ely", "destination": "cambridge", "day": "monday", "arriveBy": "11:00"}
    dialogue = _dialogue("TRID01.json", goal, [
        ("A train from ely to cambridge on monday , arriving by 11:00 ?", {}, {}),
        ("They run hourly until the 10:05 . Any preference ?", _belief(train=(semi, {})), {}),
        ("The earliest , and its id please .", {}, {}),
        ("That is TR3001 , leaving at 05:05 .", _belief(train=(semi, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("train").offered == "TR3001"


def test_multi_entity_offer_another_fitting_venue_named_after_a_lookup_by_name():
    """Asked about jade palace, the system answers with lotus garden's postcode, naming it:
    lotus garden (chinese, north, as the goal wants) is the venue it offered."""
    database = _database_with(restaurant=[{"id": "3", "name": "jade palace", "food": "chinese", "pricerange": "cheap", "area": "north",
                                           "address": "9 fen road", "phone": "01223000777", "postcode": "cb43gg"}])
    goal = {"restaurant": {"info": {"food": "chinese", "area": "north"}, "reqt": ["postcode"]}}
    dialogue = _dialogue("OTHER01.json", goal, [
        ("What is the postcode of jade palace ?", {}, {}),
        ("lotus garden 's post code is cb43bb .", _belief(restaurant=({"food": "chinese", "area": "north", "name": "jade palace"}, {})), {}),
    ])
    result = _grade(dialogue, database)
    assert result.success, result.reasons
    assert result.domain("restaurant").offered == "lotus garden"


def test_requested_attributes_an_unknown_fee_asked_with_a_typo_and_answered_in_person():
    """"Is there an entrance free for riverside lido ?" - "that information is only
    available in person": the fee the database does not know, answered."""
    from pipelines.multiwoz.text import answers

    assert answers("Is there an entrance free for riverside lido ?", "I 'm sorry but that information is only available in person .",
                   "entrance fee", "?")
    assert not answers("Is there an entrance free for riverside lido ?", "It is on 1 lido walk .", "entrance fee", "?")


def _taxi_booked(dialogue_id: str, semi: dict, user_acts: dict, goal_info: dict):
    goal = {"taxi": {"info": goal_info, "reqt": ["phone"]}}
    return _dialogue(dialogue_id, goal, [
        ("I need a taxi to riverside lido please .", {}, user_acts),
        ("Booked , contact number 07000111222 .", _belief(taxi=(semi, {"booked": [{"phone": "07000111222", "type": "red skoda"}]})), {}),
    ])


def test_classification_bookings_the_annotations_leave_incomplete(database):
    """A taxi booked without a pickup place or time nobody gave is the human system's
    failure; a hotel day the user said ("starting thurs") that the belief dropped is an
    annotation error; a taxi rebooked whose new number was never told is the human's."""
    no_pickup = _taxi_booked("INCOMP01.json", {"destination": "riverside lido", "departure": "none", "arriveBy": "10:00"},
                             {"Taxi-Inform": [["Dest", "riverside lido"]]}, {"arriveBy": "10:00"})
    no_time = _taxi_booked("INCOMP02.json", {"destination": "riverside lido", "departure": "lotus garden", "arriveBy": "none"},
                           {"Taxi-Inform": [["Dest", "riverside lido"], ["Depart", "lotus garden"]]}, {"arriveBy": "10:00"})
    for dialogue in (no_pickup, no_time):
        problems = offline_result(dialogue, database).problems
        assert problems and problems[0].kind == "no_taxi"
        assert classify_problem(problems[0], dialogue, database) == "human_failure", dialogue.dialogue_id
    goal = {"hotel": {"info": {"name": "willow guest house"}, "book": {"people": "2", "day": "thursday", "stay": "3"}}}
    dropped = _dialogue("INCOMP03.json", goal, [
        ("Willow guest house for 2 people , 3 nights starting thurs .", {}, {"Hotel-Inform": [["People", "2"], ["Stay", "3"]]}),
        ("Booked , reference HH55HH66 .", _belief(hotel=({"name": "willow guest house"}, {"people": "2", "day": "none", "stay": "3",
                                                          "booked": [{"name": "willow guest house", "reference": "HH55HH66"}]})), {}),
    ])
    problem = offline_result(dropped, database).problems[0]
    assert problem.kind == "no_booking" and classify_problem(problem, dropped, database) == "annotation_error"
    semi = {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:00"}
    goal = {"taxi": {"info": semi, "reqt": ["phone"]}}
    rebooked = _dialogue("INCOMP04.json", goal, [
        ("A taxi from lotus garden to meadow pool at 09:00 .", {}, {}),
        ("Booked , contact number 07000111222 .", _belief(taxi=({**semi, "destination": "meadow pool"}, {"booked": [{"phone": "07000111222", "type": "red skoda"}]})),
         {"Taxi-Inform": [["Phone", "07000111222"]]}),
        ("Sorry , I meant riverside lido .", {}, {}),
        ("Done , a red skoda will take you there .", _belief(taxi=(semi, {"booked": [{"phone": "07000333444", "type": "red skoda"}]})), {"Taxi-Inform": [["Car", "red skoda"]]}),
    ])
    problem = offline_result(rebooked, database).problems[0]
    assert (problem.kind, problem.slot) == ("request_not_given", "phone")
    assert classify_problem(problem, rebooked, database) == "human_failure"


def test_classification_what_the_human_system_got_wrong(database):
    """A phone told one digit off is the database's difference (or a typo), not an offer of
    another venue; an area of one venue with the phone of another is the human's mix-up; a
    taxi from a place nobody ever said is the human system's booking."""
    goal = {"attraction": {"info": {"name": "old gaol museum"}, "reqt": ["phone"]}}
    typo = _dialogue("WRONG01.json", goal, [
        ("The phone number of the old gaol museum ?", {}, {}),
        ("Old gaol museum , 01223000667 .", _belief(attraction=({"name": "old gaol museum"}, {})), {"Attraction-Inform": [["Phone", "01223000667"]]}),
    ])
    problem = offline_result(typo, database).problems[0]
    assert classify_problem(problem, typo, database) == "db_mismatch"
    pools = _database_with(attraction=[{"id": "4", "name": "east pool", "type": "swimmingpool", "area": "east", "entrance fee": "?",
                                        "address": "4 east road", "phone": "01223000888", "postcode": "cb13hh"}])
    goal = {"attraction": {"info": {"type": "swimmingpool"}, "reqt": ["area", "phone"]}}
    semi = {"type": "swimmingpool", "area": "", "name": ""}
    mixed = _dialogue("WRONG02.json", goal, [
        ("A swimming pool , any area ?", {}, {}),
        ("East pool is in the east .", _belief(attraction=(semi, {})), {"Attraction-Inform": [["Name", "east pool"], ["Area", "east"]]}),
        ("Its phone number ?", {}, {}),
        ("The phone is 01223000555 .", _belief(attraction=(semi, {})), {"Attraction-Inform": [["Phone", "01223000555"]]}),
    ])
    problems = offline_result(mixed, pools).problems
    assert [(p.kind, p.slot, p.entity) for p in problems] == [("request_not_given", "area", "meadow pool")]
    assert classify_problem(problems[0], mixed, pools) == "human_failure"
    wanted = {"departure": "lotus garden", "destination": "riverside lido", "leaveAt": "09:00"}
    unsaid = _dialogue("WRONG03.json", {"taxi": {"info": wanted, "reqt": ["phone"]}}, [
        ("I need a taxi to riverside lido at 09:00 .", {}, {}),
        ("Booked , contact number 07000111222 .", _belief(taxi=({**wanted, "departure": "the station"},
                                                             {"booked": [{"phone": "07000111222", "type": "red skoda"}]})), {}),
    ])
    problem = next(p for p in offline_result(unsaid, database).problems if p.slot == "departure")
    assert classify_problem(problem, unsaid, database) == "human_failure"
    # It told TR1001 (which fits) and booked TR1002: graded on the booking, the human's slip.
    semi = {"departure": "cambridge", "destination": "ely", "day": "monday", "leaveAt": "09:00"}
    told_other = _dialogue("WRONG04.json", {"train": {"info": semi, "reqt": ["trainID"]}}, [
        ("A train to ely on monday after 09:00 , and its id ?", {}, {}),
        ("TR1001 leaves at 09:05 .", _belief(train=(semi, {})), {"Train-Inform": [["Id", "TR1001"]]}),
        ("Thanks .", {}, {}),
        ("I booked it , reference TT55TT66 .", _belief(train=(semi, {"people": "1", "booked": [{"trainID": "TR1002", "reference": "TT55TT66"}]})), {}),
    ])
    problem = offline_result(told_other, database).problems[0]
    assert (problem.kind, problem.slot, problem.entity) == ("request_not_given", "trainID", "TR1002")
    assert classify_problem(problem, told_other, database) == "human_failure"


# -- the real validation dialogues -------------------------------------------------------


@pytest.fixture(scope="module")
def real_val_dir(real_db_dir):
    return REAL_VAL_DIR  # data.json.xz, in the repository


def test_gold_replay_of_the_real_validation_dialogues(real_val_dir, real_db_dir):
    """All 999 real dialogues, replayed as the gold_replay stage does (its params.yaml
    simulator settings); every failure gets a cause, and the success rate does not fall
    below what was measured (0.8238 before issue 18's second round, 0.8559 after, 0.8669
    after its third)."""
    from pipelines.simulators.agenda import SimulatorSpec
    from catalog.io import read_params
    from catalog.multiwoz_dir import load_multiwoz
    from tests.conftest import REPO

    settings = {k: v for k, v in read_params("gold_replay", REPO / "params.yaml")["simulator"].items() if k != "kind"}
    corpus = load_multiwoz(real_val_dir, real_db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    specs = [EpisodeSpec.from_dialogue(d, seed=0) for d in corpus.dialogues]
    episodes = run_episodes_sync(specs, ReplayAgent(get_format("speakrl"), database=database), AgendaSimulator(database, SimulatorSpec(**settings)), database)
    assert len(episodes) == 999
    success = sum(e.success for e in episodes) / len(episodes)
    assert success >= 0.86, success
    by_id = {d.dialogue_id: d for d in corpus.dialogues}
    causes = [classify(e, by_id[e.dialogue_id], database)[0] for e in episodes if not e.success]
    assert set(causes) <= set(CAUSES)
    # Genuine failures of the human dialogues and database differences are most of what is left.
    assert causes.count("human_failure") + causes.count("db_mismatch") >= len(causes) // 2, causes
