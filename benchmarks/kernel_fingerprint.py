"""Which CPU math kernel gives other bytes on another machine? (issue 28)

    python benchmarks/kernel_fingerprint.py [--kernels portable|default] [--threads N] [--out FILE]
    python benchmarks/kernel_fingerprint.py --compare A.json B.json
    python benchmarks/kernel_fingerprint.py --sqrt [--kernels portable|default]

The portable pin (``kernels: portable``, pipelines/kernels.py) gives one model on this machine
whichever instruction set it is capped at, yet another model on another vendor's CPU (README
"Reliability": fc552816 on the Intel AVX-512/AMX machine, d8749483 on an AMD EPYC Zen 4, same
commit and settings). This prints a sha256 prefix of the output of each building block of a
training step (matmuls of the embedded model's shapes, the activations, the norms, attention,
cross-entropy, their gradients, an AdamW step, a tiny Qwen2's forward and backward, numpy's
float kernels and the tokenizer's BPE training) computed in a fresh process under the chosen
kernels and thread count, from inputs made by torch's and numpy's seeded generators (whose
bytes do not depend on the CPU: the ``inputs`` line checks it). ``--out`` writes them as JSON
with the machine's description; ``--compare`` of two such files from two machines names the
blocks that differ: the first of them is where the bytes part.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import subprocess
import sys
from pathlib import Path
from typing import Callable

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipelines.kernels import kernel_environment, thread_environment  # noqa: E402


def _digest(*arrays) -> str:
    h = hashlib.sha256()
    for array in arrays:
        h.update(memoryview(array.detach().contiguous().numpy() if hasattr(array, "detach") else array).cast("B"))
    return h.hexdigest()[:16]


def blocks() -> dict[str, Callable[[], str]]:
    """Name -> a function computing one block and returning its digest (torch imported here,
    after the environment is set)."""
    import numpy as np
    import torch
    import torch.nn.functional as F

    def gen(*shape, seed: int = 0, grad: bool = False) -> torch.Tensor:
        g = torch.Generator().manual_seed(seed)
        return torch.randn(*shape, generator=g).requires_grad_(grad)

    x, w, w_up, w_head = gen(2304, 192), gen(576, 192, seed=1), gen(192, 576, seed=2), gen(4096, 192, seed=3)

    def linear_backward() -> str:
        a, b = gen(2304, 192, grad=True), gen(576, 192, seed=1, grad=True)
        out = F.linear(a, b)
        out.backward(gen(2304, 576, seed=4))
        return _digest(a.grad, b.grad)

    def cross_entropy_backward() -> str:
        logits = gen(2304, 4096, seed=5, grad=True)
        target = torch.randint(0, 4096, (2304,), generator=torch.Generator().manual_seed(6))
        loss = F.cross_entropy(logits, target)
        loss.backward()
        return _digest(loss, logits.grad)

    def rms_norm() -> str:
        a, weight = gen(2304, 192, grad=True), gen(192, seed=7, grad=True)
        out = a * torch.rsqrt(a.pow(2).mean(-1, keepdim=True) + 1e-6) * weight
        out.backward(gen(2304, 192, seed=8))
        return _digest(out, a.grad, weight.grad)

    def attention() -> str:
        q, k, v = (gen(4, 4, 576, 48, seed=s, grad=True) for s in (9, 10, 11))
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        out.backward(gen(4, 4, 576, 48, seed=12))
        return _digest(out, q.grad, k.grad, v.grad)

    def embedding_backward() -> str:
        table = gen(4096, 192, seed=13, grad=True)
        ids = torch.randint(0, 4096, (4, 576), generator=torch.Generator().manual_seed(14))
        F.embedding(ids, table).backward(gen(4, 576, 192, seed=15))
        return _digest(table.grad)

    def adamw_step() -> str:
        p = torch.nn.Parameter(gen(576, 192, seed=16))
        p.grad = gen(576, 192, seed=17)
        optimizer = torch.optim.AdamW([p], lr=3e-3, weight_decay=0.01)
        for _ in range(3):
            optimizer.step()
        return _digest(p)

    def qwen2_step() -> str:
        from transformers import Qwen2Config, Qwen2ForCausalLM

        torch.manual_seed(0)
        config = Qwen2Config(vocab_size=4096, hidden_size=192, num_hidden_layers=2, num_attention_heads=4,
                             num_key_value_heads=2, intermediate_size=576, max_position_embeddings=1024)
        model = Qwen2ForCausalLM(config).float()
        ids = torch.randint(0, 4096, (4, 256), generator=torch.Generator().manual_seed(18))
        out = model(input_ids=ids, labels=ids)
        out.loss.backward()
        return _digest(out.logits, *[p.grad for p in model.parameters() if p.grad is not None])

    def tokenizer_bpe() -> str:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers

        rng = np.random.default_rng(19)
        words = ["".join(chr(97 + c) for c in rng.integers(0, 26, rng.integers(2, 9))) for _ in range(4000)]
        text = [" ".join(words[i:i + 40]) for i in range(0, len(words), 40)]
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.train_from_iterator(text, trainers.BpeTrainer(vocab_size=600, show_progress=False))
        return hashlib.sha256(tokenizer.to_str().encode()).hexdigest()[:16]

    def numpy_float() -> str:
        a = np.random.default_rng(20).standard_normal((512, 512)).astype(np.float32)
        return _digest(np.exp(a), np.log(np.abs(a) + 1), a @ a.T, a.sum(axis=0), np.tanh(a))

    return {
        "inputs": lambda: _digest(x, w, w_up, w_head),
        "matmul x@W^T (2304x192 . 192x576)": lambda: _digest(F.linear(x, w)),
        "matmul up (2304x192 . 192x576)": lambda: _digest(x @ w_up),
        "matmul lm head (2304x192 . 192x4096)": lambda: _digest(F.linear(x, w_head)),
        "linear backward": linear_backward,
        "softmax (4096)": lambda: _digest(torch.softmax(F.linear(x, w_head), -1)),
        "log_softmax (4096)": lambda: _digest(torch.log_softmax(F.linear(x, w_head), -1)),
        "cross-entropy + backward": cross_entropy_backward,
        "exp": lambda: _digest(torch.exp(x)),
        "log": lambda: _digest(torch.log(x.abs() + 1)),
        "tanh": lambda: _digest(torch.tanh(x)),
        "sigmoid": lambda: _digest(torch.sigmoid(x)),
        "silu": lambda: _digest(F.silu(x)),
        "rsqrt": lambda: _digest(torch.rsqrt(x.abs() + 1)),
        "pow 0.5": lambda: _digest(torch.pow(x.abs(), 0.5)),
        "sum over rows": lambda: _digest(x.sum(0)),
        "mean over columns": lambda: _digest(x.mean(-1)),
        "rms norm + backward": rms_norm,
        "causal attention + backward": attention,
        "embedding backward": embedding_backward,
        "AdamW (3 steps)": adamw_step,
        "Qwen2, 2 layers: forward + backward": qwen2_step,
        "numpy float kernels": numpy_float,
        "tokenizers BPE training": tokenizer_bpe,
    }


def machine() -> dict[str, str]:
    """What distinguishes this machine's CPU: model name, vendor, stepping, microcode, the SIMD
    flags that kernels choose by, and the cache sizes GEMM libraries block their loops by (two
    Zen 4 machines with the same flags and digests trained different models: README "Reliability")."""
    info = {"machine": platform.machine(), "cores": str(os.cpu_count())}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key, value = key.strip(), value.strip()
        if key in ("model name", "vendor_id", "cpu family", "model", "stepping", "microcode") and key not in info:
            info[key] = value
        if key == "flags" and "flags" not in info:
            info["flags"] = " ".join(sorted(f for f in value.split() if f.startswith(("avx", "amx", "fma", "sse"))))
    caches = []
    for index in sorted(Path("/sys/devices/system/cpu/cpu0/cache").glob("index*")):
        try:
            level, kind, size = ((index / name).read_text().strip() for name in ("level", "type", "size"))
        except OSError:
            continue
        caches.append(f"L{level} {kind.lower()} {size}")
    if caches:
        info["caches"] = ", ".join(caches)
    return info


def _fresh(flag: str, kernels: str, threads: int, **extra: str) -> dict:
    """What this script prints with ``flag`` in a fresh process (torch reads the kernel
    settings once, when it starts) under ``kernels``, ``threads`` and ``extra`` variables."""
    env = {**os.environ, **kernel_environment(kernels), **thread_environment(threads), **extra}
    result = subprocess.run([sys.executable, __file__, flag], env=env, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise SystemExit(f"the {flag} process {extra or ''} failed:\n{result.stderr[-3000:]}")
    return json.loads(result.stdout.strip().splitlines()[-1])


def fingerprint(kernels: str, threads: int) -> dict:
    """The blocks' digests, computed in a fresh process under ``kernels`` and ``threads``."""
    return {"kernels": kernels, "machine": machine(), **_fresh("--in-process", kernels, threads)}


