"""Which CPU math kernels torch uses: the machine's fastest, or portable ones (issue 28).

``portable``: ATen's generic (non-vectorised dispatch) kernels, oneDNN at SSE4.1 (which every
x86-64 machine of the last 15 years has) and MKL's conditional numerical reproducibility. With
them CPU training gives the same bytes across x86 instruction sets
(tests/test_isa_reproducibility.py), at 2-5x the training time (README "Reliability"). ATen,
oneDNN and MKL read these variables from the environment when torch first computes, so they
are set before a stage imports anything (``stages/__init__.py``, from params.yaml ``kernels``).
"""

from __future__ import annotations

import os
from typing import Any, Mapping

# ASKFLOW_ADAMW: torch's plain AdamW divides by a square root that is MKL's, and under
# MKL_CBWR=COMPATIBLE not the IEEE result: its last bits follow the CPU's vendor (README
# "Reliability"). The fused AdamW takes its roots in ATen's own loop: exact, no MKL. TRL's
# trainers use it already (transformers' default optim); this moves the bootstrap's loop too.
PORTABLE_KERNELS: Mapping[str, str] = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE,STRICT",
                                       "ASKFLOW_ADAMW": "fused"}
KERNELS: tuple[str, ...] = ("default", "portable")


def kernel_environment(kernels: object, where: str = "params.yaml kernels") -> dict[str, str]:
    """The environment variables ``kernels`` needs (none for ``default``).

    >>> kernel_environment("default")
    {}
    >>> kernel_environment("portable")["ATEN_CPU_CAPABILITY"]
    'default'
    >>> kernel_environment("fast")
    Traceback (most recent call last):
    ...
    ValueError: params.yaml kernels: expected one of ['default', 'portable'], got 'fast'
    """
    if kernels not in KERNELS:
        raise ValueError(f"{where}: expected one of {list(KERNELS)}, got {kernels!r}")
    return dict(PORTABLE_KERNELS) if kernels == "portable" else {}


def thread_environment(threads: object, where: str = "params.yaml threads") -> dict[str, str]:
    """The environment variables that give torch ``threads`` CPU threads (OpenMP's and MKL's,
    read when torch starts).

    >>> thread_environment(1)
    {'OMP_NUM_THREADS': '1', 'MKL_NUM_THREADS': '1'}
    >>> thread_environment(0)
    Traceback (most recent call last):
    ...
    ValueError: params.yaml threads: expected an integer >= 1, got 0
    """
    if isinstance(threads, bool) or not isinstance(threads, int) or threads < 1:
        raise ValueError(f"{where}: expected an integer >= 1, got {threads!r}")
    return {"OMP_NUM_THREADS": str(threads), "MKL_NUM_THREADS": str(threads)}


def adamw_options() -> dict[str, Any]:
    """``torch.optim.AdamW``'s keyword arguments under this process's kernels: ``fused`` under
    the portable pin (``ASKFLOW_ADAMW=fused``), none otherwise (the default kernels' models
    stay what they are).

    >>> saved = os.environ.pop("ASKFLOW_ADAMW", None)
    >>> adamw_options()
    {}
    >>> os.environ["ASKFLOW_ADAMW"] = "fused"
    >>> adamw_options()
    {'fused': True}
    >>> _ = os.environ.pop("ASKFLOW_ADAMW") if saved is None else os.environ.update(ASKFLOW_ADAMW=saved)
    """
    return {"fused": True} if os.environ.get("ASKFLOW_ADAMW") == "fused" else {}
