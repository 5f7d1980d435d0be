"""Continuous batching (pipelines/episodes/continuous.py) on a tiny local model: the same
episodes, event for event, as the runner's rounds and as one episode at a time, with fewer
sequential decode steps where replies differ in length; each episode's keys and values reused
across its calls; what it refuses; a failing decoder stops the play with its error."""

from __future__ import annotations

import asyncio

import pytest

from pipelines.episodes import AgentContext, HFAgent, SpeakRLFormat, get_format, run_episodes_sync
from pipelines.episodes import decoding
from pipelines.episodes.continuous import ContinuousHFAgent, Request, SlotDecoder, play_continuous
from pipelines.episodes.runner import EpisodeState
from pipelines.llm import SamplingParams

from .helpers import gold_user
from .test_hf_agent import CONFIG, GREEDY, N_EPISODES, content_of, specs

pytestmark = pytest.mark.usefixtures("single_torch_thread")


@pytest.fixture(scope="module")
def backend(tiny_model_dir):
    from pipelines.llm import HFBackend, HFConfig

    return HFBackend.from_config(HFConfig(model_path=str(tiny_model_dir), batch_size=N_EPISODES))


def play(agent: ContinuousHFAgent, small_corpus, database, configs=None) -> list:
    chosen = specs(small_corpus)
    states = [EpisodeState.start(spec, agent, gold_user(), database, (configs or [CONFIG] * len(chosen))[i]) for i, spec in enumerate(chosen)]
    return asyncio.run(asyncio.wait_for(play_continuous(states, agent), timeout=300))


def steps_of(run) -> tuple[list, int]:
    before = decoding.DECODE_STATS["steps"]
    played = run()
    return played, decoding.DECODE_STATS["steps"] - before


@pytest.mark.parametrize(("slots", "attention", "draft"), [(N_EPISODES, "sdpa", None), (2, "sdpa", None), (N_EPISODES, "matmul", None),
                                                        (1, "matmul", None), (N_EPISODES, "sdpa", (4, 3)), (2, "matmul", (3, 1))])
def test_continuous_episodes_are_the_rounds_episodes_and_one_at_a_time(backend, small_corpus, database, slots, attention, draft):
    """Greedy rows compute what they would alone: rounds, continuous (every episode a slot, or
    fewer slots that the others queue for; the slot step attending by SDPA or by matrix
    products; one id per step, or verifying prompt-lookup drafts, several confirmed in a step)
    and one episode at a time play the same events."""
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    rounds = run_episodes_sync(specs(small_corpus), agent, gold_user(), database, CONFIG)
    shrinks, confirmed = decoding.DECODE_STATS["shrinks"], decoding.DECODE_STATS["draft_accepted"]
    continuous, steps = steps_of(lambda: play(ContinuousHFAgent(agent, slots=slots, attention=attention, draft=draft), small_corpus, database))
    if draft is not None:  # confirmed drafts: fewer sequential steps than one id per step
        assert decoding.DECODE_STATS["draft_accepted"] > confirmed
        undrafted = steps_of(lambda: play(ContinuousHFAgent(agent, slots=slots, attention=attention), small_corpus, database))[1]
        # with a slot per episode the longest episode bounds the steps (its replies may confirm
        # nothing); with fewer slots the others queue behind every step
        assert steps < undrafted if slots < N_EPISODES else steps <= undrafted
    alone = [run_episodes_sync([spec], agent, gold_user(), database, CONFIG)[0] for spec in specs(small_corpus)]
    assert [content_of(e) for e in continuous] == [content_of(e) for e in rounds] == [content_of(e) for e in alone]
    assert len({len(e.events) for e in continuous}) > 1  # episodes of different lengths: some end first
    if slots == N_EPISODES:  # the slots halve as the short episodes end
        assert decoding.DECODE_STATS["shrinks"] > shrinks


