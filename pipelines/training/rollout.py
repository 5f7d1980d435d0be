"""Whole conversations as GRPO rollouts: a policy plays an episode against the user simulator,
token by token, and the episode comes back as one sequence with a mask of who wrote what.

The episode runner (:class:`~pipelines.episodes.runner.EpisodeState`) keeps the rules: the
policy's output is parsed by the agent format, tool calls run in the episode's environment,
the simulator answers visible replies, the world grades the finished episode (MultiWOZ: the
goal checker). This module drives it with a causal LM and keeps the tokens:

* ``prompt_ids``: the chat-templated system prompt and the user's opening turn;
* ``completion_ids``: everything after it, in the order the model saw it: its own turns
  (``env_mask`` 1) and what was injected between them (``env_mask`` 0): tool results,
  the simulator's replies, the chat template's turn markers, the runner's feedback;
* ``logprobs``: the sampling log-probability of each policy token (0.0 for injected ones).

The sequence only grows: each policy turn is generated from exactly the tokens that will be
trained on, so nothing is re-tokenized between sampling and the loss.

**Asking inside reasoning** (PIR, section 3.2.1, eq. 4): with ``ask_inside_reasoning``, when
the policy closes an ``<asking>…</asking>`` block inside its turn, generation pauses, the
question goes to the user simulator, and its answer is injected as
``<response>…</response>`` (masked): the policy then reasons on. These interactions count
toward :attr:`Rollout.asks` and TTR; the user never sees the rest of the reasoning.

TRL's ``rollout_func`` (:func:`trl_rollout_func`) wraps :meth:`ConversationRollout.play` for
``GRPOTrainer(rollout_func=...)``: TRL hands it each dataset prompt repeated
``num_generations`` times and trains on ``completion_ids`` where ``env_mask`` is 1.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.env.world import World
from pipelines.episodes.agents import AgentOutput
from pipelines.episodes.formats import ASK_CLOSE, ASK_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN, AgentFormat, SpeakRLFormat
from pipelines.episodes.records import Episode
from pipelines.episodes.runner import WAITS_FOR_AGENT, WAITS_FOR_USER, EpisodeSpec, EpisodeState, RunnerConfig
from pipelines.simulators.agenda import SimulatorSpec
from pipelines.simulators.base import UserSimulator
from pipelines.training.config import DISTINGUISHING_FIELDS



@dataclass(frozen=True)
class RolloutConfig:
    """``max_exchanges``: agent turns per conversation; ``max_turn_tokens``: tokens the policy
    may write per turn (its in-reasoning asks included); ``max_total_tokens``: the whole
    sequence, prompt included, past which the conversation stops (a turn limit);
    ``max_asks``: in-reasoning questions per conversation (PIR's N_max; more are not
    answered); sampling at ``temperature`` (0: greedy) and ``top_p``; tool results keep at
    most ``max_tool_results`` search results, the second and later reduced to
    ``tool_result_fields`` (None: whole; as the compact evaluation prompts do).
    ``batch_size``: conversations played together, their turns decoded as one batch
    (:meth:`ConversationRollout.play`); 1 plays them one by one, each sampled from its own
    seed. Left out of reports at its default. ``cuda_graphs``: a batch's decode steps
    replayed as CUDA graphs on a GPU (:mod:`pipelines.episodes.decoding`; left out of
    reports when off)."""

    max_exchanges: int = 3
    max_steps: int = 3
    malformed_retries: int = 1
    max_turn_tokens: int = 96
    max_total_tokens: int = 1024
    ask_inside_reasoning: bool = True
    max_asks: int = 5
    temperature: float = 1.0
    top_p: float | None = None
    max_tool_results: int | None = 2
    seed: int = 0
    batch_size: int = field(default=1, metadata={"omit_if_default": True})
    cuda_graphs: bool = field(default=False, metadata={"omit_if_default": True})
    tool_result_fields: tuple[str, ...] | None = field(default=DISTINGUISHING_FIELDS, metadata={"omit_if_default": True})

    def __post_init__(self) -> None:
        for name in ("max_exchanges", "max_steps", "max_turn_tokens", "max_total_tokens", "max_asks", "batch_size"):
            positive_int(getattr(self, name), name)
        if isinstance(self.temperature, bool) or not isinstance(self.temperature, (int, float)) or self.temperature < 0:
            raise ConfigError(f"temperature must be a number >= 0, got {self.temperature!r}")

    @property
    def runner(self) -> RunnerConfig:
        return RunnerConfig(max_exchanges=self.max_exchanges, max_steps=self.max_steps, malformed_retries=self.malformed_retries)


@dataclass
class Rollout:
    """One played conversation: the graded episode and its tokens (module docstring)."""

    episode: Episode
    prompt_ids: list[int]
    completion_ids: list[int]
    env_mask: list[int]
    logprobs: list[float]
    asks: list[tuple[str, str]] = field(default_factory=list)  # in-reasoning (question, answer)
    policy_text: str = ""  # every token the policy wrote, decoded
    truncated: bool = False  # stopped by max_total_tokens

    @property
    def policy_tokens(self) -> int:
        return sum(self.env_mask)

    @property
    def questions(self) -> list[str]:
        """Every question the policy asked: in its reasoning, then its visible clarifications."""
        return [q for q, _ in self.asks] + [e.text or "" for e in self.episode.events if e.kind == "clarify"]

    @property
    def ttr(self) -> int:
        """Turns to resolution: the simulator's replies after its opening turn (answers to
        in-reasoning questions and replies to the agent's visible turns)."""
        return len(self.asks) + sum(1 for e in self.episode.events if e.actor == "user" and e.turn > 0)


