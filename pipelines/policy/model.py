"""The embedded policy model: a small Qwen2-architecture causal LM, its training loop,
held-out loss and greedy generation, and its Hugging Face directory.

The model is built from scratch (:func:`build_model`) with the tokenizer's ids for eos
(``<|im_end|>``) and padding, and a generation config that, as in released chat
checkpoints, samples by default: ``transformers serve`` maps temperature 0 to greedy but
never switches sampling on by itself. Greedy decoding here passes ``do_sample=False``.

Training (:func:`train_causal_lm`) is a plain PyTorch loop, CPU-sized: AdamW, linear
warm-up then cosine decay, gradient clipping, fp32, no gradient checkpointing. Given the
same model initialisation, windows and config, it runs the same steps in the same order;
``max_seconds`` stops it early on a slow machine (reported, never silent).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.kernels import adamw_options
from pipelines.policy.pretrain_data import IGNORE_INDEX, Window, batch_stream, collate

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM


@dataclass(frozen=True)
class Architecture:
    """Qwen2 dimensions. Embeddings are tied to the output layer (the vocabulary is a
    large share of a model this small)."""

    hidden_size: int = 192
    num_hidden_layers: int = 4
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 576
    max_position_embeddings: int = 1024

    def __post_init__(self) -> None:
        for name in ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size", "max_position_embeddings"):
            positive_int(getattr(self, name), name)
        if self.hidden_size % self.num_attention_heads:
            raise ValueError("hidden_size must be divisible by num_attention_heads")
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be divisible by num_key_value_heads")


def build_model(architecture: Architecture, tokenizer: "PreTrainedTokenizerFast", *, seed: int) -> "Qwen2ForCausalLM":
    """A randomly initialised model for ``tokenizer``, the same for a seed (the caller's
    torch RNG is left as it was)."""
    import torch
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=architecture.hidden_size,
        num_hidden_layers=architecture.num_hidden_layers,
        num_attention_heads=architecture.num_attention_heads,
        num_key_value_heads=architecture.num_key_value_heads,
        intermediate_size=architecture.intermediate_size,
        max_position_embeddings=architecture.max_position_embeddings,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    generation = model.generation_config
    generation.eos_token_id = tokenizer.eos_token_id
    generation.pad_token_id = tokenizer.pad_token_id
    generation.bos_token_id = None
    generation.do_sample = True  # see the module docstring
    return model


def count_parameters(model: "torch.nn.Module") -> int:
    """Distinct parameters (tied embeddings counted once)."""
    return sum(p.numel() for p in model.parameters())


# --------------------------------------------------------------------------------------
# Training
# --------------------------------------------------------------------------------------


def target_losses(model: "Qwen2ForCausalLM", batch: Mapping[str, "torch.Tensor"]) -> "torch.Tensor":
    """Negative log-likelihood of every labelled token (1-D, in batch order): token j
    scored by the logits at position j-1.

    The same numbers as the model's own causal-LM loss (which averages them), but the
    output layer, about a third of a model this small's compute, runs only where there is
    a label: with the loss on assistant tokens, a fifth of a window. A training step is
    about 30% faster."""
    import torch

    hidden = model.model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).last_hidden_state
    labels = batch["labels"][:, 1:]
    scored = labels != IGNORE_INDEX
    logits = model.lm_head(hidden[:, :-1][scored])
    return torch.nn.functional.cross_entropy(logits.float(), labels[scored], reduction="none")


@dataclass(frozen=True)
class PretrainConfig:
    """``steps`` optimizer steps of ``batch_size`` windows. ``warmup_steps`` of linear
    warm-up, then cosine decay to ``min_lr_ratio`` of the peak. ``max_seconds``: stop
    early when training has taken that long (None: never)."""

    steps: int = 400
    batch_size: int = 4
    learning_rate: float = 3e-3
    min_lr_ratio: float = 0.1
    warmup_steps: int = 40
    weight_decay: float = 0.01
    max_grad_norm: float = 1.0
    seed: int = 0
    max_seconds: float | None = None

    def __post_init__(self) -> None:
        for name in ("steps", "batch_size"):
            positive_int(getattr(self, name), name)
        if not 0 <= self.warmup_steps <= self.steps:
            raise ValueError(f"warmup_steps must be in [0, steps], got {self.warmup_steps}")
        if self.learning_rate <= 0 or not 0 <= self.min_lr_ratio <= 1:
            raise ValueError("learning_rate must be > 0 and min_lr_ratio in [0, 1]")
        if self.max_seconds is not None and self.max_seconds <= 0:
            raise ValueError(f"max_seconds must be > 0 or None, got {self.max_seconds}")

    def lr_factor(self, step: int) -> float:
        """The learning rate of optimizer step ``step`` (0-based) over the peak."""
        if step < self.warmup_steps:
            return (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(1, self.steps - self.warmup_steps)
        return self.min_lr_ratio + (1 - self.min_lr_ratio) * 0.5 * (1 + math.cos(math.pi * progress))


@dataclass
class TrainResult:
    """Per-step losses (mean over the batch's target tokens), what was seen, and time."""

    losses: list[float] = field(default_factory=list)
    tokens: int = 0  # non-padding tokens seen
    target_tokens: int = 0  # tokens with a loss
    seconds: float = 0.0
    stopped_early: bool = False

    @property
    def steps(self) -> int:
        return len(self.losses)

    def final_loss(self, last: int = 10) -> float:
        """Mean loss of the last ``last`` steps (one step's loss is noisy)."""
        tail = self.losses[-last:]
        return sum(tail) / len(tail) if tail else math.nan


def train_causal_lm(
    model: "Qwen2ForCausalLM",
    windows: Sequence[Window],
    config: PretrainConfig,
    pad_id: int,
    *,
    log: Callable[[int, float], None] | None = None,
) -> TrainResult:
    """Train ``model`` in place on ``windows`` (see the module docstring); ``log(step,
    loss)`` is called after every step."""
    import torch

    decay = [p for n, p in model.named_parameters() if p.ndim >= 2 and "embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if p.ndim < 2 or "embed" in n]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": config.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=config.learning_rate,
        betas=(0.9, 0.95),
        **adamw_options(),  # fused under the portable pin: square roots without MKL
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, config.lr_factor)
    batches = batch_stream(windows, config.batch_size, config.seed)
    result = TrainResult()
    model.train()
    started = time.perf_counter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(config.seed)  # dropout, should the architecture have any
        for step in range(config.steps):
            batch = collate(next(batches), pad_id)
            losses = target_losses(model, batch)
            loss = losses.mean()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), config.max_grad_norm)
            optimizer.step()
            scheduler.step()
            optimizer.zero_grad(set_to_none=True)
            result.losses.append(loss.item())
            result.tokens += int(batch["attention_mask"].sum())
            result.target_tokens += losses.numel()
            if log is not None:
                log(step, result.losses[-1])
            result.seconds = time.perf_counter() - started
            if config.max_seconds is not None and result.seconds >= config.max_seconds and step + 1 < config.steps:
                result.stopped_early = True
                break
    model.eval()
    return result


