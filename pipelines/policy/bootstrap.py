"""Bootstrap the base policy: tokenizer, model, pretraining on gold seed chats, evaluation.

:func:`bootstrap_policy` takes the seed chats (:func:`~pipelines.policy.pretrain_data.seed_chat`)
of the train split and of a held-out split and returns the trained tokenizer and model
with their metrics:

* ``held_out_loss``: mean NLL per assistant token (nats) on windows of held-out chats,
  whatever loss the model was trained with;
* ``generation``: greedy replies to held-out prompts (a random assistant step of a held-out
  chat; the prompt is the compact system message with the longest history that leaves
  room for the reply), parsed with :class:`SpeakRLFormat`: the share that parses
  (``format_valid_share``), that ended with eos within the budget, that do the same kind
  of thing as the gold output (call a tool / respond), that call the gold tool (with the
  gold arguments), and how many clarify (a base model should not);
* ``opening``: the same for the first agent step of held-out chats, which must be chosen
  from the user's request alone (random steps often follow a tool result that names the
  domain already).
"""

from __future__ import annotations

import random
import time
from collections import Counter
from dataclasses import asdict, dataclass, field, replace
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.episodes.formats import CLARIFY, END, RESPOND, THINK, TOOL_CALL, AgentAction, Malformed, SpeakRLFormat
from pipelines.policy.model import (
    Architecture,
    Generation,
    PretrainConfig,
    TrainResult,
    build_model,
    count_parameters,
    greedy_generate,
    mean_loss,
    train_causal_lm,
)
from pipelines.policy.pretrain_data import chats_to_windows, without_loss_mask
from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT, compact_messages_within
from pipelines.policy.tokenizer import train_tokenizer, training_chat_template

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

Chat = Sequence[Mapping[str, Any]]


@dataclass(frozen=True)
class BootstrapEvalSpec:
    """``windows``: held-out windows for the loss (the first ones, in corpus order);
    ``prompts``: held-out prompts for greedy generation, ``max_new_tokens`` each."""

    windows: int = 128
    prompts: int = 50
    max_new_tokens: int = 96


@dataclass(frozen=True)
class BootstrapConfig:
    """params.yaml ``bootstrap``. The stage's: the seed dialogues (``source``, ``db_dir``;
    ``env_seed``: the tool environment's seed in the rendered chats), ``output`` (the model
    directory), ``metrics`` (JSON), ``threads`` (None: the top-level ``threads``).
    :func:`bootstrap_policy`'s: ``seed`` drives the model's initialisation, the data order and
    the choice of evaluation prompts; ``max_length``: tokens per training window; ``model``
    (the architecture), ``train`` (its ``seed`` is this one) and ``eval``."""

    source: str
    output: str
    metrics: str
    db_dir: str | None = None
    env_seed: int = 0
    seed: int = 0
    threads: int | None = None
    vocab_size: int = 4096
    max_length: int = 512
    assistant_only_loss: bool = True
    model: Architecture = field(default_factory=Architecture)
    train: PretrainConfig = field(default_factory=PretrainConfig)
    eval: BootstrapEvalSpec = field(default_factory=BootstrapEvalSpec)

    def __post_init__(self) -> None:
        for name in ("vocab_size", "max_length"):
            positive_int(getattr(self, name), name)
        for name in ("windows", "prompts", "max_new_tokens"):
            positive_int(getattr(self.eval, name), f"eval.{name}")
        positive_int(self.threads, "threads", optional=True)
        positive_int(self.env_seed, "env_seed", minimum=0)
        if self.eval.max_new_tokens >= self.max_length:
            raise ValueError("eval.max_new_tokens must be smaller than max_length")
        if self.max_length > self.model.max_position_embeddings:
            raise ValueError("max_length must not exceed model.max_position_embeddings")


@dataclass
class BootstrapResult:
    tokenizer: "PreTrainedTokenizerFast"
    model: "Qwen2ForCausalLM"
    training: TrainResult
    metrics: dict[str, Any]  # a function of the inputs: no clock readings
    samples: list[dict[str, Any]]  # a few evaluation prompts' last message, gold and reply
    timings: dict[str, float] = field(default_factory=dict)  # seconds per phase (machine-dependent)