class _PolicyName:
    """What :meth:`EpisodeState.start` reads of an agent: its name and format."""

    def __init__(self, name: str, fmt: AgentFormat):
        self.name, self.format = name, fmt


def _asked(tokenizer: Any, new: Sequence[int]) -> bool:
    """Whether a turn's new tokens close an in-reasoning question (their last 12 tokens read)."""
    return tokenizer.decode(list(new[-12:])).rstrip().endswith(ASK_CLOSE)


class _AskStop:
    """A ``StoppingCriteria`` of one row: stop once the tokens after ``start`` close an
    in-reasoning question (:func:`_asked`)."""

    def __init__(self, tokenizer: Any, start: int):
        self.tokenizer, self.start = tokenizer, start

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        # Only the tail _asked reads is copied to the host, once per decoding step.
        tail = input_ids[0, max(self.start, input_ids.shape[1] - 12):].tolist()
        return torch.tensor([_asked(self.tokenizer, tail)], device=input_ids.device)


class ConversationRollout:
    """Plays episodes of ``world`` against ``simulator`` with a causal LM (module docstring).

    ``system_prompt``: the policy's system message (the compact prompt it was trained with);
    ``fmt``: the agent format its turns are parsed with."""

    def __init__(self, world: World | Database, simulator: UserSimulator, tokenizer: Any, config: RolloutConfig = RolloutConfig(),
                 *, system_prompt: str | None = None, fmt: AgentFormat | None = None, name: str = "policy"):
        from pipelines.env.world import as_world
        from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT

        self.world = as_world(world)
        self.simulator = simulator
        self.tokenizer = tokenizer
        self.config = config
        self.system_prompt = system_prompt if system_prompt is not None else COMPACT_SYSTEM_PROMPT
        self.format = fmt or SpeakRLFormat()
        self.name = name
        self.eos_id = tokenizer.eos_token_id
        self._system_text = tokenizer.apply_chat_template([self._system()], tokenize=False)
        self.stats: Counter = Counter()

    def _system(self) -> dict[str, str]:
        return {"role": "system", "content": self.system_prompt}

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def _blocks(self, messages: Sequence[Mapping[str, Any]]) -> str:
        """The chat-template text of ``messages`` after the system message, ending with the
        start of the assistant's reply (the template renders each message as its own block)."""
        full = self.tokenizer.apply_chat_template([self._system(), *[self._shorten(m) for m in messages]], tokenize=False,
                                                  add_generation_prompt=True)
        if not full.startswith(self._system_text):
            raise ValueError("the chat template does not render the system message as a prefix of the conversation")
        return full[len(self._system_text):]

    def _shorten(self, message: Mapping[str, Any]) -> dict[str, Any]:
        if self.config.max_tool_results is None or message.get("role") != "user":
            return {"role": message["role"], "content": message["content"]}
        from pipelines.training.config import ToolResultsSpec
        from pipelines.training.data import shorten_tool_response

        return {"role": "user", "content": shorten_tool_response(str(message["content"]), ToolResultsSpec(self.config.max_tool_results, self.config.tool_result_fields))}

    # -- prompts ------------------------------------------------------------------------

    def start(self, spec: EpisodeSpec) -> EpisodeState:
        """The episode of ``spec``, its opening user turn heard."""
        state = EpisodeState.start(spec, _PolicyName(self.name, self.format), self.simulator, self.world, self.config.runner)
        asyncio.run(state.hear_user())
        return state

    def prompt(self, spec: EpisodeSpec) -> list[dict[str, str]]:
        """The conversation's start as chat messages: the system prompt and the opening turn."""
        state = self.start(spec)
        return [self._system(), {"role": "user", "content": str(state.messages[-1]["content"])}]

    # -- playing ------------------------------------------------------------------------

    def play(self, model: Any, specs: Sequence[EpisodeSpec], seeds: Sequence[int] | None = None) -> list[Rollout]:
        """One rollout per spec; ``seeds`` (one per spec) seed the policy's sampling. With
        ``config.batch_size`` above 1, that many conversations play together and their turns
        are decoded as one left-padded batch (:class:`_LockStep`), seeded by the batch's first
        seed: a conversation's sample then depends on its batch, not on its seed alone."""
        seeds = list(seeds) if seeds is not None else [self.config.seed] * len(specs)
        was_training = getattr(model, "training", False)
        model.eval()
        try:
            size = self.config.batch_size
            if size == 1:
                return [asyncio.run(self._play_one(model, spec, seed)) for spec, seed in zip(specs, seeds)]
            played: list[Rollout] = []
            for first in range(0, len(specs), size):
                played += asyncio.run(self._play_together(model, specs[first:first + size], seeds[first:first + size]))
            return played
        finally:
            if was_training:
                model.train()

    async def _play_together(self, model: Any, specs: Sequence[EpisodeSpec], seeds: Sequence[int]) -> list[Rollout]:
        lockstep = _LockStep(self, model, len(specs))

        async def one(spec: EpisodeSpec, seed: int) -> Rollout:
            try:
                return await self._play_one(model, spec, seed, lockstep)
            finally:
                lockstep.finished()

        return list(await asyncio.gather(*(one(spec, seed) for spec, seed in zip(specs, seeds))))

    async def _play_one(self, model: Any, spec: EpisodeSpec, seed: int, lockstep: "_LockStep | None" = None) -> Rollout:
        state = EpisodeState.start(spec, _PolicyName(self.name, self.format), self.simulator, self.world, self.config.runner)
        await state.hear_user()
        prompt_ids = self._ids(self._system_text + self._blocks(state.messages[1:]))
        rollout = Rollout(episode=None, prompt_ids=prompt_ids, completion_ids=[], env_mask=[], logprobs=[])  # type: ignore[arg-type]
        seen = len(state.messages)
        turn = 0
        while state.phase == WAITS_FOR_AGENT:
            text = await self._policy_turn(model, state, rollout, seed, turn, lockstep)
            turn += 1
            state.take(AgentOutput(text=text, completion_tokens=None))
            # The runner's messages after the policy's own: tool results, feedback, an apology.
            if state.phase == WAITS_FOR_USER:
                await state.hear_user()
            new = state.messages[seen + 1:]
            seen = len(state.messages)
            if state.phase != WAITS_FOR_AGENT:  # after the end, nothing more is read
                break
            injected = self._ids("\n" + self._blocks(new))
            if len(prompt_ids) + len(rollout.completion_ids) + len(injected) + 8 > self.config.max_total_tokens:
                rollout.truncated = True  # no room for the next turn: a limit, as max_exchanges is
                state.stop()
                break
            self._inject_ids(rollout, injected)
        rollout.episode = state.finish()
        rollout.policy_text = self.tokenizer.decode([t for t, m in zip(rollout.completion_ids, rollout.env_mask) if m],
                                                    skip_special_tokens=True)
        self.stats["episodes"] += 1
        self.stats["truncated"] += rollout.truncated
        return rollout

    def _inject(self, rollout: Rollout, text: str) -> None:
        self._inject_ids(rollout, self._ids(text))

    def _inject_ids(self, rollout: Rollout, ids: list[int]) -> None:
        rollout.completion_ids.extend(ids)
        rollout.env_mask.extend([0] * len(ids))
        rollout.logprobs.extend([0.0] * len(ids))

    async def _policy_turn(self, model: Any, state: EpisodeState, rollout: Rollout, seed: int, turn: int,
                           lockstep: "_LockStep | None" = None) -> str:
        """Generate one policy turn into ``rollout``; with in-reasoning asks, answered by the
        simulator between segments. The turn's text (answers included) is returned."""
        budget = self.config.max_turn_tokens
        start = len(rollout.completion_ids)
        segment = 0
        while True:
            # Never past max_total_tokens (the model's positions): one token is kept for the turn's end.
            room = min(budget, self.config.max_total_tokens - len(rollout.prompt_ids) - len(rollout.completion_ids) - 1)
            if room <= 0:
                break
            asks_left = self.config.ask_inside_reasoning and len(rollout.asks) < self.config.max_asks
            context, step_seed = rollout.prompt_ids + rollout.completion_ids, _seed(seed, state.spec.episode_id, turn, segment)
            if lockstep is None:
                ids, logprobs = self._generate(model, context, room, step_seed, stop_at_ask=asks_left)
            else:
                ids, logprobs = await lockstep.generate(context, room, step_seed, asks_left)
            segment += 1
            budget -= len(ids)
            rollout.completion_ids.extend(ids)
            rollout.env_mask.extend([1] * len(ids))
            rollout.logprobs.extend(logprobs)
            written = self.tokenizer.decode(rollout.completion_ids[start:], skip_special_tokens=True)
            if not (asks_left and ids and ids[-1] != self.eos_id and written.rstrip().endswith(ASK_CLOSE)):
                break
            question = written.rstrip()[: -len(ASK_CLOSE)].rsplit(ASK_OPEN, 1)[-1].strip()
            reply = await state.session.respond(question)
            rollout.asks.append((question, reply.text))
            # As the SFT traces have it (pipelines.pir.insertion.render_pair): the next step follows a blank line.
            self._inject(rollout, f"\n{RESPONSE_OPEN}{reply.text.strip()}{RESPONSE_CLOSE}\n\n")
        if not rollout.completion_ids[start:] or rollout.completion_ids[-1] != self.eos_id:
            self._inject(rollout, self.tokenizer.eos_token)  # cut at the budget: the template closes the turn
        return self.tokenizer.decode(rollout.completion_ids[start:], skip_special_tokens=True)

    def _sampling(self) -> dict[str, Any]:
        """``generate``'s decoding options: greedy at temperature 0, else plain sampling."""
        if self.config.temperature <= 0:
            return {"do_sample": False}
        return {"do_sample": True, "temperature": self.config.temperature, "top_p": self.config.top_p or 1.0, "top_k": 0}

    def _generate(self, model: Any, ids: list[int], max_new: int, seed: int, *, stop_at_ask: bool) -> tuple[list[int], list[float]]:
        import torch
        from transformers import StoppingCriteriaList

        input_ids = torch.tensor([ids], device=model.device)
        options = self._sampling()
        stops = StoppingCriteriaList([_AskStop(self.tokenizer, len(ids))]) if stop_at_ask else None
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=torch.ones_like(input_ids), max_new_tokens=max_new,
                eos_token_id=self.eos_id, pad_token_id=self.tokenizer.pad_token_id, stopping_criteria=stops,
                output_scores=True, return_dict_in_generate=True, **options,
            )
        new = out.sequences[0, len(ids):].tolist()
        logprobs = [float(torch.log_softmax(score[0].float(), -1)[token]) for score, token in zip(out.scores, new)]
        if self.eos_id in new:  # nothing after the end of the turn
            end = new.index(self.eos_id) + 1
            new, logprobs = new[:end], logprobs[:end]
        return new, logprobs

    def generate_batch(self, model: Any, requests: Sequence[tuple[list[int], int, bool]], seed: int) -> list[tuple[list[int], list[float]]]:
        """:meth:`_generate` for several contexts at once, ``requests`` of ``(ids, max_new,
        stop_at_ask)``: left-padded, one sampling seed; each row is cut where the one-by-one
        path would stop it (its end token, its own limit, a closed in-reasoning question).
        A model the batched decoding loop runs (:func:`~pipelines.episodes.decoding.decode`:
        a preallocated cache, finished rows leaving the batch, CUDA graphs with
        ``config.cuda_graphs``) decodes with it; any other with ``generate``."""
        from pipelines.episodes.decoding import supports_decoding

        if supports_decoding(model):
            return self._decode_batch(model, requests, seed)
        return self._generate_batch(model, requests, seed)

    def _decode_batch(self, model: Any, requests: Sequence[tuple[list[int], int, bool]], seed: int) -> list[tuple[list[int], list[float]]]:
        from pipelines.episodes.decoding import DecodeSpec, decode

        def stop(limit: int, ask: bool) -> Callable[[list[int]], bool]:
            return lambda new: len(new) >= limit or (ask and _asked(self.tokenizer, new))

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        spec = DecodeSpec(max(m for _, m, _ in requests), frozenset({self.eos_id}), temperature=self.config.temperature,
                          top_p=self.config.top_p, seed=seed, cuda_graphs=self.config.cuda_graphs)
        logprobs: list[list[float]] = []
        new = decode(model, [list(ids) for ids, _, _ in requests], spec, pad_id=pad,
                     stop_text=[stop(m, ask) for _, m, ask in requests], logprobs_out=logprobs)
        return list(zip(new, logprobs))

    def _generate_batch(self, model: Any, requests: Sequence[tuple[list[int], int, bool]], seed: int) -> list[tuple[list[int], list[float]]]:
        import torch
        from transformers import StoppingCriteriaList

        pad = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else self.eos_id
        width = max(len(ids) for ids, _, _ in requests)
        input_ids = torch.tensor([[pad] * (width - len(ids)) + ids for ids, _, _ in requests], device=model.device)
        attention = torch.tensor([[0] * (width - len(ids)) + [1] * len(ids) for ids, _, _ in requests], device=model.device)
        options = self._sampling()
        rows = _RowStops(self, width, requests)
        torch.manual_seed(seed)
        with torch.no_grad():
            out = model.generate(
                input_ids=input_ids, attention_mask=attention, max_new_tokens=max(m for _, m, _ in requests),
                eos_token_id=self.eos_id, pad_token_id=pad, stopping_criteria=StoppingCriteriaList([rows]),
                output_scores=True, return_dict_in_generate=True, **options,
            )
        results = []
        generated = out.sequences[:, width:].tolist()  # one copy to the host, not one per row
        for row, (_, max_new, stop_at_ask) in enumerate(requests):
            new = generated[row][:rows.cut(generated[row], max_new, stop_at_ask)]
            if not new:
                results.append(([], []))
                continue
            scores = torch.log_softmax(torch.stack([score[row] for score in out.scores[:len(new)]]).float(), -1)
            picked = scores.gather(1, torch.tensor(new, device=scores.device)[:, None])[:, 0]
            results.append((new, picked.tolist()))
        return results


