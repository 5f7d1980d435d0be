"""Loading the starting model and tokenizer, the PEFT and quantization configs (saving is
:func:`catalog.models.save_model`, the one place a model directory is written).

A local ``ModelSpec.path`` is loaded with ``local_files_only`` (never a hub lookup); a
``hub_id`` goes through the hub (or its cache). A chat model must carry a chat template:
every dataset here is conversational.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pipelines.errors import ConfigError
from pipelines.training.config import LoraSpec, ModelSpec, QuantizationSpec
from pipelines.training.config import DeviceSpec


def _source_kwargs(spec: ModelSpec) -> dict[str, Any]:
    """Loading arguments; a local directory must exist (a missing one would otherwise be
    looked up as a hub id, and fail as a network error)."""
    if spec.local and not Path(spec.path).is_dir():
        raise ConfigError(f"model path {spec.path!r} does not exist")
    kwargs: dict[str, Any] = {"local_files_only": spec.local}
    if spec.revision is not None:
        kwargs["revision"] = spec.revision
    return kwargs


def load_tokenizer(spec: ModelSpec) -> Any:
    """The model's tokenizer, exactly as its ``tokenizer.json`` defines it
    (:func:`pipelines.llm.tokenizer.faithful_tokenizer`: transformers 5's ``AutoTokenizer``
    rebuilds a ``qwen2`` model's as Qwen's own), with a pad token (the eos where it has none);
    a ConfigError if it has no chat template."""
    from pipelines.llm.tokenizer import faithful_tokenizer

    tokenizer = faithful_tokenizer(spec.name_or_path, **_source_kwargs(spec))
    if not getattr(tokenizer, "chat_template", None):
        raise ConfigError(f"model {spec.name_or_path}: the tokenizer has no chat template; the training data is conversational")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def quantization_config(spec: QuantizationSpec) -> Any:
    import torch
    from transformers import BitsAndBytesConfig

    return BitsAndBytesConfig(
        load_in_4bit=True,
        bnb_4bit_quant_type=spec.quant_type,
        bnb_4bit_compute_dtype=getattr(torch, spec.compute_dtype),
        bnb_4bit_use_double_quant=spec.double_quant,
    )


def load_model(spec: ModelSpec, device: DeviceSpec) -> Any:
    """The starting model, in bf16 when the run is, on the run's device."""
    import torch
    from transformers import AutoModelForCausalLM

    if device.threads is not None:
        torch.set_num_threads(device.threads)
    kwargs = _source_kwargs(spec)
    kwargs["dtype"] = torch.bfloat16 if device.bf16 else torch.float32
    if spec.quantization is not None:
        kwargs["quantization_config"] = quantization_config(spec.quantization)
        kwargs["device_map"] = {"": 0}
    model = AutoModelForCausalLM.from_pretrained(spec.name_or_path, **kwargs)
    if spec.quantization is None:
        model.to(device.accelerator)
    return model


def peft_config(spec: LoraSpec | None) -> Any:
    if spec is None:
        return None
    from peft import LoraConfig

    target = spec.target_modules if isinstance(spec.target_modules, str) else list(spec.target_modules)
    return LoraConfig(
        task_type="CAUSAL_LM", r=spec.r, lora_alpha=spec.alpha, lora_dropout=spec.dropout, target_modules=target
    )


def parameter_counts(model: Any) -> dict[str, int]:
    total = sum(p.numel() for p in model.parameters())
    trainable = sum(p.numel() for p in model.parameters() if p.requires_grad)
    return {"total": total, "trainable": trainable}


__all__ = ["load_model", "load_tokenizer", "parameter_counts", "peft_config", "quantization_config"]
