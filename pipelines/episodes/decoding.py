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
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

if TYPE_CHECKING:
    import torch


@dataclass(frozen=True)
class DecodeSpec:
    """How tokens are picked and when a row stops.

    Greedy at ``temperature`` 0; else sampled from the temperature-scaled distribution cut
    to its ``top_p`` nucleus, from a generator seeded with ``seed``. A row stops at its
    first token in ``stop_ids`` (which ends its ids), or after ``max_new_tokens``.
    ``compact_share``: once stopped rows are this share of the batch, they leave it (None:
    they stay and compute padding until the last row stops)."""

    max_new_tokens: int
    stop_ids: frozenset[int]
    temperature: float = 0.0
    top_p: float | None = None
    seed: int = 0
    compact_share: float | None = 0.125

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_p is not None and not 0.0 <= self.top_p <= 1.0:
            raise ValueError(f"top_p must be in [0, 1], got {self.top_p}")
        if self.compact_share is not None and not 0.0 < self.compact_share <= 1.0:
            raise ValueError(f"compact_share must be in (0, 1] or None, got {self.compact_share}")


@dataclass(frozen=True)
class PrefixKV:
    """A shared prompt prefix: its token ids and every layer's (keys, values), batch 1."""

    ids: tuple[int, ...]
    layers: tuple[tuple["torch.Tensor", "torch.Tensor"], ...]


def supports_decoding(model: Any) -> bool:
    """Whether :func:`decode` can run ``model``: a decoder-only model whose every layer
    attends to the full context (no sliding windows, no linear-attention state), whose
    forward takes a cache and explicit positions."""
    config = _text_config(model)
    if getattr(config, "is_encoder_decoder", False):
        return False
    layer_types = getattr(config, "layer_types", None)
    if layer_types is not None and any(t != "full_attention" for t in layer_types):
        return False
    if getattr(config, "use_sliding_window", False) or getattr(config, "attention_chunk_size", None):
        return False
    parameters = _forward_parameters(model)
    # transformers 5.2x renamed forward's ``past_key_values`` to ``cache`` and still maps the
    # old name (deprecated, removed in 5.40); the loop passes ``past_key_values``.
    takes_cache = "past_key_values" in parameters or "cache" in parameters
    return takes_cache and {"position_ids", "attention_mask"} <= parameters


def prefix_kv(model: Any, ids: Sequence[int]) -> PrefixKV:
    """The keys and values of ``ids`` (positions 0..n-1), computed once."""
    import torch

    device = next(model.parameters()).device
    cache = _buffer_cache(model, len(ids))
    with torch.inference_mode():
        model(input_ids=torch.tensor([list(ids)], device=device), past_key_values=cache, use_cache=True, **_keep_last(model))
    return PrefixKV(tuple(ids), tuple((layer.keys.clone(), layer.values.clone()) for layer in cache.layers))


def decode(
    model: Any,
    rows: Sequence[Sequence[int]],
    spec: DecodeSpec,
    *,
    pad_id: int,
    prefix: PrefixKV | None = None,
    stop_text: Callable[[list[int]], bool] | None = None,
) -> list[list[int]]:
    """The new token ids of every row (each ends with its stop token when it stopped).

    ``prefix``: every row starts with ``prefix.ids`` (and is longer); its keys and values
    are reused. ``stop_text``: whether a row's new ids so far end the reply (stop strings);
    such a row stops after that token."""
    import torch

    if not rows:
        return []
    n = len(prefix.ids) if prefix is not None else 0
    if prefix is not None and any(len(r) <= n or tuple(r[:n]) != prefix.ids for r in rows):
        raise ValueError("every row must start with the prefix and extend it")
    device = next(model.parameters()).device
    # Slots in length order: rows of similar length prefill together (:func:`_prefill`).
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    ordered = [rows[i] for i in order]
    width = len(ordered[-1])
    capacity = width + spec.max_new_tokens
    lengths = torch.tensor([len(r) for r in ordered], device=device)
    mask, _ = _layout(lengths, n, width, capacity)
    generator = None
    if spec.temperature > 0:
        generator = torch.Generator(device=device)
        generator.manual_seed(spec.seed)

    generated: list[list[int]] = [[] for _ in rows]
    live = order  # the row in each slot of the (shrinking) batch
    stopped: set[int] = set()  # slots whose row has stopped but is still in the batch
    next_position = lengths.clone()
    with torch.inference_mode():
        cache, logits = _prefill(model, ordered, prefix, width, capacity, pad_id)
        for step in range(spec.max_new_tokens):
            tokens = _pick(logits, spec, generator)
            for slot, token in enumerate(tokens.tolist()):
                if slot in stopped:
                    continue
                ids = generated[live[slot]]
                ids.append(token)
                if token in spec.stop_ids or (stop_text is not None and stop_text(ids)):
                    stopped.add(slot)
            if len(stopped) == len(live) or step + 1 == spec.max_new_tokens:
                break
            if stopped and spec.compact_share is not None and len(stopped) >= spec.compact_share * len(live):
                keep = [slot for slot in range(len(live)) if slot not in stopped]
                index = torch.tensor(keep, device=device)
                for layer in cache.layers:
                    layer.select_rows(index)
                mask, next_position, tokens = mask[index], next_position[index], tokens[index]
                live, stopped = [live[slot] for slot in keep], set()
            column = width + step
            mask[:, column] = 1
            logits = model(
                input_ids=tokens.unsqueeze(1),
                attention_mask=mask[:, : column + 1],
                position_ids=next_position.unsqueeze(1),
                past_key_values=cache,
                use_cache=True,
            ).logits[:, -1, :]
            next_position += 1
    return generated