def tokenizer_texts(chats: Sequence[Chat], system_prompt: str = COMPACT_SYSTEM_PROMPT) -> list[str]:
    """What the tokenizer is trained on: every message of every chat, each chat preceded by
    the system prompt (as in every training window, so that it tokenizes compactly)."""
    return [text for chat in chats for text in (system_prompt, *(m["content"] for m in chat))]


def bootstrap_policy(
    train_chats: Sequence[Chat],
    held_out_chats: Sequence[Chat],
    config: BootstrapConfig,
    *,
    log: Callable[[str], None] = lambda message: None,
) -> BootstrapResult:
    """Train the tokenizer and the model, then evaluate (module docstring)."""
    if not train_chats or not held_out_chats:
        raise ValueError("bootstrap needs train and held-out chats")
    timings: dict[str, float] = {}
    clock = time.perf_counter()

    def lap(name: str) -> None:
        nonlocal clock
        now = time.perf_counter()
        timings[name] = round(now - clock, 2)
        clock = now

    tokenizer = train_tokenizer(tokenizer_texts(train_chats), config.vocab_size)
    template = training_chat_template(tokenizer)
    lap("tokenizer_s")

    windows = chats_to_windows(tokenizer, train_chats, config.max_length, chat_template=template)
    if not config.assistant_only_loss:
        windows = [without_loss_mask(w) for w in windows]
    held_out = chats_to_windows(tokenizer, held_out_chats, config.max_length, chat_template=template)[: config.eval.windows]
    if not windows or not held_out:
        raise ValueError(f"no training or held-out windows fit in max_length={config.max_length} tokens")
    lap("windows_s")
    log(f"bootstrap: {len(windows)} training windows, vocabulary {len(tokenizer)}")

    model = build_model(config.model, tokenizer, seed=config.seed)
    train = replace(config.train, seed=config.seed)

    def log_step(step: int, loss: float) -> None:
        if step == 0 or (step + 1) % 10 == 0:
            log(f"bootstrap: step {step + 1}/{train.steps} loss {loss:.4f}")

    training = train_causal_lm(model, windows, train, tokenizer.pad_token_id, log=log_step)
    lap("train_s")

    held_out_loss = mean_loss(model, held_out, tokenizer.pad_token_id)
    lap("held_out_loss_s")

    budget = config.max_length - config.eval.max_new_tokens
    prompts = evaluation_prompts(held_out_chats, tokenizer, config.eval.prompts, budget, seed=config.seed)
    openings = opening_prompts(held_out_chats, tokenizer, config.eval.prompts, budget)
    generations = greedy_generate(model, tokenizer, [p for p, _ in prompts + openings], max_new_tokens=config.eval.max_new_tokens)
    generation_metrics = {
        **score_generations(generations[: len(prompts)], [gold for _, gold in prompts]),
        "max_new_tokens": config.eval.max_new_tokens,
    }
    opening_metrics = score_generations(generations[len(prompts) :], [gold for _, gold in openings])
    lap("generation_s")

    n_tokens = sum(len(w.input_ids) for w in windows)
    metrics = {
        "parameters": count_parameters(model),
        "vocab_size": len(tokenizer),
        "architecture": asdict(config.model),
        "data": {
            "train_chats": len(train_chats),
            "train_windows": len(windows),
            "train_tokens": n_tokens,
            "train_target_tokens": sum(w.n_targets for w in windows),
            "held_out_chats": len(held_out_chats),
            "held_out_windows": len(held_out),
            "max_length": config.max_length,
            "assistant_only_loss": config.assistant_only_loss,
        },
        "training": {
            "steps": training.steps,
            "batch_size": train.batch_size,
            "tokens_seen": training.tokens,
            "epochs": round(training.tokens / n_tokens, 4),
            "stopped_early": training.stopped_early,
            "complete": not training.stopped_early,  # a user-set max_seconds ended it before `steps`
            "final_train_loss": round(training.final_loss(), 4),
            "first_train_loss": round(training.losses[0], 4),
        },
        "held_out_loss": round(held_out_loss, 4),
        "generation": generation_metrics,
        "opening": opening_metrics,
    }
    tokenizer.model_max_length = config.model.max_position_embeddings  # saved with it
    samples = [
        {"last_message": prompt[-1]["content"][:300], "gold": gold, "reply": g.text, "finished": g.finished}
        for (prompt, gold), g in list(zip(prompts, generations))[:5]
    ]
    return BootstrapResult(tokenizer, model, training, metrics, samples, timings)


