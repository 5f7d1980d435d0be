"""Step entropies from one shifted forward pass per trace, checked against a hand computation
on a tiny real model; top-k% selection; the fidelity figures."""

from __future__ import annotations

import math

import pytest
import torch

from pipelines.llm import HFBackend, HFConfig
from pipelines.pir.entropy import StepScorer, fidelity, score_steps, select_top_k, step_of_tokens, teacher_context
from pipelines.pir.traces import Trace, split_steps

pytestmark = pytest.mark.usefixtures("single_torch_thread")

TRACES = [
    Trace("a", "I am looking for a cheap restaurant.", "The user wants a cheap restaurant.\n\nI will look in the centre.\n\nBook it for two people.", "Done.", "test"),
    Trace("b", "Book a taxi.", "A taxi.\n\n\nFrom the hotel to the restaurant, at 18:30 please.", "Booked.", "test"),
    Trace("c", "x", "Which train? The one to Cambridge leaving after 09:15.", "TR1.", "test"),
]


@pytest.fixture(scope="module")
def backend(tiny_model_dir) -> HFBackend:
    return HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=3))


def hand_step_entropies(backend: HFBackend, trace: Trace, shift: int = 1) -> list[float]:
    """Mean NLL per step, written out plainly: the whole sequence, no padding, token j's
    log-probability read from the logits at j - shift."""
    tokenizer = backend.tokenizer
    context = tokenizer(teacher_context(backend, trace), add_special_tokens=True)["input_ids"]
    encoded = tokenizer(trace.reasoning, add_special_tokens=False, return_offsets_mapping=True)
    ids = context + encoded["input_ids"]
    with torch.no_grad():
        log_probs = torch.log_softmax(backend.model(torch.tensor([ids])).logits[0].float(), dim=-1)
    spans = split_steps(trace.reasoning)
    nll: list[list[float]] = [[] for _ in spans]
    for k, (start, end) in enumerate(encoded["offset_mapping"]):
        piece = trace.reasoning[start:end]
        if not piece.strip():
            continue  # a paragraph break alone
        last = start + len(piece.rstrip()) - 1
        step = next(i for i, (a, b) in enumerate(spans) if a <= last < b)
        j = len(context) + k
        nll[step].append(-log_probs[j - shift, ids[j]].item() if j - shift < len(ids) else 0.0)
    return [sum(v) / len(v) for v in nll]


@pytest.mark.parametrize("path", ["step_scorer", "hf_backend"])
def test_step_entropies_equal_a_hand_computation_with_shifted_logits(backend, path):
    # StepScorer (the stage's: output layer on the scored positions only) and HFBackend.score
    # (full logits and entropies) must agree with the plain computation.
    scorer = StepScorer(backend) if path == "step_scorer" else backend
    scores = score_steps(scorer, TRACES)  # batched: three traces of different lengths in one pass
    for trace, score in zip(TRACES, scores):
        expected = hand_step_entropies(backend, trace)
        assert len(score.entropies) == len(split_steps(trace.reasoning))
        assert score.entropies == pytest.approx(expected, rel=1e-4, abs=1e-4), trace.trace_id
        # The released code's off-by-one reads token j from the logits at j: other numbers.
        unshifted = hand_step_entropies(backend, trace, shift=0)
        assert not score.entropies == pytest.approx(unshifted, rel=1e-3)
        assert sum(score.token_counts) <= score.scored_tokens


def test_batched_scores_equal_one_trace_at_a_time(backend):
    batched = score_steps(StepScorer(backend, max_rows=7), TRACES)  # several output-layer chunks too
    one = StepScorer(HFBackend(backend.model, backend.tokenizer, batch_size=1))
    singles = [score_steps(one, [t])[0] for t in TRACES]
    for b, s in zip(batched, singles):
        assert b.entropies == pytest.approx(s.entropies, rel=1e-4, abs=1e-5)
        assert b.token_counts == s.token_counts