class _RowStops:
    """A ``StoppingCriteria`` of a left-padded batch: each row stops at its end token, at its
    own token limit, or (``stop_at_ask``) once its text closes an in-reasoning question."""

    def __init__(self, rollout: ConversationRollout, start: int, requests: Sequence[tuple[list[int], int, bool]]):
        self.tokenizer, self.eos_id, self.start = rollout.tokenizer, rollout.eos_id, start
        self.limits = [max_new for _, max_new, _ in requests]
        self.asks = [stop for _, _, stop in requests]

    def __call__(self, input_ids: Any, scores: Any, **kwargs: Any) -> Any:
        import torch

        rows = input_ids[:, self.start:].tolist()  # one copy to the host per decoding step
        done = [len(new) >= limit or self.eos_id in new or (ask and _asked(self.tokenizer, new))
                for new, limit, ask in zip(rows, self.limits, self.asks)]
        return torch.tensor(done, device=input_ids.device)

    def cut(self, new: Sequence[int], max_new: int, stop_at_ask: bool) -> int:
        """How many of a row's generated tokens are its own: up to and including the first
        stop, padding after it dropped."""
        for i, token in enumerate(new):
            if token == self.eos_id or i + 1 >= max_new or (stop_at_ask and _asked(self.tokenizer, new[:i + 1])):
                return i + 1
        return len(new)


