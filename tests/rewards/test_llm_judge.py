"""The LLM judge (Figure 6 rubric) against the fake OpenAI-compatible server."""

from __future__ import annotations

import asyncio
from collections import Counter

import pytest

from pipelines.llm import LLMClient, ResponseCache, SamplingParams
from pipelines.llm.testing.fake_server import FaultPlan
from pipelines.rewards import (
    NO_QUESTION,
    Clarification,
    ClarifyReward,
    JudgeError,
    LLMJudge,
    build_clarify_reward,
    parse_score,
    render_conversation,
)

from .conftest import fast_config

THINK = "<think>Several hotels match.</think>"
GOOD = "Which part of town would you like to stay in?"
BAD = "Do you like hotels?"
ODD = "What colour should the curtains be?"
TURNS = [
    {"role": "user", "content": "I need a cheap hotel for two."},
    {"role": "assistant", "content": "Certainly. Any other requirements?"},
    {"role": "user", "content": "Free wifi, please."},
]
CONVERSATION = render_conversation(TURNS)


def ask(question: str) -> str:
    return f"{THINK}<clarify>{question}</clarify>"


class MetricLog:
    """Stands in for TRL's ``log_metric`` / ``log_extra``."""

    def __init__(self):
        self.metrics: dict[str, list[float]] = {}
        self.extra: dict[str, list] = {}

    def metric(self, name: str, value: float) -> None:
        self.metrics.setdefault(name, []).append(value)

    def column(self, name: str, values: list) -> None:
        self.extra.setdefault(name, []).extend(values)


def call(reward, completions, log: MetricLog | None = None, **columns):
    kwargs = {"conversation": [CONVERSATION] * len(completions), **columns}
    if log is not None:
        kwargs.update(log_metric=log.metric, log_extra=log.column)
    return reward(prompts=["the prompt"] * len(completions), completions=completions, completion_ids=None, **kwargs)


@pytest.mark.parametrize(
    "reply, score",
    [
        ("Score: 1", 1),
        ("Score: 0", 0),
        ("score:1", 1),
        ("  Score: [0]\n", 0),
        ("1", 1),
        ("0", 0),
        ("Score: 1. A good question.", None),
        ("Score: 2", None),
        ("Score 1", None),
        ("10", None),
        ("[1", None),
        ("", None),
        ("<think>fine</think>Score: 1", None),
    ],
)
def test_parse_score_is_strict(reply, score):
    assert parse_score(reply) == score


def test_scores_parsed_and_the_prompt_holds_rubric_conversation_and_question(make_server, judge_replies):
    judge_replies.update({GOOD: "Score: 1", BAD: "Score: 0"})
    server = make_server()
    judge = LLMJudge(LLMClient(fast_config(server.base_url)))
    reward = ClarifyReward(judge)

    assert reward.__name__ == "clarify_llm"
    assert call(reward, [ask(GOOD), ask(BAD)]) == [1.0, 0.0]

    assert server.stats.requests == 2
    for body in server.stats.bodies:
        assert [m["role"] for m in body["messages"]] == ["user"]
        prompt = body["messages"][0]["content"]
        assert prompt.startswith("You are a judge evaluating the quality of user clarification questions.")
        assert "Constructive nature of the question" in prompt and "Score: [YOUR BINARY 0/1 SCORE HERE]" in prompt
        assert f"Conversation\n{CONVERSATION}\n" in prompt
        assert "User: Free wifi, please." in prompt
        assert body["temperature"] == 0.0 and body["seed"] == 0
    asked = [body["messages"][0]["content"].split("Agent Clarification Question to Judge\n")[1] for body in server.stats.bodies]
    assert sorted(question.split("\n")[0] for question in asked) == sorted([GOOD, BAD])
    assert judge.stats.as_dict() == {"calls": 2, "scored": 2, "unparseable": 0, "failures": {}}


def test_no_question_scores_zero_without_calling_the_judge(make_server, judge_replies):
    judge_replies[GOOD] = "Score: 1"
    server = make_server()
    judge = LLMJudge(LLMClient(fast_config(server.base_url)))
    completions = [
        THINK + "The Acorn is in the north.",
        THINK + "<clarify>unclosed",
        [{"role": "assistant", "content": ask(GOOD)}],
    ]
    log = MetricLog()
    assert call(ClarifyReward(judge), completions, log) == [0.0, 0.0, 1.0]
    assert server.stats.requests == 1 and judge.stats.calls == 1
    assert log.extra == {"clarify_llm_reason": [NO_QUESTION, NO_QUESTION, "judged"]}
    assert log.metrics == {"clarify_llm/asked": [pytest.approx(1 / 3)], "clarify_llm/unscored": [0.0]}


def test_unparseable_reply_gives_none_and_is_counted_and_logged(make_server, judge_replies):
    judge_replies.update({GOOD: "Score: 1", BAD: "The question is fine. Score: 1"})
    server = make_server()
    judge = LLMJudge(LLMClient(fast_config(server.base_url)))
    log = MetricLog()

    assert call(ClarifyReward(judge), [ask(GOOD), ask(BAD)], log) == [1.0, None]
    assert judge.stats.as_dict() == {"calls": 2, "scored": 1, "unparseable": 1, "failures": {}}
    assert log.metrics["clarify_llm/unscored"] == [1.0]
    assert log.metrics["clarify_llm/unscored/unparseable"] == [1.0]
    assert log.extra["clarify_llm_reason"] == ["judged", "unparseable"]


