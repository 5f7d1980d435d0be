"""LLMClient against a real local HTTP server (FakeOpenAIServer) with injected faults."""

from __future__ import annotations

import asyncio
import json
import logging
import random
import uuid

import pytest

from pipelines.errors import ConfigError
from pipelines.llm import (
    Completion,
    CompletionRequest,
    Failure,
    LLMClient,
    LLMFailure,
    ResponseCache,
    SamplingParams,
    unwrap,
)
from pipelines.llm.cache import cache_key
from pipelines.llm.testing.fake_server import CALL_TOOL, FaultPlan

from .helpers import fast_config, requests_for, user

PROMPTS = [f"question {i}: is there a cheap hotel in the north?" for i in range(20)]
# The fault each server-side injection should show up as, on the client's side.
FAULT_TO_REASON = {
    "timeout": "timeout",
    "http_500": "server_error",
    "http_429": "rate_limit",
    "truncated": "malformed_response",
}
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string"}, "seed": {"type": "integer"}},
    "required": ["answer", "seed"],
    "additionalProperties": False,
}


def texts(results: list[Completion | Failure]) -> list[tuple[str, ...]]:
    return [unwrap(r).texts for r in results]


# ---------------------------------------------------------------------------
# retries and failures
# ---------------------------------------------------------------------------


def test_retries_recover_and_results_equal_a_fault_free_run(make_server):
    clean = make_server()
    faulty = make_server(FaultPlan(rate=0.2, kinds=tuple(FAULT_TO_REASON)), hang_s=3.0)

    expected = LLMClient(fast_config(clean.base_url)).complete_many_sync(requests_for(PROMPTS))
    client = LLMClient(fast_config(faulty.base_url, timeout_s=1.0))
    results = client.complete_many_sync(requests_for(PROMPTS))

    assert texts(results) == texts(expected)
    injected = faulty.stats.faults
    assert set(injected) == set(FAULT_TO_REASON), "every fault kind must have been exercised"
    usage = client.accounting.role("judge")
    assert dict(usage.retries) == {FAULT_TO_REASON[kind]: count for kind, count in injected.items()}
    assert usage.requests == faulty.stats.requests == len(PROMPTS) + sum(injected.values())
    assert usage.calls == len(PROMPTS) and not usage.failures
    assert sum(r.attempts for r in results) == usage.requests


@pytest.mark.parametrize("kind", sorted(FAULT_TO_REASON))
def test_a_call_failing_after_max_retries_returns_an_explicit_failure(make_server, kind):
    server = make_server(FaultPlan(rate=1.0, kinds=(kind,)), hang_s=1.0)
    # A short timeout only where the server hangs: elsewhere a slow reply must not be a timeout.
    timeout_s = 0.3 if kind == "timeout" else 2.0
    client = LLMClient(fast_config(server.base_url, max_retries=2, timeout_s=timeout_s))

    result = client.complete_sync(user("hello"), "synthesizer", SamplingParams(), seed=1)

    reason = FAULT_TO_REASON[kind]
    assert isinstance(result, Failure)
    assert (result.role, result.reason, result.attempts) == ("synthesizer", reason, 3)
    assert result.last_error
    assert server.stats.requests == 3
    usage = client.accounting.role("synthesizer")
    assert dict(usage.retries) == {reason: 2} and dict(usage.failures) == {reason: 1}
    with pytest.raises(LLMFailure) as raised:
        unwrap(result)
    assert raised.value.failure is result and reason in str(raised.value)


def test_a_rejected_request_is_not_retried(make_server):
    server = make_server(FaultPlan(rate=1.0, kinds=("echo_auth_401",)))
    client = LLMClient(fast_config(server.base_url))

    result = client.complete_sync(user("hello"), "judge", SamplingParams(), seed=1)

    assert isinstance(result, Failure) and result.reason == "rejected" and result.attempts == 1
    assert server.stats.requests == 1
    assert client.accounting.as_dict()["total"]["retries"] == 0


