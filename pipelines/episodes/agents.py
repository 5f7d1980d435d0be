"""Agents: what produces the agent side of an episode, one batched step at a time.

The runner hands an agent the :class:`AgentContext` of every episode that waits for it
and gets one :class:`AgentOutput` per context back, in order (:class:`Agent`). What an
output means is its format's business (:mod:`pipelines.episodes.formats`); an agent only
produces text (and, for function calling, structured tool calls).

* :class:`HFAgent`: a local transformers model. Every ``act`` renders all contexts with
  the chat template and decodes them together: one ``model.generate`` call per
  ``backend.batch_size`` contexts, left-padded so that every prompt ends where generation
  starts (greedy replies then equal one-at-a-time ones).
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
from dataclasses import dataclass
from time import perf_counter
from typing import TYPE_CHECKING, Any, Mapping, Protocol, Sequence

from pipelines.env.replay import gold_tool_calls, replay
from pipelines.env.tools import Database, ToolEnvironment
from pipelines.episodes.formats import AgentAction, AgentFormat, Message, RawToolCall, SpeakRLFormat
from pipelines.llm.client import LLMClient
from pipelines.llm.config import ROLES, SamplingParams
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
    ``error``: the backend produced nothing (e.g. an LLM call failed for good)."""

    text: str
    tool_calls: tuple[RawToolCall, ...] = ()
    prompt_tokens: int = 0
    completion_tokens: int = 0
    latency_s: float = 0.0
    error: str | None = None


class Agent(Protocol):
    name: str
    format: AgentFormat

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        """One output per context, in order."""
        ...


# --------------------------------------------------------------------------------------
# Local transformers model
# --------------------------------------------------------------------------------------


class HFAgent:
    """A local causal LM (an :class:`HFBackend`'s model and tokenizer) as the agent.

    Greedy when ``sampling.temperature == 0``; otherwise sampled under a seed derived from
    ``seed`` and the contexts of the call (a forked RNG, so the caller's torch RNG is left
    alone). Sampled replies depend on the batch they were drawn in, as with HFBackend.
    """

    def __init__(
        self,
        backend: HFBackend,
        fmt: AgentFormat,
        sampling: SamplingParams = SamplingParams(),
        *,
        name: str = "hf",
        seed: int = 0,
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

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        if not contexts:
            return []
        # Generation blocks for a while; a thread keeps the event loop (other tasks) alive.
        return await asyncio.to_thread(self._act, list(contexts))

    def _act(self, contexts: list[AgentContext]) -> list[AgentOutput]:
        size = self.backend.batch_size
        outputs: list[AgentOutput] = []
        for start in range(0, len(contexts), size):
            outputs += self._generate(contexts[start : start + size])
        return outputs

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

    def _generate(self, contexts: list[AgentContext]) -> list[AgentOutput]:
        import torch

        started = perf_counter()
        tokenizer, model = self.backend.tokenizer, self.backend.model
        encoded = tokenizer(
            [self.render(c) for c in contexts],
            return_tensors="pt",
            padding=True,
            padding_side="left",
            # A rendered chat template already holds its special tokens.
            add_special_tokens=not self.has_template,
        ).to(self.backend.device)
        devices = [self.backend.device] if self.backend.device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices), torch.inference_mode():
            torch.manual_seed(self._generation_seed(contexts))
            generated = model.generate(**encoded, **self._generate_kwargs())
        new_tokens = generated[:, encoded["input_ids"].shape[1] :].tolist()
        prompt_tokens = encoded["attention_mask"].sum(dim=1).tolist()
        latency = perf_counter() - started

        stop_ids = self._stop_token_ids()
        outputs = []
        for ids, n_prompt in zip(new_tokens, prompt_tokens):
            # Finished rows are padded to the batch's length; the reply ends at its first
            # stop token, which counts as generated.
            end = next((i for i, token in enumerate(ids) if token in stop_ids), None)
            kept = ids if end is None else ids[:end]
            text = tokenizer.decode(kept, skip_special_tokens=True)
            outputs.append(
                AgentOutput(
                    _cut_at_stop(text, self.sampling.stop),
                    prompt_tokens=int(n_prompt),
                    completion_tokens=len(ids) if end is None else end + 1,
                    latency_s=latency,
                )
            )
        return outputs

    def _generate_kwargs(self) -> dict[str, Any]:
        sampling = self.sampling
        kwargs: dict[str, Any] = {
            "max_new_tokens": sampling.max_tokens,
            "do_sample": not sampling.greedy,
            "pad_token_id": self.backend.pad_token_id,
            **sampling.extra_body,
        }
        if not sampling.greedy:
            kwargs["temperature"] = sampling.temperature
            if sampling.top_p is not None:
                kwargs["top_p"] = sampling.top_p
        if sampling.stop:
            kwargs.update(stop_strings=list(sampling.stop), tokenizer=self.backend.tokenizer)
        return kwargs

    def _stop_token_ids(self) -> frozenset[int]:
        configured = self.backend.model.generation_config.eos_token_id
        ids = set(configured if isinstance(configured, (list, tuple)) else [configured])
        ids |= {self.backend.tokenizer.eos_token_id, self.backend.pad_token_id}
        return frozenset(i for i in ids if i is not None)

    def _generation_seed(self, contexts: Sequence[AgentContext]) -> int:
        key = json.dumps([self.seed, [c.step_seed for c in contexts]])
        return int.from_bytes(hashlib.sha256(key.encode()).digest()[:4], "big")


def _cut_at_stop(text: str, stop: Sequence[str]) -> str:
    # OpenAI semantics: the stop string ends the reply and is not part of it.
    cut = min((i for i in (text.find(s) for s in stop) if i >= 0), default=len(text))
    return text[:cut]


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


class ReplayAgent:
    """Replays ``AgentContext.reference``'s system side (see the module docstring).

    Its position comes from the context alone (the exchange, and the calls made in this
    turn), so forked episodes replay on independently."""

    def __init__(self, fmt: AgentFormat | None = None, *, name: str = "replay"):
        self.format = fmt or SpeakRLFormat()
        self.name = name

    async def act(self, contexts: Sequence[AgentContext]) -> list[AgentOutput]:
        return [self.output(context) for context in contexts]

    def output(self, context: AgentContext) -> AgentOutput:
        text, tool_calls = self.format.render(self.actions(context))
        return AgentOutput(text, tool_calls)

    def actions(self, context: AgentContext) -> list[AgentAction]:
        dialogue = context.reference
        if dialogue is None:
            raise ValueError(f"episode {context.episode_id!r}: the replay agent needs the reference dialogue")
        system_turns = [t for t in dialogue.turns if t.speaker == "system"]
        if context.exchange >= len(system_turns):
            return [AgentAction.end()]  # the user talks on after the gold dialogue ended
        gold_turn = system_turns[context.exchange]
        planned = [call for turn, call in gold_tool_calls(dialogue) if turn == gold_turn.index]
        made = sum(1 for turn, _ in context.calls if turn == context.turn)
        if made < len(planned):
            call = planned[made]
            return [AgentAction.tool_call(call.name, call.arguments)]
        actions = [AgentAction.respond(self._gold_text(dialogue, gold_turn.index, context.calls))]
        if gold_turn is system_turns[-1]:
            actions.append(AgentAction.end())
        return actions

    @staticmethod
    def _gold_text(dialogue: Dialogue, turn_index: int, calls: Sequence[tuple[int, ToolCall]]) -> str:
        result = replay(dialogue, _Playback([call for _, call in calls]))
        return dict(result.system_texts)[turn_index]