def evaluation_prompts(
    chats: Sequence[Chat], tokenizer: Any, n: int, max_prompt_tokens: int, *, seed: int
) -> list[tuple[list[dict[str, Any]], str]]:
    """``n`` (prompt, gold output) pairs: a random assistant step of each of ``n`` random
    chats (all chats, when there are fewer), its history cut to fit ``max_prompt_tokens``."""
    rng = random.Random(f"bootstrap-eval:{seed}")
    chosen = rng.sample(range(len(chats)), min(n, len(chats)))
    prompts = []
    for index in chosen:
        chat = chats[index]
        steps = [i for i, m in enumerate(chat) if m["role"] == "assistant" and i > 0]
        step = rng.choice(steps)
        prompts.append((compact_messages_within(chat[:step], tokenizer, max_prompt_tokens), chat[step]["content"]))
    return prompts


def opening_prompts(chats: Sequence[Chat], tokenizer: Any, n: int, max_prompt_tokens: int) -> list[tuple[list[dict[str, Any]], str]]:
    """(prompt, gold output) of the first agent step of the first ``n`` chats: the user's
    opening request, where the agent must pick its first action from the request alone."""
    return [
        (compact_messages_within(chat[:1], tokenizer, max_prompt_tokens), chat[1]["content"])
        for chat in chats[:n]
        if len(chat) > 1 and chat[0]["role"] == "user" and chat[1]["role"] == "assistant"
    ]


def _kind(parsed: tuple[AgentAction, ...]) -> str:
    """What an output does: ``tool_call``, ``clarify`` or ``respond`` (a response, ending or not)."""
    body = [a.kind for a in parsed if a.kind != THINK]
    if TOOL_CALL in body:
        return TOOL_CALL
    if CLARIFY in body:
        return CLARIFY
    return RESPOND if body and set(body) <= {RESPOND, END} else "other"


def score_generations(generations: Sequence[Generation], gold: Sequence[str]) -> dict[str, Any]:
    """The generation metrics of the module docstring."""
    fmt = SpeakRLFormat()
    kinds: Counter[str] = Counter()
    same_kind = finished = 0
    gold_calls = same_tool = same_call = 0
    for generation, expected in zip(generations, gold, strict=True):
        finished += generation.finished
        parsed, reference = fmt.parse(generation.text), fmt.parse(expected)
        if isinstance(reference, Malformed):
            raise ValueError(f"a gold output does not parse: {reference.reason}")
        if isinstance(parsed, Malformed):
            kinds["malformed"] += 1
            kind = "malformed"
        else:
            kind = _kind(parsed)
            kinds[kind] += 1
        same_kind += kind == _kind(reference)
        if _kind(reference) == TOOL_CALL:
            gold_calls += 1
            expected_call = next(a for a in reference if a.kind == TOOL_CALL)
            call = None if kind != TOOL_CALL else next(a for a in parsed if a.kind == TOOL_CALL)
            same_tool += call is not None and call.tool_name == expected_call.tool_name
            same_call += call is not None and (call.tool_name, dict(call.arguments)) == (expected_call.tool_name, dict(expected_call.arguments))
    n = len(generations)
    share = lambda count, total: round(count / total, 4) if total else None  # noqa: E731
    return {
        "prompts": n,
        "format_valid_share": share(n - kinds["malformed"], n),
        "finished_share": share(finished, n),
        "same_kind_share": share(same_kind, n),
        "gold_tool_calls": gold_calls,
        "same_tool_share": share(same_tool, gold_calls),
        "same_call_share": share(same_call, gold_calls),
        "clarify_share": share(kinds[CLARIFY], n),
        "kinds": dict(sorted(kinds.items())),
    }