def test_a_token_belongs_to_the_step_of_its_last_visible_character():
    text = "Hi.\n\n There"
    spans = split_steps(text)
    assert [text[a:b] for a, b in spans] == ["Hi.", "There"]
    # "\n\n There" as one token (a byte-level BPE may merge a break into the next word).
    assert step_of_tokens(text, [(0, 3), (3, 11)], spans) == [0, 1]
    assert step_of_tokens(text, [(0, 2), (2, 5), (5, 11)], spans) == [0, 0, 1]
    assert step_of_tokens(text, [(0, 3), (3, 5), (5, 6), (6, 11)], spans) == [0, None, None, 1]


def test_top_k_selects_a_share_of_steps_not_a_threshold():
    entropies = [[1.0, 5.0, 2.0, 5.0, 0.5, 3.0, 0.1, 0.2, 0.3, 0.4], [9.0, None, 8.0], [0.01]]
    # 20 % of 10 scored steps = 2, ties to the earlier step; 20 % of 2 rounds to 0: at least one.
    assert select_top_k(entropies, 20) == [(1, 3), (0,), (0,)]
    assert select_top_k(entropies, 100) == [tuple(range(10)), (0, 2), (0,)]
    # Ranked across traces: the tiny third trace's step is never chosen, the second's are first.
    assert select_top_k(entropies, 20, "corpus") == [(1,), (0, 2), ()]
    # Scaling all entropies changes no selection: there is no absolute threshold.
    scaled = [[None if v is None else v * 100 for v in row] for row in entropies]
    assert select_top_k(scaled, 20) == select_top_k(entropies, 20)
    for bad in (0, -5, 101):
        with pytest.raises(ValueError, match="k_percent"):
            select_top_k(entropies, bad)
    with pytest.raises(ValueError, match="scope"):
        select_top_k(entropies, 20, "global")  # type: ignore[arg-type]


def test_fidelity_against_the_expected_random_selection():
    selected = [(1,), (0, 2), ()]
    truth = [(1,), (3,), (0,)]
    result = fidelity(selected, truth, [4, 4, 2], "trace")
    assert (result["selected"], result["positives"], result["steps"], result["hits"]) == (3, 3, 10, 1)
    assert result["entropy"]["precision"] == pytest.approx(1 / 3, abs=1e-4)
    assert result["entropy"]["recall"] == pytest.approx(1 / 3, abs=1e-4)
    # Random with the same count per trace: E[hits] = 1 * 1/4 + 2 * 1/4 + 0 = 0.75.
    assert result["random"]["precision"] == pytest.approx(0.75 / 3, abs=1e-4)
    corpus = fidelity(selected, truth, [4, 4, 2], "corpus")
    assert corpus["random"]["precision"] == pytest.approx(3 / 10, abs=1e-4)  # 3 picks of 10 steps, 3 positives
    assert math.isclose(corpus["random"]["recall"], 0.3, abs_tol=1e-4)


def test_a_head_beyond_the_output_embedding_is_caught_and_scored_through_the_full_logits(backend):
    class Scaled(torch.nn.Module):
        """The tiny model with its logits doubled after the output layer (like a logit scale)."""

        def __init__(self, model):
            super().__init__()
            self.inner = model

        def forward(self, **kwargs):
            out = self.inner(**kwargs)
            out.logits = out.logits * 2
            return out

        def get_decoder(self):
            return self.inner.get_decoder()

        def get_output_embeddings(self):
            return self.inner.get_output_embeddings()

    scaled = HFBackend(Scaled(backend.model), backend.tokenizer, batch_size=3)
    scorer = StepScorer(scaled)
    got = score_steps(scorer, TRACES)
    assert scorer._full_logits
    reference = score_steps(scaled, TRACES)  # HFBackend.score reads model(...).logits
    for a, b in zip(got, reference):
        assert a.entropies == pytest.approx(b.entropies, rel=1e-4, abs=1e-4)
