"""Batched decoding for the hf agent: one prefill per batch, then one token per live row per
step, with stopped rows leaving the batch.

Why not ``model.generate`` (measured on the embedded 4-layer policy, 2 CPU cores, 99 rows of
about 250 positions; ``benchmarks/eval.py`` shows the effect on whole evaluations):

* its ``DynamicCache`` grows by concatenation, so every step copies every layer's keys and
  values: about 3 ms of a 15 ms step. :class:`KVBuffer` allocates each layer's keys and
  values once, with room for the prompt and every new token, and writes in place;
* a row that stopped keeps computing until the longest row ends. Here the stopped rows
  leave the batch (their cache rows are dropped) once they are ``compact_share`` of it, so
  the steps of a long reply cost what its few rows cost, not what the whole batch costs.

A batch is laid out as ``[prefix][padding][rest]``: an optional shared prefix (a system
prompt whose keys and values are computed once, :func:`prefix_kv`), the padding after it,
masked, and each row's remaining prompt ending where generation starts. Positions skip the
padding, so every row computes what it would alone; greedy rows therefore equal rows decoded
one at a time (and ``model.generate``'s greedy output), which the tests check.

Sampling follows OpenAI's parameters, temperature and top_p, and nothing from the
checkpoint's ``generation_config`` (no implicit top_k or repetition penalty); callers that
need other logits processors use ``model.generate``.

**CUDA graphs** (``DecodeSpec.cuda_graphs``). On a GPU a small model's step is bound by
Python and kernel launches, not by the card: SmolLM2-135M on an H100 took 26-27 ms per step
whatever the batch (the partial run of 2026-11-26: 36.9 s for 1,414 sequential steps
zero-shot, 72.8 s for 2,716 after SFT; ``benchmarks/decode_depth.py``). With ``cuda_graphs``
every step after the prefill is one call of fixed shapes (:class:`_StaticStep`): the rows stay
in the batch (no compaction), the keys and values of the step are written into the buffer at
a column held in a tensor, and attention runs over the buffer's whole capacity under a 4-D
mask, so on a CUDA device the step is captured once per call as a CUDA graph and replayed.
Where capture fails (a model whose forward synchronises with the host), and on a CPU, the
same static step runs eagerly; :data:`DECODE_STATS` counts which, and a process whose capture
failed once does not try again.

The H200 run of 2026-11-30 captured every call (22 graphs, no failure) and still took 36 ms per
step after SFT: the launches were not the cost. Under a mask, transformers' SDPA path copies
every layer's keys and values once per query head of a group (``repeat_kv``: SmolLM2's 3
key/value heads to 9, over the whole buffer: about 0.5 GB per layer for 128 rows of 1,750
positions in float32). A static step's attention therefore groups the query heads under their
key/value head instead (:func:`packed_gqa_sdpa`: the one new token's query as a group of
``num_key_value_groups`` rows), which reads each key and value once and computes the same.
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import logging
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Iterator, Sequence

from pipelines.config import positive_int, rate

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DecodeSpec:
    """How tokens are picked and when a row stops.

    Greedy at ``temperature`` 0; else sampled from the temperature-scaled distribution cut
    to its ``top_p`` nucleus, from a generator seeded with ``seed``. A row stops at its
    first token in ``stop_ids`` (which ends its ids), or after ``max_new_tokens``.
    ``compact_share``: once stopped rows are this share of the batch, they leave it (None:
    they stay and compute padding until the last row stops). ``cuda_graphs``: every step
    after the prefill is one static-shape call, replayed as a CUDA graph on a GPU (module
    docstring); rows then stay in the batch and ``compact_share`` is not used."""

    max_new_tokens: int
    stop_ids: frozenset[int]
    temperature: float = 0.0
    top_p: float | None = None
    seed: int = 0
    compact_share: float | None = 0.125
    cuda_graphs: bool = False

    def __post_init__(self) -> None:
        positive_int(self.max_new_tokens, "max_new_tokens")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        rate(self.top_p, "top_p", optional=True)
        if self.compact_share is not None and not 0.0 < self.compact_share <= 1.0:
            raise ValueError(f"compact_share must be in (0, 1] or None, got {self.compact_share}")


log = logging.getLogger(__name__)

#: This process's decoding: ``calls`` (of :func:`decode`), ``steps`` (model calls after the
#: prefills: the sequential decode steps), and with ``cuda_graphs`` ``static_calls``,
#: ``graphs`` (captured and replayed), ``graph_failures`` (ran eagerly instead) and
#: ``not_static`` (a model whose attention takes no boolean 4-D mask: the growing path).
DECODE_STATS: Counter = Counter()
#: The first capture failure's message (the rest are counted only).
GRAPH_ERRORS: list[str] = []


def decode_stats() -> dict[str, Any]:
    """:data:`DECODE_STATS` and the first capture error, for a report."""
    return {**DECODE_STATS, **({"graph_error": GRAPH_ERRORS[0]} if GRAPH_ERRORS else {})}


@dataclass(frozen=True)
class PrefixKV:
    """A shared prompt prefix: its token ids and every layer's (keys, values), batch 1."""

    ids: tuple[int, ...]
    layers: tuple[tuple["torch.Tensor", "torch.Tensor"], ...]

    def common(self, row: Sequence[int]) -> "PrefixKV | None":
        """The longest part of this prefix that ``row`` starts with and extends (a causal
        model's keys and values of a prefix do not depend on what follows); None if empty."""
        n = 0
        for mine, theirs in zip(self.ids, row[: len(row) - 1]):
            if mine != theirs:
                break
            n += 1
        if n == 0:
            return None
        if n == len(self.ids):
            return self
        return PrefixKV(self.ids[:n], tuple((keys[:, :, :n], values[:, :, :n]) for keys, values in self.layers))