def sqrt_misses(n: int = 100_000) -> dict[str, int]:
    """How many of ``n`` seeded float32 and float64 square roots torch computes differently from
    the IEEE result (numpy's: the hardware instruction, correctly rounded, the same on every
    x86 CPU). Not zero where torch's sqrt is an approximation, e.g. MKL's under
    ``MKL_CBWR=COMPATIBLE`` (README "Reliability"), whose last bits may follow the vendor."""
    import numpy as np
    import torch

    x = torch.rand(n, generator=torch.Generator().manual_seed(1), dtype=torch.float64) * 10
    return {str(t).removeprefix("torch."): int((x.to(t).sqrt().numpy() != np.sqrt(x.to(t).numpy())).sum())
            for t in (torch.float32, torch.float64)}


def openblas_core() -> str | None:
    """The kernel family numpy's bundled OpenBLAS chose for this CPU (``OPENBLAS_CORETYPE``
    overrides it), or None where numpy brings no OpenBLAS that says. numpy's matrix products
    follow it: on 2026-12-02 an AMD Zen 5 (family 26) was taken for ``Haswell`` (AVX2), where
    a Zen 4 and an Intel Xeon run ``SkylakeX``'s AVX-512 kernels, so the ``numpy float kernels``
    block parted there (README "Reliability")."""
    import ctypes

    import numpy as np

    for library in sorted((Path(np.__file__).parent.parent / "numpy.libs").glob("lib*openblas*.so*")):
        lib = ctypes.CDLL(str(library))
        for symbol in ("scipy_openblas_get_corename64_", "scipy_openblas_get_corename", "openblas_get_corename64_", "openblas_get_corename"):
            function = getattr(lib, symbol, None)
            if function is not None:
                function.restype = ctypes.c_char_p
                return function().decode()
    return None


