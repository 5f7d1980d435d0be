"""Step uncertainty (PIR eq. 1), top-k% selection and the fidelity check.

A step's predictive entropy is the mean negative log-probability of its tokens under the
teacher, conditioned on the input and every earlier step: PE(s_j | x) = -1/|s_j| sum_i log p(z_i
| s_<j, x). All steps of a trace come from ONE forward pass over input + reasoning, with the
logits shifted (token j scored by the logits at j-1; :meth:`pipelines.llm.hf.HFBackend.score`),
and traces are batched together. The released PIR code scored each sentence in its own pass,
unshifted, and kept steps above an absolute threshold; here the top k % are selected.

A token belongs to the step holding its last non-space character (a byte-level BPE token may
carry the paragraph break in front of a step's first word); tokens of the breaks alone score
no step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable, Literal, Protocol, Sequence

from pipelines.pir.traces import Trace, split_steps

Scope = Literal["trace", "corpus"]
SCOPES: tuple[str, ...] = ("trace", "corpus")


class Scorer(Protocol):
    """What the entropy needs of a teacher: :class:`pipelines.llm.hf.HFBackend` is one."""

    tokenizer: Any

    def render(self, messages: Sequence[Any]) -> str: ...

    def score(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[Any]: ...


@dataclass(frozen=True)
class StepScores:
    """One trace's steps: PE per step (None for a step no token fell in), tokens per step and
    the tokens scored in all (breaks included)."""

    entropies: tuple[float | None, ...]
    token_counts: tuple[int, ...]
    scored_tokens: int
    context_tokens: int


@dataclass(frozen=True)
class TokenLogprobs:
    """The scored tokens of one text and their log-probabilities (shifted: token j from the
    logits at j-1)."""

    token_ids: tuple[int, ...]
    logprobs: tuple[float, ...]


class StepScorer:
    """The teacher's scorer for PIR: :meth:`pipelines.llm.hf.HFBackend.score`'s semantics
    (context and text tokenized apart, every text token scored from the logits one position
    earlier, right padding, ``backend.batch_size`` texts per forward pass) without its costs
    that PE does not need: the output layer runs only on the positions that predict a
    reasoning token (not on the context, nor on padding), and no full-vocabulary entropy is
    computed. A model whose head is more than its output embedding (soft-capping, scaling) is
    caught by a check against the full logits on the first batch, and then scored through
    them."""

    def __init__(self, backend: Any, *, max_rows: int = 2048, on_scored: Callable[[int], Any] | None = None):
        self.backend = backend
        self.tokenizer = backend.tokenizer
        self.max_rows = max_rows  # output-layer rows per matmul: bounds the rows x vocabulary buffer
        self.on_scored = on_scored  # told how many texts each forward pass scored (a stage's progress)
        self._head_checked = False
        self._full_logits = False

    def render(self, messages: Sequence[Any]) -> str:
        return self.backend.render(messages)

    def score(self, texts: Sequence[str], contexts: Sequence[str] | None = None) -> list[TokenLogprobs]:
        if contexts is None or len(contexts) != len(texts):
            raise ValueError("StepScorer scores each text after its context: one context per text")
        sequences = []
        for text, context in zip(texts, contexts):
            prefix = self.tokenizer(context, add_special_tokens=True)["input_ids"]
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            if not prefix:
                raise ValueError("an empty context (and no BOS token) leaves the first token unconditioned")
            sequences.append((prefix + ids, len(prefix)))
        results: list[TokenLogprobs] = [TokenLogprobs((), ())] * len(sequences)
        scorable = [i for i, (ids, first) in enumerate(sequences) if len(ids) > first]
        size = self.backend.batch_size
        for start in range(0, len(scorable), size):
            batch = scorable[start : start + size]
            for i, scored in zip(batch, self._score_batch([sequences[i] for i in batch])):
                results[i] = scored
            if self.on_scored is not None:
                self.on_scored(len(batch))
        return results

    def _score_batch(self, batch: Sequence[tuple[list[int], int]]) -> list[TokenLogprobs]:
        import torch

        model, device = self.backend.model, self.backend.device
        width = max(len(ids) for ids, _ in batch)
        input_ids = torch.full((len(batch), width), self.backend.pad_token_id, dtype=torch.long)
        attention_mask = torch.zeros((len(batch), width), dtype=torch.long)
        for row, (ids, _) in enumerate(batch):
            input_ids[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
            attention_mask[row, : len(ids)] = 1
        # Token j (j >= first) is predicted at position j-1.
        rows = torch.cat([torch.full((len(ids) - first,), r, dtype=torch.long) for r, (ids, first) in enumerate(batch)])
        cols = torch.cat([torch.arange(first - 1, len(ids) - 1) for ids, first in batch])
        targets = input_ids[rows, cols + 1].to(device)
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        with torch.inference_mode():
            if self._full_logits:
                logits = model(input_ids=input_ids, attention_mask=attention_mask).logits[rows.to(device), cols.to(device)]
                logprobs = self._logprobs(lambda chunk: chunk, logits, targets)
            else:
                hidden = model.get_decoder()(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
                picked = hidden[rows.to(device), cols.to(device)]
                head = model.get_output_embeddings()
                logprobs = self._logprobs(head, picked, targets)
                if not self._head_checked:
                    self._head_checked = True
                    full = model(input_ids=input_ids[:1], attention_mask=attention_mask[:1]).logits[0, cols[rows == 0].to(device)]
                    reference = self._logprobs(lambda chunk: chunk, full, targets[rows.to(device) == 0])
                    if not torch.allclose(reference, logprobs[rows.to(device) == 0], atol=1e-3, rtol=1e-3):
                        self._full_logits = True
                        return self._score_batch(batch)
        values = logprobs.float().cpu().tolist()
        out, position = [], 0
        for ids, first in batch:
            count = len(ids) - first
            out.append(TokenLogprobs(tuple(ids[first:]), tuple(values[position : position + count])))
            position += count
        return out

    def _logprobs(self, head: Any, inputs: Any, targets: Any) -> Any:
        import torch

        parts = []
        for start in range(0, inputs.shape[0], self.max_rows):
            # float32: bf16 log-probabilities of unlikely tokens are badly rounded.
            logits = head(inputs[start : start + self.max_rows]).float()
            chosen = logits.gather(-1, targets[start : start + self.max_rows, None]).squeeze(-1)
            parts.append(chosen - torch.logsumexp(logits, dim=-1))
        return torch.cat(parts)


def teacher_context(scorer: Scorer, trace: Trace) -> str:
    """The prefix the reasoning is scored after: the input as the user's message, rendered
    with the teacher's chat template up to where its reply begins."""
    return scorer.render([{"role": "user", "content": trace.input}])


