"""US-GRPO's composite reward: one test per branch, with the helpfulness judge offline
(rules) and through the fake OpenAI-compatible server (LLM, failures explicit)."""

from __future__ import annotations

from typing import Any

import pytest

from pipelines.llm import ClientConfig, LLMClient
from pipelines.llm.testing import fake_server
from pipelines.llm.testing.fake_server import FaultPlan
from pipelines.rewards.pir import LLMHelpfulness, PIRReward, RulesHelpfulness, efficiency, questions

ASK_AREA = "<think>Several match.<asking>Which area would you like?</asking><response>North.</response>Done.</think>The Acorn."
NO_ASK = "<think>Several match.</think>The Acorn."


class Fixed:
    """A judge that gives every item the same helpfulness, and counts its calls."""

    name = "fixed"

    def __init__(self, score: float | None, reason: str = "judged"):
        self.score, self.reason, self.calls = score, reason, 0

    def helpfulness(self, items):
        self.calls += len(items)
        return [(self.score, self.reason)] * len(items)


def asks(n: int) -> str:
    return "<think>" + "".join(f"<asking>Q{i}?</asking><response>A{i}.</response>" for i in range(n)) + "</think>x"


def test_wrong_answer_scores_zero_whatever_was_asked():
    judge = Fixed(1.0)
    assert PIRReward(judge)(["p", "p"], [ASK_AREA, NO_ASK], correct=[False, False]) == [0.0, 0.0]
    assert judge.calls == 0  # the judge is not asked when nothing depends on it


def test_correct_without_a_question_scores_s_base():
    judge = Fixed(1.0)
    assert PIRReward(judge, s_base=2.0)(["p"], [NO_ASK], correct=[True]) == [2.0]
    assert judge.calls == 0


def test_correct_with_questions_adds_s_base_times_efficiency_times_helpfulness():
    reward = PIRReward(Fixed(0.6), s_base=2.0, n_max=5)
    # n = 1, 2, 3: E = 1, 0.75, 0.5
    assert reward(["p"] * 3, [asks(1), asks(2), asks(3)], correct=[True] * 3) == pytest.approx([2 + 2 * 0.6, 2 + 2 * 0.75 * 0.6, 2 + 2 * 0.5 * 0.6])


def test_efficiency_is_clipped_at_zero_past_n_max():
    # The released code: (5 - 7) / 4 = -0.5, a penalty below S_base; clipped, asking too much earns nothing extra.
    assert efficiency(7, 5) == 0.0
    assert PIRReward(Fixed(1.0), n_max=5)(["p"] * 2, [asks(5), asks(7)], correct=[True, True]) == [1.0, 1.0]
    with pytest.raises(ValueError, match="n_max"):
        PIRReward(Fixed(1.0), n_max=1)


def test_judge_failure_is_none_never_zero():
    reward = PIRReward(Fixed(None, "server_error"))
    assert reward(["p"] * 3, [asks(1), NO_ASK, asks(1)], correct=[True, True, False]) == [None, 1.0, 0.0]
    assert reward.stats["unscored:server_error"] == 1


def test_unknown_correctness_is_none_and_a_missing_column_is_an_error():
    reward = PIRReward(Fixed(1.0))
    assert reward(["p"], [ASK_AREA], correct=[None]) == [None]
    with pytest.raises(ValueError, match="'correct' column"):
        reward(["p"], [ASK_AREA])


def test_questions_come_from_the_policys_messages_only():
    conversation = [
        {"role": "user", "content": "<asking>not mine</asking>"},
        {"role": "assistant", "content": "<asking>Which day?</asking>"},
        {"role": "user", "content": "Friday."},
        {"role": "assistant", "content": "<asking>How many people?</asking>"},
    ]
    assert questions(conversation) == ["Which day?", "How many people?"]


def test_rules_helpfulness_is_the_share_of_questions_about_unstated_constraints():
    reward = PIRReward(RulesHelpfulness(), n_max=5)
    two = "<think><asking>Which area would you like?</asking><asking>What price range do you want?</asking></think>x"
    out = reward(["p"] * 3, [two, two, ASK_AREA], correct=[True] * 3,
                 unstated_slots=[["area"], '["area", "pricerange"]', None])
    assert out == pytest.approx([1 + 0.75 * 0.5, 1 + 0.75 * 1.0, None])


def _client(url: str, **overrides: Any) -> LLMClient:
    return LLMClient(ClientConfig(base_url=url, model="fake-judge", timeout_s=5.0, max_retries=1, backoff_base_s=0.001, backoff_max_s=0.002, **overrides))


def test_llm_helpfulness_uses_the_papers_prompt_and_parses_its_json(make_server, monkeypatch):
    replies = {"Which area would you like?": '{"thought": "useful", "helpfulness": 0.8}', "Q0?": "very helpful"}

    def scripted(messages, seed, index, as_json):
        prompt = str(messages[-1]["content"])
        return next((r for q, r in replies.items() if f"Evaluated|>\n{q}\n" in prompt), "no script")

    monkeypatch.setattr(fake_server, "reply_text", scripted)
    server = make_server()
    judge = LLMHelpfulness(_client(server.base_url))
    reward = PIRReward(judge)
    out = reward([[{"role": "user", "content": "Find me a hotel."}]] * 2, [ASK_AREA, asks(1)], correct=[True, True], intent=["a cheap hotel in the north", "x"])
    assert out == [pytest.approx(1.8), None]
    assert judge.stats == {"judged": 1, "unparsable": 1}
    # The two requests go out concurrently, so the server may receive them in either order.
    prompts = [b["messages"][0]["content"] for b in server.stats.bodies]
    prompt = next(p for p in prompts if "a cheap hotel in the north" in p)
    assert len(prompts) == 2 and "assess the helpfulness of an LLM-generated response" in prompt
    assert "user: Find me a hotel." in prompt


def test_llm_helpfulness_server_failure_is_none(make_server):
    server = make_server(FaultPlan(rate=1.0, kinds=("http_500",)))
    judge = LLMHelpfulness(_client(server.base_url))
    assert PIRReward(judge)(["p"], [ASK_AREA], correct=[True]) == [None]
    assert judge.stats == {"server_error": 1}