def _in_process() -> dict:
    """The blocks' digests under this process's environment (what :func:`fingerprint` runs),
    :func:`sqrt_misses` and :func:`openblas_core` there."""
    import torch

    return {"blocks": {name: block() for name, block in blocks().items()}, "torch": torch.__version__,
            "threads": torch.get_num_threads(), "sqrt_misses_per_100k": sqrt_misses(), "openblas_core": openblas_core()}


#: MKL's code branches (``MKL_CBWR``) whose square roots ``--sqrt`` counts.
MKL_BRANCHES = ("AUTO", "COMPATIBLE,STRICT", "SSE4_2,STRICT", "AVX2,STRICT", "AVX512,STRICT")


def sqrt_by_branch(kernels: str, threads: int, branches: tuple[str, ...] = MKL_BRANCHES) -> dict[str, dict[str, int]]:
    """:func:`sqrt_misses` in a fresh process per MKL branch, the other settings ``kernels``'."""
    return {branch: _fresh("--in-process-sqrt", kernels, threads, MKL_CBWR=branch) for branch in branches}


def compare(a: dict, b: dict) -> list[str]:
    """The blocks whose digests differ between two fingerprints, in computation order.

    >>> compare({"blocks": {"exp": "1", "log": "2"}}, {"blocks": {"exp": "1", "log": "3"}})
    ['log']
    """
    return [name for name, digest in a["blocks"].items() if b["blocks"].get(name) != digest]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernels", default="portable", choices=["portable", "default"])
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--out", type=Path, help="write the fingerprint as JSON")
    parser.add_argument("--compare", nargs=2, type=Path, metavar=("A", "B"), help="two fingerprint files: the blocks that differ")
    parser.add_argument("--sqrt", action="store_true", help="per MKL branch (MKL_CBWR): square roots that are not the IEEE result")
    parser.add_argument("--in-process", action="store_true", help=argparse.SUPPRESS)  # fingerprint()'s fresh process
    parser.add_argument("--in-process-sqrt", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.in_process:
        print(json.dumps(_in_process()))
        return 0
    if args.in_process_sqrt:
        print(json.dumps(sqrt_misses()))
        return 0
    if args.sqrt:
        print(f"{machine().get('model name', '?')}: {args.kernels} kernels but MKL_CBWR, {args.threads} thread(s); "
              "of 100,000 square roots, how many differ from the IEEE result")
        for branch, misses in sqrt_by_branch(args.kernels, args.threads).items():
            print(f"  MKL_CBWR={branch:<18} float32 {misses['float32']:>6}  float64 {misses['float64']:>6}")
        return 0
    if args.compare:
        a, b = (json.loads(p.read_text()) for p in args.compare)
        for side, doc in zip("AB", (a, b)):
            print(f"{side}: {doc['machine'].get('model name', '?')} ({doc['kernels']} kernels, {doc['threads']} threads, torch {doc['torch']})")
        differ = compare(a, b)
        for name in a["blocks"]:
            print(f"  {'DIFFER' if name in differ else 'same  '}  {name}")
        for side, doc in zip("AB", (a, b)):
            print(f"{side}: square roots off the IEEE result per 100,000: {doc.get('sqrt_misses_per_100k', 'not recorded')}; "
                  f"numpy's OpenBLAS kernels: {doc.get('openblas_core', 'not recorded')}")
        return 1 if differ else 0
    found = fingerprint(args.kernels, args.threads)
    print(f"{found['machine'].get('model name', '?')}: {args.kernels} kernels, {found['threads']} thread(s), torch {found['torch']}")
    for name, digest in found["blocks"].items():
        print(f"  {digest}  {name}")
    print(f"  square roots off the IEEE result per 100,000: {found['sqrt_misses_per_100k']}")
    print(f"  numpy's OpenBLAS kernels: {found['openblas_core']}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(found, indent=1, sort_keys=False) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
