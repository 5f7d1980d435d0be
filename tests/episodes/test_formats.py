"""The three agent output formats: well-formed outputs parse into the right actions, every
kind of malformed output is refused with a reason, and rendering round-trips."""

from __future__ import annotations

import json
import re

import pytest

from pipelines.env.tools import TOOL_NAMES
from pipelines.episodes import (
    END_TOKEN,
    AgentAction,
    FunctionCallingFormat,
    Malformed,
    ReActFormat,
    SpeakRLFormat,
    get_format,
)

think, clarify, respond, tool_call, end = (
    AgentAction.think,
    AgentAction.clarify,
    AgentAction.respond,
    AgentAction.tool_call,
    AgentAction.end,
)

SPEAKRL = SpeakRLFormat()
REACT = ReActFormat()
FUNCTIONS = FunctionCallingFormat()


def malformed(result, *words: str) -> str:
    assert isinstance(result, Malformed), f"expected Malformed, got {result!r}"
    for word in words:
        assert word in result.reason, f"{word!r} not in {result.reason!r}"
    return result.reason


# --------------------------------------------------------------------------------------
# SpeakRL
# --------------------------------------------------------------------------------------

SPEAKRL_OK = [
    ("<think>The area is missing.</think><clarify>Which area would you like?</clarify>",
     (think("The area is missing."), clarify("Which area would you like?"))),
    ("<clarify>Which day?</clarify>", (clarify("Which day?"),)),
    ('<think>Search.</think>\n<tool_call>\n{"name": "query_hotel", "arguments": {"area": "north", "stars": "4"}}\n</tool_call>',
     (think("Search."), tool_call("query_hotel", {"area": "north", "stars": "4"}))),
    ('<tool_call>{"name": "query_train", "arguments": {}}</tool_call>', (tool_call("query_train", {}),)),
    ("<think>Done.</think> The acorn guest house is in the north.", (think("Done."), respond("The acorn guest house is in the north."))),
    ("Your reference is AB12CD34. Goodbye! <end>", (respond("Your reference is AB12CD34. Goodbye!"), end())),
    ("<think>All done.</think><end>", (think("All done."), end())),
    ("  <end>  ", (end(),)),
    ("<think></think>Hello", (think(""), respond("Hello"))),  # an empty think is still a think
    ("Prices are < 5 pounds.", (respond("Prices are < 5 pounds."),)),  # "<" is not a tag
]


@pytest.mark.parametrize("text, expected", SPEAKRL_OK)
def test_speakrl_parses_well_formed_outputs(text, expected):
    assert SPEAKRL.parse(text) == expected


SPEAKRL_BAD = [
    # missing close tags
    ("<think>I should ask<clarify>Which area?</clarify>", ["<think> is not closed", "found <clarify>"]),
    ("<clarify>Which area?", ["<clarify> is not closed", "ends first"]),
    ('<tool_call>{"name": "query_hotel", "arguments": {}}', ["<tool_call> is not closed"]),
    ("<think>hmm</think><clarify>Which area?</think>", ["<clarify> is not closed"]),
    # two actions
    ("<clarify>Which area?</clarify><clarify>Which day?</clarify>", ["more than one action"]),
    ('<clarify>Which area?</clarify><tool_call>{"name": "query_hotel", "arguments": {}}</tool_call>', ["more than one action"]),
    ('<tool_call>{"name": "a", "arguments": {}}</tool_call>\n<tool_call>{"name": "b", "arguments": {}}</tool_call>', ["more than one action"]),
    # bad JSON or shape in a tool call
    ('<tool_call>{"name": "query_hotel", "arguments": {"area": "north"}</tool_call>', ["not valid JSON"]),
    ("<tool_call>query_hotel(area='north')</tool_call>", ["not valid JSON"]),
    ('<tool_call>{"name": "query_hotel"}</tool_call>', ['"arguments"']),
    ('<tool_call>{"name": "query_hotel", "arguments": "area=north"}</tool_call>', ['"arguments" must be a JSON object']),
    ('<tool_call>{"name": "query_hotel", "parameters": {}}</tool_call>', ["must be a JSON object {"]),
    ('<tool_call>{"name": "", "arguments": {}}</tool_call>', ["tool name"]),
    ('<tool_call>["query_hotel", {}]</tool_call>', ["must be a JSON object"]),
    # text outside tags
    ("Sure! <clarify>Which area?</clarify>", ["text outside tags"]),
    ("<clarify>Which area?</clarify> Thanks.", ["text outside tags", "clarify"]),
    ('<tool_call>{"name": "query_hotel", "arguments": {}}</tool_call> Let me check.', ["text outside tags", "tool call"]),
    ("Let me think. <think>hidden</think> Hello", ["text outside tags"]),
    # misplaced or foreign tags
    ("<think>a</think><think>b</think>Hello", ["<think> may only come once"]),
    ("Hello</clarify>", ["text outside tags"]),
    ("</think>Hello", ["</think> without a matching <think>"]),
    ('<tool_response>{"count": 0}</tool_response>', ["must not write <tool_response>"]),
    ("<clarify>Which day?</clarify><end>", [f"{END_TOKEN} may only follow a plain response"]),
    ("Goodbye <end> see you", [f"nothing may follow {END_TOKEN}"]),
    ("<end> Goodbye", [f"nothing may follow {END_TOKEN}"]),
    # empty
    ("", ["empty output"]),
    ("   \n ", ["empty output"]),
    ("<think>Only thinking.</think>", ["nothing after </think>"]),
    ("<clarify>  </clarify>", ["empty <clarify>"]),
]