def supports_decoding(model: Any) -> bool:
    """Whether :func:`decode` can run ``model``: a decoder-only model whose every layer
    attends to the full context (no sliding windows, no linear-attention state), whose
    forward takes a cache and explicit positions."""
    if getattr(model, "config", None) is None:  # not a transformers model (a scripted stand-in)
        return False
    config = _text_config(model)
    if getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(config, "use_sliding_window", False) or getattr(config, "attention_chunk_size", None):
        return False
    parameters = _forward_parameters(model)
    # transformers 5.2x renamed forward's ``past_key_values`` to ``cache`` (see _cache_name).
    return bool({"past_key_values", "cache"} & parameters) and {"position_ids", "attention_mask"} <= parameters


def prefix_kv(model: Any, ids: Sequence[int]) -> PrefixKV:
    """The keys and values of ``ids`` (positions 0..n-1), computed once."""
    import torch

    device = next(model.parameters()).device
    cache = _buffer_cache(model, len(ids))
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(ids)], device=device), **{_cache_name(model): cache}, use_cache=True, **_keep_last(model))
    return PrefixKV(tuple(ids), tuple((layer.keys.clone(), layer.values.clone()) for layer in cache.layers))


def decode(
    model: Any,
    rows: Sequence[Sequence[int]],
    spec: DecodeSpec,
    *,
    pad_id: int,
    prefix: PrefixKV | None = None,
    prefixes: Sequence[PrefixKV | None] | None = None,
    stop_text: Callable[[list[int]], bool] | Sequence[Callable[[list[int]], bool] | None] | None = None,
    kv_out: list[PrefixKV | None] | None = None,
    logprobs_out: list[list[float]] | None = None,
) -> list[list[int]]:
    """The new token ids of every row (each ends with its stop token when it stopped).

    ``prefix``: every row starts with ``prefix.ids`` (and is longer); its keys and values
    are reused. ``prefixes``: the same per row (None: no prefix), e.g. each episode's own
    cache from its previous round; only the rest of a row is prefilled. ``stop_text``:
    whether a row's new ids so far end the reply (stop strings, a row's own token limit); such
    a row stops after that token; one callable for every row, or one (or None) per row.
    ``logprobs_out``: filled with each row's log-probability of every new token under the
    distribution it was drawn from (temperature-scaled and cut to the nucleus when sampled,
    the model's own when greedy: what ``generate``'s scores give). ``kv_out``: filled with one :class:`PrefixKV` per row, the keys and values of the
    row and of its new ids but the last (the ones fed to the model), for the row's next call."""
    import torch

    if not rows:
        return []
    if prefixes is None:
        prefixes = [prefix] * len(rows)
    elif prefix is not None or len(prefixes) != len(rows):
        raise ValueError("give prefix or one prefix per row, not both")
    if any(p is not None and (len(r) <= len(p.ids) or tuple(r[: len(p.ids)]) != p.ids) for r, p in zip(rows, prefixes)):
        raise ValueError("every row must start with its prefix and extend it")
    device = next(model.parameters()).device
    # Slots in order of the length left to prefill: such rows prefill together (:func:`_prefill`).
    cached = [len(p.ids) if p is not None else 0 for p in prefixes]
    order = sorted(range(len(rows)), key=lambda i: (len(rows[i]) - cached[i], cached[i]))
    ordered = [rows[i] for i in order]
    generator = None
    if spec.temperature > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(spec.seed)

    generated: list[list[int]] = [[] for _ in rows]
    live = order  # the row in each slot of the (shrinking) batch
    stopped: set[int] = set()  # slots whose row has stopped but is still in the batch
    next_position = torch.tensor([len(r) for r in ordered], device=device)
    if kv_out is not None:
        kv_out[:] = [None] * len(rows)
    if logprobs_out is not None:
        logprobs_out[:] = [[] for _ in rows]
    row_stops = [stop_text] * len(rows) if stop_text is None or callable(stop_text) else list(stop_text)
    if len(row_stops) != len(rows):
        raise ValueError("give one stop_text or one per row")
    DECODE_STATS["calls"] += 1
    with torch.inference_mode():
        cache, logits, mask, width = _prefill(model, ordered, [prefixes[i] for i in order], spec.max_new_tokens, pad_id)
        static = None
        if spec.cuda_graphs:
            # SDPA takes a boolean 4-D mask as it is; other attention implementations add it.
            if getattr(_text_config(model), "_attn_implementation", None) == "sdpa":
                static = _StaticStep(model, cache, mask)
            else:
                DECODE_STATS["not_static"] += 1

        def keep_kv(slots: Sequence[int]) -> None:
            # The row's own columns (masked ones are padding) up to its last fed token.
            for slot in slots:
                row = live[slot]
                fed = width + len(generated[row]) - 1
                columns = mask[slot, :fed].nonzero().squeeze(1)
                # Indexing by a tensor of columns copies already: no clone.
                layers = tuple((layer.keys[slot : slot + 1, :, columns], layer.values[slot : slot + 1, :, columns]) for layer in cache.layers)
                kv_out[row] = PrefixKV(tuple(rows[row]) + tuple(generated[row][:-1]), layers)

        for step in range(spec.max_new_tokens):
            tokens, picked = _pick(logits, spec, generator, logprobs=logprobs_out is not None)
            picked_list = picked.tolist() if picked is not None else None
            for slot, token in enumerate(tokens.tolist()):
                if slot in stopped:
                    continue
                row = live[slot]
                ids = generated[row]
                ids.append(token)
                if picked_list is not None:
                    logprobs_out[row].append(picked_list[slot])
                if token in spec.stop_ids or (row_stops[row] is not None and row_stops[row](ids)):
                    stopped.add(slot)
            if len(stopped) == len(live) or step + 1 == spec.max_new_tokens:
                break
            if static is None and stopped and spec.compact_share is not None and len(stopped) >= spec.compact_share * len(live):
                if kv_out is not None:
                    keep_kv(sorted(stopped))
                keep = [slot for slot in range(len(live)) if slot not in stopped]
                index = torch.tensor(keep, device=device)
                for layer in cache.layers:
                    layer.select_rows(index)
                mask, next_position, tokens = mask[index], next_position[index], tokens[index]
                live, stopped = [live[slot] for slot in keep], set()
            column = width + step
            mask[:, column] = 1
            DECODE_STATS["steps"] += 1
            if static is not None:
                logits = static(tokens, next_position, column)
            else:
                logits = model(
                    input_ids=tokens.unsqueeze(1),
                    attention_mask=mask[:, : column + 1],
                    position_ids=next_position.unsqueeze(1),
                    use_cache=True,
                    **{_cache_name(model): cache},
                ).logits[:, -1, :]
            next_position += 1
        if static is not None:
            static.finish()
        if kv_out is not None:
            keep_kv(range(len(live)))
    return generated