class _LockStep:
    """Conversations played together: each asks for its next tokens and waits; once every
    conversation still playing waits, the requests are decoded as one batch
    (:meth:`ConversationRollout.generate_batch`). Simulator replies and tool calls run between
    batches, conversation by conversation."""

    def __init__(self, rollout: ConversationRollout, model: Any, playing: int):
        self.rollout, self.model, self.playing = rollout, model, playing
        self.pending: list[tuple[list[int], int, int, bool, asyncio.Future]] = []

    async def generate(self, ids: list[int], max_new: int, seed: int, stop_at_ask: bool) -> tuple[list[int], list[float]]:
        future = asyncio.get_running_loop().create_future()
        self.pending.append((ids, max_new, seed, stop_at_ask, future))
        self._decode_when_all_wait()
        return await future

    def finished(self) -> None:
        self.playing -= 1
        self._decode_when_all_wait()

    def _decode_when_all_wait(self) -> None:
        if not self.pending or len(self.pending) < self.playing:
            return
        batch, self.pending = self.pending, []
        try:
            results = self.rollout.generate_batch(self.model, [(ids, m, ask) for ids, m, _, ask, _ in batch], batch[0][2])
        except BaseException as exc:  # every waiting conversation hears of it
            for *_, future in batch:
                future.set_exception(exc)
            return
        self.rollout.stats["batches"] += 1
        for (*_, future), result in zip(batch, results):
            future.set_result(result)


