"""Fixtures for the reward tests: a fake OpenAI-compatible judge whose replies are scripted
per clarification question."""

from __future__ import annotations

import re
from typing import Any

import pytest

from pipelines.llm import ClientConfig
from pipelines.llm.testing import fake_server

# Where the Figure 6 prompt puts the question.
_QUESTION = re.compile(r"Agent Clarification Question to Judge\n(.*?)\n\nYour Decision", re.DOTALL)


def fast_config(base_url: str, **overrides: Any) -> ClientConfig:
    """Near-zero back-off, so that retried faults cost milliseconds."""
    settings: dict[str, Any] = {
        "base_url": base_url,
        "model": "fake-judge",
        "max_concurrency": 8,
        "timeout_s": 5.0,
        "max_retries": 2,
        "backoff_base_s": 0.001,
        "backoff_max_s": 0.005,
    }
    settings.update(overrides)
    return ClientConfig(**settings)


@pytest.fixture
def judge_replies(monkeypatch) -> dict[str, str]:
    """{question: the fake judge's reply}. The fake server derives its reply from the request
    through ``fake_server.reply_text``; this replaces it (for this test only) with a lookup of
    the question in the judge prompt. A question without a script is a test bug, and the
    reply says so (it is unparseable, so the test sees it)."""
    replies: dict[str, str] = {}

    def scripted(messages: list[dict[str, Any]], seed: int | None, index: int, as_json: bool) -> str:
        match = _QUESTION.search(str(messages[-1].get("content", "")))
        question = match.group(1) if match else None
        return replies.get(question, f"NO SCRIPT FOR QUESTION {question!r}")

    monkeypatch.setattr(fake_server, "reply_text", scripted)
    return replies
