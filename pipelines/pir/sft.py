"""Cold-start SFT examples from augmented PIR traces (section 3.1.2), with the simulated
user's ``<response>…</response>`` text masked out of the loss by default.

The paper's objective (eq. 3) trains on the whole sequence, simulated replies included; a
policy trained so learns to write the user's answers itself. askflow masks every token that
overlaps a ``<response>…</response>`` span (the tags too: after ``</asking>`` the user speaks,
so the policy is not taught to open the reply either). ``train_on_responses=True`` is the
paper's choice.

The examples are tokenized here, with a ``labels`` column (-100 = no loss), which TRL's
SFTTrainer takes as is (a dataset with ``input_ids`` and ``labels`` is not re-processed).
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

from pipelines.pir.insertion import RESPONSE_CLOSE, RESPONSE_OPEN

IGNORE_INDEX = -100
_RESPONSE = re.compile(re.escape(RESPONSE_OPEN) + ".*?" + re.escape(RESPONSE_CLOSE), re.DOTALL)


def response_spans(text: str) -> list[tuple[int, int]]:
    """Character spans of the ``<response>…</response>`` blocks of ``text``, tags included.

    >>> response_spans("a<response>b</response>c<response>d</response>")
    [(1, 23), (24, 46)]
    """
    return [m.span() for m in _RESPONSE.finditer(text)]


def sft_prompt_completion(row: Mapping[str, Any]) -> dict[str, Any]:
    """A ``pir_traces`` row as a conversational prompt-completion pair: the input as the
    user's message, the augmented trace (think-ask-respond, then the answer) as the reply."""
    return {
        "prompt": [{"role": "user", "content": row["input"]}],
        "completion": [{"role": "assistant", "content": row["augmented_trace"]}],
    }


def tokenize_example(
    tokenizer: Any, prompt: Sequence[Mapping[str, str]], completion: str, *, train_on_responses: bool = False,
    max_length: int | None = None,
) -> dict[str, list[int]]:
    """``input_ids`` and ``labels`` of one example: the prompt rendered with the chat template
    up to the reply (no loss), the completion and an end-of-sequence token (loss), except the
    tokens of ``<response>`` spans unless ``train_on_responses``. A token counts as part of a
    span when its characters overlap it."""
    from pipelines.training.data import masked_example

    spans = [] if train_on_responses else response_spans(completion)
    return masked_example(tokenizer, prompt, completion, spans, max_length)
