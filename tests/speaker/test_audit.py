"""The speaker_sft audit (pipelines.speaker.audit): a pure function over rows."""

from __future__ import annotations

import json

from pipelines.episodes.formats import AgentAction, SpeakRLFormat
from pipelines.speaker.audit import audit_sft, booking_domains, no_preference_reply

FORMAT = SpeakRLFormat()
SYSTEM = {"role": "system", "content": "tools"}
GOAL = {"restaurant": {"info": {"food": "thai"}, "book": {"people": "2", "day": "friday", "time": "18:00"}}, "taxi": {"info": {"leaveAt": "10:00"}}}


def _agent(*actions: AgentAction) -> dict[str, str]:
    return {"role": "assistant", "content": FORMAT.render([AgentAction.think("t"), *actions])[0]}


def _obs(body: dict) -> dict[str, str]:
    return {"role": "user", "content": f"<tool_response>\n{json.dumps(body)}\n</tool_response>"}


def _rows(dialogue_id: str, goal: dict, turns: list[dict]) -> list[dict]:
    rows, step = [], 0
    for index, turn in enumerate(turns):
        if turn["role"] == "assistant" and not turn.get("needless"):
            kind = {"clarify": "clarify", "tool_call": "tool_call"}.get(_kind(turn["content"]), "respond")
            rows.append({"dialogue_id": dialogue_id, "step": step, "kind": kind, "prompt": [SYSTEM, *[_msg(t) for t in turns[:index]]],
                         "completion": [_msg(turn)], "goal": json.dumps(goal)})
        if turn["role"] == "assistant":
            step += 1
    return rows


def _msg(turn: dict) -> dict[str, str]:
    return {"role": turn["role"], "content": turn["content"]}


def _kind(content: str) -> str:
    from pipelines.episodes.formats import decision

    return decision(content)


def test_audit_counts_questions_replies_bookings_and_errors():
    needless = {**_agent(AgentAction.clarify("Which part of town would you prefer: the north or the centre?")), "needless": True}
    turns = [
        {"role": "user", "content": "I want a restaurant."},
        _agent(AgentAction.tool_call("query_restaurant", {})),
        _obs({"count": 9, "results": []}),
        _agent(AgentAction.clarify("What kind of food would you like: thai or indian?")),  # grounded: the goal has food
        {"role": "user", "content": "Thai food, please."},
        _agent(AgentAction.tool_call("query_restaurant", {"food": "thai"})),
        _obs({"count": 3, "results": []}),
        needless,  # about the area, which the goal lacks: no row of its own
        {"role": "user", "content": "I don't mind about the area."},
        _agent(AgentAction.respond("How about bangkok city?")),
        {"role": "user", "content": "Book it for 2 people on friday at 18:00."},
        _agent(AgentAction.tool_call("book_restaurant", {"name": "bangkok city", "people": 2, "day": "friday", "time": "18:00"})),
        _obs({"reference": "ABC"}),
        _agent(AgentAction.respond("Booked for 2 people on friday at 18:00, reference ABC.")),
        {"role": "user", "content": "And a boat with a price range."},
        _agent(AgentAction.tool_call("query_attraction", {"pricerange": "cheap"})),  # not a parameter of the tool
        _obs({"error": "query_attraction has no parameter pricerange"}),
        _agent(AgentAction.clarify("Do you need free parking?")),  # the goal has no parking: absent
        {"role": "user", "content": "Bye."},
        _agent(AgentAction.respond("Bye."), AgentAction.end()),
    ]
    audit = audit_sft(_rows("d1", GOAL, turns))
    assert audit["rows"] == 9 and audit["rows_by_kind"] == {"clarify": 2, "respond": 3, "tool_call": 4}
    assert audit["questions"] == {"total": 2, "absent_from_goal": 1, "unread": 0, "absent_from_goal_share": 0.5}
    assert audit["after_question"]["replies"] == {"answer": 2, "no_preference": 1}
    assert audit["after_question"]["next_after_no_preference"] == {"respond": 1}
    assert audit["after_question"]["next_after_answer"] == {"end": 1, "tool_call": 1}
    assert audit["bookings"]["restaurant"] == {"goal_dialogues": 1, "dialogues_booked": 1, "booking_calls": 1}
    assert audit["bookings"]["taxi"] == {"goal_dialogues": 1, "dialogues_booked": 0, "booking_calls": 0}
    assert audit["bookings"]["hotel"]["goal_dialogues"] == 0
    assert audit["tool_calls"]["errors_by_kind"] == {"error_observation": 1, "invalid_argument": 1}
    assert audit["tool_calls"]["by_tool"] == {"book_restaurant": 1, "query_attraction": 1, "query_restaurant": 2}