@pytest.mark.parametrize("text, words", SPEAKRL_BAD)
def test_speakrl_refuses_malformed_outputs(text, words):
    result = SPEAKRL.parse(text)
    malformed(result, *words)
    assert result.raw == text


def test_speakrl_takes_no_structured_tool_calls():
    call = {"type": "function", "function": {"name": "query_hotel", "arguments": "{}"}}
    malformed(SPEAKRL.parse("", (call,)), "<tool_call>")


def test_speakrl_system_prompt_lists_the_tools_and_the_tags():
    prompt = SPEAKRL.system_prompt("TASK")
    assert prompt.startswith("TASK")
    assert all(name in prompt for name in TOOL_NAMES)
    assert all(tag in prompt for tag in ("<think>", "<clarify>", "<tool_call>", END_TOKEN))
    assert SPEAKRL.tools is None  # the schemas are in the prompt, not sent out of band


# --------------------------------------------------------------------------------------
# ReACT (JOSH)
# --------------------------------------------------------------------------------------

# JOSH appendix C, verbatim: what a well-formed turn must match.
JOSH_REGEX = re.compile(r"^PLAN .+? <COMMAND_END> (APICALL ({.*?}) <COMMAND_END>|SPEAK .+? <COMMAND_END>)$")

REACT_OK = [
    # JOSH Table 10, example 1 (no space between <COMMAND_END> and APICALL, as printed)
    ('PLAN I will look up a hotel using query_hotel. <COMMAND_END>APICALL {"name": "query_hotel", "parameters": '
     '{"name": "hamilton lodge", "area": "north", "parking": "yes"}} <COMMAND_END>',
     (think("I will look up a hotel using query_hotel."), tool_call("query_hotel", {"name": "hamilton lodge", "area": "north", "parking": "yes"}))),
    # example 2, one command per line as the prompt asks
    ("PLAN I need the number of people. <COMMAND_END>\nSPEAK Sure! How many people will be coming? <COMMAND_END>",
     (think("I need the number of people."), respond("Sure! How many people will be coming?"))),
    # exactly the regex's spacing
    ('PLAN Search. <COMMAND_END> APICALL {"name": "query_train", "parameters": {"day": "tuesday", "leaveAt": ""}} <COMMAND_END>',
     (think("Search."), tool_call("query_train", {"day": "tuesday", "leaveAt": ""}))),
    ("PLAN Done. <COMMAND_END> SPEAK Your reference is X1. Bye! <end> <COMMAND_END>", (think("Done."), respond("Your reference is X1. Bye!"), end())),
    ("PLAN Done. <COMMAND_END> SPEAK <end> <COMMAND_END>", (think("Done."), end())),
]


@pytest.mark.parametrize("text, expected", REACT_OK)
def test_react_parses_well_formed_outputs(text, expected):
    assert REACT.parse(text) == expected


def test_react_accepts_what_the_josh_regex_accepts():
    for text in ("PLAN a <COMMAND_END> SPEAK b <COMMAND_END>", 'PLAN a <COMMAND_END> APICALL {"name": "x", "parameters": {}} <COMMAND_END>'):
        assert JOSH_REGEX.match(text)
        assert not isinstance(REACT.parse(text), Malformed)


