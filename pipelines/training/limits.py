"""The generation limit that never cuts a turn (issue 26, point 3).

A ``max_new_tokens`` below the policy's longest turn cuts some turns before their end (on
the first GPU run, a ``<clarify>`` whose closing tag never came): the runner then sees
malformed text where the policy was only stopped. :func:`generation_limit` derives the
limit from the training data instead: the longest completion, in the policy's own tokens
(with the end-of-turn token it must also write), plus a margin, rounded up.

    >>> class Chars:  # a stand-in tokenizer: one token per character
    ...     eos_token = "$"
    ...     def __call__(self, text, add_special_tokens=False):
    ...         return {"input_ids": list(text)}
    >>> generation_limit(["<think>a</think>hi", "x" * 100], Chars(), margin=0.25, multiple=16)
    128
    >>> longest_completion_tokens([[{"role": "assistant", "content": "abc"}]], Chars())
    4
"""

from __future__ import annotations

import math
from typing import Any, Iterable, Mapping, Sequence

Completion = str | Sequence[Mapping[str, Any]]


def _text(completion: Completion) -> str:
    if isinstance(completion, str):
        return completion
    return "".join(str(m.get("content") or "") for m in completion if m.get("role", "assistant") == "assistant")


def longest_completion_tokens(completions: Iterable[Completion], tokenizer: Any) -> int:
    """The most tokens any completion takes (texts, or TRL conversational completions), its
    end-of-turn token (the tokenizer's ``eos_token``) included."""
    eos = getattr(tokenizer, "eos_token", None) or ""
    longest = 0
    for completion in completions:
        longest = max(longest, len(tokenizer(_text(completion) + eos, add_special_tokens=False)["input_ids"]))
    return longest


def generation_limit(
    completions: Iterable[Completion], tokenizer: Any, *, margin: float = 0.25, minimum: int = 32, multiple: int = 16,
    maximum: int | None = None,
) -> int:
    """``max_new_tokens`` for the policy: the longest completion in tokens times
    ``1 + margin``, rounded up to a ``multiple``, at least ``minimum``; ``maximum`` (e.g. the
    context left after the longest prompt) caps it. ValueError without any completion."""
    if margin < 0 or minimum < 1 or multiple < 1:
        raise ValueError(f"margin must be >= 0, minimum and multiple >= 1; got {margin}, {minimum}, {multiple}")
    longest = longest_completion_tokens(completions, tokenizer)
    if longest == 0:
        raise ValueError("generation_limit needs at least one non-empty completion")
    limit = max(minimum, multiple * math.ceil(longest * (1 + margin) / multiple))
    return min(limit, maximum) if maximum is not None else limit


def generation_limit_from_parquet(path: str, tokenizer: Any, column: str = "completion", **kwargs: Any) -> int:
    """:func:`generation_limit` over a training table's completion column (e.g.
    ``data/processed/speaker/speaker_sft.parquet``), read with pyarrow."""
    import pyarrow.parquet as pq

    return generation_limit(pq.read_table(path, columns=[column]).column(column).to_pylist(), tokenizer, **kwargs)


__all__ = ["generation_limit", "generation_limit_from_parquet", "longest_completion_tokens"]