def test_replies_of_different_lengths_take_fewer_sequential_steps(backend, small_corpus, database):
    """A stop string ends some replies early: rounds wait for each round's longest reply, a
    continuous row is refilled at once."""
    context = AgentContext("e", 0, 0, 1, 0, 0, ({"role": "system", "content": "Be brief."}, {"role": "user", "content": "a hotel"}))
    free = asyncio.run(HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(max_tokens=16)).act([context]))
    stop = next(c for c in free[0].text[2:] if c.isalpha())  # a letter the model writes
    agent = HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(max_tokens=16, stop=(stop,)))
    rounds, round_steps = steps_of(lambda: run_episodes_sync(specs(small_corpus), agent, gold_user(), database, CONFIG))
    continuous, continuous_steps = steps_of(lambda: play(ContinuousHFAgent(agent), small_corpus, database))
    assert [content_of(e) for e in continuous] == [content_of(e) for e in rounds]
    lengths = {ev.completion_tokens for e in rounds for ev in e.events if ev.completion_tokens}
    assert len(lengths) > 1, lengths
    assert continuous_steps < round_steps


def test_each_episode_prefills_only_what_its_last_call_did_not_hold(backend, small_corpus, database, monkeypatch):
    prefixes: list[int] = []
    prefill = decoding._prefill

    def recording(model, rows, row_prefixes, *args):
        prefixes.extend(len(p.ids) if p is not None else 0 for p in row_prefixes)
        return prefill(model, rows, row_prefixes, *args)

    monkeypatch.setattr(decoding, "_prefill", recording)
    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)
    played = play(ContinuousHFAgent(agent), small_corpus, database)
    calls = sum(1 for e in played for ev in e.events if ev.actor == "agent" and ev.prompt_tokens is not None)
    assert len(prefixes) == calls
    # Every call after an episode's first reuses its previous prompt and reply as a prefix.
    assert sum(n > 0 for n in prefixes) >= calls - len(played)
    monkeypatch.setattr(decoding, "_prefill", prefill)
    assert [content_of(e) for e in played] == [content_of(e) for e in play(ContinuousHFAgent(HFAgent(
        backend, SpeakRLFormat(tools=()), GREEDY, episode_cache=False, prefix_cache=False)), small_corpus, database)]


def test_what_continuous_batching_refuses(backend, small_corpus, database):
    with pytest.raises(ValueError, match="greedy only"):
        ContinuousHFAgent(HFAgent(backend, SpeakRLFormat(tools=()), SamplingParams(temperature=0.7, max_tokens=8)))
    with pytest.raises(ValueError, match="not model.generate"):
        ContinuousHFAgent(HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, use_generate=True))
    with pytest.raises(ValueError, match=r"attention: expected one of \['matmul', 'sdpa'\], got 'flash'"):
        ContinuousHFAgent(HFAgent(backend, SpeakRLFormat(tools=()), GREEDY), attention="flash")
    with pytest.raises(ValueError, match=r"attention: expected one of"):
        SlotDecoder(backend.model, 2, 4, frozenset(), 0, attention="flash")
    agent = ContinuousHFAgent(HFAgent(backend, SpeakRLFormat(tools=()), GREEDY))
    other = type("Other", (), {"name": "other", "format": get_format("react")})()
    state = EpisodeState.start(specs(small_corpus)[0], other, gold_user(), database, CONFIG)
    with pytest.raises(ValueError, match="was started for format 'react'"):
        asyncio.run(play_continuous([state], agent))


def test_a_decoder_that_fails_stops_the_play_with_its_error(backend, small_corpus, database, monkeypatch):
    def broken(self):
        raise RuntimeError("injected decode fault")

    monkeypatch.setattr(SlotDecoder, "launch", broken)
    with pytest.raises(RuntimeError, match="injected decode fault"):
        play(ContinuousHFAgent(HFAgent(backend, SpeakRLFormat(tools=()), GREEDY)), small_corpus, database)


def _assert_capturable(step) -> None:
    """What CUDA graph capture needs of ``step`` (run again here: its ids and columns as they
    were, so it writes the same keys): it dispatches no host-bound op and traces as one graph."""
    import torch
    import torch._dynamo as dynamo

    from .test_decoding import _host_ops

    with torch.inference_mode():
        assert _host_ops(step) == []
        try:
            explained = dynamo.explain(step)()
        finally:
            dynamo.reset()
    assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
