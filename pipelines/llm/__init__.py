"""LLM backends for askflow's roles: an OpenAI-compatible client with retries, structured output,
a content-addressed response cache and per-role accounting, plus a local transformers backend.

Configuration comes in as dataclasses (``backends_from_dict`` validates a params section);
the cache directory is whatever the caller passes to ``ResponseCache``.
"""

from pipelines.llm.accounting import Accounting, RoleUsage
from pipelines.llm.cache import ResponseCache, cache_key, canonical_json
from pipelines.llm.client import (
    FAILURE_REASONS,
    RETRYABLE_REASONS,
    Completion,
    CompletionRequest,
    Failure,
    LLMClient,
    LLMFailure,
    Usage,
    unwrap,
)
from pipelines.llm.hf import HFBackend, TokenScores  # torch is imported only when used
from pipelines.llm.config import (
    BACKEND_KINDS,
    ROLES,
    BackendConfig,
    ClientConfig,
    HFConfig,
    SamplingParams,
    backends_from_dict,
)

__all__ = [
    "Accounting",
    "BACKEND_KINDS",
    "BackendConfig",
    "ClientConfig",
    "Completion",
    "CompletionRequest",
    "FAILURE_REASONS",
    "Failure",
    "HFBackend",
    "HFConfig",
    "LLMClient",
    "LLMFailure",
    "RETRYABLE_REASONS",
    "ROLES",
    "ResponseCache",
    "RoleUsage",
    "SamplingParams",
    "TokenScores",
    "Usage",
    "backends_from_dict",
    "cache_key",
    "canonical_json",
    "unwrap",
]