def test_backoff_is_jittered_exponential_and_capped(server):
    client = LLMClient(
        fast_config(server.base_url, backoff_base_s=0.1, backoff_max_s=1.0), rng=random.Random(0)
    )
    for retry in range(1, 9):
        ceiling = min(1.0, 0.1 * 2 ** (retry - 1))
        delays = [client._backoff(retry, RuntimeError()) for _ in range(200)]
        assert all(0.0 <= d <= ceiling for d in delays)
        assert max(delays) > 0.8 * ceiling, "the jitter should span the whole window"


# ---------------------------------------------------------------------------
# concurrency, sync wrappers
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("limit", [1, 3])
def test_the_concurrency_limit_is_respected(make_server, limit):
    # Latency long against scheduling hiccups, so that `limit` requests really overlap.
    server = make_server(latency_s=0.2)
    client = LLMClient(fast_config(server.base_url, max_concurrency=limit))

    results = client.complete_many_sync(requests_for(PROMPTS[: 2 * limit + 1]))

    assert all(r.ok for r in results)
    assert server.stats.max_in_flight == limit


def test_sync_wrappers_work_repeatedly_and_refuse_a_running_loop(server):
    client = LLMClient(fast_config(server.base_url))
    # Each call runs in a new event loop; connections of the previous loop must not leak in.
    first = client.complete_sync(user("a"), "judge", SamplingParams(), seed=0).unwrap()
    second = client.complete_sync(user("a"), "judge", SamplingParams(), seed=0).unwrap()
    assert first.texts == second.texts

    async def inside_a_loop():
        with pytest.raises(RuntimeError, match="await"):
            client.complete_sync(user("a"), "judge", SamplingParams(), seed=0)
        async with client:
            return await client.complete(user("a"), "judge", SamplingParams(), seed=0)

    assert asyncio.run(inside_a_loop()).unwrap().texts == first.texts


def test_bad_arguments_are_programming_errors(server):
    client = LLMClient(fast_config(server.base_url))
    with pytest.raises(ValueError, match="unknown role"):
        client.complete_sync(user("a"), "jduge", SamplingParams(), seed=0)
    with pytest.raises(TypeError, match="seed"):
        client.complete_sync(user("a"), "judge", SamplingParams(), seed="0")
    with pytest.raises(ValueError, match="n: expected an integer >= 1, got 0"):
        client.complete_sync(user("a"), "judge", SamplingParams(), seed=0, n=0)
    with pytest.raises(ValueError, match="role"):
        client.complete_sync([{"content": "no role"}], "judge", SamplingParams(), seed=0)
    assert server.stats.requests == 0


# ---------------------------------------------------------------------------
# cache
# ---------------------------------------------------------------------------


def test_a_second_run_sends_zero_requests(server, tmp_path):
    requests = requests_for(PROMPTS[:10])
    first = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path / "cache"))
    first_results = first.complete_many_sync(requests)
    sent = server.stats.requests
    assert sent == 10 and not any(r.cached for r in first_results)

    cache = ResponseCache(tmp_path / "cache")
    second = LLMClient(fast_config(server.base_url), cache=cache)
    second_results = second.complete_many_sync(requests)

    assert server.stats.requests == sent
    assert texts(second_results) == texts(first_results)
    assert all(r.cached and r.attempts == 0 for r in second_results)
    usage = second.accounting.role("judge")
    assert (usage.calls, usage.cache_hits, usage.requests, usage.prompt_tokens) == (10, 10, 0, 0)
    assert cache.stats() == {"hits": 10, "misses": 0, "writes": 0}

    # Any change of a key field is a different request.
    second.complete_sync(requests[0].messages, "judge", SamplingParams(temperature=0.7), seed=0).unwrap()
    second.complete_sync(requests[0].messages, "judge", SamplingParams(), seed=1).unwrap()
    assert server.stats.requests == sent + 2


