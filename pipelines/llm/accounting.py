"""Per-role counts of what the LLM backends did: calls, cache hits, HTTP requests, retries,
repairs, failures, tokens and cost.

One ``Accounting`` is meant to be shared by all clients of a stage, so that its report covers
every role. The counters sit behind a ``threading.Lock``: the critical sections never await,
so the lock is safe in async code too, and it also covers clients driven from several threads.
"""

from __future__ import annotations

import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from pipelines.errors import LLMOutage


@dataclass
class RoleUsage:
    """Counts for one role.

    ``calls``: logical completions asked for; ``cache_hits`` of them were answered from the
    cache. ``requests``: HTTP requests sent, retries and repairs included. ``retries`` and
    ``failures`` are broken down by reason ("timeout", "rate_limit", ...). ``repairs``:
    requests spent on replies that failed schema validation."""

    calls: int = 0
    cache_hits: int = 0
    requests: int = 0
    retries: Counter = field(default_factory=Counter)
    repairs: int = 0
    failures: Counter = field(default_factory=Counter)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost: float = 0.0

    def add(self, other: "RoleUsage") -> None:
        self.calls += other.calls
        self.cache_hits += other.cache_hits
        self.requests += other.requests
        self.retries.update(other.retries)
        self.repairs += other.repairs
        self.failures.update(other.failures)
        self.prompt_tokens += other.prompt_tokens
        self.completion_tokens += other.completion_tokens
        self.cost += other.cost

    def as_dict(self) -> dict[str, Any]:
        return {
            "calls": self.calls,
            "cache_hits": self.cache_hits,
            "requests": self.requests,
            "retries": sum(self.retries.values()),
            "retries_by_reason": dict(sorted(self.retries.items())),
            "repairs": self.repairs,
            "failures": sum(self.failures.values()),
            "failures_by_reason": dict(sorted(self.failures.items())),
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "cost": round(self.cost, 6),
        }


class Accounting:
    """Thread- and task-safe per-role counters; ``as_dict()`` is the report."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._roles: dict[str, RoleUsage] = {}

    def _usage(self, role: str) -> RoleUsage:
        # Callers hold the lock.
        return self._roles.setdefault(role, RoleUsage())

    def record_call(self, role: str) -> None:
        with self._lock:
            self._usage(role).calls += 1

    def record_cache_hit(self, role: str) -> None:
        with self._lock:
            self._usage(role).cache_hits += 1

    def record_request(self, role: str) -> None:
        with self._lock:
            self._usage(role).requests += 1

    def record_tokens(self, role: str, prompt_tokens: int, completion_tokens: int, cost: float) -> None:
        with self._lock:
            usage = self._usage(role)
            usage.prompt_tokens += prompt_tokens
            usage.completion_tokens += completion_tokens
            usage.cost += cost

    def record_retry(self, role: str, reason: str) -> None:
        with self._lock:
            self._usage(role).retries[reason] += 1

    def record_repair(self, role: str) -> None:
        with self._lock:
            self._usage(role).repairs += 1

    def record_failure(self, role: str, reason: str) -> None:
        with self._lock:
            self._usage(role).failures[reason] += 1

    def role(self, role: str) -> RoleUsage:
        """A snapshot (a copy) of one role's counts; zeros for a role never seen."""
        snapshot = RoleUsage()
        with self._lock:
            if role in self._roles:
                snapshot.add(self._roles[role])
        return snapshot

    def total(self) -> RoleUsage:
        snapshot = RoleUsage()
        with self._lock:
            for usage in self._roles.values():
                snapshot.add(usage)
        return snapshot

    def snapshot(self) -> dict[str, RoleUsage]:
        """Every role's counts, copied: what a worker sends back to be merged."""
        with self._lock:
            roles = list(self._roles)
        return {role: self.role(role) for role in roles}

    def merge(self, snapshot: dict[str, RoleUsage]) -> None:
        """Add another accounting's :meth:`snapshot` (a fanned-out worker's) to this one.

        >>> worker = Accounting()
        >>> worker.record_call("synthesizer"); worker.record_failure("synthesizer", "timeout")
        >>> total = Accounting()
        >>> total.record_call("synthesizer")
        >>> total.merge(worker.snapshot())
        >>> total.role("synthesizer").calls, sum(total.role("synthesizer").failures.values())
        (2, 1)
        """
        with self._lock:
            for role, usage in snapshot.items():
                self._usage(role).add(usage)

    def as_dict(self) -> dict[str, Any]:
        """``{"roles": {role: counts}, "total": counts}``, plain JSON values."""
        with self._lock:
            roles = {role: usage.as_dict() for role, usage in sorted(self._roles.items())}
        return {"roles": roles, "total": self.total().as_dict()}


#: Failure reasons that say the model answered (badly), not that the endpoint was unusable:
#: "invalid_output" from the client (the reply did not validate, repairs included), and
#: "invalid_dialogue" from a caller whose valid JSON still made no usable record.
MODEL_FAILURE_REASONS = frozenset({"invalid_output", "invalid_dialogue"})


def check_failure_rate(accounting: Accounting, max_rate: float, where: str, *, count_invalid_output: bool = False) -> None:
    """Raise ``LLMOutage`` when, for any role, more than ``max_rate`` of its calls failed
    (timeouts, 5xx, refused connections, a 401 from a revoked key...). The model's own invalid
    output counts too with ``count_invalid_output``: a stage that generates data from the
    replies (``speaker``) must not publish what a garbage-answering server left; an evaluation
    of a model leaves it out, its invalid answers being what it measures. A stage calls this
    before publishing, so that an outage stops it and leaves the previous artifacts in place
    instead of publishing what little got through.

    >>> accounting = Accounting()
    >>> for _ in range(10): accounting.record_call("synthesizer")
    >>> accounting.record_failure("synthesizer", "connection")
    >>> check_failure_rate(accounting, 0.1, "speaker")
    >>> accounting.record_failure("synthesizer", "rejected")
    >>> check_failure_rate(accounting, 0.1, "speaker")
    Traceback (most recent call last):
    ...
    pipelines.errors.LLMOutage: speaker: 2 of 10 synthesizer LLM call(s) failed (connection: 1, rejected: 1), more than the allowed 10%; nothing was published
    >>> accounting = Accounting()
    >>> for _ in range(10): accounting.record_call("synthesizer")
    >>> for _ in range(2): accounting.record_failure("synthesizer", "invalid_output")
    >>> check_failure_rate(accounting, 0.1, "eval")
    >>> check_failure_rate(accounting, 0.1, "speaker", count_invalid_output=True)
    Traceback (most recent call last):
    ...
    pipelines.errors.LLMOutage: speaker: 2 of 10 synthesizer LLM call(s) failed (invalid_output: 2), more than the allowed 10%; nothing was published
    """
    for role, usage in accounting.as_dict()["roles"].items():
        reasons = {r: c for r, c in usage["failures_by_reason"].items() if count_invalid_output or r not in MODEL_FAILURE_REASONS}
        failed = sum(reasons.values())
        if usage["calls"] and failed / usage["calls"] > max_rate:
            detail = ", ".join(f"{r}: {c}" for r, c in sorted(reasons.items()))
            raise LLMOutage(
                f"{where}: {failed} of {usage['calls']} {role} LLM call(s) failed ({detail}), "
                f"more than the allowed {max_rate:.0%}; nothing was published"
            )
