"""The batched decoding loop on a tiny Qwen2 model: greedy rows equal ``model.generate``
row by row (with a shared prefix, length groups and stopped rows leaving), seeded
sampling, the length grouping, and what the loop refuses."""

from __future__ import annotations

import itertools
import random

import pytest

from pipelines.episodes import decoding
from pipelines.episodes.decoding import DecodeSpec, decode, length_groups, prefix_kv, supports_decoding

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def model(tiny_model_dir):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()


PREFIX = [11, 12, 13, 14, 15, 16, 17, 18]


def rows_with_prefix(n: int = 7, seed: int = 0) -> list[list[int]]:
    rnd = random.Random(seed)
    return [PREFIX + [rnd.randrange(20, 200) for _ in range(rnd.randrange(1, 30))] for _ in range(n)]


def generate_alone(model, row: list[int], max_new_tokens: int, stop_ids: frozenset[int]) -> list[int]:
    """``model.generate``'s greedy continuation of one row, cut after its first stop id."""
    import torch

    with torch.inference_mode():
        out = model.generate(
            input_ids=torch.tensor([row]), max_new_tokens=max_new_tokens, do_sample=False, pad_token_id=0, eos_token_id=sorted(stop_ids)
        )
    new = out[0, len(row) :].tolist()
    end = next((k for k, token in enumerate(new) if token in stop_ids), None)
    return new if end is None else new[: end + 1]


@pytest.mark.parametrize("with_prefix", [True, False])
@pytest.mark.parametrize("call_tokens", [0, 10_000])
def test_greedy_rows_equal_model_generate_row_by_row(model, monkeypatch, with_prefix, call_tokens):
    # call_tokens 0: a prefill group per distinct length; 10000: one group, padded.
    monkeypatch.setattr(decoding, "PREFILL_CALL_TOKENS", call_tokens)
    rows = rows_with_prefix()
    # A tenth of the vocabulary stops a row: rows stop at different steps and leave.
    stops = frozenset(range(0, 400, 10))
    spec = DecodeSpec(max_new_tokens=16, stop_ids=stops, compact_share=0.01)
    prefix = prefix_kv(model, PREFIX) if with_prefix else None
    batched = decode(model, rows, spec, pad_id=0, prefix=prefix)
    alone = [generate_alone(model, row, 16, stops) for row in rows]
    assert batched == alone
    lengths = {len(ids) for ids in batched}
    assert len(lengths) > 1 and 16 in lengths, lengths  # some stopped early, some ran out


def test_length_groups_minimise_padding_plus_call_cost():
    rnd = random.Random(3)
    for _ in range(50):
        lengths = sorted(rnd.randrange(1, 60) for _ in range(rnd.randrange(1, 8)))
        call = rnd.choice([0, 8, 40, 1000])

        def cost(groups):
            return sum(call + (end - start) * lengths[end - 1] for start, end in groups)

        best = min(
            cost(list(zip((0,) + cuts, cuts + (len(lengths),))))
            for k in range(len(lengths))
            for cuts in itertools.combinations(range(1, len(lengths)), k)
        )
        groups = length_groups(lengths, call)
        assert cost(groups) == best
        assert groups[0][0] == 0 and groups[-1][1] == len(lengths)
        assert all(a[1] == b[0] for a, b in zip(groups, groups[1:]))
    assert length_groups([5, 5, 5], 100) == [(0, 3)]
    assert length_groups([1, 50], 0) == [(0, 1), (1, 2)]


def test_sampling_is_seeded_and_a_zero_nucleus_is_greedy(model):
    rows = rows_with_prefix(4, seed=1)
    no_stop = frozenset({-1})

    def sample(seed: int, top_p: float | None = None) -> list[list[int]]:
        return decode(model, rows, DecodeSpec(12, no_stop, temperature=1.5, top_p=top_p, seed=seed), pad_id=0)

    assert sample(1) == sample(1)
    assert sample(1) != sample(2)
    greedy = decode(model, rows, DecodeSpec(12, no_stop), pad_id=0)
    assert sample(1) != greedy
    assert sample(1, top_p=0.0) == greedy == sample(2, top_p=0.0)