@pytest.mark.parametrize("n_mode", ["native", "ignore", "reject"])
def test_choices_and_seeds_never_collapse_into_one_cache_entry(make_server, tmp_path, n_mode):
    server = make_server(n_mode=n_mode)
    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(fast_config(server.base_url), cache=cache)
    sampling = SamplingParams(temperature=0.8)
    messages = user("suggest a hotel")

    three = client.complete_sync(messages, "synthesizer", sampling, seed=10, n=3).unwrap()
    seed_10 = client.complete_sync(messages, "synthesizer", sampling, seed=10).unwrap()
    seed_11 = client.complete_sync(messages, "synthesizer", sampling, seed=11).unwrap()

    assert len(three.texts) == 3 and len(set(three.texts)) == 3
    assert seed_10.text != seed_11.text
    assert len(list(cache.directory.rglob("*.json"))) == 3
    if n_mode == "native":
        assert client.supports_n is True and three.seeds == (10,)
        assert server.stats.requests == 3  # one for all three choices, one per single seed
    else:
        # Fanned out: choice i is the answer for seed 10 + i, cached per seed and reused.
        assert client.supports_n is False and three.seeds == (10, 11, 12)
        assert three.texts[:2] == (seed_10.text, seed_11.text) and seed_10.cached and seed_11.cached
        assert server.stats.requests == 1 + 3  # the probe that found n unsupported, then 3 seeds

    # A fresh client (which does not know what the server supports) re-runs from the cache alone.
    sent = server.stats.requests
    fresh = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path / "cache"))
    again = fresh.complete_sync(messages, "synthesizer", sampling, seed=10, n=3).unwrap()
    assert again.cached and again.texts == three.texts
    assert server.stats.requests == sent


def test_concurrent_calls_discover_a_missing_n_with_a_single_probe(make_server):
    server = make_server(n_mode="ignore", latency_s=0.01)
    client = LLMClient(fast_config(server.base_url, max_concurrency=8))

    results = client.complete_many_sync(requests_for(PROMPTS[:12], sampling=SamplingParams(temperature=1.0), n=3))

    assert all(len(r.unwrap().texts) == 3 for r in results)
    assert server.stats.requests == 1 + 12 * 3
    assert sum(r.attempts for r in results) == server.stats.requests


def test_failures_are_not_cached(make_server, tmp_path):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(fast_config(server.base_url, max_retries=1), cache=cache)
    assert isinstance(client.complete_sync(user("a"), "judge", SamplingParams(), seed=0), Failure)
    assert not list(tmp_path.rglob("*.json"))


# ---------------------------------------------------------------------------
# structured output
# ---------------------------------------------------------------------------


def test_schema_replies_are_validated_and_parsed(server):
    client = LLMClient(fast_config(server.base_url))

    result = client.complete_sync(user("a hotel?"), "synthesizer", SamplingParams(), seed=3, response_schema=SCHEMA)

    completion = result.unwrap()
    assert completion.parsed == (json.loads(completion.text),) and completion.parsed[0]["seed"] == 3
    sent_format = server.stats.bodies[-1]["response_format"]
    assert sent_format["type"] == "json_schema" and sent_format["json_schema"]["schema"] == SCHEMA
    assert client.supports_response_format is True


def test_invalid_replies_are_repaired_and_counted(make_server):
    clean = make_server()
    faulty = make_server(FaultPlan(rate=0.25, kinds=("invalid_content", "wrong_schema")))
    requests = requests_for(PROMPTS[:8], role="synthesizer", response_schema=SCHEMA)

    expected = LLMClient(fast_config(clean.base_url)).complete_many_sync(requests)
    # One request at a time: faults follow the server's request counter (4th, 8th), so with
    # requests in flight together a repair could land on the 8th and fail again (seen on a
    # loaded machine); in order, each repair is the request after its fault.
    client = LLMClient(fast_config(faulty.base_url, repair_retries=1, max_concurrency=1))
    results = client.complete_many_sync(requests)

    assert [r.unwrap().parsed for r in results] == [r.unwrap().parsed for r in expected]
    injected = sum(faulty.stats.faults.values())
    assert injected == 2
    usage = client.accounting.role("synthesizer")
    assert usage.repairs == sum(r.repairs for r in results) == injected
    assert usage.requests == len(requests) + injected and not usage.retries and not usage.failures
    # A repair request shows the model its invalid reply and what is wrong with it.
    repairs = [b for b in faulty.stats.bodies if len(b["messages"]) == 3]
    assert len(repairs) == injected
    for body in repairs:
        invalid_reply = body["messages"][1]["content"]
        assert invalid_reply in ('{"answer": "cut off', json.dumps({"answer": 42, "seed": body["seed"]}))
    errors = " ".join(r["messages"][2]["content"] for r in repairs)
    assert "not valid JSON" in errors and "42 is not of type 'string'" in errors