REACT_BAD = [
    ("SPEAK Hello <COMMAND_END>", ["must start with PLAN"]),
    ("I will search. PLAN x <COMMAND_END> SPEAK Hello <COMMAND_END>", ["must start with PLAN"]),
    ("plan x <COMMAND_END> SPEAK Hello <COMMAND_END>", ["must start with PLAN"]),
    ("PLAN x <COMMAND_END> SPEAK Hello", ["must each end with <COMMAND_END>"]),
    ("PLAN x SPEAK Hello <COMMAND_END>", ["must each end with <COMMAND_END>"]),
    ("PLAN x <COMMAND_END>", ["must each end with <COMMAND_END>"]),
    ("PLAN x <COMMAND_END> Hello there <COMMAND_END>", ["followed by exactly one APICALL or SPEAK"]),
    ('PLAN x <COMMAND_END> APICALL {"name": "query_hotel", "parameters": {}} <COMMAND_END> SPEAK Found it <COMMAND_END>',
     ["more than one command"]),
    ("PLAN x <COMMAND_END> SPEAK Hi <COMMAND_END> SPEAK Again <COMMAND_END>", ["more than one command"]),
    ("PLAN x <COMMAND_END> SPEAK Hello <COMMAND_END> and more", ["text after the last <COMMAND_END>"]),
    ('PLAN x <COMMAND_END> APICALL {"name": "query_hotel", "parameters": {"area": "north"} <COMMAND_END>', ["not valid JSON"]),
    ("PLAN <COMMAND_END> SPEAK Hello <COMMAND_END>", ["does not match"]),  # an empty plan
    ('PLAN x <COMMAND_END> APICALL {"name": "query_hotel", "parameters": {"area": north}} <COMMAND_END>', ["not valid JSON"]),
    ('PLAN x <COMMAND_END> APICALL {"name": "query_hotel", "arguments": {}} <COMMAND_END>', ['"parameters"']),
    ("PLAN x <COMMAND_END> SPEAK Bye <end> really <COMMAND_END>", [f"{END_TOKEN} may only come at the very end"]),
    ("", ["must start with PLAN"]),
]


@pytest.mark.parametrize("text, words", REACT_BAD)
def test_react_refuses_malformed_outputs(text, words):
    malformed(REACT.parse(text), *words)


def test_react_hands_tool_results_back_as_apireturn():
    message = REACT.observation_message(tool_call("query_hotel", {}), {"count": 0, "results": []})
    assert message == {"role": "user", "content": 'APIRETURN {"count": 0, "results": []}'}


# --------------------------------------------------------------------------------------
# Function calling
# --------------------------------------------------------------------------------------


def api_call(name, arguments, call_id=None):
    raw = {"type": "function", "function": {"name": name, "arguments": arguments}}
    return raw if call_id is None else {"id": call_id, **raw}


def test_function_calling_parses_structured_calls():
    calls = (api_call("query_hotel", '{"area": "north"}', "call_a"), api_call("query_train", {"day": "monday"}))
    assert FUNCTIONS.parse("", calls) == (
        tool_call("query_hotel", {"area": "north"}, "call_a"),
        tool_call("query_train", {"day": "monday"}),
    )
    # Content next to calls is hidden: the turn goes on, the user has not seen it.
    assert FUNCTIONS.parse("Let me look.", calls[:1]) == (think("Let me look."), tool_call("query_hotel", {"area": "north"}, "call_a"))
    assert FUNCTIONS.parse("", (api_call("query_train", ""),)) == (tool_call("query_train", {}),)


def test_function_calling_parses_content_as_the_response():
    assert FUNCTIONS.parse("Which area?") == (respond("Which area?"),)
    assert FUNCTIONS.parse("Bye! <end>") == (respond("Bye!"), end())
    assert FUNCTIONS.parse("<end>") == (end(),)


def test_function_calling_reads_qwen_tool_call_blocks_from_a_local_model():
    text = 'Searching.\n<tool_call>\n{"name": "query_hotel", "arguments": {"area": "north"}}\n</tool_call>'
    assert FUNCTIONS.parse(text) == (think("Searching."), tool_call("query_hotel", {"area": "north"}))