def test_stop_text_ends_a_row_after_the_token_that_completes_it(model):
    [row] = rows_with_prefix(1, seed=2)
    spec = DecodeSpec(12, frozenset({-1}))
    [free] = decode(model, [row], spec, pad_id=0)
    [cut] = decode(model, [row], spec, pad_id=0, stop_text=lambda ids: len(ids) >= 2 and ids[-1] == free[4])
    assert cut == free[: free.index(free[4], 2) + 1]


def test_what_the_loop_refuses(model, tiny_model_dir):
    from transformers import AutoConfig, AutoModelForCausalLM

    with pytest.raises(ValueError, match="start with its prefix"):
        decode(model, [[1, 2, 3]], DecodeSpec(4, frozenset()), pad_id=0, prefix=prefix_kv(model, PREFIX))
    with pytest.raises(ValueError, match="compact_share"):
        DecodeSpec(4, frozenset(), compact_share=0.0)
    with pytest.raises(ValueError, match="max_new_tokens"):
        DecodeSpec(0, frozenset())
    assert supports_decoding(model)
    # Sliding-window layers keep only a window of keys: the loop's cache would be wrong.
    config = AutoConfig.from_pretrained(tiny_model_dir)
    config.use_sliding_window, config.sliding_window, config.max_window_layers = True, 16, 0
    config.layer_types = ["sliding_attention"] * config.num_hidden_layers
    assert not supports_decoding(AutoModelForCausalLM.from_config(config))


def test_a_full_buffer_is_an_error_not_a_silent_overwrite(model):
    import torch

    cache = decoding._buffer_cache(model, 4)
    with torch.inference_mode(), pytest.raises(RuntimeError, match="KV buffer full"):
        model(input_ids=torch.tensor([[1, 2, 3, 4, 5]]), past_key_values=cache, use_cache=True)


@pytest.mark.parametrize("call_tokens", [0, 10_000])
def test_per_row_caches_carried_to_the_next_call_change_no_greedy_output(model, monkeypatch, call_tokens):
    # Round 1 decodes rows and keeps their keys and values; round 2 extends every row (a
    # reply, then a new turn) and prefills only what is new, each row from its own cache
    # (some cut to a shorter common prefix, one without): the outputs equal model.generate's.
    monkeypatch.setattr(decoding, "PREFILL_CALL_TOKENS", call_tokens)
    rows = rows_with_prefix(6, seed=1)
    stops = frozenset(range(0, 400, 10))
    spec = DecodeSpec(max_new_tokens=12, stop_ids=stops, compact_share=0.01)
    kept: list = []
    first = decode(model, rows, spec, pad_id=0, prefix=prefix_kv(model, PREFIX), kv_out=kept)
    assert first == [generate_alone(model, row, 12, stops) for row in rows]
    for row, ids, kv in zip(rows, first, kept):
        assert kv.ids == tuple(row + ids[:-1])  # every fed token; the last one never was
        assert all(k.shape[2] == len(kv.ids) == v.shape[2] for k, v in kv.layers)
    rnd = random.Random(2)
    second = [row + ids + [rnd.randrange(20, 200) for _ in range(rnd.randrange(1, 20))] for row, ids in zip(rows, first)]
    second[1] = second[1][:10] + [201] + second[1][11:]  # a changed history: only the common prefix is reused
    prefixes = [kv.common(row) for kv, row in zip(kept, second)]
    prefixes[2] = None
    assert len(prefixes[1].ids) == 10 and all(len(p.ids) >= len(r) for p, r in zip(prefixes[3:], rows[3:]))
    again = decode(model, second, spec, pad_id=0, prefixes=prefixes)
    assert again == [generate_alone(model, row, 12, stops) for row in second]