def test_persistently_invalid_output_fails_after_the_repairs(make_server, tmp_path):
    server = make_server(FaultPlan(rate=1.0, kinds=("wrong_schema",)))
    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(fast_config(server.base_url, repair_retries=2), cache=cache)

    result = client.complete_sync(user("a"), "synthesizer", SamplingParams(), seed=0, response_schema=SCHEMA)

    assert isinstance(result, Failure)
    assert (result.reason, result.attempts) == ("invalid_output", 3)
    assert result.last_error.endswith("answer: 42 is not of type 'string'")
    usage = client.accounting.role("synthesizer")
    assert usage.repairs == 2 and dict(usage.failures) == {"invalid_output": 1}
    assert not list(tmp_path.rglob("*.json")), "a failure must not be cached"


def test_a_rejected_response_format_falls_back_to_prompt_instructions_once(make_server):
    server = make_server(response_format_mode="reject")
    client = LLMClient(fast_config(server.base_url))

    first = client.complete_sync(user("first"), "judge", SamplingParams(), seed=0, response_schema=SCHEMA)
    second = client.complete_sync(user("second"), "judge", SamplingParams(), seed=0, response_schema=SCHEMA)

    assert ": first\n" in first.unwrap().parsed[0]["answer"]
    assert ": second\n" in second.unwrap().parsed[0]["answer"]
    assert client.supports_response_format is False
    assert server.stats.response_format_rejections == 1 and server.stats.requests == 3
    last = server.stats.bodies[-1]
    assert "response_format" not in last and "JSON schema" in last["messages"][-1]["content"]


def test_concurrent_calls_discover_a_rejected_response_format_once(make_server):
    server = make_server(response_format_mode="reject", latency_s=0.01)
    client = LLMClient(fast_config(server.base_url, max_concurrency=8))

    results = client.complete_many_sync(requests_for(PROMPTS[:12], response_schema=SCHEMA))

    assert all(r.ok for r in results)
    assert server.stats.response_format_rejections == 1 and server.stats.requests == 13


def test_prompt_mode_never_sends_response_format(server):
    client = LLMClient(fast_config(server.base_url, structured_output="prompt"))
    client.complete_sync(user("x"), "judge", SamplingParams(), seed=0, response_schema=SCHEMA).unwrap()
    assert "response_format" not in server.stats.bodies[-1]


def test_an_invalid_schema_is_a_programming_error(server):
    client = LLMClient(fast_config(server.base_url))
    with pytest.raises(Exception, match="is not valid under any of the given schemas|is not of type"):
        client.complete_sync(user("x"), "judge", SamplingParams(), seed=0, response_schema={"type": 12})
    assert server.stats.requests == 0


# ---------------------------------------------------------------------------
# function calling
# ---------------------------------------------------------------------------

TOOLS = [
    {
        "type": "function",
        "function": {
            "name": "query_hotel",
            "description": "Search hotels.",
            "parameters": {"type": "object", "properties": {"area": {"type": "string"}}},
        },
    },
    {"type": "function", "function": {"name": "book_taxi", "parameters": {"type": "object", "properties": {}}}},
]


def test_tools_are_sent_and_tool_calls_read_back(server):
    client = LLMClient(fast_config(server.base_url))

    called = client.complete_sync(user(f"{CALL_TOOL}: a hotel?"), "judge", SamplingParams(), seed=4, tools=TOOLS).unwrap()
    plain = client.complete_sync(user("a hotel?"), "judge", SamplingParams(), seed=4, tools=TOOLS).unwrap()
    untooled = client.complete_sync(user(f"{CALL_TOOL}: a hotel?"), "judge", SamplingParams(), seed=4).unwrap()

    # A reply with tool_calls and null content is a reply, not a malformed one.
    assert called.text == "" and called.attempts == 1 and not client.accounting.role("judge").retries
    [[call]] = called.tool_calls
    assert call["type"] == "function" and call["id"].startswith("call_")
    assert call["function"] == {"name": "query_hotel", "arguments": "{}"}  # arguments as sent: a JSON string
    assert plain.text.startswith("echo ") and plain.tool_calls == ((),)
    assert untooled.text.startswith("echo ") and untooled.tool_calls == ((),)
    # Server side: the tools went in the body only when given.
    with_tools, _, without_tools = server.stats.bodies
    assert with_tools["tools"] == TOOLS and "tools" not in without_tools
    assert server.stats.tool_requests == 2


