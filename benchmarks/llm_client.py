"""Requests per second through LLMClient at concurrency 1, 4 and 16.

    python benchmarks/llm_client.py [--requests 96] [--repeats 3] [--latency-ms 0 20] [--no-serve]

Targets: the local fake OpenAI-compatible server (once per ``--latency-ms``: with 0 ms the
client's own overhead dominates, with a simulated model latency the concurrency gain shows),
then, unless ``--no-serve``, a real ``transformers serve`` process over a tiny locally built
model (greedy, 8 new tokens). The cache is off: every request reaches the server. Each cell is
the median of ``--repeats`` runs after one warm-up run, with fresh prompts per run so nothing
can be served from any cache; the spread (min-max) is printed too, since on a shared machine
single runs are noisy.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from pipelines.llm import ClientConfig, CompletionRequest, LLMClient, SamplingParams
from pipelines.llm.testing.fake_server import FakeOpenAIServer
from pipelines.llm.testing.serve import TransformersServe
from pipelines.llm.testing.tiny_model import build_tiny_chat_model

CONCURRENCY = (1, 4, 16)
SAMPLING = SamplingParams(temperature=0.0, max_tokens=8)


def requests_per_second(base_url: str, model: str, concurrency: int, n_requests: int, run: str) -> float:
    client = LLMClient(ClientConfig(base_url=base_url, model=model, max_concurrency=concurrency, timeout_s=120))
    requests = [
        CompletionRequest([{"role": "user", "content": f"run {run}, request {i}: a cheap hotel?"}], "judge", SAMPLING, seed=i)
        for i in range(n_requests)
    ]
    start = time.perf_counter()
    results = client.complete_many_sync(requests)
    elapsed = time.perf_counter() - start
    failures = [r for r in results if not r.ok]
    if failures:
        raise RuntimeError(f"{len(failures)} request(s) failed, e.g. {failures[0]}")
    return n_requests / elapsed


def measure(label: str, base_url: str, model: str, args: argparse.Namespace) -> None:
    requests_per_second(base_url, model, 4, min(args.requests, 16), f"{label}-warm-up")
    cells = []
    for concurrency in CONCURRENCY:
        rates = [
            requests_per_second(base_url, model, concurrency, args.requests, f"{label}-{concurrency}-{repeat}")
            for repeat in range(args.repeats)
        ]
        cells.append(f"{statistics.median(rates):>8.1f} ({min(rates):.0f}-{max(rates):.0f})")
    print(f"{label:<34}" + "".join(f"{cell:>22}" for cell in cells), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", type=int, default=96, help="requests per run")
    parser.add_argument("--repeats", type=int, default=3, help="runs per cell (median reported)")
    parser.add_argument("--latency-ms", type=float, nargs="+", default=[0.0, 20.0], help="fake server latencies")
    parser.add_argument("--no-serve", action="store_true", help="skip transformers serve")
    run_targets(parser.parse_args())


def run_targets(args: argparse.Namespace) -> None:
    """Measure every target; ``args`` carries requests, repeats, latency_ms and no_serve."""
    print(f"requests/s, median (min-max) of {args.repeats} runs of {args.requests} requests")
    print(f"{'target':<34}" + "".join(f"{f'concurrency {c}':>22}" for c in CONCURRENCY))
    for latency_ms in args.latency_ms:
        with FakeOpenAIServer(latency_s=latency_ms / 1000, keep_bodies=False) as server:
            measure(f"fake server, {latency_ms:g} ms latency", server.base_url, "fake-model", args)
    if args.no_serve:
        return
    with tempfile.TemporaryDirectory() as tmp:
        model_dir = build_tiny_chat_model(Path(tmp) / "tiny-qwen2")
        # One torch thread: the tiny model is far faster so on a small shared machine.
        with TransformersServe(model_dir, Path(tmp) / "serve.log", env={"OMP_NUM_THREADS": "1"}) as server:
            measure("transformers serve, tiny Qwen2", server.base_url, str(model_dir), args)


if __name__ == "__main__":
    main()