def _seed(seed: int, *parts: Any) -> int:
    digest = hashlib.sha256(json.dumps([seed, *parts], default=str).encode()).digest()
    return int.from_bytes(digest[:4], "big")


def trl_rollout_func(rollout: ConversationRollout, specs_by_prompt: Mapping[str, EpisodeSpec],
                     extra: Callable[[Rollout], Mapping[str, Any]] | None = None) -> Callable[[list, Any], dict[str, list]]:
    """TRL's ``rollout_func(prompts, trainer)`` over ``rollout``: each prompt (the chat
    messages of :meth:`ConversationRollout.prompt`, keyed by :func:`prompt_key`) names its
    episode; TRL passes each one ``num_generations`` times and each copy is played with its
    own sampling seed (the trainer's step and the copy's rank). Returns ``prompt_ids``,
    ``completion_ids``, ``logprobs``, ``env_mask`` and, for the rewards, ``correct`` (the
    world's grade of the finished conversation) plus ``extra(rollout)``'s columns."""

    def rollout_func(prompts: list, trainer: Any) -> dict[str, list]:
        model = trainer.accelerator.unwrap_model(trainer.model) if hasattr(trainer, "accelerator") else trainer.model
        step = getattr(getattr(trainer, "state", None), "global_step", 0)
        specs, seeds, copies = [], [], Counter()
        for prompt in prompts:
            key = prompt_key(prompt)
            if key not in specs_by_prompt:
                raise KeyError(f"rollout_func: a prompt that names no episode: {key[:200]}")
            specs.append(specs_by_prompt[key])
            seeds.append(_seed(rollout.config.seed, step, key, copies[key]))
            copies[key] += 1
        played = rollout.play(model, specs, seeds)
        out: dict[str, list] = {"prompt_ids": [], "completion_ids": [], "logprobs": [], "env_mask": [], "correct": []}
        for r in played:
            out["prompt_ids"].append(r.prompt_ids)
            out["completion_ids"].append(r.completion_ids)
            out["logprobs"].append(r.logprobs)
            out["env_mask"].append(r.env_mask)
            out["correct"].append(r.episode.success)
            for name, value in (extra(r) if extra else {}).items():
                out.setdefault(name, []).append(value)
        return out

    return rollout_func