def test_tool_calls_per_choice_and_determinism(make_server):
    server = make_server(n_mode="ignore")
    client = LLMClient(fast_config(server.base_url))
    messages = user(f"{CALL_TOOL} now")

    three = client.complete_sync(messages, "judge", SamplingParams(temperature=1.0), seed=7, n=3, tools=TOOLS).unwrap()
    again = client.complete_sync(messages, "judge", SamplingParams(temperature=1.0), seed=8, tools=TOOLS).unwrap()

    assert three.seeds == (7, 8, 9) and three.texts == ("", "", "")
    ids = [calls[0]["id"] for calls in three.tool_calls]
    assert len(set(ids)) == 3 and again.tool_calls[0][0]["id"] == ids[1]


def test_a_tool_call_history_is_accepted_and_sent_in_openai_form(server):
    client = LLMClient(fast_config(server.base_url))
    # The form FunctionCallingFormat keeps its history in: arguments as objects.
    history = [
        {"role": "system", "content": "be helpful"},
        {"role": "user", "content": f"{CALL_TOOL} please"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "call_1", "type": "function", "function": {"name": "query_hotel", "arguments": {"area": "north"}}},
                {"id": "call_2", "type": "function", "function": {"name": "book_taxi", "arguments": "{}"}},
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "name": "query_hotel", "content": '{"count": 0}'},
        {"role": "tool", "tool_call_id": "call_2", "name": "book_taxi", "content": '{"error": "x"}'},
    ]

    result = client.complete_sync(history, "judge", SamplingParams(), seed=0, tools=TOOLS).unwrap()

    # The fake model answers a tool result in text.
    assert result.text.startswith("echo ") and result.tool_calls == ((),)
    sent = server.stats.bodies[-1]["messages"]
    assert sent[2]["tool_calls"][0]["function"]["arguments"] == json.dumps({"area": "north"})
    assert sent[2]["tool_calls"][1]["function"]["arguments"] == "{}"
    assert sent[2]["content"] is None and sent[3:] == history[3:]
    # An assistant message with tool calls needs no content at all.
    without_content = [history[1], {k: v for k, v in history[2].items() if k != "content"}, *history[3:]]
    assert client.complete_sync(without_content, "judge", SamplingParams(), seed=0, tools=TOOLS).ok


def test_the_request_body_is_what_the_sdks_create_sends(server):
    """The client posts the body itself (the SDK's ``create`` walks every message through a
    typed-dict transform that costs milliseconds per request): the server must get the same
    JSON as from ``chat.completions.create``, extra_body merged, headers included."""
    import openai

    history = [
        {"role": "system", "content": "be helpful"},
        {"role": "user", "content": f"{CALL_TOOL} please"},
        {"role": "assistant", "content": None, "tool_calls": [
            {"id": "call_1", "type": "function", "function": {"name": "query_hotel", "arguments": {"area": "north"}}}]},
        {"role": "tool", "tool_call_id": "call_1", "name": "query_hotel", "content": '{"count": 0}'},
    ]
    sampling = SamplingParams(temperature=0.7, max_tokens=32, top_p=0.9, stop=("###",), extra_body={"top_k": 50})
    client = LLMClient(fast_config(server.base_url))
    assert client.complete_sync(history, "judge", sampling, seed=3, tools=TOOLS).ok
    client.complete_sync(user("plain"), "judge", SamplingParams(), seed=4, n=2)
    ours = server.stats.bodies[-2:]
    header = server.stats.authorizations

    async def through_the_sdk(bodies):
        sdk = openai.AsyncOpenAI(api_key="EMPTY", base_url=server.base_url, max_retries=0)
        for body in bodies:
            body = dict(body)
            extra = {k: body.pop(k) for k in ("top_k",) if k in body}
            await sdk.chat.completions.create(**body, **({"extra_body": extra} if extra else {}))
        await sdk.close()

    server.reset_stats()
    asyncio.run(through_the_sdk(ours))
    assert server.stats.bodies == ours and ours[0]["top_k"] == 50 and ours[0]["stop"] == ["###"]
    assert server.stats.authorizations == header == {"Bearer EMPTY"}