def test_a_common_prefix_is_never_the_whole_row(model):
    kv = prefix_kv(model, PREFIX)
    assert kv.common(PREFIX + [30]) is kv
    assert kv.common(PREFIX).ids == tuple(PREFIX[:-1])  # one token is left to prefill
    assert kv.common([99] + PREFIX) is None
    with pytest.raises(ValueError, match="not both"):
        decode(model, [PREFIX + [1]], DecodeSpec(2, frozenset()), pad_id=0, prefix=kv, prefixes=[kv])


# --------------------------------------------------------------------------------------
# cuda_graphs: fixed-shape steps (run eagerly on a CPU), the capture's fallback
# --------------------------------------------------------------------------------------


def test_static_steps_write_what_the_growing_cache_writes(model):
    """Greedy rows equal ``model.generate`` row by row, and the per-row caches they hand to
    the next call give that call the same output as the growing path's."""
    rows = rows_with_prefix()
    stops = frozenset(range(0, 400, 10))
    prefix = prefix_kv(model, PREFIX)
    growing_kv, static_kv = [], []
    growing = decode(model, rows, DecodeSpec(16, stops, compact_share=0.01), pad_id=0, prefix=prefix, kv_out=growing_kv)
    calls = decoding.DECODE_STATS["static_calls"]
    static = decode(model, rows, DecodeSpec(16, stops, cuda_graphs=True), pad_id=0, prefix=prefix, kv_out=static_kv)
    assert decoding.DECODE_STATS["static_calls"] == calls + 1
    assert static == growing == [generate_alone(model, row, 16, stops) for row in rows]
    assert len({len(ids) for ids in static}) > 1  # rows stopped at different steps and stayed in the batch
    follow = [row + ids + [21, 22] for row, ids in zip(rows, static)]
    assert decode(model, follow, DecodeSpec(8, stops, cuda_graphs=True), pad_id=0, prefixes=static_kv) == decode(
        model, follow, DecodeSpec(8, stops), pad_id=0, prefixes=growing_kv)


def test_static_steps_sample_what_a_batch_that_keeps_its_rows_samples(model):
    rows = rows_with_prefix(5, seed=3)
    stops = frozenset(range(0, 400, 25))
    for seed in (0, 1):
        kept = decode(model, rows, DecodeSpec(12, stops, temperature=1.5, seed=seed, compact_share=None), pad_id=0)
        assert decode(model, rows, DecodeSpec(12, stops, temperature=1.5, seed=seed, cuda_graphs=True), pad_id=0) == kept


def test_a_failed_graph_capture_decodes_the_same_tokens_eagerly_and_says_so(model, monkeypatch):
    # Fault injection: capture is attempted (as on a GPU) and fails.
    def fail(forward):
        raise RuntimeError("injected: operation not permitted when stream is capturing")

    monkeypatch.setattr(decoding, "_can_capture", lambda device: True)
    monkeypatch.setattr(decoding, "capture_step", fail)
    monkeypatch.setattr(decoding, "GRAPH_ERRORS", [])
    rows = rows_with_prefix(4)
    before = dict(decoding.DECODE_STATS)
    out = decode(model, rows, DecodeSpec(10, frozenset({-1}), cuda_graphs=True), pad_id=0)
    assert out == decode(model, rows, DecodeSpec(10, frozenset({-1})), pad_id=0)
    assert decoding.DECODE_STATS["graph_failures"] == before.get("graph_failures", 0) + 1
    assert decoding.DECODE_STATS["graphs"] == before.get("graphs", 0)
    assert decoding.decode_stats()["graph_error"] == "RuntimeError: injected: operation not permitted when stream is capturing"
    # On a GPU a failed capture is not tried again in the process.
    monkeypatch.undo()
    cuda = type("Device", (), {"type": "cuda"})()
    monkeypatch.setattr(decoding, "GRAPH_ERRORS", ["RuntimeError: earlier"])
    assert not decoding._can_capture(cuda)
    monkeypatch.setattr(decoding, "GRAPH_ERRORS", [])
    assert decoding._can_capture(cuda) and not decoding._can_capture(type("Device", (), {"type": "cpu"})())
    # A block that asks for eager static steps (a profiler's): no capture inside, capture after.
    with decoding.eager_static_steps():
        with decoding.eager_static_steps():
            assert not decoding._can_capture(cuda)
        assert not decoding._can_capture(cuda)
    assert decoding._can_capture(cuda)