@pytest.mark.parametrize("architecture", ["qwen2", "llama"])
def test_a_slot_step_neither_waits_on_the_host_nor_breaks_a_trace(backend, architecture, attention):
    """What CUDA graph capture needs of the one step shape every slot shares: its forward
    dispatches no host-bound op and traces as one graph without a break."""
    import torch

    if architecture == "llama":
        from transformers import LlamaConfig, LlamaForCausalLM

        torch.manual_seed(0)
        config = LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, tie_word_embeddings=True, max_position_embeddings=512)
        net = LlamaForCausalLM._from_config(config, attn_implementation="sdpa").eval()
    else:
        net = backend.model
    decoder = SlotDecoder(net, 3, 6, frozenset(), 0, attention=attention)
    requests = [Request(None, row, None, None, 0.0) for row in ([21, 22, 23], [24, 25, 26, 27, 28])]
    assert decoder.admit(requests) == []
    decoder.step()  # the first step of the admitted rows; the third slot is free
    _assert_capturable(decoder._eager)
    # Each row wrote at its own column (the one after its prompt) and attends to its columns up
    # to it, nothing after (a shorter row's slot holds the admission's padding there, masked).
    keys = decoder.layers[0].keys_buffer
    assert decoder.lengths[:2] == [4, 6]
    assert bool(keys[0, :, 3].abs().sum() > 0) and bool(keys[1, :, 5].abs().sum() > 0)
    assert decoder.allowed[0].nonzero().squeeze(1).tolist() == [0, 1, 2, 3]
    assert decoder.allowed[1].nonzero().squeeze(1).tolist() == [0, 1, 2, 3, 4, 5]
    assert bool(keys[1, :, 6:].abs().sum() == 0)


@pytest.mark.parametrize("attention", ["sdpa", "matmul"])
def test_a_drafted_step_writes_what_one_id_per_step_writes_and_attends_to_what_it_confirmed(backend, attention):
    """A step that verifies drafts (rows whose context repeats, so there are drafts to verify):
    every row's ids to its end are those of the same decoder without drafts; after each step a
    row attends to exactly its confirmed columns; and the wider step, like the one-id step,
    dispatches no host-bound op and traces as one graph (what CUDA graph capture needs)."""
    rows = ([21, 22, 23, 21, 22, 23, 21], [24, 25, 24, 25, 24, 25], [30, 31, 32])

    def started(draft):
        decoder = SlotDecoder(backend.model, 3, 10, frozenset(), 0, attention=attention, draft=draft)
        requests = [Request(None, list(row), None, None, 0.0) for row in rows]
        assert decoder.admit(requests) == []
        return decoder, requests

    def run(draft):
        decoder, requests = started(draft)
        while decoder.busy():
            decoder.step()
            for slot, request in enumerate(decoder.rows):
                if request is not None:
                    assert decoder.allowed[slot].nonzero().squeeze(1).tolist() == list(range(decoder.lengths[slot]))
        return [r.generated for r in requests]

    drafted = decoding.DECODE_STATS["drafted"]
    assert run((3, 2)) == run(None)
    assert decoding.DECODE_STATS["drafted"] > drafted
    decoder, _ = started((3, 2))  # a decoder of its own: the checks below run its step again
    decoder.step()
    _assert_capturable(decoder._eager)


def test_a_failed_capture_decodes_the_same_episodes_eagerly_and_says_so(backend, small_corpus, database, monkeypatch):
    """Fault injection: capture is attempted (as on a GPU) and fails; the slots' step runs
    eagerly, the failure is counted and its message kept."""
    def fail(forward):
        raise RuntimeError("injected: operation not permitted when stream is capturing")

    agent = HFAgent(backend, SpeakRLFormat(tools=()), GREEDY, cuda_graphs=True)
    expected = play(ContinuousHFAgent(agent), small_corpus, database)
    monkeypatch.setattr(decoding, "_can_capture", lambda device: True)
    monkeypatch.setattr(decoding, "capture_step", fail)
    monkeypatch.setattr(decoding, "GRAPH_ERRORS", [])
    before = dict(decoding.DECODE_STATS)
    played = play(ContinuousHFAgent(agent), small_corpus, database)
    assert [content_of(e) for e in played] == [content_of(e) for e in expected]
    assert decoding.DECODE_STATS["graph_failures"] == before.get("graph_failures", 0) + 1  # tried once, not again
    assert decoding.decode_stats()["graph_error"] == "RuntimeError: injected: operation not permitted when stream is capturing"



