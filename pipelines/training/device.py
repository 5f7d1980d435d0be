"""The machine a run trains on, and the precision settings that suit it.

On a GPU: bf16 where the GPU supports it, gradient checkpointing on. On CPU: both off.
bf16 on a CPU-only machine is refused at build time by ``TrainingArguments`` itself
(``use_cpu`` autocasting would work but is several times slower); gradient checkpointing
trades compute for memory a small model does not need. Asking for either where it cannot
work is a :class:`~pipelines.errors.ConfigError`, raised before anything is loaded.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass

from pipelines.config import positive_int
from pipelines.errors import ConfigError
from pipelines.training.config import DeviceSpec, ModelSpec


@dataclass(frozen=True)
class Machine:
    """What the run can use: ``accelerator`` is ``"cuda"`` or ``"cpu"``."""

    accelerator: str
    bf16_supported: bool
    n_gpus: int = 0

    @classmethod
    def detect(cls) -> "Machine":
        import torch

        if torch.cuda.is_available():
            return cls("cuda", torch.cuda.is_bf16_supported(), torch.cuda.device_count())
        return cls("cpu", False, 0)


VLLM_MODES = ("colocate", "server")


def resolve_device(spec: DeviceSpec, model: ModelSpec, method: str, machine: Machine) -> DeviceSpec:
    """``spec`` made concrete for ``machine`` (every None chosen, ``accelerator`` set);
    ConfigError for what the machine cannot do."""
    gpu = machine.accelerator == "cuda"
    if spec.accelerator is not None and spec.accelerator != machine.accelerator:
        if spec.accelerator not in ("cuda", "cpu"):
            raise ConfigError(f"device.accelerator must be cuda, cpu or null (what the machine has), got {spec.accelerator!r}")
        raise ConfigError(f"device.accelerator is {spec.accelerator} but this machine runs on {machine.accelerator}")
    if spec.bf16 and not machine.bf16_supported:
        where = "a CPU-only machine" if not gpu else "this GPU"
        raise ConfigError(f"device.bf16 is true but {where} does not support bf16; set it to false or leave it unset (auto)")
    if model.quantization is not None:
        if not gpu:
            raise ConfigError("model.quantization (4-bit) needs a CUDA GPU; remove it to train on CPU")
        if model.lora is None:
            raise ConfigError("model.quantization needs model.lora: a 4-bit model is trained through an adapter")
        if importlib.util.find_spec("bitsandbytes") is None:
            raise ConfigError("model.quantization needs the bitsandbytes package, which is not installed")
    if spec.use_vllm:
        if method != "grpo":
            raise ConfigError(f"device.use_vllm is for grpo generation; {method} does not generate")
        if not gpu:
            raise ConfigError("device.use_vllm needs a CUDA GPU; set it to false on CPU")
        if importlib.util.find_spec("vllm") is None:
            raise ConfigError("device.use_vllm needs the vllm package, which is not installed")
    if spec.vllm_mode not in VLLM_MODES:
        raise ConfigError(f"device.vllm_mode must be one of {', '.join(VLLM_MODES)}, got {spec.vllm_mode!r}")
    bf16 = machine.bf16_supported if spec.bf16 is None else spec.bf16
    checkpointing = gpu if spec.gradient_checkpointing is None else spec.gradient_checkpointing
    for key in ("threads", "data_workers"):
        positive_int(getattr(spec, key), f"device.{key}", optional=True)
    return DeviceSpec(bf16, checkpointing, spec.use_vllm, spec.vllm_mode, spec.threads, spec.data_workers, machine.accelerator)


__all__ = ["Machine", "VLLM_MODES", "resolve_device"]