#: The attention implementation the static steps run under (registered with transformers on first use).
PACKED_SDPA = "askflow_packed_gqa_sdpa"


def packed_gqa_sdpa(module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: Any,
                    dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple["torch.Tensor", None]:
    """SDPA for one new token per row with grouped-query attention: the query's heads of each
    key/value head attend as one group (``[batch, kv_heads, groups, dim]`` against the
    unrepeated keys and values), so no layer copies its keys and values per group. A mask of
    ``[batch, 1, 1, positions]`` covers every group. Anything else (a longer query, no
    groups): transformers' own SDPA attention."""
    import torch

    groups = getattr(module, "num_key_value_groups", 1)
    if groups > 1 and query.shape[2] == 1 and dropout == 0.0:
        batch, heads, _, dim = query.shape
        out = torch.nn.functional.scaled_dot_product_attention(
            query.reshape(batch, heads // groups, groups, dim), key, value, attn_mask=attention_mask, scale=scaling)
        return out.reshape(batch, heads, 1, dim).transpose(1, 2).contiguous(), None
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)


@functools.cache
def _packed_attention() -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(PACKED_SDPA, packed_gqa_sdpa)
    AttentionMaskInterface.register(PACKED_SDPA, sdpa_mask)  # masks as SDPA's (a 4-D one passes as it is)
    return PACKED_SDPA


class _StaticStep:
    """One decode step of fixed shapes over ``cache`` (module docstring, CUDA graphs): the
    batch's tokens, positions and mask live in tensors allocated once; each layer writes the
    step's keys and values at the column held in :attr:`column` and attends over the whole
    buffer. On a CUDA device the first step is captured as a CUDA graph, the rest replay it."""

    def __init__(self, model: Any, cache: Any, mask: "torch.Tensor", *, capture: bool | None = None):
        import torch

        self.model, self.cache = model, cache
        batch, capacity = mask.shape
        self.width = int(cache.layers[0].length)
        self.ids = torch.zeros(batch, 1, dtype=torch.long, device=mask.device)
        self.positions = torch.zeros(batch, 1, dtype=torch.long, device=mask.device)
        self.column = torch.zeros(1, dtype=torch.long, device=mask.device)
        # A boolean 4-D mask is taken as it is (transformers builds none) and SDPA attends where True.
        self.allowed = mask.bool()
        self.mask = self.allowed[:, None, None, :]
        for layer in cache.layers:
            layer.make_static(self.column)
        self.capture = _can_capture(mask.device) if capture is None else capture
        self.graph: Any = None
        self.logits: Any = None
        self.fed = 0
        DECODE_STATS["static_calls"] += 1

    def __call__(self, tokens: "torch.Tensor", positions: "torch.Tensor", column: int) -> "torch.Tensor":
        self.ids.copy_(tokens.unsqueeze(1))
        self.positions.copy_(positions.unsqueeze(1))
        self.column.fill_(column)
        self.allowed[:, column].fill_(True)  # a Scalar fill: no host tensor made per step
        self.fed += 1
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if self.capture:
            self.capture = False
            try:
                # The step is idempotent (the same keys and values written at the same column),
                # so capture's warm-up is the step itself.
                self.graph, self.logits = capture_step(self._forward)
                return self.logits
            except Exception as error:  # noqa: BLE001 - any capture failure: run the same step eagerly
                capture_failed(error)
        return self._forward()

    def _forward(self) -> "torch.Tensor":
        return packed_step(self.model, self.cache, self.ids, self.mask, self.positions)

    def finish(self) -> None:
        """Back to a growing cache holding the prefill and every fed token."""
        for layer in self.cache.layers:
            layer.end_static(self.width + self.fed)
        self.graph = None


def packed_step(model: Any, cache: Any, ids: "torch.Tensor", mask: "torch.Tensor", positions: "torch.Tensor") -> "torch.Tensor":
    """One token per row through ``model`` over ``cache`` under a boolean 4-D ``mask``, with
    the static steps' own attention (module docstring) for this forward only: the prefill and
    any other use of the model keep theirs. Each row's next-token logits."""
    config = _text_config(model)
    own = config._attn_implementation
    config._attn_implementation = _packed_attention()
    try:
        return model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=True,
                     **{_cache_name(model): cache}).logits[:, -1, :]
    finally:
        config._attn_implementation = own


def capture_step(forward: Callable[[], "torch.Tensor"]) -> tuple[Any, "torch.Tensor"]:
    """``forward`` (a decode step that may run more than once: each run writes the same keys
    and values at the same columns) captured as a CUDA graph, after a warm-up on a side stream
    as torch.cuda.graphs asks, and replayed once; the graph and the tensor its replays fill."""
    import torch

    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        forward()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    # thread_local: the agent decodes in a worker thread while the event loop's thread
    # plays simulator turns; only this thread's CUDA calls may invalidate the capture.
    with torch.cuda.graph(graph, capture_error_mode="thread_local"):
        logits = forward()
    graph.replay()
    DECODE_STATS["graphs"] += 1
    return graph, logits


def capture_failed(error: Exception) -> None:
    """A capture that failed: counted, the first message kept and logged, the device settled;
    the caller runs the same step eagerly (and, :func:`_can_capture`, no capture is tried again)."""
    DECODE_STATS["graph_failures"] += 1
    if not GRAPH_ERRORS:
        GRAPH_ERRORS.append(f"{type(error).__name__}: {error}"[:500])
        log.warning("decode: CUDA graph capture failed, decoding eagerly (%s: %s)", type(error).__name__, error)
    _recover_from_capture()


_NO_CAPTURE = [0]  # open eager_static_steps() blocks


@contextlib.contextmanager
def eager_static_steps() -> Iterator[None]:
    """Static steps in this block run eagerly, never captured: each kernel is launched on its
    own, as a profiler needs to see them (``benchmarks/decode_probe.py --kernels``)."""
    _NO_CAPTURE[0] += 1
    try:
        yield
    finally:
        _NO_CAPTURE[0] -= 1


def _can_capture(device: Any) -> bool:
    # A capture that failed once fails again (the same forward): not retried in this process.
    return device.type == "cuda" and not GRAPH_ERRORS and not _NO_CAPTURE[0]


def _recover_from_capture() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()  # a capture error leaves nothing pending; a real fault raises here


# A prefill call's fixed cost in prompt tokens (the embedded policy on 2 cores: about 5 ms
# per call against 33 us per token): splitting rows into more length groups saves padding
# until the extra calls cost more.
PREFILL_CALL_TOKENS = 128


def _prefill(
    model: Any, rows: Sequence[Sequence[int]], prefixes: Sequence[PrefixKV | None], max_new_tokens: int, pad_id: int
) -> tuple[Any, "torch.Tensor", "torch.Tensor", int]:
    """The cache of ``rows`` (in order of the length left to prefill), each row's
    next-token logits, the attention mask over the cache's capacity, and the column where
    generation starts.

    Rows prefill in groups of similar remaining length (:func:`length_groups`). In a group
    each row is laid out ``[padding][its prefix][padding][its rest]``: the prefixes
    right-aligned in a block as wide as the group's longest, the rests right-aligned after
    it, so only the rests are computed. The groups are then placed, right-aligned, in one
    cache, the padding zeroed and masked; positions skip the padding, so every row computes
    what it would alone."""
    import torch

    device = next(model.parameters()).device
    cached = [len(p.ids) if p is not None else 0 for p in prefixes]
    groups = length_groups([len(r) - c for r, c in zip(rows, cached)], PREFILL_CALL_TOKENS)
    spans = [(max(cached[start:end]), len(rows[end - 1]) - cached[end - 1]) for start, end in groups]
    width = max(c + r for c, r in spans)
    capacity = width + max_new_tokens
    cache = _buffer_cache(model, capacity)
    mask = torch.zeros(len(rows), capacity, dtype=torch.long, device=device)
    logits = []
    for (start, end), (prefix_width, rest_width) in zip(groups, spans):
        group, group_prefixes, group_cached = rows[start:end], prefixes[start:end], cached[start:end]
        part = _buffer_cache(model, prefix_width + rest_width)
        if prefix_width:
            for index, layer in enumerate(part.layers):
                layer.update(*_prefix_block(group_prefixes, index, prefix_width))
        rests = torch.tensor([len(r) - c for r, c in zip(group, group_cached)], device=device).unsqueeze(1)
        lengths = torch.tensor(group_cached, device=device).unsqueeze(1)
        columns = torch.arange(prefix_width + rest_width, device=device)
        group_mask = (((columns < prefix_width) & (columns >= prefix_width - lengths)) | (columns >= prefix_width + rest_width - rests)).long()
        positions = (columns[prefix_width:] - prefix_width - rest_width + rests + lengths).clamp(min=0)
        ids = torch.tensor([[pad_id] * (rest_width - len(r) + c) + list(r[c:]) for r, c in zip(group, group_cached)], device=device)
        out = model(input_ids=ids, attention_mask=group_mask, position_ids=positions, use_cache=True, **{_cache_name(model): part}, **_keep_last(model))
        logits.append(out.logits[:, -1, :])
        offset = width - prefix_width - rest_width
        mask[start:end, offset:width] = group_mask
        for layer, part_layer in zip(cache.layers, part.layers):
            layer.place(part_layer, start, len(rows), offset, width)
    return cache, torch.cat(logits), mask, width


def _prefix_block(prefixes: Sequence[PrefixKV | None], layer: int, block: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """Layer ``layer``'s keys and values of every row's prefix, right-aligned in ``block``
    columns (zeros before; a row without a prefix is all zeros)."""
    sample = next(p for p in prefixes if p is not None).layers[layer]
    if all(p is prefixes[0] for p in prefixes) and len(prefixes[0].ids) == block:
        # One shared prefix (the system prompt): a view, no copy.
        return sample[0].expand(len(prefixes), -1, -1, -1), sample[1].expand(len(prefixes), -1, -1, -1)
    keys, values = (t.new_zeros((len(prefixes), t.shape[1], block, t.shape[3])) for t in sample)
    for row, p in enumerate(prefixes):
        if p is not None:
            n = len(p.ids)
            keys[row, :, block - n :] = p.layers[layer][0][0]
            values[row, :, block - n :] = p.layers[layer][1][0]
    return keys, values


def length_groups(lengths: Sequence[int], call_tokens: int) -> list[tuple[int, int]]:
    """Split ascending ``lengths`` into consecutive ``(start, end)`` groups minimising the
    padded tokens (each group padded to its last length) plus ``call_tokens`` per group."""
    best = [0] + [0] * len(lengths)
    cut = [0] * (len(lengths) + 1)
    for end in range(1, len(lengths) + 1):
        best[end], cut[end] = min((best[start] + call_tokens + (end - start) * lengths[end - 1], start) for start in range(end))
    groups = []
    end = len(lengths)
    while end > 0:
        groups.append((cut[end], end))
        end = cut[end]
    return groups[::-1]


def _pick(logits: "torch.Tensor", spec: DecodeSpec, generator: "torch.Generator | None", *,
          logprobs: bool = False) -> tuple["torch.Tensor", "torch.Tensor | None"]:
    """Each row's next token, and with ``logprobs`` its log-probability under the
    distribution it was drawn from."""
    import torch

    if generator is None:
        tokens = logits.argmax(dim=-1)
        return tokens, (_chosen(logits, tokens) if logprobs else None)
    scaled = logits.float() / spec.temperature
    if spec.top_p is not None and spec.top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)
        # Drop a token once the tokens before it already cover top_p; the first always stays.
        probs = ordered.softmax(dim=-1)
        dropped = probs.cumsum(dim=-1) - probs >= spec.top_p
        dropped[:, 0] = False
        ordered = ordered.masked_fill(dropped, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
    tokens = torch.multinomial(scaled.softmax(dim=-1), 1, generator=generator).squeeze(1)
    return tokens, (_chosen(scaled, tokens) if logprobs else None)


def _chosen(logits: "torch.Tensor", tokens: "torch.Tensor") -> "torch.Tensor":
    return logits.float().log_softmax(dim=-1).gather(1, tokens[:, None])[:, 0]


def _text_config(model: Any) -> Any:
    config = model.config
    return config.get_text_config(decoder=True) if hasattr(config, "get_text_config") else config


def _forward_parameters(model: Any) -> frozenset[str]:
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # a PEFT wrapper
    return _signature_parameters(type(base))


@functools.cache
def _signature_parameters(model_class: type) -> frozenset[str]:
    # Asked at every prefill: inspecting a signature costs more than the lookup.
    return frozenset(inspect.signature(model_class.forward).parameters)


def _cache_name(model: Any) -> str:
    """The forward's cache argument: ``cache`` since transformers 5 renamed it (the old
    ``past_key_values`` is a deprecated alias), else ``past_key_values``."""
    return "cache" if "cache" in _forward_parameters(model) else "past_key_values"


def _keep_last(model: Any) -> dict[str, int]:
    """Ask for the last position's logits only: a prefill's full logits would be batch x
    length x vocabulary floats."""
    parameters = _forward_parameters(model)
    for name in ("logits_to_keep", "num_logits_to_keep"):
        if name in parameters:
            return {name: 1}
    return {}


def _buffer_cache(model: Any, capacity: int) -> Any:
    from transformers.cache_utils import Cache

    config = _text_config(model)
    return Cache(layers=[_kv_buffer_class()(capacity) for _ in range(config.num_hidden_layers)])


@functools.cache
def _kv_buffer_class() -> type:
    """:class:`KVBuffer`, built on first use so that importing this module needs no
    transformers."""
    from transformers.cache_utils import DynamicLayer

    class KVBuffer(DynamicLayer):
        """A layer's keys and values in tensors allocated once with room for ``capacity``
        positions, written in place; ``keys`` and ``values`` are views of the filled part.
        Everything else (mask sizes, sequence length) is a growing cache's."""

        def __init__(self, capacity: int):
            super().__init__()
            self.capacity = capacity
            self.length = 0
            self.static_column: Any = None

        def lazy_initialization(self, key_states: "torch.Tensor", value_states: "torch.Tensor") -> None:
            import torch

            self.dtype, self.device = key_states.dtype, key_states.device
            batch, heads, _, key_dim = key_states.shape
            self.key_buffer = torch.empty(batch, heads, self.capacity, key_dim, dtype=self.dtype, device=self.device)
            self.value_buffer = torch.empty(batch, heads, self.capacity, value_states.shape[-1], dtype=self.dtype, device=self.device)
            self.is_initialized = True
            self._view()

        def update(self, key_states: "torch.Tensor", value_states: "torch.Tensor", *args: Any, **kwargs: Any) -> Any:
            if self.static_column is not None:
                # Under autocast keys (rotated: float32) and values (bf16) differ in dtype; the
                # buffers hold the prefill's, as the growing path's slice assignment casts to.
                self.key_buffer.index_copy_(2, self.static_column, key_states.to(self.key_buffer.dtype))
                self.value_buffer.index_copy_(2, self.static_column, value_states.to(self.value_buffer.dtype))
                return self.key_buffer, self.value_buffer
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            end = self.length + key_states.shape[-2]
            if end > self.capacity:
                raise RuntimeError(f"KV buffer full: {end} positions, room for {self.capacity}")
            self.key_buffer[:, :, self.length : end] = key_states
            self.value_buffer[:, :, self.length : end] = value_states
            self.length = end
            self._view()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.length

        def make_static(self, column: "torch.Tensor") -> None:
            """Static steps (:class:`_StaticStep`): each update writes at ``column`` and the
            layer attends over the whole buffer; the columns past the filled part are zeroed
            (masked, but they must not be NaN)."""
            self.static_column = column
            self.key_buffer[:, :, self.length :].zero_()
            self.value_buffer[:, :, self.length :].zero_()
            self.keys, self.values = self.key_buffer, self.value_buffer

        def end_static(self, length: int) -> None:
            self.static_column = None
            self.length = length
            self._view()

        def place(self, part: "KVBuffer", start: int, batch: int, offset: int, width: int) -> None:
            """Copy ``part`` (every column up to its length) into rows ``start..`` of this
            ``batch``-row buffer at columns ``offset..width``; the columns before are zero
            (masked, but they must not be NaN)."""
            if not self.is_initialized:
                self.lazy_initialization(part.keys[:1].expand(batch, -1, -1, -1), part.values[:1].expand(batch, -1, -1, -1))
                self.key_buffer[:, :, :width].zero_()
                self.value_buffer[:, :, :width].zero_()
            end = start + part.keys.shape[0]
            self.key_buffer[start:end, :, offset:width] = part.keys
            self.value_buffer[start:end, :, offset:width] = part.values
            self.length = width
            self._view()

        def select_rows(self, index: "torch.Tensor") -> None:
            """Keep only the batch rows ``index`` (copies the filled part)."""
            for name in ("key_buffer", "value_buffer"):
                old = getattr(self, name)
                new = old.new_empty((len(index),) + tuple(old.shape[1:]))
                new[:, :, : self.length] = old[index, :, : self.length]
                setattr(self, name, new)
            self._view()

        def _view(self) -> None:
            self.keys = self.key_buffer[:, :, : self.length]
            self.values = self.value_buffer[:, :, : self.length]

    return KVBuffer
