"""The verifiable clarification judge, through the TRL reward callable."""

from __future__ import annotations

import json
import pickle

import pytest

from pipelines.errors import DataError
from pipelines.rewards import (
    NO_QUESTION,
    REWARD_FUNCTIONS,
    SLOT_CUES,
    ClarifyReward,
    VerifiableJudge,
    asked_slots,
)
from pipelines.rewards.verifiable import ASKS_KNOWN, CONSTRAINT_SLOTS, IRRELEVANT, TARGETS_DISCRIMINATING

THINK = "<think>Three hotels match; they differ in area and name.</think>"
# A decision point: the user wants a cheap hotel for 2 people; the candidates differ in area
# and name.
ROW = {
    "discriminating_slots": ["hotel-area", "hotel-name"],
    "candidate_values": {"area": ["north", "centre"], "name": ["acorn guest house", "alexander bed and breakfast"]},
    "known_slots": ["hotel-pricerange", "hotel-book-people"],
}


def ask(question: str) -> str:
    return f"{THINK}<clarify>{question}</clarify>"


def judge_one(completion, row=ROW, **extra):
    reward = ClarifyReward(VerifiableJudge())
    columns = {key: [value] for key, value in row.items()}
    verdict = reward.verdicts(prompts=["prompt"], completions=[completion], **columns, **extra)[0]
    assert reward(prompts=["prompt"], completions=[completion], **columns, **extra) == [verdict.score]
    return verdict


@pytest.mark.parametrize(
    "completion, score, reason",
    [
        # targets a discriminating slot by its words
        (ask("Which part of town would you like to stay in?"), 1.0, TARGETS_DISCRIMINATING),
        (ask("Do you have a particular hotel in mind?"), 1.0, TARGETS_DISCRIMINATING),
        # names two candidate values, no slot word
        (ask("Would you like the Acorn Guest House or the Alexander Bed and Breakfast?"), 1.0, TARGETS_DISCRIMINATING),
        (ask("North or centre?"), 1.0, TARGETS_DISCRIMINATING),
        # restating a known value is context, not re-asking
        (ask("Which area would you like your cheap hotel in?"), 1.0, TARGETS_DISCRIMINATING),
        # one candidate value is a guess, not a choice
        (ask("Would the Acorn Guest House suit you?"), 0.0, IRRELEVANT),
        # irrelevant
        (ask("Is there anything else I can help you with?"), 0.0, IRRELEVANT),
        (ask("Which day would you like to arrive?"), 0.0, IRRELEVANT),
        # about something already known, alone or next to a good question
        (ask("What is your budget?"), 0.0, ASKS_KNOWN),
        (ask("Cheap or expensive?"), 0.0, ASKS_KNOWN),
        (ask("Which area do you prefer, and how many people are coming?"), 0.0, ASKS_KNOWN),
        # no question: another action, a plain reply, a malformed output
        (THINK + "The Acorn Guest House is in the north.", 0.0, NO_QUESTION),
        (THINK + '<tool_call>{"name": "query_hotel", "arguments": {}}</tool_call>', 0.0, NO_QUESTION),
        (THINK + "<clarify>Which part of town would you like?", 0.0, NO_QUESTION),
        ("<clarify>Which area?</clarify><think>late</think>", 0.0, NO_QUESTION),
        # conversational completion
        ([{"role": "assistant", "content": ask("Which area?")}], 1.0, TARGETS_DISCRIMINATING),
    ],
)
def test_verdicts(completion, score, reason):
    verdict = judge_one(completion)
    assert (verdict.score, verdict.reason) == (score, reason)


def test_columns_may_be_json_strings_and_bare_lower_case_slot_names():
    row = {
        "discriminating_slots": json.dumps(["leaveat"]),
        "candidate_values": json.dumps({"train-leaveAt": ["09:15", "11:15"]}),
        "known_slots": json.dumps(["destination", "day"]),
    }
    assert judge_one(ask("Would you rather take the 09:15 or the 11:15?"), row).score == 1.0
    assert judge_one(ask("What time would you like to leave?"), row).score == 1.0
    assert judge_one(ask("Where are you heading to?"), row).reason == ASKS_KNOWN


def test_known_slots_may_be_a_belief_state_mapping():
    row = {"discriminating_slots": ["area"], "known_slots": {"pricerange": "cheap", "people": None}}
    assert judge_one(ask("Which area, and what price range?"), row).reason == ASKS_KNOWN
    assert judge_one(ask("Which area, and for how many people?"), row).reason == TARGETS_DISCRIMINATING
    row["known_slots"] = json.dumps(row["known_slots"])
    assert judge_one(ask("Which area, and what price range?"), row).reason == ASKS_KNOWN


def test_optional_columns_may_be_missing_or_null():
    row = {"discriminating_slots": ["area"]}
    assert judge_one(ask("North or south?"), row).score == 1.0
    row = {"discriminating_slots": ["area"], "candidate_values": {"area": None, "food": None}, "known_slots": None}
    assert judge_one(ask("Which area?"), row).score == 1.0


