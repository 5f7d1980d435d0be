"""HFBackend on a tiny locally built Qwen2 model: batched generation and shifted token scores."""

from __future__ import annotations

import math

import pytest
import torch

from pipelines.llm import HFBackend, HFConfig, SamplingParams

from .helpers import user

pytestmark = pytest.mark.usefixtures("single_torch_thread")

CONVERSATIONS = [
    user("hello"),
    user("I am looking for a cheap restaurant in the centre of town, please."),
    [{"role": "system", "content": "Be brief."}, user("book a taxi")],
    user("Which train?"),
    user("x"),
]
TEXTS = ["hello world", "Book a table for two people on Friday at 18:30, please.", "x y", "The hotel has free wifi."]
GREEDY = SamplingParams(temperature=0.0, max_tokens=10)


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> HFBackend:
    return HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=3))


def manual_scores(backend: HFBackend, ids: list[int], first: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Log-probabilities and entropies of ids[first:], one unpadded sequence, written out plainly."""
    with torch.no_grad():
        logits = backend.model(torch.tensor([ids])).logits[0].float()
    log_probs = torch.log_softmax(logits, dim=-1)
    positions = torch.arange(first, len(ids))
    token_logprobs = log_probs[positions - 1, torch.tensor(ids[first:])]
    entropies = -(log_probs[positions - 1].exp() * log_probs[positions - 1]).sum(-1)
    return token_logprobs, entropies


def test_generation_gives_one_deterministic_reply_per_input(backend):
    first = backend.generate(CONVERSATIONS, GREEDY)
    second = backend.generate(CONVERSATIONS, GREEDY)

    assert len(first) == len(CONVERSATIONS) and first == second
    assert len(set(first)) > 1, "replies should depend on the prompt"


def test_batched_generation_equals_one_by_one(backend):
    # Left padding makes every prompt end where generation starts; right padding would not.
    batched = backend.generate(CONVERSATIONS, GREEDY)
    singles = [backend.generate([conversation], GREEDY)[0] for conversation in CONVERSATIONS]
    assert batched == singles


def test_sampling_is_reproducible_per_seed_and_leaves_the_global_rng_alone(backend):
    sampling = SamplingParams(temperature=1.0, max_tokens=12)
    torch.manual_seed(123)
    expected_next = torch.rand(1)
    torch.manual_seed(123)

    a = backend.generate(CONVERSATIONS, sampling, seed=1)
    b = backend.generate(CONVERSATIONS, sampling, seed=1)
    c = backend.generate(CONVERSATIONS, sampling, seed=2)

    assert a == b and a != c
    assert torch.equal(torch.rand(1), expected_next)


def test_the_chat_template_is_used(backend):
    rendered = backend.render(user("hi"))
    assert "<|im_start|>user\nhi<|im_end|>" in rendered and rendered.endswith("<|im_start|>assistant\n")


def test_token_logprobs_equal_a_manual_shifted_computation(backend):
    scores = backend.score(TEXTS)

    for text, score in zip(TEXTS, scores):
        ids = backend.tokenizer(text)["input_ids"]
        assert score.token_ids == tuple(ids[1:])  # no BOS: the first token has nothing to condition on
        expected, _ = manual_scores(backend, ids, first=1)
        assert torch.allclose(torch.tensor(score.logprobs), expected, atol=1e-5)
        assert all(lp <= 0 for lp in score.logprobs)
    assert backend.token_logprobs(TEXTS) == [list(s.logprobs) for s in scores]

    # The comparison above can tell a shift error apart: unshifted values differ.
    ids = backend.tokenizer(TEXTS[1])["input_ids"]
    with torch.no_grad():
        log_probs = torch.log_softmax(backend.model(torch.tensor([ids])).logits[0].float(), dim=-1)
    unshifted = log_probs[torch.arange(1, len(ids)), torch.tensor(ids[1:])]
    assert not torch.allclose(torch.tensor(scores[1].logprobs), unshifted, atol=1e-3)


def test_entropies_are_nonnegative_bounded_and_match_a_manual_computation(backend):
    entropies = backend.token_entropies(TEXTS)
    log_vocab = math.log(backend.model.config.vocab_size)

    for text, values in zip(TEXTS, entropies):
        ids = backend.tokenizer(text)["input_ids"]
        _, expected = manual_scores(backend, ids, first=1)
        assert torch.allclose(torch.tensor(values), expected, atol=1e-4)
        assert all(0.0 <= h <= log_vocab + 1e-4 for h in values)


def test_contexts_condition_without_being_scored(backend):
    contexts = ["I would like", "Please"]
    texts = [" a cheap hotel", " book it"]

    scores = backend.score(texts, contexts)

    for context, text, score in zip(contexts, texts, scores):
        prefix = backend.tokenizer(context)["input_ids"]
        ids = backend.tokenizer(text, add_special_tokens=False)["input_ids"]
        assert score.token_ids == tuple(ids)
        expected_lp, expected_h = manual_scores(backend, prefix + ids, first=len(prefix))
        assert torch.allclose(torch.tensor(score.logprobs), expected_lp, atol=1e-5)
        assert torch.allclose(torch.tensor(score.entropies), expected_h, atol=1e-4)


def test_padding_and_batch_size_do_not_change_scores(backend):
    one_by_one = HFBackend(backend.model, backend.tokenizer, batch_size=1).score(TEXTS + [""])
    batched = backend.score(TEXTS + [""])
    for a, b in zip(one_by_one, batched):
        assert a.token_ids == b.token_ids
        assert torch.allclose(torch.tensor(a.logprobs), torch.tensor(b.logprobs), atol=1e-5)
    assert batched[-1].token_ids == () and batched[-1].logprobs == ()
