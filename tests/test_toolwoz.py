"""ToolWOZ environment: Algorithms 2/3 of the JOSH paper, goal APIs, scoring, forks.

Most tests use a small hand-built database whose rows are arranged so that each case of
the algorithms gives a different answer than the naive one (first match). The tests
marked ``real_data`` run against ../shared/data when it is there and skip otherwise.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import SHARED

from pipelines.env.toolwoz import (
    API_SPECS,
    TARGET_BELIEF,
    TARGET_BOOKED,
    TARGET_DATABASE,
    TARGET_NOT_NEEDED,
    TARGET_UNRESOLVED,
    TOOLWOZ_TOOLS,
    ToolWozDatabase,
    ToolWozEnvironment,
    ToolWozTask,
    booking_reference,
    call_meets_goal,
    derive_goal_apis,
    goal_progress,
    toolwoz_test_ids,
    toolwoz_tools,
)
from pipelines.multiwoz.parse import parse_database
from pipelines.records import BookedRecord, Dialogue, DomainBelief, DomainGoal, Entity, Goal, ToolCall, Turn, frozen_dict

# --------------------------------------------------------------------------------------
# Builders
# --------------------------------------------------------------------------------------


def entity(domain: str, entity_id: str, **attributes: str) -> Entity:
    attributes = {key.replace("__", " ").replace("_dot_", "."): value for key, value in attributes.items()}
    name = attributes.get("name") or attributes["trainID"]
    return Entity(domain, entity_id, name, frozen_dict(attributes))


def restaurant(entity_id: str, name: str, food: str, pricerange: str, area: str) -> Entity:
    return entity("restaurant", entity_id, name=name, food=food, pricerange=pricerange, area=area, phone="01223000000", id=entity_id)


def train(entity_id: str, train_id: str, departure: str, destination: str, day: str, leave: str, arrive: str) -> Entity:
    return entity(
        "train", entity_id, trainID=train_id, departure=departure, destination=destination, day=day,
        leaveAt=leave, arriveBy=arrive, duration="50 minutes", price="10.00 pounds",
    )


ENTITIES: dict[str, list[Entity]] = {
    "restaurant": [
        restaurant("r1", "golden wok", "chinese", "moderate", "north"),
        restaurant("r2", "the hotpot", "chinese", "expensive", "north"),
        restaurant("r3", "King's Kitchen", "chinese", "moderate", "north"),
        restaurant("r4", "curry corner", "indian", "cheap", "centre"),
        restaurant("r5", "rice house", "indian", "cheap", "centre"),
        restaurant("r6", "the cow pizza kitchen", "italian", "expensive", "south"),
    ],
    "hotel": [
        entity(
            "hotel", "h1", id="h1", name="alpha lodge", area="north", parking="yes", internet="yes", pricerange="cheap",
            stars="4", type="guesthouse", price_dot_single="40", price_dot_double="60", price_dot_family="80",
            takesbookings="yes",
        ),
    ],
    "attraction": [
        entity("attraction", "a1", id="a1", name="King's College", type="college", area="centre", entrance__fee="free"),
        entity("attraction", "a2", id="a2", name="abbey pool", type="swimmingpool", area="east", entrance__fee="?"),
        entity("attraction", "a3", id="a3", name="clare college", type="college", area="west", entrance__fee="2.50 pounds"),
    ],
    "train": [
        train("t1", "TR0001", "cambridge", "london kings cross", "monday", "09:15", "10:05"),
        train("t2", "TR0002", "cambridge", "london kings cross", "monday", "10:00", "10:51"),
        train("t3", "TR0003", "cambridge", "london kings cross", "monday", "11:00", "11:51"),
        train("t4", "TR0002", "norwich", "cambridge", "friday", "23:40", "24:55"),  # trainIDs repeat in MultiWOZ
        train("t5", "TR0005", "cambridge", "london kings cross", "tuesday", "10:00", "10:51"),
    ],
}
DB = ToolWozDatabase(ENTITIES)


def system_turn(dialogue_id: str, index: int, beliefs: tuple[DomainBelief, ...]) -> Turn:
    return Turn(dialogue_id, index, "system", "ok", beliefs)


def belief(domain: str, semi: dict | None = None, book: dict | None = None, booked: tuple[dict, ...] = ()) -> DomainBelief:
    return DomainBelief(
        domain, frozen_dict(semi or {}), frozen_dict(book or {}), tuple(BookedRecord(domain, frozen_dict(b)) for b in booked)
    )


def dialogue(dialogue_id: str, goals: list[DomainGoal], system_beliefs: list[tuple[DomainBelief, ...]] = ()) -> Dialogue:
    turns = []
    for i, beliefs in enumerate(system_beliefs):
        turns.append(Turn(dialogue_id, 2 * i, "user", "hello"))
        turns.append(system_turn(dialogue_id, 2 * i + 1, beliefs))
    return Dialogue(dialogue_id, Goal(dialogue_id, tuple(goals)), tuple(turns))


def goal(domain: str, info: dict, book: dict | None = None) -> DomainGoal:
    return DomainGoal(domain, info=frozen_dict(info), book=frozen_dict(book or {}))


CHINESE_GOAL = goal("restaurant", {"food": "chinese", "pricerange": "moderate", "area": "north"}, {"people": "4", "day": "friday", "time": "19:30"})
TRAIN_GOAL = goal("train", {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "09:30"}, {"people": "2"})


def chinese_task(target: str = "King's Kitchen") -> ToolWozTask:
    """Restaurant booking whose target is not the first matching row."""
    booked = ({"name": target, "reference": "REF00001"},)
    d = dialogue("PMUL0001.json", [CHINESE_GOAL], [(belief("restaurant", {"name": "not mentioned"}),), (belief("restaurant", booked=booked),)])
    return derive_goal_apis(d, DB)


def result_names(observation: dict) -> list[str]:
    assert "error" not in observation, observation
    return [item.get("name") or item.get("trainID") for item in observation["results"]]


# --------------------------------------------------------------------------------------
# Tool definitions
# --------------------------------------------------------------------------------------


def shared_file(*parts: str) -> Path:
    path = SHARED.joinpath("data", *parts)
    if not path.exists():
        pytest.skip(f"shared data {'/'.join(parts)} not present")
    return path


def test_tools_are_openai_function_definitions():
    assert [t["function"]["name"] for t in TOOLWOZ_TOOLS] == [
        "book_restaurant", "search_restaurant", "book_hotel", "search_hotel",
        "book_attraction", "search_attraction", "book_train", "search_train",
    ]
    for tool in TOOLWOZ_TOOLS:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and params["required"] == []
        assert all(p["type"] == "string" and p["description"] for p in params["properties"].values())
    copied = toolwoz_tools()
    copied[0]["function"]["name"] = "changed"
    assert TOOLWOZ_TOOLS[0]["function"]["name"] == "book_restaurant"


@pytest.mark.real_data
def test_tools_match_toolwoz_tools_json():
    reference = json.loads(shared_file("toolwoz", "tools.json").read_text())
    ours = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in TOOLWOZ_TOOLS}
    theirs = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in reference}
    assert ours.keys() == theirs.keys()
    for name, properties in theirs.items():
        assert set(ours[name]) == set(properties), name
        for param, definition in properties.items():
            assert ours[name][param].get("enum") == definition.get("enum"), (name, param)
            assert ours[name][param]["type"] == definition["type"]


@pytest.mark.real_data
def test_api_parameters_and_returns_match_valid_api_defs():
    defs = json.loads(shared_file("toolwoz", "valid_api_defs.json").read_text())
    for spec in API_SPECS.values():
        assert list(spec.parameter_names) == defs[spec.domain][spec.name]["parameters"], spec.name
        assert list(spec.returns) == defs[spec.domain][spec.name]["returns"], spec.name


# --------------------------------------------------------------------------------------
# Goal APIs
# --------------------------------------------------------------------------------------


def test_goal_apis_from_booked_record():
    task = chinese_task()
    assert [g.name for g in task.goal_apis] == ["search_restaurant", "book_restaurant"]
    search, book = task.goal_apis
    assert search.parameters == {"food": "chinese", "pricerange": "moderate", "area": "north"}
    assert search.unique_id == "King's Kitchen" and search.returns["name"] == "King's Kitchen"
    assert book.parameters == {"people": "4", "day": "friday", "time": "19:30", "name": "King's Kitchen"}
    assert book.returns == {"name": "King's Kitchen", "reference": "REF00001"}
    domain = task.domain("restaurant")
    assert domain.target_source == TARGET_BOOKED and domain.unique_id == "King's Kitchen"
    assert task.target_sources == {"restaurant": TARGET_BOOKED}


def test_target_from_belief_name_then_database():
    # No booked record: the belief state's name (spelt differently from the DB) is the target.
    d = dialogue("SNG0002.json", [CHINESE_GOAL], [(belief("restaurant", {"name": "kings kitchen"}),)])
    task = derive_goal_apis(d, DB)
    assert task.domain("restaurant").target_source == TARGET_BELIEF
    assert task.domain("restaurant").unique_id == "King's Kitchen"  # the database's spelling
    # No belief state at all: the first entity meeting the goal, with a hashed reference.
    task = derive_goal_apis(dialogue("SNG0003.json", [CHINESE_GOAL]), DB)
    domain = task.domain("restaurant")
    assert domain.target_source == TARGET_DATABASE and domain.unique_id == "golden wok"
    reference = domain.booking_return["reference"]
    assert re.fullmatch(r"[0-9A-Z]{8}", reference)
    assert reference == booking_reference("SNG0003.json", "restaurant") != booking_reference("SNG0004.json", "restaurant")


def test_dialogue_target_that_breaks_the_goal_is_not_used():
    # "the hotpot" is expensive: no search meeting the goal could return it.
    booked = ({"name": "the hotpot", "reference": "XYZ"},)
    d = dialogue("MUL0005.json", [CHINESE_GOAL], [(belief("restaurant", booked=booked),)])
    domain = derive_goal_apis(d, DB).domain("restaurant")
    assert domain.target_source == TARGET_DATABASE and domain.unique_id == "golden wok"


def test_booked_train_with_shared_id_resolves_to_the_goals_train():
    d = dialogue("MUL0006.json", [TRAIN_GOAL], [(belief("train", booked=({"trainID": "tr0002", "reference": "T2"},)),)])
    task = derive_goal_apis(d, DB)
    search, book = task.goal_apis
    assert book.parameters == {"people": "2", "trainID": "TR0002"}
    assert search.returns["departure"] == "cambridge" and search.returns["leaveAt"] == "10:00"  # not the norwich TR0002


def test_domains_without_goal_apis():
    taxi_only = dialogue("SNG0007.json", [goal("taxi", {"departure": "a", "destination": "b"})])
    assert derive_goal_apis(taxi_only, DB).goal_apis == ()
    # Attractions are searched, never booked; dont-care values are no constraint.
    d = dialogue("SNG0008.json", [goal("attraction", {"type": "college", "area": "dontcare"}), goal("police", {})])
    task = derive_goal_apis(d, DB)
    assert [(g.name, g.parameters) for g in task.goal_apis] == [("search_attraction", {"type": "college"})]
    assert task.domain("attraction").target_source == TARGET_NOT_NEEDED


def test_unresolvable_booking_target_drops_the_book_goal():
    d = dialogue("SNG0009.json", [goal("restaurant", {"food": "thai"}, {"people": "2"})])
    task = derive_goal_apis(d, DB)
    assert [g.name for g in task.goal_apis] == ["search_restaurant"]
    assert task.domain("restaurant").target_source == TARGET_UNRESOLVED


# --------------------------------------------------------------------------------------
# Algorithm 2: search
# --------------------------------------------------------------------------------------


def test_underspecified_search_returns_a_goal_violating_result():
    env = ToolWozEnvironment(DB, chinese_task())
    # {food: chinese} ⊆ goal: matches are golden wok, the hotpot (expensive), King's Kitchen.
    assert result_names(env.call("search_restaurant", {"food": "chinese"})) == ["the hotpot"]
    assert result_names(env.call("search_restaurant", {})) == ["the cow pizza kitchen"]  # last violating row


def test_underspecified_search_returns_target_when_nothing_violates():
    booked = ({"name": "rice house", "reference": "R5"},)
    indian = goal("restaurant", {"food": "indian", "pricerange": "cheap", "area": "centre"}, {"people": "2"})
    task = derive_goal_apis(dialogue("SNG0010.json", [indian], [(belief("restaurant", booked=booked),)]), DB)
    env = ToolWozEnvironment(DB, task)
    # Both indian restaurants meet the goal; the target (second row) comes back, not the first match.
    assert result_names(env.call("search_restaurant", {"food": "indian"})) == ["rice house"]


def test_fully_specified_search_returns_the_booking_target():
    env = ToolWozEnvironment(DB, chinese_task())
    args = {"food": "Chinese", "pricerange": "moderate", "area": "north"}
    assert result_names(env.call("search_restaurant", args)) == ["King's Kitchen"]
    assert result_names(env.call("search_restaurant", {**args, "name": "KING'S KITCHEN"})) == ["King's Kitchen"]


def test_full_goal_without_target_among_matches_returns_nothing():
    env = ToolWozEnvironment(DB, chinese_task())
    # Goal ⊆ args but the name excludes the target; every match meets the goal, so no
    # violating result exists either (with the goal in the arguments, none ever can).
    args = {"food": "chinese", "pricerange": "moderate", "area": "north", "name": "golden wok"}
    assert result_names(env.call("search_restaurant", args)) == []


def test_search_outside_the_goal_returns_the_first_match():
    env = ToolWozEnvironment(DB, chinese_task())
    assert result_names(env.call("search_restaurant", {"pricerange": "expensive"})) == ["the hotpot"]
    assert result_names(env.call("search_restaurant", {"food": "thai"})) == []


def test_search_without_booking_goal():
    task = derive_goal_apis(dialogue("SNG0011.json", [goal("attraction", {"type": "college", "area": "west"})]), DB)
    env = ToolWozEnvironment(DB, task)
    assert result_names(env.call("search_attraction", {"type": "college"})) == ["King's College"]  # violates area
    assert result_names(env.call("search_attraction", {"type": "college", "area": "west"})) == ["clare college"]


def test_names_with_apostrophes_and_capitals_are_found():
    env = ToolWozEnvironment(DB, ToolWozTask("x", (), {}))
    for spelling in ("King's College", "kings college", "KINGS COLLEGE ", "king\u2019s college"):
        assert result_names(env.call("search_attraction", {"name": spelling})) == ["King's College"], spelling
    # The result is the cleaned record: "entrance fee" is returned as "entrance".
    item = env.call("search_attraction", {"name": "kings college"})["results"][0]
    assert item["entrance"] == "free" and "entrance fee" not in item


def test_hotel_prices_are_flattened():
    env = ToolWozEnvironment(DB, ToolWozTask("x", (), {}))
    item = env.call("search_hotel", {"name": "alpha lodge"})["results"][0]
    assert (item["single"], item["double"], item["family"]) == ("40", "60", "80")
    assert not any(key.startswith("price.") for key in item)


def test_times_are_compared_as_times():
    env = ToolWozEnvironment(DB, ToolWozTask("x", (), {}))
    base = {"departure": "cambridge", "destination": "london kings cross", "day": "monday"}
    # As strings "10:00" < "9:30"; as times 10:00 is after 9:30. leaveAt = at or after.
    assert result_names(env.call("search_train", {**base, "leaveAt": "9:30"})) == ["TR0002"]
    assert result_names(env.call("search_train", {**base, "leaveAt": "09:15"})) == ["TR0001"]
    assert result_names(env.call("search_train", {**base, "leaveAt": "11:01"})) == []
    # arriveBy = at or before, across the 24:xx times of the real data.
    assert result_names(env.call("search_train", {"departure": "norwich", "arriveBy": "24:55"})) == ["TR0002"]
    assert result_names(env.call("search_train", {"departure": "norwich", "arriveBy": "24:54"})) == []
    assert "error" in env.call("search_train", {**base, "leaveAt": "after lunch"})


def test_train_goal_search_with_times():
    task = derive_goal_apis(dialogue("MUL0012.json", [TRAIN_GOAL]), DB)
    assert task.domain("train").unique_id == "TR0002"  # first train leaving at/after 09:30
    env = ToolWozEnvironment(DB, task)
    full = {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "9:30"}
    assert result_names(env.call("search_train", full)) == ["TR0002"]  # "9:30" states the goal's "09:30"
    # Underspecified: a train that breaks the goal (wrong day / too early) comes back.
    item = env.call("search_train", {"departure": "cambridge"})["results"][0]
    assert item["day"] != "monday" or item["leaveAt"] < "09:30"


def test_bad_calls_give_error_observations():
    env = ToolWozEnvironment(DB, chinese_task())
    assert "error" in env.call("search_restaurant", {"cuisine": "chinese"})  # unknown parameter
    assert "error" in env.call("search_restaurant", {"food": ["chinese", "thai"]})  # list value
    assert "error" in env.call("book_restaurant", {"name": {"value": "golden wok"}})  # dict value
    assert "error" in env.call("find_restaurant", {})  # unknown tool
    assert "error" in env.call("search_restaurant", "food=chinese")  # not an object
    assert "error" in env.call("book_attraction", {"name": "King's College"})  # takes no parameters
    missing_db = ToolWozEnvironment(ToolWozDatabase({"restaurant": ENTITIES["restaurant"]}), chinese_task())
    assert "error" in missing_db.call("search_train", {"day": "monday"})  # no silent empty result
    assert len(env.calls) == 6 and all(not call.ok for call in env.calls)


def test_empty_and_dont_care_arguments_are_ignored():
    env = ToolWozEnvironment(DB, chinese_task())
    goal_args = {"food": "chinese", "pricerange": "moderate", "area": "north"}
    for no_constraint in ("", "dont care", "dontcare", None):
        # Still the fully specified case: an ignored name does not make the call "outside the goal".
        assert result_names(env.call("search_restaurant", {**goal_args, "name": no_constraint})) == ["King's Kitchen"]


# --------------------------------------------------------------------------------------
# Algorithm 3: book
# --------------------------------------------------------------------------------------


def test_booking_needs_the_goals_booking_arguments():
    env = ToolWozEnvironment(DB, chinese_task())
    good = {"name": "kings kitchen", "people": "4", "day": "Friday", "time": "19:30"}
    assert env.call("book_restaurant", good) == {"success": True, "return": {"name": "King's Kitchen", "reference": "REF00001"}}
    assert env.call("book_restaurant", {**good, "time": "19:30"})["success"]
    failed = {"success": False, "return": None}
    assert env.call("book_restaurant", {k: v for k, v in good.items() if k != "people"}) == failed  # missing people
    assert env.call("book_restaurant", {**good, "name": "golden wok"}) == failed  # wrong venue
    assert env.call("book_restaurant", {**good, "people": "5"}) == failed
    assert env.call("book_attraction", {}) == failed  # attractions cannot be booked
    assert env.call("book_hotel", {"name": "alpha lodge", "people": "1", "day": "monday", "stay": "2"}) == failed  # no hotel goal


def test_booking_compares_times_as_times_and_names_normalised():
    task = chinese_task()
    env = ToolWozEnvironment(DB, task)
    assert env.call("book_restaurant", {"name": "King's Kitchen", "people": 4, "day": "friday", "time": "19.30"})["success"]
    attraction_like = derive_goal_apis(
        dialogue("SNG0013.json", [goal("restaurant", {"area": "north", "food": "chinese", "pricerange": "moderate"}, {"time": "09:30", "people": "1", "day": "monday"})]),
        DB,
    )
    env = ToolWozEnvironment(DB, attraction_like)
    assert env.call("book_restaurant", {"name": "Golden Wok", "time": "9:30", "people": "1", "day": "monday"})["success"]
    assert not env.call("book_restaurant", {"name": "Golden Wok", "time": "9:31", "people": "1", "day": "monday"})["success"]


def test_booking_a_train():
    task = derive_goal_apis(dialogue("MUL0014.json", [TRAIN_GOAL]), DB)
    env = ToolWozEnvironment(DB, task)
    observation = env.call("book_train", {"trainID": "tr0002", "people": "2"})
    assert observation["success"] and observation["return"]["trainID"] == "TR0002"
    assert not env.call("book_train", {"trainID": "TR0003", "people": "2"})["success"]


# --------------------------------------------------------------------------------------
# State and forks
# --------------------------------------------------------------------------------------


def test_fork_is_independent():
    env = ToolWozEnvironment(DB, chinese_task())
    args = {"food": "chinese"}
    observation = env.call("search_restaurant", args)
    args["food"] = "mutated"  # neither the caller's dict nor the returned observation is the log
    observation["results"].clear()
    assert env.calls[0].arguments == {"food": "chinese"} and len(env.calls[0].observation["results"]) == 1

    child = env.fork()
    assert child.database is env.database and child.task is env.task
    child.call("book_restaurant", {"name": "kings kitchen", "people": "4", "day": "friday", "time": "19:30"})
    assert len(env.calls) == 1 and len(child.calls) == 2
    env.call("search_hotel", {"area": "north"})
    assert [c.name for c in child.calls] == ["search_restaurant", "book_restaurant"]
    assert [c.name for c in env.calls] == ["search_restaurant", "search_hotel"]
    grandchild = child.fork()
    assert grandchild.progress().met == (False, True) and env.progress().met == (False, False)


# --------------------------------------------------------------------------------------
# Goal-API completion
# --------------------------------------------------------------------------------------


def test_goal_progress_reward_fractions():
    booked = (belief("restaurant", booked=({"name": "King's Kitchen", "reference": "R"},)), belief("train", booked=({"trainID": "TR0002", "reference": "T"},)))
    task = derive_goal_apis(dialogue("MUL0015.json", [CHINESE_GOAL, TRAIN_GOAL], [booked]), DB)
    assert [g.name for g in task.goal_apis] == ["search_restaurant", "book_restaurant", "search_train", "book_train"]
    env = ToolWozEnvironment(DB, task)
    assert env.progress().reward == 0.0

    env.call("search_restaurant", {"food": "chinese"})  # violating result: not met
    env.call("book_train", {"trainID": "TR0002"})  # people missing: not met
    env.call("book_train", {"trainID": "TR0002", "people": "2", "extra": "x"})  # error: not met
    assert env.progress().reward == 0.0

    env.call("book_train", {"trainID": "TR0002", "people": "2"})
    score = env.progress()
    assert score.met == (False, False, False, True) and score.reward == 0.25 and not score.success
    assert score.met_by == (None, None, None, 3)

    env.call("search_restaurant", {"food": "chinese", "pricerange": "moderate", "area": "north"})
    assert env.progress().reward == 0.5
    env.call("search_train", {"departure": "cambridge", "destination": "london kings cross", "day": "monday", "leaveAt": "09:30"})
    env.call("search_hotel", {})  # extra calls are not penalised
    assert env.progress().reward == 0.75
    env.call("book_restaurant", {"name": "king's kitchen", "people": "4", "day": "friday", "time": "19:30"})
    score = env.progress()
    assert score.reward == 1.0 and score.success and score.n_met == score.total == 4


def test_search_goal_without_booking_is_met_by_a_result_meeting_the_goal():
    task = derive_goal_apis(dialogue("SNG0016.json", [goal("attraction", {"type": "college", "area": "west"})]), DB)
    (search,) = task.goal_apis
    hit = ToolCall("search_attraction", {"type": "college", "area": "west"}, {"results": [{"name": "clare college", "type": "college", "area": "west"}]})
    miss = ToolCall("search_attraction", {"type": "college"}, {"results": [{"name": "King's College", "type": "college", "area": "centre"}]})
    empty = ToolCall("search_attraction", {"type": "college", "area": "west"}, {"results": []})
    assert call_meets_goal(search, hit) and not call_meets_goal(search, miss) and not call_meets_goal(search, empty)
    assert goal_progress(task, [miss, empty]).reward == 0.0 and goal_progress(task, [miss, hit]).success


def test_search_goal_with_target_needs_the_target_itself():
    task = derive_goal_apis(dialogue("MUL0017.json", [TRAIN_GOAL], [(belief("train", booked=({"trainID": "TR0002"},)),)]), DB)
    search = task.goal_apis[0]
    norwich = dict(next(r for r in DB.rows("train") if r.entity.get("departure") == "norwich").result)
    imposter = ToolCall("search_train", {}, {"results": [norwich]})  # same trainID, another train
    assert not call_meets_goal(search, imposter)
    assert call_meets_goal(search, ToolCall("search_train", {}, {"results": [search.returns]}))
    # A call another environment answered with an error never counts, even with the right arguments.
    book = task.goal_apis[1]
    assert call_meets_goal(book, ToolCall("book_train", {"trainID": "TR0002", "people": "2"}, None))
    assert not call_meets_goal(book, ToolCall("book_train", {"trainID": "TR0002", "people": "2"}, {"error": "timeout"}))


def test_task_without_goal_apis_scores_zero():
    task = derive_goal_apis(dialogue("SNG0018.json", [goal("taxi", {"departure": "a"})]), DB)
    score = goal_progress(task, [])
    assert score.reward == 0.0 and not score.success and score.total == 0


# --------------------------------------------------------------------------------------
# Official test set
# --------------------------------------------------------------------------------------


def test_toolwoz_test_ids():
    with_goal = [chinese_task()]  # PMUL0001.json
    for i in range(2, 8):
        d = dialogue(f"SNG{i:04d}.json", [goal("attraction", {"type": "college"})])
        with_goal.append(derive_goal_apis(d, DB))
    without = derive_goal_apis(dialogue("SNG0009.json", [goal("taxi", {"departure": "a"})]), DB)
    listed = ["SNG0005", "SNG0003.json", "PMUL0001.json", "SNG0009.json", "SNG0007", "SNG0099.json", "  "]
    tasks = with_goal + [without]
    assert toolwoz_test_ids(listed, tasks) == ["PMUL0001.json", "SNG0003.json", "SNG0005.json", "SNG0007.json"]
    assert toolwoz_test_ids(listed, {t.dialogue_id: t for t in tasks}, limit=2) == ["PMUL0001.json", "SNG0003.json"]


@pytest.mark.real_data
def test_official_test_list_ids_are_accepted():
    ids = [line.strip() for line in shared_file("toolwoz", "testListFile.json").read_text().splitlines() if line.strip()]
    tasks = [derive_goal_apis(dialogue(i, [goal("attraction", {"type": "college"})]), DB) for i in ids]
    selected = toolwoz_test_ids(ids, tasks)
    assert len(selected) == 450 and selected == sorted(ids)[:450]


# --------------------------------------------------------------------------------------
# Real MultiWOZ database
# --------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def real_db(real_raw_db) -> ToolWozDatabase:
    # The real loader: train_db.json reuses trainIDs, which parse_database keys by (trainID, day, leaveAt).
    return ToolWozDatabase({d: parse_database(d, real_raw_db[d], f"{d}_db.json")[0] for d in ("restaurant", "hotel", "attraction", "train")})


@pytest.mark.real_data
def test_real_db_every_venue_is_findable_by_name(real_db):
    env = ToolWozEnvironment(real_db, ToolWozTask("x", (), {}))
    for domain in ("restaurant", "hotel", "attraction"):
        for row in real_db.rows(domain):
            name = row.entity.name
            for spelling in (name, name.upper(), name.replace("'", "")):
                assert result_names(env.call(f"search_{domain}", {"name": spelling})) == [name], (domain, spelling)


@pytest.mark.real_data
def test_real_db_hand_written_goal(real_db):
    restaurant_goal = goal("restaurant", {"food": "italian", "pricerange": "moderate", "area": "centre"}, {"people": "3", "day": "sunday", "time": "18:45"})
    train_goal = goal("train", {"departure": "stansted airport", "destination": "cambridge", "day": "saturday", "arriveBy": "10:00"}, {"people": "3"})
    attraction_goal = goal("attraction", {"name": "king's college"})
    beliefs = (
        belief("restaurant", {"name": "pizza express Fen Ditton"}, booked=({"name": "pizza express Fen Ditton", "reference": "PZ1234AB"},)),
        belief("train", booked=({"trainID": "TR7409", "reference": "TR7409RF"},)),  # TR7409 is also a monday train
    )
    task = derive_goal_apis(dialogue("MUL9999.json", [attraction_goal, restaurant_goal, train_goal], [beliefs]), real_db)
    assert [g.name for g in task.goal_apis] == ["search_attraction", "search_restaurant", "book_restaurant", "search_train", "book_train"]
    assert task.domain("restaurant").target_source == TARGET_BOOKED and task.domain("train").target_source == TARGET_BOOKED
    env = ToolWozEnvironment(real_db, task)

    item = env.call("search_restaurant", {"food": "italian"})["results"][0]  # underspecified
    assert (item["pricerange"], item["area"]) != ("moderate", "centre")
    assert result_names(env.call("search_restaurant", {"food": "italian", "pricerange": "moderate", "area": "centre"})) == ["pizza express Fen Ditton"]
    assert env.call("book_restaurant", {"name": "pizza express fen ditton", "people": "3", "day": "sunday", "time": "18:45"})["return"]["reference"] == "PZ1234AB"

    trains = env.call("search_train", {"departure": "stansted airport", "destination": "cambridge", "day": "saturday", "arriveBy": "10:00"})["results"]
    assert [(t["trainID"], t["day"]) for t in trains] == [("TR7409", "saturday")]
    assert env.call("book_train", {"trainID": "TR7409", "people": "3"})["success"]
    assert result_names(env.call("search_attraction", {"name": "Kings College"})) == ["king's college"]
    score = env.progress()
    assert score.success, score.met