def test_a_static_step_traces_as_one_graph_without_a_break(model):
    """What CUDA graph capture needs: nothing in the step's forward waits on the host (no
    ``.item()``, no data-dependent branch); torch.compile's tracer breaks its graph where
    something does, so one graph and no break is checked on a CPU."""
    import torch
    import torch._dynamo as dynamo

    with torch.inference_mode():
        cache, logits, mask, width = decoding._prefill(model, [[21, 22, 23], [24, 25, 26, 27, 28]], [None, None], 4, 0)
        step = decoding._StaticStep(model, cache, mask, capture=False)
        step.ids.copy_(logits.argmax(-1).unsqueeze(1))
        step.positions.copy_(torch.tensor([[3], [5]]))
        step.column.fill_(width)
        step.allowed[:, width] = True
        try:
            explained = dynamo.explain(step._forward)()
        finally:
            dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


#: Operations that make the host wait for the device (a value read back, a shape that depends on
#: data) or copy host data to it (``torch.tensor(...)`` inside forward): each breaks a CUDA graph
#: capture ("operation not permitted when stream is capturing").
HOST_OPS = {"item", "_local_scalar_dense", "nonzero", "masked_select", "unique", "_unique2", "equal", "is_nonzero",
            "lift_fresh", "lift_fresh_copy", "repeat_interleave"}


def _host_ops(fn) -> list[str]:
    """The :data:`HOST_OPS` that ``fn()`` dispatches, in order, and indexing by a boolean mask
    (its nonzero runs below the dispatcher)."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode

    seen = []

    class Record(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            name = func.overloadpacket.__name__
            indices = args[1] if name.startswith("index") and len(args) > 1 and isinstance(args[1], (list, tuple)) else ()
            if name in HOST_OPS or any(getattr(index, "dtype", None) == torch.bool for index in indices):
                seen.append(name)
            return func(*args, **(kwargs or {}))

    with Record():
        fn()
    return seen


@pytest.fixture(scope="module")
def llama():
    """A tiny model of SmolLM2's architecture (Llama: grouped-query attention, tied embeddings),
    the GPU job's model, random weights."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=512)
    return LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()


@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_a_static_step_neither_waits_on_the_host_nor_copies_to_the_device(model, llama, architecture):
    """The other half of what capture needs, op by op (the tracer above does not see a tensor
    built from host data): the step dispatches none of :data:`HOST_OPS`; the prefill may."""
    import torch

    net = {"qwen2": model, "llama": llama}[architecture]
    with torch.inference_mode():
        # The recorder sees what it must see (else the assertion below could not fail).
        probe = torch.ones(3)
        assert _host_ops(lambda: (probe.sum().item(), torch.tensor([1, 2]), probe.nonzero(), probe[probe > 0])) == [
            "item", "lift_fresh", "nonzero", "index"]
        cache, logits, mask, width = decoding._prefill(net, [[21, 22, 23], [24, 25, 26, 27, 28]], [None, None], 4, 0)
        step = decoding._StaticStep(net, cache, mask, capture=False)
        for k in range(3):
            tokens, positions, out = logits.argmax(-1), torch.tensor([3 + k, 5 + k]), []
            assert _host_ops(lambda: out.append(step(tokens, positions, width + k))) == []
            logits = out[0]
        assert bool(cache.layers[0].keys[:, :, width : width + 3].abs().sum(-1).gt(0).all())  # the steps wrote their columns


