"""Which CPU math kernels torch uses: the machine's fastest, or portable ones (issue 28).

``portable``: ATen's generic (non-vectorised dispatch) kernels, oneDNN at SSE4.1 (which every
x86-64 machine of the last 15 years has) and MKL's conditional numerical reproducibility. With
them CPU training gives the same bytes across x86 instruction sets
(tests/test_isa_reproducibility.py), at 2-5x the training time (README "Reliability"). ATen,
oneDNN and MKL read these variables from the environment when torch first computes, so they
are set before a stage imports anything (``stages/__init__.py``, from params.yaml ``kernels``).
"""

from __future__ import annotations

from typing import Mapping

PORTABLE_KERNELS: Mapping[str, str] = {"ATEN_CPU_CAPABILITY": "default", "ONEDNN_MAX_CPU_ISA": "SSE41", "MKL_CBWR": "COMPATIBLE,STRICT"}
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