def test_tool_calls_are_cached_and_tools_are_part_of_the_key(server, tmp_path):
    messages = user(f"{CALL_TOOL}: a taxi")
    first = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path / "cache"))
    called = first.complete_sync(messages, "judge", SamplingParams(), seed=1, tools=TOOLS).unwrap()
    untooled = first.complete_sync(messages, "judge", SamplingParams(), seed=1).unwrap()
    assert server.stats.requests == 2 and called.tool_calls[0] and not untooled.tool_calls[0]

    cache = ResponseCache(tmp_path / "cache")
    second = LLMClient(fast_config(server.base_url), cache=cache)
    requests = [
        CompletionRequest(messages, "judge", SamplingParams(), seed=1, tools=TOOLS),
        CompletionRequest(messages, "judge", SamplingParams(), seed=1),
    ]
    again, again_untooled = second.complete_many_sync(requests)

    assert server.stats.requests == 2, "a re-run sends no request"
    assert again.cached and again.tool_calls == called.tool_calls and again.text == ""
    assert again_untooled.cached and again_untooled.text == untooled.text and again_untooled.tool_calls == ((),)
    assert cache.stats() == {"hits": 2, "misses": 0, "writes": 0}

    # Other tools are another request.
    other = second.complete_sync(messages, "judge", SamplingParams(), seed=1, tools=TOOLS[1:]).unwrap()
    assert server.stats.requests == 3 and other.tool_calls[0][0]["function"]["name"] == "book_taxi"


def test_cache_keys_without_tools_are_unchanged(server, tmp_path):
    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(fast_config(server.base_url), cache=cache)
    client.complete_sync(user("a"), "judge", SamplingParams(), seed=3).unwrap()
    fields = {
        "endpoint": client.config.endpoint,
        "model": client.config.model,
        "messages": user("a"),
        "sampling": SamplingParams().as_dict(),
        "seed": 3,
        "n": 1,
    }
    [path] = cache.directory.rglob("*.json")
    assert path == cache.path_for(cache_key(fields))
    assert set(json.loads(path.read_text())["response"]) == {"texts", "parsed"}


def test_bad_tool_arguments_are_programming_errors(server):
    client = LLMClient(fast_config(server.base_url))
    with pytest.raises(ValueError, match="cannot be combined"):
        client.complete_sync(user("a"), "judge", SamplingParams(), seed=0, tools=TOOLS, response_schema=SCHEMA)
    with pytest.raises(ValueError, match="tools must be"):
        client.complete_sync(user("a"), "judge", SamplingParams(), seed=0, tools=[])
    with pytest.raises(ValueError, match=r"tools\[0\]"):
        client.complete_sync(user("a"), "judge", SamplingParams(), seed=0, tools=[{"name": "x"}])
    with pytest.raises(ValueError, match="tool call"):
        bad = [*user("a"), {"role": "assistant", "content": None, "tool_calls": [{"name": "x"}]}]
        client.complete_sync(bad, "judge", SamplingParams(), seed=0, tools=TOOLS)
    assert server.stats.requests == 0


# ---------------------------------------------------------------------------
# accounting and secrets
# ---------------------------------------------------------------------------