def _teacher_forced_logprobs(model, row, new, temperature):
    import torch

    with torch.inference_mode():
        logits = model(input_ids=torch.tensor([row + new[:-1]])).logits[0, len(row) - 1 :].float()
    if temperature > 0:
        logits = logits / temperature
    return logits.log_softmax(-1).gather(1, torch.tensor(new)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("temperature", [0.0, 0.7])
@pytest.mark.parametrize("cuda_graphs", [False, True])
def test_log_probabilities_are_those_of_the_distribution_each_token_was_drawn_from(model, temperature, cuda_graphs):
    """What GRPO's rollouts hand to TRL: each new token's log-probability, greedy under the
    model's distribution, sampled under the temperature-scaled one, as teacher forcing
    recomputes it."""
    rows = rows_with_prefix(4, seed=5)
    logprobs = []
    new = decode(model, rows, DecodeSpec(10, frozenset(range(0, 400, 30)), temperature=temperature, seed=3, cuda_graphs=cuda_graphs),
                 pad_id=0, logprobs_out=logprobs)
    assert [len(p) for p in logprobs] == [len(ids) for ids in new]
    for row, ids, got in zip(rows, new, logprobs):
        assert got == pytest.approx(_teacher_forced_logprobs(model, row, ids, temperature), abs=1e-4)


def test_each_row_can_have_its_own_stop(model):
    rows = rows_with_prefix(3, seed=2)
    spec = DecodeSpec(12, frozenset({-1}))
    free = decode(model, rows, spec, pad_id=0)
    limited = decode(model, rows, spec, pad_id=0, stop_text=[None, lambda ids: len(ids) >= 4, lambda ids: len(ids) >= 7])
    assert limited == [free[0], free[1][:4], free[2][:7]]
    with pytest.raises(ValueError, match="one per row"):
        decode(model, rows, spec, pad_id=0, stop_text=[None])


def test_static_steps_run_under_autocast_where_keys_and_values_differ_in_dtype(model):
    """GRPO's rollouts decode a float32 model under bf16 autocast: the projections give bf16
    values, rotary embeddings float32 keys. The static steps write both into the buffers the
    prefill allocated, as the growing cache does (the H200 run of 2026-11-30 failed here:
    index_copy_ of BFloat16 values into a Float buffer)."""
    import torch

    rows = rows_with_prefix(4, seed=5)
    stops = frozenset(range(0, 400, 10))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        growing = decode(model, rows, DecodeSpec(10, stops, compact_share=0.01), pad_id=0)
        static = decode(model, rows, DecodeSpec(10, stops, cuda_graphs=True), pad_id=0)
    assert static == growing


def test_packed_grouped_query_attention_computes_what_repeated_keys_compute():
    """A static step's attention (one query token, 9 heads over 3 key/value heads, a boolean
    mask over the buffer) equals transformers' SDPA path, which repeats the keys and values."""
    import types

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    query, key, value = torch.randn(4, 9, 1, 16), torch.randn(4, 3, 40, 16), torch.randn(4, 3, 40, 16)
    mask = torch.rand(4, 1, 1, 40) > 0.3
    mask[:, :, :, -1] = True
    packed, _ = decoding.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.25)
    repeated, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert packed.shape == repeated.shape == (4, 1, 9, 16)
    assert torch.allclose(packed, repeated, atol=1e-5)


def test_static_steps_attend_packed_and_leave_the_models_attention_as_it_was(llama):
    rows = rows_with_prefix(3, seed=7)
    stops = frozenset(range(0, 400, 10))
    assert llama.config._attn_implementation == "sdpa"
    assert decode(llama, rows, DecodeSpec(6, stops, cuda_graphs=True), pad_id=0) == decode(llama, rows, DecodeSpec(6, stops), pad_id=0)
    assert llama.config._attn_implementation == "sdpa"
    from transformers import AttentionInterface

    assert AttentionInterface._global_mapping[decoding.PACKED_SDPA] is decoding.packed_gqa_sdpa
