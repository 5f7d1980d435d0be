"""Agents: what produces the agent side of an episode, one batched step at a time.

The runner hands an agent the :class:`AgentContext` of every episode that waits for it
and gets one :class:`AgentOutput` per context back, in order (:class:`Agent`). What an
output means is its format's business (:mod:`pipelines.episodes.formats`); an agent only
produces text (and, for function calling, structured tool calls).

* :class:`HFAgent`: a local transformers model. Every ``act`` renders all contexts with
  the chat template and decodes them together: one batch per ``backend.batch_size``
  contexts (:mod:`pipelines.episodes.decoding`), laid out so that every prompt ends where
  generation starts (greedy replies then equal one-at-a-time ones).
* :class:`OpenAIAgent`: any OpenAI-compatible endpoint through :class:`LLMClient`, for
  every format: the text formats (speakrl, react) as plain chat, function calling with the
  format's tool schemas sent as ``tools`` and the reply's ``tool_calls`` handed to the
  format's parser (the server must support function calling, e.g. vLLM with a tool parser).
* :class:`ReplayAgent`: replays a dataset dialogue's system side, whatever the user says:
  for gold system turn k the gold tool calls of that turn (one per step), then the gold
  text, with MultiWOZ's booking references and taxi details replaced by what this
  episode's environment returned; after the last gold turn it ends the episode. Replay
  agent + simulator is how gold trajectories are checked against the goal checker.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, replace
from time import perf_counter
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from pipelines.env.replay import GoldCalls
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.episodes.decoding import DecodeSpec, PrefixKV, decode, prefix_kv, supports_decoding
from pipelines.episodes.formats import AgentAction, AgentFormat, Message, RawToolCall, SpeakRLFormat
from pipelines.llm.client import LLMClient
from pipelines.llm.config import ROLES, SamplingParams
from pipelines.llm.hf import cut_at_stop
from pipelines.records import Dialogue, ToolCall

if TYPE_CHECKING:
    from pipelines.llm.hf import HFBackend


@dataclass(frozen=True)
class AgentContext:
    """What an agent knows when it takes a step in one episode.

    ``messages``: the episode's chat history as the agent sees it (system prompt with the
    format instructions, user turns, the agent's outputs, tool results, format feedback).
    ``tools``: tool schemas to send next to the messages (function calling), else None.
    ``exchange``: the user-agent exchange (0-based); ``turn``: the agent's dialogue turn
    index (MultiWOZ numbering: user turns even, agent turns odd). ``step``: accepted outputs
    so far in this exchange; ``attempt``: malformed ones. ``calls``: the episode's tool
    calls so far as ``(turn, call with observation)``. ``reference``: the dataset dialogue
    the goal comes from, for scripted agents; a model agent must not look at it.
    """

    episode_id: str
    seed: int
    exchange: int
    turn: int
    step: int
    attempt: int
    messages: tuple[Message, ...]
    tools: tuple[Mapping[str, Any], ...] | None = None
    calls: tuple[tuple[int, ToolCall], ...] = ()
    reference: Dialogue | None = None

    @property
    def step_seed(self) -> int:
        """A seed for this step's request: fixed by the episode and the position in it, so that
        re-runs repeat (and hit the response cache) while every step and retry differs."""
        key = f"{self.episode_id}\x00{self.seed}\x00{self.exchange}\x00{self.step}\x00{self.attempt}"
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big") >> 1


@dataclass(frozen=True)
class AgentOutput:
    """One step's raw output: text, structured tool calls (function-calling APIs), what it
    cost and how long the agent took (for a batched step: the whole batch's time).
    ``error``: the backend produced nothing (e.g. an LLM call failed for good).
    ``truncated``: the output stopped at the generation limit, not at its own end (a stop
    token or string); the local transformers agent sets it."""

    text: str
    tool_calls: tuple[RawToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None
    truncated: bool = False


class Agent(Protocol):
    name: str
    format: AgentFormat

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        """One output per context, in order."""
        ...


# --------------------------------------------------------------------------------------
# Local transformers model
# --------------------------------------------------------------------------------------


#: An episode cache: (episode id, seed) -> the (exchange, step, attempt) of the episode's last
#: call and the keys and values of its prompt and reply.
EpisodeCache = dict[tuple[str, int], tuple[tuple[int, int, int], PrefixKV]]


def episode_entry(context: AgentContext, kv: PrefixKV) -> tuple[tuple[str, int], tuple[tuple[int, int, int], PrefixKV]]:
    """``context``'s call's entry in an :data:`EpisodeCache`."""
    return (context.episode_id, context.seed), ((context.exchange, context.step, context.attempt), kv)


def episode_prefix(cache: EpisodeCache, context: AgentContext, row: Sequence[int], shared: PrefixKV | None) -> PrefixKV | None:
    """The keys and values ``row`` (``context``'s prompt) starts from: the part of its
    episode's last call in ``cache`` that it shares, where longer than ``shared`` (the system
    prompt's), else ``shared``."""
    position, last = cache.get((context.episode_id, context.seed), (None, None))
    # Only an earlier step of the same run of the episode: a re-run starts afresh
    # (sampled replies then repeat, whatever was decoded before).
    earlier = last is not None and position < (context.exchange, context.step, context.attempt)
    common = last.common(row) if earlier else None
    longer = common is not None and (shared is None or len(common.ids) > len(shared.ids))
    return common if longer else shared


class HFAgent:
    """A local causal LM (an :class:`HFBackend`'s model and tokenizer) as the agent.

    Decodes with :func:`pipelines.episodes.decoding.decode`: a preallocated key/value cache,
    stopped rows leaving the batch, OpenAI sampling semantics (greedy when
    ``sampling.temperature == 0``; otherwise temperature and top_p under a seed derived from
    ``seed`` and the contexts of the call, so sampled replies depend on the batch they were
    drawn in). Models the loop does not support (sliding-window or linear-attention layers,
    encoder-decoders), ``sampling.extra_body`` (arbitrary ``generate`` options) and
    ``use_generate=True`` decode with ``model.generate`` instead, left-padded.

    ``prefix_cache``: every prompt starts with the same rendered system message, so its
    keys and values are computed once and reused by every row of every call (the prefix
    caching of serving engines). Rows that do not start with the prefix (no system
    message, a tokenizer that merges across it) are decoded without it.

    ``episode_cache``: each episode's keys and values (its prompt and reply) are kept from
    one call to the next, so a round prefills only what is new in the episode's prompt: the
    part after the longest token prefix it shares with the last one (a prompt rewritten at
    the front, e.g. history dropped to fit, shares less and prefills more; nothing is
    assumed), from an earlier step of the episode only. Only the episodes of the latest call
    are kept: a finished episode's cache goes with the next call.

    ``compact_share``: stopped rows leave a batch once they are this share of it (None:
    they stay until the last row stops). ``cuda_graphs``: decode steps of fixed shapes,
    replayed as CUDA graphs on a GPU (:mod:`pipelines.episodes.decoding`).
    """

    def __init__(
        self,
        backend: HFBackend,
        fmt: AgentFormat,
        sampling: SamplingParams = SamplingParams(),
        *,
        name: str = "hf",
        seed: int = 0,
        prefix_cache: bool = True,
        episode_cache: bool = True,
        compact_share: float | None = 0.125,
        use_generate: bool = False,
        cuda_graphs: bool = False,
    ):
        if sampling.presence_penalty is not None or sampling.frequency_penalty is not None:
            raise ValueError("the hf agent does not support presence_penalty / frequency_penalty")
        self.has_template = bool(getattr(backend.tokenizer, "chat_template", None))
        if fmt.tools is not None and not self.has_template:
            raise ValueError(f"format {fmt.name!r} sends tool schemas out of band, which needs a chat template")
        self.backend = backend
        self.format = fmt
        self.sampling = sampling
        self.name = name
        self.seed = seed
        self.prefix_cache = prefix_cache
        self.episode_cache = episode_cache
        # Stop ids and the seed are the call's; the rest is checked here, once.
        self.decode_spec = DecodeSpec(
            sampling.max_tokens, frozenset(), temperature=sampling.temperature, top_p=sampling.top_p, compact_share=compact_share,
            cuda_graphs=cuda_graphs,
        )
        self.use_generate = use_generate or bool(sampling.extra_body) or not supports_decoding(backend.model)
        self._prefixes: dict[tuple[int, ...], PrefixKV] = {}
        self._episodes: EpisodeCache = {}

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        if not contexts:
            return []
        # Generation blocks for a while; a thread keeps the event loop (other tasks) alive.
        return await asyncio.to_thread(self._act, list(contexts))

    def _act(self, contexts: list[AgentContext]) -> list[AgentOutput]:
        size = self.backend.batch_size
        prompts = [self.render(c) for c in contexts]
        # Prompts of similar length share a batch: a batch pads every prompt to its longest,
        # and the padding costs as much as real tokens in the prefill.
        order = sorted(range(len(contexts)), key=lambda i: len(prompts[i]))
        outputs: list[AgentOutput | None] = [None] * len(contexts)
        kept: EpisodeCache = {}
        for start in range(0, len(order), size):
            chunk = order[start : start + size]
            for i, output in zip(chunk, self._generate([contexts[i] for i in chunk], [prompts[i] for i in chunk], kept)):
                outputs[i] = output
        self._episodes = kept
        return outputs  # type: ignore[return-value]

    def render(self, context: AgentContext) -> str:
        """The prompt of one context, ending where the agent's reply begins."""
        if context.tools is None:
            return self.backend.render(context.messages)
        return self.backend.tokenizer.apply_chat_template(
            [dict(m) for m in context.messages],
            tools=[dict(t) for t in context.tools],
            tokenize=False,
            add_generation_prompt=True,
        )

    def _generate(
        self, contexts: list[AgentContext], prompts: list[str], kept: EpisodeCache | None = None
    ) -> list[AgentOutput]:
        """One batch: the reply of every prompt, cut after its first stop token. With the
        episode cache, each episode's keys and values go to ``kept`` for its next call."""
        started = perf_counter()
        tokenizer = self.backend.tokenizer
        # A rendered chat template already holds its special tokens.
        rows = tokenizer(prompts, add_special_tokens=not self.has_template)["input_ids"]
        stop_ids = self._stop_token_ids()
        seed = self._generation_seed(contexts)
        if self.use_generate:
            new = self._generate_with_hf(rows, seed)
        else:
            spec = replace(self.decode_spec, stop_ids=stop_ids, seed=seed)
            prefix = self._shared_prefix(contexts, rows) if self.prefix_cache else None
            stop_text = self._ends_with_stop_string if self.sampling.stop else None
            if self.episode_cache:
                prefixes = [episode_prefix(self._episodes, context, row, prefix) for context, row in zip(contexts, rows)]
                out: list[PrefixKV | None] = []
                new = decode(
                    self.backend.model, rows, spec, pad_id=self.backend.pad_token_id, prefixes=prefixes, stop_text=stop_text, kv_out=out
                )
                if kept is not None:
                    kept.update(episode_entry(c, kv) for c, kv in zip(contexts, out) if kv is not None)
            else:
                new = decode(self.backend.model, rows, spec, pad_id=self.backend.pad_token_id, prefix=prefix, stop_text=stop_text)
        latency = perf_counter() - started
        return [self.output(row, ids, stop_ids, latency) for row, ids in zip(rows, new)]

    def output(self, row: Sequence[int], ids: Sequence[int], stop_ids: frozenset[int], latency: float) -> AgentOutput:
        """The :class:`AgentOutput` of prompt ``row`` and new ``ids``: the reply cut at its first
        stop token (which counts as generated) and at a stop string."""
        end = next((k for k, token in enumerate(ids) if token in stop_ids), None)
        ids = ids if end is None else ids[: end + 1]
        text = self.backend.tokenizer.decode(ids if end is None else ids[:-1], skip_special_tokens=True)
        reply = cut_at_stop(text, self.sampling.stop)
        return AgentOutput(
            reply,
            prompt_tokens=len(row),
            completion_tokens=len(ids),
            latency_s=latency,
            # No stop token, no stop string, and the limit reached: cut by the limit.
            truncated=end is None and reply == text and len(ids) >= self.decode_spec.max_new_tokens,
        )

    def _generate_with_hf(self, rows: list[list[int]], seed: int) -> list[list[int]]:
        """``model.generate`` on left-padded rows: the new ids of each row (rows that stopped
        carry pad ids after their stop)."""
        import torch

        device = self.backend.device
        pad = self.backend.pad_token_id
        width = max(len(r) for r in rows)
        inputs = {
            "input_ids": torch.tensor([[pad] * (width - len(r)) + r for r in rows], device=device),
            "attention_mask": torch.tensor([[0] * (width - len(r)) + [1] * len(r) for r in rows], device=device),
        }
        kwargs = self.backend.generate_kwargs(self.sampling)
        devices = [device] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(seed)
            generated = self.backend.model.generate(**inputs, **kwargs)
        return generated[:, width:].tolist()

    def _ends_with_stop_string(self, ids: list[int]) -> bool:
        # A stop string of c characters spans at most 4c byte-level tokens; earlier tokens
        # were checked when they were new.
        tail = max(len(s) for s in self.sampling.stop) * 4
        text = self.backend.tokenizer.decode(ids[-tail:], skip_special_tokens=True)
        return any(s in text for s in self.sampling.stop)

    def _shared_prefix(self, contexts: list[AgentContext], rows: list[list[int]]) -> PrefixKV | None:
        """The keys and values of the rendered system message when every context has the
        same one and every prompt starts with exactly its ids; else None."""
        first = contexts[0].messages[0] if contexts[0].messages else None
        if not self.has_template or first is None or first.get("role") != "system":
            return None
        if any(not c.messages or c.messages[0] != first for c in contexts):
            return None
        tokenizer = self.backend.tokenizer
        prefix = tuple(tokenizer(tokenizer.apply_chat_template([dict(first)], tokenize=False), add_special_tokens=False)["input_ids"])
        n = len(prefix)
        if n == 0 or any(len(r) <= n or tuple(r[:n]) != prefix for r in rows):
            return None
        if prefix not in self._prefixes:
            self._prefixes.clear()  # one system prompt at a time is the common case
            self._prefixes[prefix] = prefix_kv(self.backend.model, prefix)
        return self._prefixes[prefix]

    def _stop_token_ids(self) -> frozenset[int]:
        configured = self.backend.model.generation_config.eos_token_id
        ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
        ids |= {self.backend.tokenizer.eos_token_id, self.backend.pad_token_id}
        return frozenset(i for i in ids if i is not None)

    def _generation_seed(self, contexts: Sequence[AgentContext]) -> int:
        key = json.dumps([self.seed, [c.step_seed for c in contexts]])
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")


# --------------------------------------------------------------------------------------
# OpenAI-compatible endpoint
# --------------------------------------------------------------------------------------


class OpenAIAgent:
    """An endpoint behind :class:`LLMClient` as the agent (see the module docstring).
    ``role``: whose accounting the calls go to (``agent`` unless the caller names another
    of ``ROLES``). Each step's seed is :attr:`AgentContext.step_seed`. With a format that
    sends tools out of band (function calling), the context's tools go with every request
    and the first choice's ``tool_calls`` come back in :attr:`AgentOutput.tool_calls`.
    A failed call becomes an output with ``error`` set, which the runner treats like a
    malformed output (retried, then the turn fails)."""

    # Calls may overlap (the client bounds the requests in flight), so a caller need not
    # wait for one call's slowest request before making the next (pipelines.josh.beam).
    overlapping_calls = True

    def __init__(
        self,
        client: LLMClient,
        fmt: AgentFormat,
        sampling: SamplingParams = SamplingParams(),
        *,
        role: str = "agent",
        name: str | None = None,
    ):
        if role not in ROLES:
            raise ValueError(f"unknown role {role!r}; roles: {list(ROLES)}")
        self.client = client
        self.format = fmt
        self.sampling = sampling
        self.role = role
        self.name = name or f"openai:{client.config.model}"

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        # The client bounds the requests in flight itself.
        return list(await asyncio.gather(*(self._act_one(c) for c in contexts)))

    async def _act_one(self, context: AgentContext) -> AgentOutput:
        started = perf_counter()
        tools = context.tools if context.tools is not None else self.format.tools
        result = await self.client.complete(
            context.messages, self.role, self.sampling, seed=context.step_seed, tools=tools
        )
        latency = perf_counter() - started
        if not result.ok:
            return AgentOutput("", latency_s=latency, error=f"{result.reason}: {result.last_error}")
        usage = result.usage
        return AgentOutput(
            result.text or "",
            tool_calls=tuple(result.tool_calls[0]),
            prompt_tokens=usage.prompt_tokens,
            completion_tokens=usage.completion_tokens,
            latency_s=latency,
        )


# --------------------------------------------------------------------------------------
# Gold replay
# --------------------------------------------------------------------------------------

# replay() needs an environment; the playback below never searches, so it gets no entities.
_NO_DATABASE = Database({})


class _Playback(ToolEnvironment):
    """An environment that answers the i-th call with the i-th observation this episode got.

    :func:`replay` holds the logic that swaps MultiWOZ's booking references and taxi
    details for the environment's; run over a playback of the episode's own calls, it
    applies that logic to this episode instead of being duplicated here."""

    def __init__(self, calls: Sequence[ToolCall]):
        super().__init__(_NO_DATABASE)
        self._calls = iter(calls)

    def call(self, call: ToolCall | str, arguments: Mapping[str, Any] | None = None, *, turn: int | None = None) -> dict[str, Any]:
        made = next(self._calls, None)
        name = call.name if isinstance(call, ToolCall) else call
        if made is None or made.name != name or made.observation is None:
            return {"error": "this call was not made in the episode"}
        return dict(made.observation)


class ActionAgent:
    """A rule-based agent: ``actions(context)`` decides, and the agent's ``format`` renders
    them as the model-facing text and tool calls (subclasses set ``format`` and ``name``)."""

    format: AgentFormat
    name: str

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        return [self.output(context) for context in contexts]

    def output(self, context: AgentContext) -> AgentOutput:
        text, tool_calls = self.format.render(self.actions(context))
        return AgentOutput(text, tool_calls)

    def actions(self, context: AgentContext) -> list[AgentAction]:
        raise NotImplementedError


class ReplayAgent(ActionAgent):
    """Replays ``AgentContext.reference``'s system side (see the module docstring).

    Its position comes from the context alone (the exchange, and the calls made in this
    turn), so forked episodes replay on independently."""

    def __init__(self, fmt: AgentFormat | None = None, *, name: str = "replay", database: Database | None = None):
        self.format = fmt or SpeakRLFormat()
        self.name = name
        self.database = database  # reads booked train ids against the timetable (pipelines.env.replay)
        self._gold = GoldCalls()

    def actions(self, context: AgentContext) -> list[AgentAction]:
        dialogue = context.reference
        if dialogue is None:
            raise ValueError(f"episode {context.episode_id!r}: the replay agent needs the reference dialogue")
        system_turns = [t for t in dialogue.turns if t.speaker == "system"]
        if context.exchange >= len(system_turns):
            return [AgentAction.end()]  # the user talks on after the gold dialogue ended
        gold_turn = system_turns[context.exchange]
        planned = [call for turn, call in self._gold.calls(dialogue, self.database) if turn == gold_turn.index]
        made = sum(1 for turn, _ in context.calls if turn == context.turn)
        if made < len(planned):
            call = planned[made]
            return [AgentAction.tool_call(call.name, call.arguments)]
        actions = [AgentAction.respond(self._gold_text(dialogue, gold_turn.index, context.calls))]
        if gold_turn is system_turns[-1]:
            actions.append(AgentAction.end())
        return actions

    def _gold_text(self, dialogue: Dialogue, turn_index: int, calls: Sequence[tuple[int, ToolCall]]) -> str:
        result = self._gold.replay(dialogue, _Playback([call for _, call in calls]))
        return dict(result.system_texts)[turn_index]