def test_requery_without_arguments_after_no_preference_is_counted_and_goals_come_from_a_mapping():
    turns = [
        {"role": "user", "content": "A restaurant."},
        _agent(AgentAction.clarify("What kind of food would you like?")),
        {"role": "user", "content": "Could you recommend one?"},
        _agent(AgentAction.tool_call("query_restaurant", {})),
        _obs({"count": 79, "results": []}),
    ]
    rows = [{k: v for k, v in row.items() if k != "goal"} for row in _rows("d2", GOAL, turns)]
    audit = audit_sft(rows, {"d2": GOAL})
    assert audit["after_question"]["requery_no_arguments_after_no_preference"] == 1
    assert audit_sft(rows)["no_goal"] == 2


def test_reply_reading_and_booking_domains():
    assert no_preference_reply("The price range doesn't matter to me.") and no_preference_reply("Any type of food is fine.")
    assert not no_preference_reply("I'd prefer the north.")
    assert booking_domains(GOAL) == ["restaurant", "taxi"]
    assert booking_domains({"hotel": {"info": {"area": "north"}}, "attraction": {"info": {"type": "museum"}}}) == []


def test_over_asking_fields_count_a_question_about_a_slot_the_user_stated():
    """The GPU run's failure (episode sft/MUL01253.json#0): the user says "in the centre", the
    search returns two pools in the centre, and the agent asks which part of town."""
    goal = {"attraction": {"info": {"type": "swimmingpool", "area": "centre"}}}
    pools = {"count": 2, "results": [{"name": "a", "area": "centre"}, {"name": "b", "area": "centre"}]}
    turns = [
        {"role": "user", "content": "I'd like to find a swimmingpool to visit in the centre."},
        _agent(AgentAction.tool_call("query_attraction", {"type": "swimmingpool", "area": "centre"})),
        _obs(pools),
        _agent(AgentAction.clarify("Which part of town would you prefer: the east or the centre?")),
        {"role": "user", "content": "The centre."},
        _agent(AgentAction.respond("How about a?")),
    ]
    audit = audit_sft(_rows("d3", goal, turns))
    assert audit["over_asking"]["asks_stated_slot"] == 1
    assert audit["over_asking"]["asks_known_slot"] == 0 and audit["over_asking"]["nothing_open"] == 1
    assert audit["after_search"]["stated"] == {"ask": 1, "act": 1, "ask_share": 0.5}

    # The same request without the area: the question is about an open slot, and the next
    # decision (after the answer) acts.
    open_turns = [
        {"role": "user", "content": "I'd like to find a swimmingpool to visit."},
        _agent(AgentAction.tool_call("query_attraction", {"type": "swimmingpool"})),
        _obs({"count": 2, "results": [{"name": "a", "area": "centre"}, {"name": "b", "area": "east"}]}),
        _agent(AgentAction.clarify("Which part of town would you prefer: the east or the centre?")),
        {"role": "user", "content": "The centre."},
        _agent(AgentAction.respond("How about a?")),
    ]
    audit = audit_sft(_rows("d4", goal, open_turns))
    assert audit["over_asking"]["asks_stated_slot"] == 0 and audit["over_asking"]["verdicts"] == {"targets_discriminating_slot": 1}
    assert audit["after_search"]["open"]["ask"] == 1 and audit["after_search"]["stated"] == {"ask": 0, "act": 1, "ask_share": 0.0}