def test_tokens_and_cost_are_accounted_per_role(server):
    client = LLMClient(fast_config(server.base_url, price_in_per_1k=1.0, price_out_per_1k=2.0))

    judge = client.complete_sync(user("one two three"), "judge", SamplingParams(), seed=0).unwrap()
    synthesizer = client.complete_sync(user("four five"), "synthesizer", SamplingParams(), seed=0).unwrap()

    report = client.accounting.as_dict()
    for completion, prompt_tokens in ((judge, 3), (synthesizer, 2)):
        role = report["roles"][completion.role]
        completion_tokens = len(completion.text.split())  # the fake server counts words
        assert (role["prompt_tokens"], role["completion_tokens"]) == (prompt_tokens, completion_tokens)
        assert completion.usage.cost == pytest.approx((prompt_tokens * 1.0 + completion_tokens * 2.0) / 1000)
        assert role["cost"] == pytest.approx(completion.usage.cost)
    assert report["total"]["requests"] == 2 and report["total"]["cost"] == pytest.approx(
        judge.usage.cost + synthesizer.usage.cost
    )


def test_the_api_key_never_appears_in_files_logs_or_errors(make_server, tmp_path, monkeypatch, caplog):
    canary = f"sk-canary-{uuid.uuid4().hex}"
    monkeypatch.setenv("ASKFLOW_TEST_API_KEY", canary)
    caplog.set_level(logging.DEBUG)  # the openai/httpx debug logs included
    flaky = make_server(FaultPlan(rate=0.25, kinds=("http_500", "truncated")))
    echoing = make_server(FaultPlan(rate=1.0, kinds=("echo_auth_401",)))

    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(fast_config(flaky.base_url, api_key_env="ASKFLOW_TEST_API_KEY"), cache=cache)
    results = client.complete_many_sync(requests_for(PROMPTS[:8], response_schema=SCHEMA))
    rerun = client.complete_many_sync(requests_for(PROMPTS[:8], response_schema=SCHEMA))
    leaky = LLMClient(fast_config(echoing.base_url, api_key_env="ASKFLOW_TEST_API_KEY"))
    failure = leaky.complete_sync(user("x"), "judge", SamplingParams(), seed=0)

    # The key was really used (else this test would prove nothing) ...
    assert f"Bearer {canary}" in flaky.stats.authorizations | echoing.stats.authorizations
    assert all(r.ok for r in results) and all(r.cached for r in rerun)
    assert isinstance(failure, Failure) and "***" in failure.last_error
    with pytest.raises(LLMFailure) as raised:
        failure.unwrap()
    # ... and appears nowhere: files (cache, plus a report a stage would write), logs, reprs.
    (tmp_path / "report.json").write_text(
        json.dumps({"accounting": client.accounting.as_dict(), "failure": repr(failure), "error": str(raised.value)})
    )
    for path in tmp_path.rglob("*"):
        if path.is_file():
            assert canary.encode() not in path.read_bytes(), f"API key leaked into {path}"
    assert len(list(cache.directory.rglob("*.json"))) == 8
    assert canary not in caplog.text
    assert all(canary not in record.getMessage() for record in caplog.records)
    for text in (repr(client), repr(leaky), repr(client.config), str(raised.value), repr(failure)):
        assert canary not in text


def test_a_missing_key_variable_is_a_config_error_naming_it(server, monkeypatch):
    monkeypatch.delenv("ASKFLOW_ABSENT_KEY", raising=False)
    with pytest.raises(ConfigError, match="ASKFLOW_ABSENT_KEY"):
        LLMClient(fast_config(server.base_url, api_key_env="ASKFLOW_ABSENT_KEY"))


def test_the_fake_server_in_its_own_process_answers_like_the_in_process_one(server):
    """FakeServerProcess (what benchmarks/josh.py measures against): the same replies, the
    delays it slept added up (spread around the latency), its own CPU time, and no process
    left behind."""
    from pipelines.llm.testing.fake_server import FakeServerProcess

    requests = requests_for(PROMPTS[:6])
    expected = texts(LLMClient(fast_config(server.base_url)).complete_many_sync(requests))
    with FakeServerProcess(latency_s=0.02, latency_spread=0.5) as child:
        got = texts(LLMClient(fast_config(child.base_url)).complete_many_sync(requests))
        stats = child.stats()
        process = child._process
    assert got == expected
    assert stats["requests"] == 6 and 6 * 0.01 <= stats["service_s"] <= 6 * 0.03 and stats["cpu_s"] > 0
    assert process is not None and process.poll() is not None