def step_of_tokens(text: str, offsets: Sequence[tuple[int, int]], spans: Sequence[tuple[int, int]]) -> list[int | None]:
    """For each token (character offsets into ``text``), the index of the step span holding
    its last non-space character; None for a token of whitespace only.

    >>> text = "a b.\\n\\nc d."
    >>> step_of_tokens(text, [(0, 1), (1, 3), (3, 4), (4, 6), (6, 7), (7, 9), (9, 10)], [(0, 4), (6, 10)])
    [0, 0, 0, None, 1, 1, 1]
    """
    owners: list[int | None] = []
    for start, end in offsets:
        last = end - 1
        while last >= start and text[last].isspace():
            last -= 1
        owner = None
        if last >= start:
            owner = next((i for i, (a, b) in enumerate(spans) if a <= last < b), None)
        owners.append(owner)
    return owners


def score_steps(scorer: Scorer, traces: Sequence[Trace]) -> list[StepScores]:
    """The step entropies of every trace, in order: one forward pass per trace, batched by
    the scorer (longest first, so that a batch holds traces of similar length)."""
    contexts = [teacher_context(scorer, t) for t in traces]
    order = sorted(range(len(traces)), key=lambda i: -(len(contexts[i]) + len(traces[i].reasoning)))
    scored = scorer.score([traces[i].reasoning for i in order], [contexts[i] for i in order])
    by_trace: list[Any] = [None] * len(traces)
    for i, scores in zip(order, scored):
        by_trace[i] = scores
    results = []
    for trace, context, scores in zip(traces, contexts, by_trace):
        encoded = scorer.tokenizer(trace.reasoning, add_special_tokens=False, return_offsets_mapping=True)
        if list(encoded["input_ids"]) != list(scores.token_ids):
            raise RuntimeError(f"trace {trace.trace_id!r}: the offsets' tokenization differs from the scored one")
        spans = split_steps(trace.reasoning)
        owners = step_of_tokens(trace.reasoning, encoded["offset_mapping"], spans)
        sums = [0.0] * len(spans)
        counts = [0] * len(spans)
        for owner, logprob in zip(owners, scores.logprobs):
            if owner is not None:
                sums[owner] -= logprob
                counts[owner] += 1
        context_tokens = len(scorer.tokenizer(context, add_special_tokens=True)["input_ids"])
        results.append(StepScores(
            tuple(s / c if c else None for s, c in zip(sums, counts)), tuple(counts), len(scores.token_ids), context_tokens,
        ))
    return results