# A prefill call's fixed cost in prompt tokens (the embedded policy on 2 cores: about 5 ms
# per call against 33 us per token): splitting rows into more length groups saves padding
# until the extra calls cost more.
PREFILL_CALL_TOKENS = 128


def _prefill(model: Any, rows: Sequence[Sequence[int]], prefix: PrefixKV | None, width: int, capacity: int, pad_id: int) -> tuple[Any, "torch.Tensor"]:
    """The cache of ``rows`` (in length order) laid out ``[prefix][padding][rest]`` at
    ``width``, and each row's next-token logits. Rows prefill in groups of similar length
    (:func:`length_groups`), each group padded only to its own longest row; the groups'
    keys and values are then placed in one cache, the padding columns zeroed and masked."""
    import torch

    n = len(prefix.ids) if prefix is not None else 0
    device = next(model.parameters()).device
    cache = _buffer_cache(model, capacity)
    logits = []
    for start, end in length_groups([len(r) - n for r in rows], PREFILL_CALL_TOKENS):
        group = rows[start:end]
        group_width = len(group[-1])
        part = _buffer_cache(model, group_width)
        if prefix is not None:
            for layer, (keys, values) in zip(part.layers, prefix.layers):
                layer.update(keys.expand(len(group), -1, -1, -1), values.expand(len(group), -1, -1, -1))
        lengths = torch.tensor([len(r) for r in group], device=device)
        mask, positions = _layout(lengths, n, group_width, group_width)
        ids = torch.tensor([[pad_id] * (group_width - len(r)) + list(r[n:]) for r in group], device=device)
        out = model(input_ids=ids, attention_mask=mask, position_ids=positions, past_key_values=part, use_cache=True, **_keep_last(model))
        logits.append(out.logits[:, -1, :])
        for layer, part_layer in zip(cache.layers, part.layers):
            layer.place(part_layer, start, len(rows), n, width)
    return cache, torch.cat(logits)


def _layout(lengths: "torch.Tensor", n: int, width: int, capacity: int) -> tuple["torch.Tensor", "torch.Tensor"]:
    """The attention mask over ``capacity`` columns of rows of ``lengths`` laid out
    ``[prefix n][padding][rest]`` with the rest ending at ``width``, and the positions of
    columns ``n..width`` (the padding's are 0; it is masked)."""
    import torch

    columns = torch.arange(capacity, device=lengths.device)
    first_real = (width - lengths + n).unsqueeze(1)
    mask = ((columns < n) | ((columns >= first_real) & (columns < width))).long()
    positions = (columns[n:width] - width + lengths.unsqueeze(1)).clamp(min=0)
    return mask, positions


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


def _pick(logits: "torch.Tensor", spec: DecodeSpec, generator: "torch.Generator | None") -> "torch.Tensor":
    import torch

    if generator is None:
        return logits.argmax(dim=-1)
    scaled = logits.float() / spec.temperature
    if spec.top_p is not None and spec.top_p < 1.0:
        ordered, order = scaled.sort(dim=-1, descending=True)
        # Drop a token once the tokens before it already cover top_p; the first always stays.
        probs = ordered.softmax(dim=-1)
        dropped = probs.cumsum(dim=-1) - probs >= spec.top_p
        dropped[:, 0] = False
        ordered = ordered.masked_fill(dropped, float("-inf"))
        scaled = torch.full_like(scaled, float("-inf")).scatter(-1, order, ordered)
    return torch.multinomial(scaled.softmax(dim=-1), 1, generator=generator).squeeze(1)


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

        def lazy_initialization(self, key_states: "torch.Tensor", value_states: "torch.Tensor") -> None:
            import torch

            self.dtype, self.device = key_states.dtype, key_states.device
            batch, heads, _, key_dim = key_states.shape
            self.key_buffer = torch.empty(batch, heads, self.capacity, key_dim, dtype=self.dtype, device=self.device)
            self.value_buffer = torch.empty(batch, heads, self.capacity, value_states.shape[-1], dtype=self.dtype, device=self.device)
            self.is_initialized = True
            self._view()

        def update(self, key_states: "torch.Tensor", value_states: "torch.Tensor", *args: Any, **kwargs: Any) -> Any:
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

        def place(self, part: "KVBuffer", start: int, batch: int, n: int, width: int) -> None:
            """Copy ``part`` (rows laid out ``[prefix n][padding][rest]`` up to its length) into
            rows ``start..`` of this ``batch``-row buffer, the rest ending at ``width``; the
            padding between is zero (masked, but it must not be NaN)."""
            if not self.is_initialized:
                self.lazy_initialization(part.keys[:1].expand(batch, -1, -1, -1), part.values[:1].expand(batch, -1, -1, -1))
                self.key_buffer[:, :, :width].zero_()
                self.value_buffer[:, :, :width].zero_()
            end, rest = start + part.keys.shape[0], part.length - n
            for mine, theirs in ((self.key_buffer, part.keys), (self.value_buffer, part.values)):
                mine[start:end, :, :n] = theirs[:, :, :n]
                mine[start:end, :, width - rest : width] = theirs[:, :, n:]
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