def test_server_failure_after_retries_gives_none_and_is_counted(make_server, judge_replies):
    judge_replies[GOOD] = "Score: 1"
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    client = LLMClient(fast_config(server.base_url, max_retries=2))
    judge = LLMJudge(client)
    log = MetricLog()

    assert call(ClarifyReward(judge), [ask(GOOD), THINK + "No question."], log) == [None, 0.0]
    assert server.stats.requests == 3  # the request and its 2 retries
    assert judge.stats.failures == Counter({"server_error": 1}) and judge.stats.scored == 0
    assert client.accounting.role("judge").failures == {"server_error": 1}
    assert log.metrics["clarify_llm/unscored/server_error"] == [1.0]


def test_strict_mode_raises(make_server, judge_replies):
    judge_replies.update({GOOD: "Score: 1", BAD: "maybe"})
    server = make_server()
    strict = ClarifyReward(LLMJudge(LLMClient(fast_config(server.base_url)), strict=True))
    with pytest.raises(JudgeError, match="could not score 1 of 2 question.*unparseable"):
        call(strict, [ask(GOOD), ask(BAD)])

    failing = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    strict = ClarifyReward(LLMJudge(LLMClient(fast_config(failing.base_url, max_retries=0)), strict=True))
    with pytest.raises(JudgeError, match="server_error"):
        call(strict, [ask(GOOD)])
    # Without a question there is nothing to fail.
    assert call(strict, [THINK + "Fine."]) == [0.0]


def test_second_run_is_served_from_the_cache(make_server, judge_replies, tmp_path):
    judge_replies.update({GOOD: "Score: 1", BAD: "Score: 0", ODD: "Score: 0"})
    server = make_server()
    completions = [ask(GOOD), ask(BAD), ask(ODD)]

    first = call(ClarifyReward(LLMJudge(LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path)))), completions)
    assert server.stats.requests == 3
    server.reset_stats()

    fresh = LLMClient(fast_config(server.base_url), cache=ResponseCache(tmp_path))
    judge = LLMJudge(fresh)
    assert call(ClarifyReward(judge), completions) == first == [1.0, 0.0, 0.0]
    assert server.stats.requests == 0
    assert fresh.accounting.role("judge").cache_hits == 3 and judge.stats.scored == 3

    # The seed is part of the request: another seed is another judgement.
    call(ClarifyReward(LLMJudge(fresh, seed=1)), completions[:1])
    assert server.stats.requests == 1


def test_a_batch_is_judged_concurrently(make_server, judge_replies):
    questions = [f"Which area, option {i}?" for i in range(6)]
    judge_replies.update({q: "Score: 1" for q in questions})
    server = make_server(latency_s=0.2)
    reward = ClarifyReward(LLMJudge(LLMClient(fast_config(server.base_url, max_concurrency=8))))
    assert call(reward, [ask(q) for q in questions]) == [1.0] * 6
    assert server.stats.max_in_flight >= 2


def test_conversation_falls_back_to_the_prompt(make_server, judge_replies):
    judge_replies[GOOD] = "Score: 1"
    server = make_server()
    judge = LLMJudge(LLMClient(fast_config(server.base_url)))
    reward = ClarifyReward(judge)
    assert reward(prompts=[TURNS], completions=[ask(GOOD)]) == [1.0]
    assert reward(prompts=["User: a plain prompt"], completions=[ask(GOOD)], conversation=[TURNS]) == [1.0]
    prompts = [body["messages"][0]["content"] for body in server.stats.bodies]
    assert f"Conversation\n{CONVERSATION}\n" in prompts[0]  # rendered from the prompt's messages
    assert f"Conversation\n{CONVERSATION}\n" in prompts[1]  # rendered from the column's turns


def test_inside_a_running_event_loop_use_ajudge(make_server, judge_replies):
    judge_replies[GOOD] = "Score: 1"
    server = make_server()
    judge = LLMJudge(LLMClient(fast_config(server.base_url)))
    clarification = Clarification(GOOD, "prompt", {"conversation": CONVERSATION})

    async def inside_a_loop():
        with pytest.raises(RuntimeError, match="cannot run inside an event loop"):
            judge.judge([clarification])
        return await judge.ajudge([clarification])

    verdicts = asyncio.run(inside_a_loop())
    assert [v.score for v in verdicts] == [1.0]


def test_build_clarify_reward(make_server):
    from pipelines.errors import ConfigError

    assert build_clarify_reward("verifiable").__name__ == "clarify_verifiable"
    client = LLMClient(fast_config("http://127.0.0.1:9/v1"))
    reward = build_clarify_reward("llm", client)
    assert isinstance(reward.judge, LLMJudge) and reward.judge.client is client
    assert reward.judge.sampling == SamplingParams(temperature=0.0) and reward.judge.seed == 0
    with pytest.raises(ConfigError, match="needs an LLM client"):
        build_clarify_reward("llm")
    with pytest.raises(ConfigError, match="unknown judge 'gpt'; judges: verifiable, llm"):
        build_clarify_reward("gpt", client)
