"""Issue 19 items 2 and 3 against the local fault-injecting server: capability probing during an
outage and after unrelated 400s, and cache hits that return exactly what the live call did."""

from __future__ import annotations

import json

from pipelines.llm import CompletionRequest, LLMClient, ResponseCache, SamplingParams
from pipelines.llm.testing.fake_server import CALL_TOOL, FaultPlan

from .helpers import fast_config, requests_for, user

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "seed": {"type": "integer"}},
    "required": ["answer", "seed"],
    "additionalProperties": False,
}
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "book_restaurant",
            "parameters": {"type": "object", "properties": {"time": {"type": "string"}, "day": {"type": "string"}}},
        },
    }
]


def test_an_outage_does_not_serialise_schema_calls_behind_the_probe(make_server):
    # Every request fails (500) while the client does not know yet whether response_format works.
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)), latency_s=0.05)
    client = LLMClient(fast_config(server.base_url, max_concurrency=8, max_retries=1))

    results = client.complete_many_sync(requests_for([f"q{i}" for i in range(16)], response_schema=SCHEMA))

    assert all(not r.ok and r.reason == "server_error" for r in results)
    assert server.stats.requests == 16 * 2
    # One probe call goes first; the other 15 then run side by side within the bound (before: 1).
    assert 1 < server.stats.max_in_flight <= 8
    assert client.supports_response_format is None, "an outage says nothing about the feature"


def test_a_context_length_400_does_not_switch_structured_output_off(make_server):
    server = make_server(FaultPlan(rate=1.0, kinds=("context_length_400",)))
    client = LLMClient(fast_config(server.base_url))

    failed = client.complete_sync(user("a long one"), "judge", SamplingParams(), seed=0, response_schema=SCHEMA)

    assert not failed.ok and failed.reason == "rejected" and "context length" in failed.last_error
    assert server.stats.requests == 1, "not retried, not re-sent without response_format"
    assert client.supports_response_format is None
    server.faults = FaultPlan()
    ok = client.complete_sync(user("short"), "judge", SamplingParams(), seed=0, response_schema=SCHEMA).unwrap()
    assert ok.parsed[0]["seed"] == 0
    assert "response_format" in server.stats.bodies[-1] and client.supports_response_format is True


def test_an_unsupported_response_format_is_still_probed_once(make_server):
    server = make_server(response_format_mode="reject", latency_s=0.02)
    client = LLMClient(fast_config(server.base_url, max_concurrency=8))

    results = client.complete_many_sync(requests_for([f"q{i}" for i in range(12)], response_schema=SCHEMA))

    assert all(r.ok for r in results)
    assert server.stats.response_format_rejections == 1 and server.stats.requests == 13
    assert 1 < server.stats.max_in_flight <= 8


def test_a_cache_hit_returns_exactly_what_the_live_call_returned(make_server, tmp_path):
    # Arguments as an object with unsorted keys (some servers send objects, not strings).
    server = make_server(tool_arguments={"time": "19:30", "day": "friday", "people": 2})
    requests = [
        CompletionRequest(user(f"{CALL_TOOL}: book it"), "synthesizer", SamplingParams(), seed=5, tools=TOOLS),
        CompletionRequest(user("a plain answer"), "judge", SamplingParams(), seed=6, response_schema=SCHEMA),
    ]
    live = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path / "cache")).complete_many_sync(requests)
    sent = server.stats.requests

    cached = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path / "cache")).complete_many_sync(requests)

    assert server.stats.requests == sent and all(c.cached for c in cached)
    for before, after in zip(live, cached):
        # json.dumps without sort_keys is how the stages serialise tool calls into prompts.
        assert json.dumps(after.tool_calls) == json.dumps(before.tool_calls)
        assert json.dumps(after.parsed) == json.dumps(before.parsed) and after.texts == before.texts
    call = cached[0].tool_calls[0][0]
    assert list(call) == ["id", "type", "function"] and list(call["function"]) == ["name", "arguments"]
    assert list(call["function"]["arguments"]) == ["time", "day", "people"]