def select_top_k(entropies: Sequence[Sequence[float | None]], k_percent: float, scope: Scope = "trace") -> list[tuple[int, ...]]:
    """The selected steps of each trace (ascending indices): the top ``k_percent`` % by
    entropy, ties to the earlier step. ``trace``: max(1, round(k % of the trace's scored
    steps)) per trace; ``corpus``: round(k % of all scored steps), ranked across traces.

    >>> select_top_k([[0.1, 2.0, 0.5, 3.0, 0.2]], 40)
    [(1, 3)]
    >>> select_top_k([[0.1, 2.0], [0.5, 0.2, 0.4]], 20, "corpus")
    [(1,), ()]
    """
    if not 0 < k_percent <= 100:
        raise ValueError(f"k_percent must be in (0, 100], got {k_percent!r}")
    if scope == "trace":
        selected = []
        for values in entropies:
            ranked = sorted((i for i, v in enumerate(values) if v is not None), key=lambda i: (-values[i], i))
            count = max(1, round(k_percent / 100 * len(ranked))) if ranked else 0
            selected.append(tuple(sorted(ranked[:count])))
        return selected
    if scope == "corpus":
        pool = [(-v, t, i) for t, values in enumerate(entropies) for i, v in enumerate(values) if v is not None]
        count = round(k_percent / 100 * len(pool))
        chosen: list[list[int]] = [[] for _ in entropies]
        for _, t, i in sorted(pool)[:count]:
            chosen[t].append(i)
        return [tuple(sorted(c)) for c in chosen]
    raise ValueError(f"scope must be one of {list(SCOPES)}, got {scope!r}")


def fidelity(selected: Sequence[Sequence[int]], truth: Sequence[Sequence[int]], n_steps: Sequence[int], scope: Scope) -> dict[str, Any]:
    """Precision and recall of the selected steps against the known assumption steps, pooled
    over traces, next to a uniformly random selection of the same size: the same count per
    trace (``trace`` scope) or in all (``corpus``); the random figures are expectations,
    not one draw.

    >>> fidelity([(1,), (0,)], [(1,), (2,)], [3, 4], "trace")["entropy"]
    {'precision': 0.5, 'recall': 0.5, 'f1': 0.5}
    """
    positives = sum(len(t) for t in truth)
    picked = sum(len(s) for s in selected)
    hits = sum(len(set(s) & set(t)) for s, t in zip(selected, truth))
    if scope == "trace":
        expected = sum(len(s) * len(t) / n for s, t, n in zip(selected, truth, n_steps) if n)
    else:
        total = sum(n_steps)
        expected = picked * positives / total if total else 0.0
    return {
        "selected": picked, "positives": positives, "steps": sum(n_steps), "hits": hits,
        "entropy": _pr(hits, picked, positives),
        "random": _pr(expected, picked, positives),
    }


def _pr(hits: float, picked: int, positives: int) -> dict[str, float | None]:
    precision = hits / picked if picked else None
    recall = hits / positives if positives else None
    f1 = 2 * precision * recall / (precision + recall) if precision and recall else (0.0 if precision is not None and recall is not None else None)
    return {k: (round(v, 4) if v is not None and math.isfinite(v) else v) for k, v in (("precision", precision), ("recall", recall), ("f1", f1))}
