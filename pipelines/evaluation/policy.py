"""Load a trained policy (a local Hugging Face directory, a LoRA adapter directory, or a
hub id) as a batched agent with the prompts it was trained on."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import ConfigError
from pipelines.evaluation.agent import PolicyPromptAgent, PromptSpec


@dataclass(frozen=True)
class PolicySpec:
    """One model to evaluate. ``path`` (a local directory, possibly a LoRA adapter saved
    by a training flow) or ``hub_id`` (with ``revision``); ``prompt``: how its prompts are
    built (the compact prompt of the embedded policy by default)."""

    name: str
    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    prompt: PromptSpec = field(default_factory=PromptSpec)

    def __post_init__(self) -> None:
        if (self.path is None) == (self.hub_id is None):
            raise ConfigError(f"model {self.name!r}: give exactly one of path and hub_id")

    @property
    def name_or_path(self) -> str:
        return self.path if self.path is not None else str(self.hub_id)


@dataclass(frozen=True)
class ModelEntry:
    """A model as a section's ``models`` names it: ``path`` (local directory or LoRA adapter)
    or ``hub_id``; ``prompt`` overrides the section's shared prompt settings for it (e.g.
    ``{compact: false}`` for a hub model). The evaluation and JOSH's ToolWOZ evaluation read it.

    >>> ModelEntry(path="models/sft").policy("sft", PromptSpec(max_prompt_tokens=576)).prompt.max_prompt_tokens
    576
    """

    path: str | None = None
    hub_id: str | None = None
    revision: str | None = None
    prompt: PromptSpec | None = None

    def policy(self, name: str, prompt: PromptSpec) -> PolicySpec:
        """The model to play as ``name``, prompted by its own settings or ``prompt``."""
        return PolicySpec(name, self.path, self.hub_id, self.revision, self.prompt or prompt)


@dataclass(frozen=True)
class GenerationSpec:
    """Decoding: greedy at ``temperature`` 0 (the default: seeds then vary the user and
    the environment, not the policy). ``batch_size``: conversations per decoded batch.
    ``cuda_graphs``: decode steps replayed as CUDA graphs on a GPU (a small model's step is
    launch-bound there; :mod:`pipelines.episodes.decoding`); on a CPU the same fixed-shape
    steps run eagerly, without the batch compaction that saves work on a CPU. ``dtype``: the
    weights' (``float32`` or ``bfloat16``); on the H200 of 2026-11-30 a graphed step of 128
    rows over 1,500 positions took 16.4 ms in float32 and 7.5 ms in bfloat16
    (``benchmarks/decode_probe.py``).

    >>> GenerationSpec(dtype="float16")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: generation.dtype: expected one of ['bfloat16', 'float32'], got 'float16'
    """

    temperature: float = 0.0
    top_p: float | None = None
    max_new_tokens: int = 128
    batch_size: int = 64
    threads: int | None = None
    cuda_graphs: bool = field(default=False, metadata={"omit_if_default": True})
    dtype: str = field(default="float32", metadata={"omit_if_default": True})

    def __post_init__(self) -> None:
        if self.dtype not in GENERATION_DTYPES:
            raise ConfigError(f"generation.dtype: expected one of {sorted(GENERATION_DTYPES)}, got {self.dtype!r}")


GENERATION_DTYPES = frozenset({"float32", "bfloat16"})


def check_policy(spec: PolicySpec) -> None:
    """Fail before any model loads: a local model directory must exist with a config."""
    if spec.path is not None:
        directory = Path(spec.path)
        if not directory.is_dir():
            raise ConfigError(f"model {spec.name!r}: {spec.path} does not exist (run its training stage first)")
        if not (directory / "config.json").is_file() and not (directory / "adapter_config.json").is_file():
            raise ConfigError(f"model {spec.name!r}: {spec.path} has neither config.json nor adapter_config.json")


def load_policy(spec: PolicySpec, fmt: Any, generation: GenerationSpec, seed: int = 0) -> PolicyPromptAgent:
    """The model of ``spec`` as an :class:`HFAgent` behind its prompt rewriting."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.episodes.agents import HFAgent
    from pipelines.llm.config import SamplingParams
    from pipelines.llm.hf import HFBackend
    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer

    check_policy(spec)
    if generation.threads is not None:
        torch.set_num_threads(generation.threads)
    adapter = spec.path is not None and (Path(spec.path) / "adapter_config.json").is_file()
    source = {"revision": spec.revision} if spec.hub_id is not None and spec.revision else {}
    tokenizer = load_tokenizer(ModelSpec(path=spec.path, hub_id=spec.hub_id, revision=spec.revision))
    if adapter:
        from peft import AutoPeftModelForCausalLM

        model = AutoPeftModelForCausalLM.from_pretrained(spec.path, dtype=getattr(torch, generation.dtype))
    else:
        model = AutoModelForCausalLM.from_pretrained(spec.name_or_path, dtype=getattr(torch, generation.dtype), **source)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model.to(device).eval()
    backend = HFBackend(model, tokenizer, batch_size=generation.batch_size)
    sampling = SamplingParams(temperature=generation.temperature, top_p=generation.top_p, max_tokens=generation.max_new_tokens)
    agent = HFAgent(backend, fmt, sampling, name=spec.name, seed=seed, cuda_graphs=generation.cuda_graphs)
    return PolicyPromptAgent(agent, tokenizer, spec.prompt)