def test_grouped_matrix_products_compute_what_repeated_keys_compute():
    """The slot step's ``matmul`` attention (one query token, 9 heads over 3 key/value heads,
    float32) equals transformers' SDPA path, which repeats the keys and values, under a boolean
    mask and under an additive one, with the given scale and the default one; a row masked
    everywhere gives numbers, not NaN. A drafted step's longer query (each position under its
    own mask row) is grouped the same way, by either attention. bf16 and autocast run the
    grouped SDPA (whose kernels keep the scores in float32) instead, bit for bit, and for one
    token per row that is the rounds' packed SDPA."""
    import types

    import torch
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from pipelines.episodes.continuous import grouped_matmul_attention, grouped_sdpa_attention

    torch.manual_seed(0)
    module = types.SimpleNamespace(num_key_value_groups=3, is_causal=True, training=False)
    query, key, value = torch.randn(4, 9, 1, 16), torch.randn(4, 3, 40, 16), torch.randn(4, 3, 40, 16)
    mask = torch.rand(4, 1, 1, 40) > 0.3
    mask[:, :, :, -1] = True
    grouped, _ = grouped_matmul_attention(module, query, key, value, mask, scaling=0.25)
    repeated, _ = sdpa_attention_forward(module, query, key, value, mask, scaling=0.25)
    assert grouped.shape == repeated.shape == (4, 1, 9, 16) and grouped.dtype == torch.float32
    assert torch.allclose(grouped, repeated, atol=1e-5)
    additive = torch.zeros(4, 1, 1, 40).masked_fill(~mask, torch.finfo(torch.float32).min)
    assert torch.allclose(grouped_matmul_attention(module, query, key, value, additive, scaling=0.25)[0], repeated, atol=1e-5)
    assert torch.allclose(grouped_matmul_attention(module, query, key, value, mask)[0],
                          sdpa_attention_forward(module, query, key, value, mask)[0], atol=1e-5)  # the default scale
    nowhere = mask.clone()
    nowhere[1] = False
    assert not grouped_matmul_attention(module, query, key, value, nowhere, scaling=0.25)[0].isnan().any()
    longer, causal = torch.randn(4, 9, 3, 16), mask.expand(4, 1, 3, 40).clone()
    causal[:, :, :, -3:] = torch.ones(3, 3, dtype=torch.bool).tril()  # the step's positions, each seeing those up to its own
    repeated, _ = sdpa_attention_forward(module, longer, key, value, causal, scaling=0.25)
    for attention in (grouped_matmul_attention, grouped_sdpa_attention):
        out, _ = attention(module, longer, key, value, causal, scaling=0.25)
        assert out.shape == repeated.shape == (4, 3, 9, 16) and torch.allclose(out, repeated, atol=1e-5)
    half = [t.to(torch.bfloat16) for t in (query, key, value)]
    assert torch.equal(grouped_matmul_attention(module, *half, mask, scaling=0.25)[0], decoding.packed_gqa_sdpa(module, *half, mask, scaling=0.25)[0])
    assert torch.equal(grouped_sdpa_attention(module, *half, mask, scaling=0.25)[0], decoding.packed_gqa_sdpa(module, *half, mask, scaling=0.25)[0])
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(grouped_matmul_attention(module, query, key, value, mask, scaling=0.25)[0],
                           decoding.packed_gqa_sdpa(module, query, key, value, mask, scaling=0.25)[0])


def test_the_slot_step_attends_with_its_own_implementation_and_leaves_the_models(backend):
    """The ``matmul`` step is registered with transformers and used for the step only: the
    model's own attention (its prefills') is SDPA before and after, also when the step fails."""
    from transformers import AttentionInterface

    from pipelines.episodes.continuous import ATTENTIONS, attending, grouped_matmul_attention

    decoder = SlotDecoder(backend.model, 2, 4, frozenset(), 0, attention="matmul")
    assert AttentionInterface._global_mapping[ATTENTIONS["matmul"]] is grouped_matmul_attention
    assert decoder.admit([Request(None, [21, 22, 23], None, None, 0.0)]) == []
    seen = []
    AttentionInterface.register(ATTENTIONS["matmul"], lambda *a, **k: (seen.append(1), grouped_matmul_attention(*a, **k))[1])
    try:
        decoder.step()
    finally:
        AttentionInterface.register(ATTENTIONS["matmul"], grouped_matmul_attention)
    assert len(seen) == backend.model.config.num_hidden_layers  # every layer, once
    assert backend.model.config._attn_implementation == "sdpa"
    with pytest.raises(RuntimeError, match="injected"):
        with attending(backend.model, ATTENTIONS["matmul"]):
            raise RuntimeError("injected")
    assert backend.model.config._attn_implementation == "sdpa"