def test_nothing_ambiguous_means_no_question_earns_credit():
    assert judge_one(ask("Which area?"), {"discriminating_slots": []}).reason == IRRELEVANT


def test_a_slot_both_known_and_discriminating_counts_as_discriminating():
    row = {"discriminating_slots": ["train-day"], "known_slots": ["hotel-day"]}
    assert judge_one(ask("Which day will you travel?"), row).score == 1.0


@pytest.mark.parametrize(
    "row, message",
    [
        ({"known_slots": []}, "discriminating_slots"),
        ({"discriminating_slots": None}, "discriminating_slots"),
        ({"discriminating_slots": ["colour"]}, "unknown slot 'colour'"),
        ({"discriminating_slots": "area"}, "not valid JSON"),
        ({"discriminating_slots": '"area"'}, "expected a list of slot names"),
        ({"discriminating_slots": ["area"], "candidate_values": ["north"]}, "expected a mapping"),
        ({"discriminating_slots": ["area"], "candidate_values": {"area": "north"}}, "must be a list"),
        ({"discriminating_slots": ["area"], "known_slots": [3]}, "expected a list of slot names"),
    ],
)
def test_bad_columns_raise_data_errors_naming_the_field(row, message):
    with pytest.raises(DataError, match=message):
        judge_one(ask("Which area?"), row)


def test_the_judge_is_not_consulted_without_a_question():
    # Rows with bad columns are never read when no completion asks anything.
    reward = ClarifyReward(VerifiableJudge())
    assert reward(prompts=["p"], completions=["no tags"], discriminating_slots=[None]) == [0.0]


# One question per slot that must read as that slot and nothing else.
SLOT_QUESTIONS = {
    "food": "What kind of food would you like?",
    "pricerange": "What price range are you looking for?",
    "area": "Which part of town do you prefer?",
    "name": "Do you have a specific restaurant in mind?",
    "type": "Would you prefer a guesthouse or a hotel?",
    "stars": "How many stars should it have?",
    "parking": "Do you need parking?",
    "internet": "Do you need wifi?",
    "people": "How many people is the booking for?",
    "day": "Which day would you like?",
    "time": "What time should the table be for?",
    "stay": "How many nights?",
    "departure": "Where will you be leaving from?",
    "destination": "What is your destination?",
    "leaveAt": "What time do you want to leave?",
    "arriveBy": "By what time do you need to arrive?",
    "department": "Which department do you need?",
}


def test_every_constraint_slot_has_cues():
    assert set(SLOT_CUES) == set(CONSTRAINT_SLOTS) == set(SLOT_QUESTIONS)


@pytest.mark.parametrize("slot, question", sorted(SLOT_QUESTIONS.items()))
def test_asked_slots_reads_each_slot_alone(slot, question):
    assert asked_slots(question) == {slot}


def test_asked_slots_value_choices():
    assert asked_slots("The north or the city centre?") == {"area"}  # a synonym of centre
    assert asked_slots("Would you like the north?") == frozenset()  # one value is no choice
    assert asked_slots("Monday or Tuesday?") == {"day"}
    food = {"food": ["north american", "british"]}
    # "north american" is read once, as food, not as the north
    assert asked_slots("North American or British?", food) == {"food"}
    assert asked_slots("North American or British, in the south?", food) == {"food"}
    assert asked_slots("North American or the north?", food) == frozenset()


def test_registry_instance_is_shareable():
    reward = REWARD_FUNCTIONS["clarify_verifiable"]
    assert reward.__name__ == "clarify_verifiable"
    copy = pickle.loads(pickle.dumps(reward))  # TRL may ship reward functions to workers
    assert copy(prompts=["p"], completions=[ask("Which area?")], discriminating_slots=[["area"]]) == [1.0]


def test_where_asking_is_not_needed_a_question_scores_zero_and_acting_scores_one():
    """Act-here rows (ask_needed false): the judge is not consulted; over-asking is penalised."""
    from pipelines.rewards import ClarifyReward, VerifiableJudge

    reward = ClarifyReward(VerifiableJudge())
    ask = "<think>Unsure.</think><clarify>Which area of town would you like?</clarify>"
    act = '<think>All set.</think><tool_call>{"name": "query_hotel", "arguments": {"area": "north"}}</tool_call>'
    columns = {"discriminating_slots": [["area"], [], []], "candidate_values": ['{"area": ["north", "south"]}', "{}", "{}"],
               "known_slots": [[], ["area"], ["area"]], "ask_needed": [True, False, False]}
    logged = {}
    scores = reward(prompts=["p"] * 3, completions=[ask, ask, act], log_metric=logged.__setitem__, **columns)
    assert scores == [1.0, 0.0, 1.0]
    assert [v.reason for v in reward.verdicts(["p"] * 3, [ask, ask, "<think>Hmm.</think>"], **columns)] == [
        "targets_discriminating_slot", "needless_question", "malformed"]
    assert logged["clarify_verifiable/over_asking"] == 0.5
