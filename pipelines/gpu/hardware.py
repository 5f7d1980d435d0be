"""What a run ran on, and how well it used it: device, memory, package versions, and model
FLOPs utilisation (MFU).

MFU follows the PaLM paper's definition: a dense decoder trains at about
``6 x parameters`` FLOPs per token (forward 2, backward 4; attention's own FLOPs left
out), so ``mfu = 6 * parameters * tokens_per_s / peak``, ``peak`` the accelerator's dense
bf16 throughput from its data sheet (no sparsity). A CPU has no peak in the table: its MFU
is None, never a guess.
"""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from typing import Any, Iterable

#: Dense bf16 tensor-core peaks (FLOP/s) from the vendors' data sheets, matched by name
#: substring, most specific first.
PEAK_BF16_FLOPS: tuple[tuple[str, float], ...] = (
    ("H100 PCIe", 756e12),
    ("H100 NVL", 835e12),
    ("H100", 989e12),   # SXM
    ("H200", 989e12),
    ("H800", 989e12),
    ("GH200", 989e12),
    ("B200", 2250e12),
    ("A100", 312e12),
    ("A800", 312e12),
    ("L40S", 362e12),
    ("L4", 121e12),
    ("A10G", 70e12),
    ("A10", 125e12),
    ("RTX 4090", 165e12),
)

#: Packages whose versions every report records.
PACKAGES = ("torch", "transformers", "trl", "peft", "accelerate", "datasets", "tokenizers", "numpy", "pyarrow", "gguf")


def peak_flops(device_name: str) -> float | None:
    """The dense bf16 peak of a device by name, or None when it is not in the table (a CPU).

    >>> peak_flops("NVIDIA H100 80GB HBM3")
    989000000000000.0
    >>> peak_flops("NVIDIA H100 PCIe") == 756e12
    True
    >>> peak_flops("cpu") is None
    True
    """
    for key, value in PEAK_BF16_FLOPS:
        if key.lower() in device_name.lower():
            return value
    return None


def mfu(parameters: int, tokens_per_s: float, peak: float | None) -> float | None:
    """Model FLOPs utilisation of a training run (module docstring).

    >>> round(mfu(135_000_000, 100_000, 989e12), 4)
    0.0819
    >>> mfu(135_000_000, 100_000, None) is None
    True
    """
    if peak is None or peak <= 0:
        return None
    return 6.0 * parameters * tokens_per_s / peak


def versions(packages: Iterable[str] = PACKAGES) -> dict[str, str | None]:
    """Installed version of each package (None where it is absent)."""
    found: dict[str, str | None] = {"python": platform.python_version()}
    for name in packages:
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = None
    return found


def describe() -> dict[str, Any]:
    """The machine: accelerator name and memory (or the CPU), the peak used for MFU, versions."""
    import torch

    machine: dict[str, Any] = {"platform": platform.platform(), "python": sys.version.split()[0],
                               "cpu_threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        properties = torch.cuda.get_device_properties(0)
        machine.update(
            accelerator="cuda", device=properties.name, devices=torch.cuda.device_count(),
            memory_gib=round(properties.total_memory / 2**30, 1), cuda=torch.version.cuda,
            bf16=torch.cuda.is_bf16_supported(),
        )
    else:
        machine.update(accelerator="cpu", device=platform.processor() or platform.machine(), devices=0)
    machine["peak_bf16_flops"] = peak_flops(machine["device"]) if machine["accelerator"] == "cuda" else None
    machine["versions"] = versions()
    return machine


__all__ = ["PACKAGES", "PEAK_BF16_FLOPS", "describe", "mfu", "peak_flops", "versions"]
