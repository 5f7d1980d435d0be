"""Helpers shared by the LLM tests."""

from __future__ import annotations

from typing import Any

from pipelines.llm import ClientConfig, CompletionRequest, SamplingParams


def fast_config(base_url: str, **overrides: Any) -> ClientConfig:
    """A client config for tests: near-zero back-off, so faults cost milliseconds. The timeout is
    generous, because the fake server shares this process's GIL and a loaded CI machine must not
    produce timeouts nobody injected; tests that inject hangs set a shorter one."""
    settings: dict[str, Any] = {
        "base_url": base_url,
        "model": "fake-model",
        "max_concurrency": 4,
        "timeout_s": 2.0,
        "max_retries": 5,
        "backoff_base_s": 0.005,
        "backoff_max_s": 0.02,
    }
    settings.update(overrides)
    return ClientConfig(**settings)


def user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def requests_for(prompts: list[str], role: str = "judge", sampling: SamplingParams = SamplingParams(), **kwargs: Any) -> list[CompletionRequest]:
    """One request per prompt, seeds 0, 1, 2, ..."""
    return [CompletionRequest(user(p), role, sampling, seed=i, **kwargs) for i, p in enumerate(prompts)]