FUNCTIONS_BAD = [
    ("", (api_call("query_hotel", '{"area": "north"'),), ["not valid JSON"]),
    ("", (api_call("query_hotel", "[1, 2]"),), ["must be a JSON object"]),
    ("", ({"type": "function", "function": {"arguments": "{}"}},), ['"function": {"name"']),
    ("", ({"name": "query_hotel"},), ['"function": {"name"']),
    ("Done <end>", (api_call("query_hotel", "{}"),), [f"{END_TOKEN} cannot come with tool calls"]),
    ('<tool_call>{"name": "query_hotel", "arguments": {}}', (), ["<tool_call> is not closed"]),
    ('<tool_call>{"name": "query_hotel", "arguments": {</tool_call>', (), ["not valid JSON"]),
    ("", (), ["empty response"]),
    ("Bye <end> now", (), [f"{END_TOKEN} may only come at the very end"]),
]


@pytest.mark.parametrize("text, calls, words", FUNCTIONS_BAD)
def test_function_calling_refuses_malformed_outputs(text, calls, words):
    malformed(FUNCTIONS.parse(text, calls), *words)


def test_function_calling_history_keeps_calls_structured_and_answers_them_by_id():
    actions = (think("Looking."), tool_call("query_hotel", {"area": "north"}, "c1"))
    message = FUNCTIONS.assistant_message("Looking.", (), actions)
    assert message == {
        "role": "assistant",
        "content": "Looking.",
        "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "query_hotel", "arguments": {"area": "north"}}}],
    }
    observation = FUNCTIONS.observation_message(actions[1], {"count": 1})
    assert observation == {"role": "tool", "tool_call_id": "c1", "name": "query_hotel", "content": '{"count": 1}'}
    assert [t["function"]["name"] for t in FUNCTIONS.tools] == list(TOOL_NAMES)


# --------------------------------------------------------------------------------------
# Rendering
# --------------------------------------------------------------------------------------

ROUND_TRIPS = {
    "speakrl": [
        (think("Missing the day."), clarify("Which day?")),
        (tool_call("book_hotel", {"name": "acorn guest house", "people": 2, "day": "monday", "stay": 3}),),
        (think("ok"), respond("It is in the north.")),
        (respond("Reference ABCD1234. Goodbye."), end()),
        (end(),),
    ],
    "react": [
        (think("Search."), tool_call("query_hotel", {"area": "north"})),
        (think("Tell."), respond("It is in the north.")),
        (think("Done."), respond("Bye."), end()),
        (think("Done."), end()),
    ],
    "function_calling": [
        (tool_call("query_hotel", {"area": "north"}, "c1"), tool_call("query_train", {}, "c2")),
        (think("Searching."), tool_call("query_hotel", {}, "c3")),
        (respond("Bye."), end()),
        (respond("Which area?"),),
    ],
}


@pytest.mark.parametrize("name", list(ROUND_TRIPS))
def test_render_then_parse_gives_the_actions_back(name):
    fmt = get_format(name)
    for actions in ROUND_TRIPS[name]:
        assert fmt.parse(*fmt.render(actions)) == actions


def test_rendering_refuses_what_a_format_cannot_express():
    with pytest.raises(ValueError):
        REACT.render((clarify("Which area?"),))  # ReACT has no clarification command
    with pytest.raises(ValueError):
        SPEAKRL.render((tool_call("a"), tool_call("b")))  # one tool call per output
    with pytest.raises(ValueError):
        SPEAKRL.render((respond("a"), think("b")))  # think comes first
    with pytest.raises(ValueError):
        FUNCTIONS.render((think("only thinking"),))


def test_react_rendering_supplies_a_plan_when_there_is_no_think():
    text, _ = REACT.render((respond("Hello."),))
    assert JOSH_REGEX.match(text.replace("\n", " "))


def test_get_format_knows_the_three_formats():
    assert [get_format(n).name for n in ("speakrl", "react", "function_calling")] == ["speakrl", "react", "function_calling"]
    with pytest.raises(ValueError, match="unknown agent format"):
        get_format("xml")


def test_action_arguments_serialise_as_json():
    action = tool_call("book_hotel", {"name": "acorn", "people": 2})
    assert json.loads(action.arguments_json) == {"name": "acorn", "people": 2}
    with pytest.raises(ValueError):
        AgentAction("shout", "hi")