# --------------------------------------------------------------------------------------
# Evaluation
# --------------------------------------------------------------------------------------


def mean_loss(model: "Qwen2ForCausalLM", windows: Sequence[Window], pad_id: int, *, batch_size: int = 8) -> float:
    """Mean negative log-likelihood per target token (nats) over all ``windows``."""
    import torch

    total, count = 0.0, 0
    model.eval()
    with torch.inference_mode():
        for begin in range(0, len(windows), batch_size):
            losses = target_losses(model, collate(windows[begin : begin + batch_size], pad_id))
            total += losses.sum().item()
            count += losses.numel()
    if not count:
        raise ValueError("no target tokens to evaluate")
    return total / count


@dataclass(frozen=True)
class Generation:
    """A decoded reply (special tokens skipped, as agents decode) and whether it ended
    with eos within the token budget."""

    text: str
    finished: bool
    n_tokens: int


def greedy_generate(
    model: "Qwen2ForCausalLM",
    tokenizer: "PreTrainedTokenizerFast",
    prompts: Sequence[Sequence[Mapping[str, Any]]],
    *,
    max_new_tokens: int,
    batch_size: int = 16,
) -> list[Generation]:
    """Greedy replies to chat ``prompts`` (rendered with the chat template and its
    generation prompt), left-padded in batches; one per prompt, in order."""
    import torch

    eos = tokenizer.eos_token_id
    outputs: list[Generation] = []
    model.eval()
    for begin in range(0, len(prompts), batch_size):
        texts = [
            tokenizer.apply_chat_template([dict(m) for m in p], tokenize=False, add_generation_prompt=True)
            for p in prompts[begin : begin + batch_size]
        ]
        encoded = tokenizer(texts, return_tensors="pt", padding=True, padding_side="left", add_special_tokens=False)
        with torch.inference_mode():
            generated = model.generate(
                **encoded,
                max_new_tokens=max_new_tokens,
                do_sample=False,
                eos_token_id=eos,
                pad_token_id=tokenizer.pad_token_id,
            )
        for ids in generated[:, encoded["input_ids"].shape[1] :].tolist():
            end = ids.index(eos) if eos in ids else None
            kept = ids if end is None else ids[:end]
            outputs.append(Generation(tokenizer.decode(kept, skip_special_tokens=True), end is not None, len(kept)))
    return outputs