@dataclass(frozen=True)
class ConversationEnv:
    """Where a multi-turn GRPO run's conversations come from (PIR's US-GRPO, SpeakRL's on the
    GPU): the MultiWOZ directory ``source`` (``db_dir``: its database elsewhere),
    ``max_goals`` goals of the ``split`` to train on (the first by dialogue id that need the
    tools), ``eval_goals`` of ``eval_split`` played greedily before and after training (by
    US-GRPO's flow; the GPU job's ``evaluate`` stages play the test goals instead), the agenda
    simulator's settings, the rollout's limits and sampling."""

    source: str
    db_dir: str | None = None
    split: str = "train"
    max_goals: int = 8
    eval_split: str = "val"
    eval_goals: int = 8
    seed: int = 0
    simulator: SimulatorSpec = SimulatorSpec()
    rollout: RolloutConfig = RolloutConfig()

    def __post_init__(self) -> None:
        if self.simulator.kind != "agenda":  # the rollouts call the agenda user in-process
            raise ConfigError(f"simulator.kind: multi-turn GRPO rolls out with the agenda user simulator, got {self.simulator.kind!r}")


def conversation_rows(rollout: ConversationRollout, dialogues: Sequence[Any], seed: int) -> tuple[list[dict[str, Any]], dict[str, EpisodeSpec], int]:
    """GRPO rows (``prompt``: the conversation start; ``dialogue_id``), the episode each
    prompt names, and how many goals were left out because their start repeats another's."""
    rows, specs, repeated = [], {}, 0
    for dialogue in dialogues:
        spec = EpisodeSpec(f"{dialogue.dialogue_id}#{seed}", dialogue.goal, seed)
        prompt = rollout.prompt(spec)
        key = prompt_key(prompt)
        if key in specs:
            repeated += 1
            continue
        specs[key] = spec
        rows.append({"prompt": prompt, "dialogue_id": dialogue.dialogue_id})
    return rows, specs, repeated


def prompt_key(prompt: Any) -> str:
    """A prompt (chat messages or text) as a lookup key."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps([[m["role"], m["content"]] for m in prompt], ensure_ascii=False)


__all__ = ["ConversationEnv", "ConversationRollout", "Rollout", "RolloutConfig", "conversation_rows", "prompt_key", "trl_rollout_func"]