def test_each_attention_is_timed_at_the_asked_width(backend, monkeypatch):
    """``time_attentions``: every attention of ATTENTIONS stepped at the asked rows and buffer
    width (prompts short, the buffer as wide as an evaluation's longest), its ms per step."""
    from pipelines.episodes import continuous

    widths = []
    real_step = SlotDecoder.step

    def step(self):
        widths.append((self.attention, self.slots, self.capacity, self.layers[0].keys_buffer.shape[2]))
        return real_step(self)

    monkeypatch.setattr(SlotDecoder, "step", step)
    times, errors = continuous.time_attentions(backend.model, 3, 300, cuda_graphs=False, steps=4)
    assert set(times) == set(continuous.ATTENTIONS) and all(ms > 0 for ms in times.values()) and errors == {}
    assert sorted(set(widths)) == sorted((continuous.ATTENTIONS[name], 3, 512, 512) for name in continuous.ATTENTIONS)
    assert len(widths) == 2 * (2 + 4)  # two untimed steps (the capture's), four timed, per attention


def test_the_decoder_times_its_prefills_and_steps_and_counts_prefilled_tokens(backend):
    """What an evaluation's report splits its wall time by (pipelines.evaluation.speed):
    the prefill's and the steps' time and the tokens prefilled (the rows less their reused prefix)."""
    before = dict(decoding.DECODE_STATS)
    decoder = SlotDecoder(backend.model, 2, 4, frozenset(), 0)
    decoder.admit([Request(None, [21, 22, 23], None, None, 0.0), Request(None, [24, 25], None, None, 0.0)])
    decoder.step(), decoder.step()
    decoder.timer.flush()
    grew = {key: decoding.DECODE_STATS[key] - before.get(key, 0) for key in ("prefill_us", "step_us", "prefill_tokens", "steps")}
    assert grew["prefill_tokens"] == 5 and grew["steps"] == 2 and grew["prefill_us"] > 0 and grew["step_us"] > 0


def test_an_attention_that_fails_or_will_not_capture_is_ruled_out(backend, monkeypatch):
    """Fault injection. A step that raises: that attention is ruled out with its error. A step
    that will not capture as a CUDA graph (on this CPU: capture allowed and made to fail for
    matmul): ruled out too, and its failure taken back, so that later steps still capture."""
    from pipelines.episodes import continuous

    real = continuous.grouped_matmul_attention

    def broken(*args, **kwargs):
        raise RuntimeError("injected matmul fault")

    from transformers import AttentionInterface

    AttentionInterface.register(continuous.ATTENTIONS["matmul"], broken)
    try:
        times, errors = continuous.time_attentions(backend.model, 2, 64, cuda_graphs=False, steps=2)
    finally:
        AttentionInterface.register(continuous.ATTENTIONS["matmul"], real)
    assert set(times) == {"sdpa"} and errors == {"matmul": "RuntimeError: injected matmul fault"}

    captured = []

    def capture_step(forward):
        if forward.__self__.attention == continuous.ATTENTIONS["matmul"]:
            raise RuntimeError("injected capture fault")
        captured.append(forward.__self__.attention)
        return None, forward()

    monkeypatch.setattr(decoding, "_can_capture", lambda device: not decoding.GRAPH_ERRORS)
    monkeypatch.setattr(decoding, "capture_step", capture_step)
    before = list(decoding.GRAPH_ERRORS)
    times, errors = continuous.time_attentions(backend.model, 2, 64, cuda_graphs=True, steps=2)
    assert set(times) == {"sdpa"} and errors["matmul"].startswith("capture failed: RuntimeError: injected capture fault")
    assert decoding.GRAPH_ERRORS == before and captured and set(captured) == {continuous.ATTENTIONS["sdpa"]}
