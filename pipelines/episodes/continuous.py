"""Continuous batching for the hf agent: episodes step on their own, and a reply that ends
leaves its row to the next prompt that is ready, without waiting for the rest of a round.

The runner's rounds (:func:`pipelines.episodes.runner.play`) hand every waiting episode to
one ``agent.act`` call, and the call decodes until its longest reply ends: each round costs
its longest reply's tokens in sequential decode steps. On the H200 run of 2026-11-30 the SFT
model's 100 test dialogues took 2,334 such steps where the longest single dialogue needed
1,646 (``benchmarks/decode_depth.py``), and on a GPU the step is the cost
(``benchmarks/eval_host.py``). Here (:func:`play_continuous`) each episode is a task of its
own: it hears its user, submits its context to a :class:`ContinuousHFAgent` and waits for its
output; the agent's decoder (:class:`SlotDecoder`) keeps ``slots`` rows, one per request in
flight. Each step it admits the requests waiting for a free slot (one prefill for those that
arrived together, reusing each episode's keys and values of its previous call as
:class:`~pipelines.episodes.HFAgent` does), then decodes one token for every occupied slot;
a row that stops frees its slot at once.

A slot holds its row's keys and values from column 0 (its positions are its columns) and
each row writes its new token's at its own column, so a step has one shape whatever the
rows hold: on a CUDA device it is captured once as a CUDA graph and replayed (the slots'
buffer grows, and the graph with it, only when a prompt needs more room than any before).
Attention runs over the whole buffer under a mask of each row's own columns, the query heads
of each key/value head grouped as the rows of one query (SmolLM2: 9 heads over 3), so no layer
copies its keys and values per head. ``attention`` says how that grouped query is computed:

* ``"sdpa"``: PyTorch's SDPA, as :mod:`pipelines.episodes.decoding`'s static steps do. On the
  H200 (2026-11-30, ``benchmarks/decode_probe.py``) a step of 128 rows over 1,500 positions took
  16.4 ms in float32, where reading its keys and values (9.2 GB over 30 layers) takes about
  2 ms at the card's bandwidth; probably because the kernel SDPA picks under a mask in
  float32 (the memory-efficient one) tiles the queries in blocks of dozens of rows and
  computes the 3 rows of a group as a full block.
* ``"matmul"`` (:func:`grouped_matmul_attention`): the same grouped query as two batched matrix
  products and a float32 softmax, whose cost is reading the keys and values once. The same
  arithmetic up to rounding (the tests check both against transformers' attention); float32
  only (a bf16 step keeps SDPA, whose kernels hold the scores in float32). Its GPU step time is
  to be measured (``benchmarks/decode_probe.py`` times both).

Continuous batching cannot go below an evaluation's longest dialogue, one sequential step per
id it writes. ``draft`` (:class:`SlotDecoder`) lowers that floor: each step feeds every row
its last id and a guess at the next few, copied from the row's own context where its last ids
occurred before (prompt lookup, :class:`NgramDrafts`; an agent's reply repeats names, values
and markup from its prompt), and takes the guesses the step's greedy picks confirm, then one
more (:func:`accepted`). Read off the H200 run's recorded SFT replies, 4-id drafts give 1.48
ids per step and take that model's longest dialogue from 1,646 steps to 1,055
(``benchmarks/draft_depth.py``).

Greedy decoding only: a greedy row computes what it would alone, so the transcripts are the
round-based runner's (and one episode at a time's), which the tests check; sampled rows
would draw from one generator in another order. Episodes with a Clarifier play in rounds.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections import deque
from dataclasses import dataclass, field, replace
from time import perf_counter
from typing import TYPE_CHECKING, Any, Callable, Sequence

from pipelines.episodes import decoding
from pipelines.episodes.agents import AgentContext, EpisodeCache, episode_entry, episode_prefix
from pipelines.episodes.decoding import DECODE_STATS, PrefixKV
from pipelines.episodes.records import Episode
from pipelines.episodes.runner import DONE, WAITS_FOR_AGENT, WAITS_FOR_USER, EpisodeState

if TYPE_CHECKING:
    import torch

#: Buffer columns are allocated in multiples of this (a longer prompt grows the buffer by it).
CAPACITY_STEP = 256

#: How a slot step computes its grouped-query attention (module docstring), each registered
#: with transformers under its name on first use.
ATTENTIONS = {"sdpa": "askflow_grouped_sdpa", "matmul": "askflow_grouped_matmul"}


def _grouped(query: "torch.Tensor", attention_mask: Any, kv_heads: int) -> tuple["torch.Tensor", Any]:
    """``query`` (``[batch, heads, length, dim]``) as ``[batch, kv_heads, groups * length, dim]``:
    the query heads of each key/value head and their positions as the rows of one query, and a
    ``[batch, 1, length, positions]`` mask repeated to match (a one-position mask broadcasts)."""
    batch, heads, length, dim = query.shape
    groups = heads // kv_heads
    if length > 1 and attention_mask is not None and attention_mask.shape[2] == length:
        attention_mask = attention_mask[:, :, None].expand(-1, -1, groups, -1, -1).reshape(batch, 1, groups * length, -1)
    return query.reshape(batch, kv_heads, groups * length, dim), attention_mask


def _ungrouped(out: "torch.Tensor", heads: int, length: int) -> "torch.Tensor":
    batch, _, _, dim = out.shape
    return out.reshape(batch, heads, length, dim).transpose(1, 2).contiguous()


def grouped_sdpa_attention(module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: Any,
                           dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple["torch.Tensor", None]:
    """SDPA for a slot step: one new token per row as
    :func:`pipelines.episodes.decoding.packed_gqa_sdpa` computes it, and a drafted step's
    positions (:class:`SlotDecoder` ``draft``) grouped the same way (:func:`_grouped`), so no
    layer copies its keys and values per head for them either; anything else (dropout, no
    groups) as transformers' SDPA.

    >>> import types, torch
    >>> module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    >>> query, key, value = torch.randn(1, 4, 3, 8), torch.randn(1, 2, 5, 8), torch.randn(1, 2, 5, 8)
    >>> mask = torch.ones(1, 1, 3, 5, dtype=torch.bool).tril(2)
    >>> out, _ = grouped_sdpa_attention(module, query, key, value, mask)
    >>> expected = torch.nn.functional.scaled_dot_product_attention(
    ...     query, key.repeat_interleave(2, 1), value.repeat_interleave(2, 1), attn_mask=mask).transpose(1, 2)
    >>> out.shape, torch.allclose(out, expected, atol=1e-6)
    (torch.Size([1, 3, 4, 8]), True)
    """
    import torch

    heads, length = query.shape[1], query.shape[2]
    groups = getattr(module, "num_key_value_groups", 1)
    if length == 1 or groups == 1 or dropout != 0.0:
        return decoding.packed_gqa_sdpa(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    grouped, mask = _grouped(query, attention_mask, key.shape[1])
    out = torch.nn.functional.scaled_dot_product_attention(grouped, key, value, attn_mask=mask, scale=scaling)
    return _ungrouped(out, heads, length), None


def grouped_matmul_attention(module: Any, query: "torch.Tensor", key: "torch.Tensor", value: "torch.Tensor", attention_mask: Any,
                             dropout: float = 0.0, scaling: float | None = None, **kwargs: Any) -> tuple["torch.Tensor", None]:
    """Attention for a slot step's new tokens as two batched matrix products: the query heads of
    each key/value head (and a drafted step's positions, :func:`_grouped`) as the rows of one
    query (``[batch, kv_heads, groups, dim]`` for one token per row) times
    the unrepeated keys, scaled, masked (a boolean ``[batch, 1, 1, positions]`` mask attends
    where True; a float one is added), a float32 softmax, times the values. A masked position
    gets the dtype's lowest score rather than minus infinity, so a row masked everywhere
    averages its values instead of giving NaN. Float32 only: in bf16 (or under autocast) the
    product would round every score to bf16 before the softmax (a step of 0.125 at a score of
    20), where SDPA's kernels keep scores in float32, so such a step runs the grouped SDPA
    (:func:`grouped_sdpa_attention`), as does one with dropout.

    >>> import types, torch
    >>> module = types.SimpleNamespace(num_key_value_groups=2, is_causal=True, training=False)
    >>> query, key = torch.ones(1, 4, 1, 8), torch.zeros(1, 2, 3, 8)
    >>> value = torch.arange(48.0).reshape(1, 2, 3, 8)
    >>> mask = torch.tensor([True, True, False]).reshape(1, 1, 1, 3)
    >>> out, _ = grouped_matmul_attention(module, query, key, value, mask)
    >>> out.shape, out[0, 0, :, 0].tolist()  # [batch, 1, heads, dim]; heads 0-1 average rows 0-1 of kv head 0
    (torch.Size([1, 1, 4, 8]), [4.0, 4.0, 28.0, 28.0])
    """
    import torch

    batch, heads, length, dim = query.shape
    exact = query.dtype == key.dtype == value.dtype == torch.float32 and not torch.is_autocast_enabled(query.device.type)
    if dropout != 0.0 or not exact:
        return grouped_sdpa_attention(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    grouped, attention_mask = _grouped(query, attention_mask, key.shape[1])
    scores = torch.matmul(grouped, key.transpose(-1, -2)) * (dim ** -0.5 if scaling is None else scaling)
    if attention_mask is not None and attention_mask.dtype == torch.bool:
        scores = scores.masked_fill(attention_mask.logical_not(), torch.finfo(scores.dtype).min)
    elif attention_mask is not None:
        scores = scores + attention_mask
    weights = torch.softmax(scores, dim=-1, dtype=torch.float32).to(value.dtype)
    return _ungrouped(torch.matmul(weights, value), heads, length), None


@functools.cache
def _registered(attention: str) -> str:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    AttentionInterface.register(ATTENTIONS[attention], {"sdpa": grouped_sdpa_attention, "matmul": grouped_matmul_attention}[attention])
    AttentionMaskInterface.register(ATTENTIONS[attention], sdpa_mask)  # masks as SDPA's (a 4-D one passes as it is)
    return ATTENTIONS[attention]


class NgramDrafts:
    """Prompt-lookup drafts for one row: its ids so far (prompt, then what it generated), and
    for its last ``ngram`` ids (down to 1) the ids that followed their most recent earlier
    occurrence, at most ``tokens`` of them (:meth:`draft`). An agent's reply copies much of its
    context (a venue's name, a postcode from a tool's result, the format's own markup), so a
    verifying step can take several of its tokens at once. Each id is indexed once, when a
    later one arrives: a draft costs a dictionary lookup per n-gram size, not a scan.

    >>> drafts = NgramDrafts([5, 6, 7, 8, 5, 6], ngram=2, tokens=3)
    >>> drafts.draft()  # (5, 6) came before, followed by 7, 8, 5
    [7, 8, 5]
    >>> drafts.extend([9]); drafts.draft()  # (6, 9) and (9,) never came before
    []
    """

    def __init__(self, ids: Sequence[int], ngram: int, tokens: int):
        if ngram < 1 or tokens < 1:
            raise ValueError(f"draft: ngram and tokens must be at least 1, got {ngram} and {tokens}")
        self.ids, self.ngram, self.tokens = list(ids), ngram, tokens
        self.seen: dict[tuple[int, ...], int] = {}  # an n-gram -> where its most recent earlier occurrence ends
        self.indexed = 0  # n-grams ending before this position are in ``seen``

    def extend(self, ids: Sequence[int]) -> None:
        self.ids.extend(ids)

    def restart(self, ids: Sequence[int]) -> "NgramDrafts":
        """These drafts for ``ids``, a new call's prompt that mostly repeats this row's (an
        episode's next prompt holds its last prompt and reply): only the ids after the part
        they share are indexed anew. Entries of the part that changed stay until overwritten;
        a draft is a guess the step verifies, so a stale one costs a step's worth of ids at
        most, never a wrong one.

        >>> drafts = NgramDrafts([5, 6, 7], ngram=2, tokens=2)
        >>> drafts.draft(); drafts.restart([5, 6, 7, 8, 5, 6]).draft()
        []
        [7, 8]
        """
        ids = list(ids)
        if ids[: len(self.ids)] == self.ids:  # the usual case, compared in one go
            shared = len(self.ids)
        else:
            shared = next((i for i, (a, b) in enumerate(zip(self.ids, ids)) if a != b), min(len(self.ids), len(ids)))
        self.ids, self.indexed = ids, min(self.indexed, shared)
        return self

    def draft(self) -> list[int]:
        ids, seen = self.ids, self.seen
        # Index the n-grams that end before the last id (the last one's would find itself).
        for end in range(max(self.indexed, 1), len(ids)):
            for n in range(1, min(self.ngram, end) + 1):
                seen[tuple(ids[end - n : end])] = end
        self.indexed = max(self.indexed, len(ids))
        for n in range(min(self.ngram, len(ids)), 0, -1):
            end = seen.get(tuple(ids[-n:]))
            if end is not None:
                return ids[end : end + self.tokens]
        return []


def accepted(draft: Sequence[int], picked: Sequence[int]) -> int:
    """How many of ``draft``'s ids a verifying step confirms: ``picked[i]`` is the greedy id
    after the row's ids and ``draft[:i]``, so the leading drafts that equal it are what
    decoding one id at a time would have given (and ``picked[accepted]`` is the next).

    >>> accepted([7, 8, 5], [7, 8, 9, 4]), accepted([7], [3, 1]), accepted([], [3])
    (2, 0, 0)
    """
    for i, (token, pick) in enumerate(zip(draft, picked)):
        if pick != token:
            return i
    return min(len(draft), len(picked))


class PhaseTimer:
    """The device time of a decoder's prefills and steps, in :data:`DECODE_STATS`
    (``prefill_us``, ``step_us``): on a CUDA device a pair of events around each, read once
    the decoder is done (:meth:`flush`; recording adds no host sync); elsewhere the wall clock
    (the work is done when the call returns). What the wall time of an evaluation holds
    beyond the two is the host's: the simulator, prompts, tokenising, admission bookkeeping
    (and the one forward of the shared system prompt's keys and values, made once)."""

    def __init__(self, device: Any):
        self.cuda = device.type == "cuda"
        self.pending: list[tuple[str, Any, Any]] = []

    @contextlib.contextmanager
    def __call__(self, phase: str) -> Any:
        if self.cuda:
            import torch

            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            yield
            end.record()
            self.pending.append((phase, start, end))
        else:
            started = perf_counter()
            yield
            DECODE_STATS[f"{phase}_us"] += round(1e6 * (perf_counter() - started))

    def flush(self) -> None:
        """Add the recorded events' times to :data:`DECODE_STATS` (waits for the device)."""
        if self.pending:
            self.pending[-1][2].synchronize()
        for phase, start, end in self.pending:
            DECODE_STATS[f"{phase}_us"] += round(1000 * start.elapsed_time(end))
        self.pending.clear()


@dataclass
class Request:
    """One agent call in flight: its prompt's ids, the prefix whose keys and values it
    reuses, and what it has generated."""

    context: AgentContext
    row: list[int]
    prefix: PrefixKV | None
    future: asyncio.Future
    started: float
    generated: list[int] = field(default_factory=list)
    slot: int = -1
    drafts: NgramDrafts | None = None


class SlotDecoder:
    """``slots`` rows of keys and values (module docstring) for ``model``: :meth:`admit`
    prefills new rows into free slots, :meth:`step` decodes one token for every occupied
    slot. Greedy; a row stops at a token of ``stop_ids``, when ``stop_text(ids)`` says so, or
    after ``max_new_tokens``. ``attention``: a key of :data:`ATTENTIONS` (module docstring).

    ``draft=(tokens, ngram)``: each step feeds every row its last id and a prompt-lookup draft
    of at most ``tokens`` ids (:class:`NgramDrafts`), ``tokens + 1`` positions per row, and
    takes the drafted ids the step's greedy picks confirm, then one more
    (:func:`accepted`): a reply that copies its context takes fewer sequential steps. A
    row's pick at each position is the greedy id after its ids so far, so the ids are the
    ones one id per step gives (up to the rounding of a wider step's kernels, which the
    evaluation's ``unbatched_check`` compares); a draft only decides how many are taken at
    once. The drafted positions' keys are written at the row's next columns and attended to
    only once confirmed."""

    def __init__(self, model: Any, slots: int, max_new_tokens: int, stop_ids: frozenset[int], pad_id: int,
                 stop_text: Callable[[list[int]], bool] | None = None, *, cuda_graphs: bool = False, attention: str = "sdpa",
                 draft: tuple[int, int] | None = None):
        import torch

        if attention not in ATTENTIONS:
            raise ValueError(f"attention: expected one of {sorted(ATTENTIONS)}, got {attention!r}")
        self.draft_tokens, self.draft_ngram = draft or (0, 0)
        if draft is not None and (self.draft_tokens < 1 or self.draft_ngram < 1):
            raise ValueError(f"draft: tokens and ngram must be at least 1, got {draft!r}")
        self.model, self.slots, self.max_new_tokens = model, slots, max_new_tokens
        self.attention = _registered(attention)
        self.stop_ids, self.pad_id, self.stop_text = stop_ids, pad_id, stop_text
        self.device = next(model.parameters()).device
        config = decoding._text_config(model)
        if getattr(config, "_attn_implementation", None) != "sdpa":
            raise ValueError("continuous batching needs the model's attention to be sdpa (a boolean 4-D mask taken as it is)")
        self.capture = cuda_graphs and decoding._can_capture(self.device)
        self.capacity = 0
        self.layers: list[Any] = []
        self.rows: list[Request | None] = [None] * slots
        self.lengths = [0] * slots  # columns filled per slot (a free slot keeps its last row's)
        width = 1 + self.draft_tokens  # positions fed per row and step
        self.ids = torch.zeros(slots, width, dtype=torch.long, device=self.device)
        self.positions = torch.zeros(slots, width, dtype=torch.long, device=self.device)
        self.offsets = torch.arange(width, device=self.device)
        self.columns = torch.zeros(slots, dtype=torch.long, device=self.device)
        self.slot_index = torch.arange(slots, device=self.device)
        self.allowed: Any = None
        self.graph: Any = None
        self.logits: Any = None
        self.timer = PhaseTimer(self.device)
        self.picked: Any = None  # a launched step's tokens, on the device, until collected
        self.live: list[int] = []
        self.drafted: list[list[int]] = [[] for _ in range(slots)]  # each slot's draft in the launched step

    # -- room -------------------------------------------------------------------------------

    def _ensure(self, columns: int) -> None:
        """A buffer of at least ``columns`` columns per slot (grown, contents kept)."""
        import torch

        if columns <= self.capacity:
            return
        capacity = -(-columns // CAPACITY_STEP) * CAPACITY_STEP
        allowed = torch.zeros(self.slots, capacity, dtype=torch.bool, device=self.device)
        allowed[:, 0] = True  # a free slot attends to something (a row with no key gives NaN)
        if self.allowed is not None:
            allowed[:, : self.capacity] = self.allowed
        self.allowed = allowed
        self.mask = allowed[:, None, None, :]
        self.column_index = torch.arange(capacity, device=self.device)
        if not self.layers:
            self.layers = [_slot_layer_class()(self) for _ in range(decoding._text_config(self.model).num_hidden_layers)]
        for layer in self.layers:
            layer.grow(capacity)
        self.capacity = capacity
        self.graph = None  # the buffers moved: capture again

    # -- admission --------------------------------------------------------------------------

    def free(self) -> list[int]:
        return [slot for slot, request in enumerate(self.rows) if request is None]

    def admit(self, requests: Sequence[Request]) -> list[Request]:
        """Prefill ``requests`` (at most as many as free slots) into free slots and pick
        their first tokens; the ones that stopped at it are returned (done)."""
        import torch

        if not requests:
            return []
        free = self.free()
        if len(requests) > len(free):
            raise ValueError(f"{len(requests)} requests for {len(free)} free slots")
        self._ensure(max(len(r.row) for r in requests) + self.max_new_tokens + self.draft_tokens)
        cached = [len(r.prefix.ids) if r.prefix is not None else 0 for r in requests]
        order = sorted(range(len(requests)), key=lambda i: (len(requests[i].row) - cached[i], cached[i]))
        ordered = [requests[i] for i in order]
        with torch.inference_mode(), self.timer("prefill"):
            cache, logits, mask, width = decoding._prefill(self.model, [r.row for r in ordered], [r.prefix for r in ordered], 0, self.pad_id)
            DECODE_STATS["calls"] += 1
            DECODE_STATS["prefill_tokens"] += sum(len(r.row) for r in ordered) - sum(cached)
            first = logits.argmax(dim=-1).tolist()
            lengths = [len(r.row) for r in ordered]
            longest = max(lengths)
            # Each row's own columns first, in order, then its padding: one gather per layer
            # moves every admitted row's keys and values to column 0 of its slot, without a host
            # sync per row. A shorter row's slot gets some padding after its own columns, masked
            # until its steps write there.
            own_first = torch.argsort(mask[:, :width].eq(0).to(torch.uint8), dim=1, stable=True)[:, :longest]
            slots = torch.tensor(free[: len(ordered)], device=self.device)
            for layer, part in zip(self.layers, cache.layers):
                if layer.keys_buffer is None:
                    layer.allocate(part.keys, self.capacity)
                index = own_first[:, None, :, None].expand(-1, part.keys.shape[1], -1, part.keys.shape[3])
                layer.keys_buffer[slots, :, :longest] = part.keys[:, :, :width].gather(2, index)
                layer.values_buffer[slots, :, :longest] = part.values[:, :, :width].gather(2, index)
            self.allowed[slots] = self.column_index[None, :] < torch.tensor(lengths, device=self.device)[:, None]
            for k, request in enumerate(ordered):
                request.slot = free[k]
                self.rows[free[k]], self.lengths[free[k]] = request, lengths[k]
                if self.draft_tokens and request.drafts is None:  # else the episode's earlier call's, restarted
                    request.drafts = NgramDrafts(request.row, self.draft_ngram, self.draft_tokens)
        done = []
        for k, request in enumerate(ordered):
            if self._take(request, first[k]):
                done.append(request)
        return done

    # -- decoding -----------------------------------------------------------------------------

    def busy(self) -> bool:
        return any(request is not None for request in self.rows)

    def shrink(self, slots: int) -> None:
        """Keep ``slots`` slots (at least the occupied ones), the occupied rows moved to the
        first: a step computes every slot, so once fewer episodes are left to play than half
        the slots, the rest would compute padding for the remaining steps."""
        import torch

        occupied = [slot for slot, request in enumerate(self.rows) if request is not None]
        if slots >= self.slots or len(occupied) > slots:
            return
        keep = occupied + [slot for slot in range(self.slots) if slot not in set(occupied)][: slots - len(occupied)]
        index = torch.tensor(keep, device=self.device)
        for layer in self.layers:
            layer.select(index)
        if self.allowed is not None:
            self.allowed = self.allowed[index].contiguous()
            self.mask = self.allowed[:, None, None, :]
        self.rows = [self.rows[slot] for slot in keep]
        self.lengths = [self.lengths[slot] for slot in keep]
        for new_slot, request in enumerate(self.rows):
            if request is not None:
                request.slot = new_slot
        self.slots = slots
        self.ids, self.positions = self.ids[:slots].clone(), self.positions[:slots].clone()
        self.columns, self.slot_index = self.columns[:slots].clone(), torch.arange(slots, device=self.device)
        self.drafted = [self.drafted[slot] for slot in keep]
        self.graph = None  # other shapes: capture again
        DECODE_STATS["shrinks"] += 1

    def step(self) -> list[Request]:
        """One token for every occupied slot; the requests that stopped (their slots freed)."""
        self.launch()
        return self.collect()

    def launch(self) -> None:
        """Start a step on the device (:meth:`step`'s first half): on a GPU it returns once the
        step is queued, so the host can do other work while it runs; :meth:`collect` ends it."""
        import torch

        live = [slot for slot, request in enumerate(self.rows) if request is not None]
        if self.draft_tokens:
            return self._launch_drafted(live)
        # A free slot computes a pad token at column 0 (its row's keys were read when it ended).
        ids, columns = [self.pad_id] * self.slots, [0] * self.slots
        for slot in live:
            ids[slot], columns[slot] = self.rows[slot].generated[-1], self.lengths[slot]
        with torch.inference_mode(), self.timer("step"):
            self.ids.copy_(torch.tensor(ids).unsqueeze(1))
            self.columns.copy_(torch.tensor(columns))
            self.positions.copy_(self.columns.unsqueeze(1))  # a slot's row starts at column 0
            self.allowed[self.slot_index, self.columns] = True
            self.picked = self._forward().argmax(dim=-1)
        self.live = live

    def _launch_drafted(self, live: list[int]) -> None:
        """:meth:`launch` with drafts: each row feeds its last id and its draft (padded to
        the step's width) at its next columns; the step's mask (:meth:`_eager`) lets each
        position see the row's confirmed columns and the step's positions before it."""
        import torch

        width = 1 + self.draft_tokens
        ids, columns = [[self.pad_id] * width for _ in range(self.slots)], [0] * self.slots
        for slot in live:
            request = self.rows[slot]
            draft = request.drafts.draft()[: self.draft_tokens]
            self.drafted[slot] = draft
            ids[slot][: 1 + len(draft)] = [request.generated[-1], *draft]
            columns[slot] = self.lengths[slot]
            DECODE_STATS["drafted"] += len(draft)
            DECODE_STATS["drafted_rows"] += 1
        with torch.inference_mode(), self.timer("step"):
            self.ids.copy_(torch.tensor(ids))
            self.columns.copy_(torch.tensor(columns))
            self.positions.copy_(self.columns.unsqueeze(1) + self.offsets)
            self.picked = self._forward().argmax(dim=-1)
        self.live = live

    def collect(self) -> list[Request]:
        """The launched step's tokens (waits for the device); the requests that stopped."""
        picked, live = self.picked.tolist(), self.live
        self.picked, self.live = None, []
        DECODE_STATS["steps"] += 1
        if self.draft_tokens:
            return self._collect_drafted(picked, live)
        done = []
        for slot in live:
            request = self.rows[slot]
            self.lengths[slot] += 1
            if self._take(request, picked[slot]):
                done.append(request)
        return done

    def _collect_drafted(self, picked: list[list[int]], live: list[int]) -> list[Request]:
        """Each row takes its confirmed drafts and the pick after them, one at a time as a
        step without drafts would (a stop among them ends the row there); the fed positions
        whose ids were confirmed become columns the row attends to."""
        import torch

        done, committed = [], [-1] * self.slots
        for slot in live:
            request, draft = self.rows[slot], self.drafted[slot]
            took = accepted(draft, picked[slot]) + 1
            DECODE_STATS["draft_accepted"] += took - 1
            committed[slot] = took - 1  # the fed last id, then the confirmed drafts
            for token in picked[slot][:took]:
                self.lengths[slot] += 1
                if self._take(request, token):
                    done.append(request)
                    break
        with torch.inference_mode():
            span = self.column_index[None, :] - self.columns[:, None]
            self.allowed |= (span >= 0) & (span <= torch.tensor(committed, device=self.device)[:, None])
        return done

    def _take(self, request: Request, token: int) -> bool:
        """Append ``token``; True (and the slot freed) when the row stops."""
        ids = request.generated
        ids.append(token)
        if request.drafts is not None:
            request.drafts.extend((token,))
        if token in self.stop_ids or len(ids) >= self.max_new_tokens or (self.stop_text is not None and self.stop_text(ids)):
            self.rows[request.slot] = None
            return True
        return False

    def kept(self, request: Request) -> PrefixKV:
        """The keys and values of ``request``'s row and of its new ids but the last (the ones
        fed), for the episode's next call (read before its slot is reused)."""
        n = len(request.row) + len(request.generated) - 1
        slot = request.slot
        layers = tuple((layer.keys_buffer[slot : slot + 1, :, :n].clone(), layer.values_buffer[slot : slot + 1, :, :n].clone())
                       for layer in self.layers)
        return PrefixKV(tuple(request.row) + tuple(request.generated[:-1]), layers)

    def _forward(self) -> "torch.Tensor":
        if self.graph is not None:
            self.graph.replay()
            return self.logits
        if self.capture:
            try:
                # Each row writes its key and value at its own column: a replay (warm-up,
                # capture) writes the same again.
                self.graph, self.logits = decoding.capture_step(self._eager)
                return self.logits
            except Exception as error:  # noqa: BLE001 - any capture failure: the same step eagerly
                self.capture = False
                decoding.capture_failed(error)
        return self._eager()

    def _eager(self) -> "torch.Tensor":
        mask = self.mask
        if self.draft_tokens:
            # Position i of a row sees the row's confirmed columns and the step's columns up
            # to its own (computed on the device from the columns: a graph replays it).
            span = self.column_index[None, None, :] - self.columns[:, None, None]
            mask = (self.allowed[:, None, :] | ((span >= 0) & (span <= self.offsets[None, :, None])))[:, None]
        with attending(self.model, self.attention):
            logits = self.model(input_ids=self.ids, attention_mask=mask, position_ids=self.positions, use_cache=True,
                                **{decoding._cache_name(self.model): _slot_cache(self.layers)}).logits
        return logits if self.draft_tokens else logits[:, -1, :]  # every fed position's picks, or the one


def time_attentions(model: Any, rows: int, columns: int, *, cuda_graphs: bool, steps: int = 16, prompt_tokens: int = 16,
                    seed: int = 0, draft: tuple[int, int] | None = None) -> tuple[dict[str, float], dict[str, str]]:
    """Milliseconds per slot step of ``model`` with each attention of :data:`ATTENTIONS`, at
    one shape: ``rows`` slots of ``columns`` columns (an evaluation's widest buffer: its
    longest prompt plus its reply's room), each holding a row of ``prompt_tokens`` seeded
    random ids, ``steps`` steps timed after two (the first captures the CUDA graph where
    ``cuda_graphs``), the device synchronised around them. A step attends over every column
    under the mask whatever the rows hold, so short rows time the full width without a long
    prefill (with ``draft``, each step verifies a draft of its full width, whatever it takes).
    What an evaluation's ``continuous: {attention: auto}`` takes its pick from.

    And the attentions ruled out, with why: one whose step raised, and, where ``cuda_graphs``,
    one whose step would not capture (a graphed evaluation must not get the eager step; its
    failure is taken back from :data:`~pipelines.episodes.decoding.GRAPH_ERRORS`, which would
    otherwise stop every later capture, the other attention's too)."""
    import torch

    vocab = decoding._text_config(model).vocab_size
    ids = torch.randint(vocab, (rows, prompt_tokens), generator=torch.Generator().manual_seed(seed)).tolist()
    device = next(model.parameters()).device
    times: dict[str, float] = {}
    errors: dict[str, str] = {}
    for attention in ATTENTIONS:
        failures = len(decoding.GRAPH_ERRORS)
        decoder = None
        try:
            decoder = SlotDecoder(model, rows, max(columns - prompt_tokens, (1 + (draft or (0,))[0]) * (steps + 3)), frozenset(), 0,
                                  cuda_graphs=cuda_graphs, attention=attention, draft=draft)
            decoder._ensure(columns)
            decoder.admit([Request(None, row, None, None, 0.0) for row in ids])  # type: ignore[arg-type]
            decoder.step(), decoder.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            started = perf_counter()
            for _ in range(steps):
                decoder.step()
            if device.type == "cuda":
                torch.cuda.synchronize(device)
            times[attention] = round(1000 * (perf_counter() - started) / steps, 3)
            decoder.timer.pending.clear()  # not an evaluation's time
        except Exception as error:  # noqa: BLE001 - an attention that fails here is not picked
            errors[attention] = f"{type(error).__name__}: {error}"[:300]
        finally:
            del decoder  # its buffers and graph, before the next attention's
            if device.type == "cuda":
                torch.cuda.empty_cache()
        if len(decoding.GRAPH_ERRORS) > failures:
            errors[attention] = f"capture failed: {decoding.GRAPH_ERRORS[failures]}"
            times.pop(attention, None)
            del decoding.GRAPH_ERRORS[failures:]
    return times, errors


@contextlib.contextmanager
def attending(model: Any, implementation: str) -> Any:
    """``model`` attends with the registered ``implementation`` inside the block only: its
    prefills keep their own. (:func:`pipelines.episodes.decoding.packed_step` does the same for
    the rounds' static steps with SDPA; it takes this once a relock of the 34 stages that run
    decoding.py can show their outputs unchanged.)"""
    config = decoding._text_config(model)
    own, config._attn_implementation = config._attn_implementation, implementation
    try:
        yield
    finally:
        config._attn_implementation = own


def _slot_cache(layers: Sequence[Any]) -> Any:
    from transformers.cache_utils import Cache

    return Cache(layers=list(layers))


_SLOT_LAYER: list[type] = []


def _slot_layer_class() -> type:
    """:class:`SlotLayer`, built on first use so that importing this module needs no
    transformers."""
    if _SLOT_LAYER:
        return _SLOT_LAYER[0]
    from transformers.cache_utils import DynamicLayer

    class SlotLayer(DynamicLayer):
        """One layer's keys and values of every slot, ``[slots, heads, capacity, dim]``; an
        update writes each slot's one new key and value at the decoder's column for it and
        returns the whole buffer (the mask says which columns a row attends to)."""

        def __init__(self, decoder: SlotDecoder):
            super().__init__()
            self.decoder = decoder
            self.keys_buffer: Any = None
            self.values_buffer: Any = None

        def grow(self, capacity: int) -> None:
            if self.keys_buffer is None:
                return  # allocated at the first prefill, whose keys give the shape and dtype
            for name in ("keys_buffer", "values_buffer"):
                old = getattr(self, name)
                new = old.new_zeros(old.shape[0], old.shape[1], capacity, old.shape[3])
                new[:, :, : old.shape[2]] = old
                setattr(self, name, new)

        def select(self, index: Any) -> None:
            if self.keys_buffer is not None:
                self.keys_buffer, self.values_buffer = self.keys_buffer[index].contiguous(), self.values_buffer[index].contiguous()

        def allocate(self, like: Any, capacity: int) -> None:
            slots = self.decoder.slots
            self.keys_buffer = like.new_zeros(slots, like.shape[1], capacity, like.shape[3])
            self.values_buffer = like.new_zeros(slots, like.shape[1], capacity, like.shape[3])
            self.is_initialized = True

        def update(self, key_states: Any, value_states: Any, *args: Any, **kwargs: Any) -> Any:
            decoder = self.decoder
            rows, columns = decoder.slot_index, decoder.columns
            if key_states.shape[2] == 1:
                self.keys_buffer[rows, :, columns] = key_states[:, :, 0].to(self.keys_buffer.dtype)
                self.values_buffer[rows, :, columns] = value_states[:, :, 0].to(self.values_buffer.dtype)
            else:  # a drafted step: each row's positions at its next columns
                rows, columns = rows[:, None], columns[:, None] + decoder.offsets[None, :]
                self.keys_buffer[rows, :, columns] = key_states.transpose(1, 2).to(self.keys_buffer.dtype)
                self.values_buffer[rows, :, columns] = value_states.transpose(1, 2).to(self.values_buffer.dtype)
            return self.keys_buffer, self.values_buffer

        def get_seq_length(self) -> int:
            return 0 if self.keys_buffer is None else int(self.keys_buffer.shape[2])

    _SLOT_LAYER.append(SlotLayer)
    return SlotLayer


class ContinuousHFAgent:
    """An agent (an :class:`~pipelines.episodes.HFAgent`, optionally behind a prompt rewriter
    with a ``messages(messages)`` method such as
    :class:`~pipelines.evaluation.agent.PolicyPromptAgent`) that takes one context at a time
    (:meth:`submit`) and decodes continuously (module docstring) while :meth:`serve` runs.
    Its outputs are those of ``agent.act`` for greedy decoding. ``slots``: rows decoded
    together (default: the backend's batch size); ``attention``: the slot step's
    (:data:`ATTENTIONS`); ``draft``: the prompt-lookup drafts its steps verify
    (:class:`SlotDecoder`)."""

    def __init__(self, agent: Any, slots: int | None = None, attention: str = "sdpa", draft: tuple[int, int] | None = None):
        inner = getattr(agent, "inner", agent)
        self.rewrite = agent.messages if inner is not agent else None
        self.hf, self.name, self.format = inner, agent.name, agent.format
        if inner.use_generate:
            raise ValueError(f"agent {agent.name!r}: continuous batching needs the decoding loop, not model.generate")
        if inner.decode_spec.temperature != 0.0:
            raise ValueError(f"agent {agent.name!r}: continuous batching is greedy only (temperature {inner.decode_spec.temperature})")
        if attention not in ATTENTIONS:
            raise ValueError(f"agent {agent.name!r}: attention: expected one of {sorted(ATTENTIONS)}, got {attention!r}")
        self.slots, self.attention, self.draft = slots or inner.backend.batch_size, attention, draft
        self.pending: deque[Request] = deque()
        self.wake = asyncio.Event()
        self.closed = False
        self.decoder: SlotDecoder | None = None
        self._episodes: EpisodeCache = {}
        self._drafts: dict[tuple[str, int], NgramDrafts] = {}  # an episode's last call's draft index

    def submit(self, context: AgentContext) -> asyncio.Future:
        """Queue ``context``; its :class:`~pipelines.episodes.AgentOutput` when the reply ends."""
        if self.rewrite is not None:
            context = replace(context, messages=tuple(self.rewrite(context.messages)))
        hf = self.hf
        prompt = hf.render(context)
        row = hf.backend.tokenizer([prompt], add_special_tokens=not hf.has_template)["input_ids"][0]
        prefix = hf._shared_prefix([context], [row]) if hf.prefix_cache else None
        if hf.episode_cache:
            prefix = episode_prefix(self._episodes, context, row, prefix)
        future = asyncio.get_running_loop().create_future()
        earlier = self._drafts.pop((context.episode_id, context.seed), None)
        self.pending.append(Request(context, row, prefix, future, perf_counter(), drafts=earlier.restart(row) if earlier else None))
        self.wake.set()
        return future

    def close(self) -> None:
        self.closed = True
        self.wake.set()

    async def serve(self, playing: Callable[[], int]) -> None:
        """Admit and decode until :meth:`close` and nothing is left; while each step runs on
        the device, the event loop runs the episodes the previous one answered (their users
        reply, their next contexts arrive and are admitted after the step). ``playing()``: how
        many episodes have not ended (no more rows than that are ever needed: the slots halve
        as they end)."""
        hf = self.hf
        stop_text = hf._ends_with_stop_string if hf.sampling.stop else None
        self.decoder = decoder = SlotDecoder(hf.backend.model, max(1, min(self.slots, playing())), hf.decode_spec.max_new_tokens,
                                             hf._stop_token_ids(), hf.backend.pad_token_id, stop_text, cuda_graphs=hf.decode_spec.cuda_graphs,
                                             attention=self.attention, draft=self.draft)
        while True:
            # The step is queued on the device first, then the episodes answered by the last
            # one take their turn (users, tools, prompts) while it runs: on a GPU the host's
            # work hides under the step's. Their next calls join one step later; greedy rows
            # are what they would be alone, so the transcripts do not change.
            stepping = decoder.busy()
            if stepping:
                decoder.launch()
            await asyncio.sleep(0)
            if stepping:
                self._answer(decoder.collect())
            left = playing()
            if 0 < left <= decoder.slots // 2:
                decoder.shrink(1 << (left - 1).bit_length())  # the power of two at or above: few captures
            free = decoder.free()
            if self.pending and free:
                admitted = [self.pending.popleft() for _ in range(min(len(free), len(self.pending)))]
                self._answer(decoder.admit(admitted))
            if decoder.busy() or self.pending:
                continue
            if self.closed:
                decoder.timer.flush()
                return
            if not stepping:  # nothing decoding, nothing waiting: sleep until a call arrives
                self.wake.clear()
                await self.wake.wait()

    def forget(self, state: EpisodeState) -> None:
        """Drop an ended episode's keys and values (no call of it comes again)."""
        self._episodes.pop((state.spec.episode_id, state.spec.seed), None)
        self._drafts.pop((state.spec.episode_id, state.spec.seed), None)

    def _answer(self, done: Sequence[Request]) -> None:
        for request in done:
            if self.hf.episode_cache:
                self._episodes.update([episode_entry(request.context, self.decoder.kept(request))])
            if request.drafts is not None:  # the episode's next prompt repeats this one: index only what is new
                self._drafts[(request.context.episode_id, request.context.seed)] = request.drafts
            output = self.hf.output(request.row, request.generated, self.decoder.stop_ids, perf_counter() - request.started)
            request.future.set_result(output)


async def play_continuous(states: Sequence[EpisodeState], agent: ContinuousHFAgent,
                          progress: Callable[[int, int], Any] | None = None) -> list[Episode]:
    """Play ``states`` to their end, each episode on its own (module docstring); their
    records, in order. ``progress(done, total)`` after each episode that ends."""
    for state in states:
        if state.format.name != agent.format.name:
            raise ValueError(f"episode {state.spec.episode_id!r} was started for format {state.format.name!r}, "
                             f"the agent writes {agent.format.name!r}")
    finished = 0

    async def episode(state: EpisodeState) -> None:
        nonlocal finished
        while True:
            if state.phase == WAITS_FOR_USER:
                await state.hear_user()
            if state.phase != WAITS_FOR_AGENT:
                break
            state.take(await agent.submit(state.context()))
        assert state.phase == DONE, state.phase
        agent.forget(state)
        finished += 1
        if progress is not None:
            progress(finished, len(states))

    server = asyncio.ensure_future(agent.serve(lambda: len(states) - finished))
    try:
        playing = asyncio.gather(*(episode(state) for state in states))
        done, _ = await asyncio.wait({server, playing}, return_when=asyncio.FIRST_COMPLETED)
        if server in done:  # the decoder failed (or returned early): its error, not a hang
            playing.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await playing
            server.result()
            raise RuntimeError("continuous decoding stopped while episodes were still playing")
        await playing
        agent.close()
        await server
    finally:
        if not server.done():
            server.cancel()
    return [state.finish() for state in states]

