"""PIR step-entropy scoring throughput: traces/s and tokens/s, batched across traces vs one
trace at a time, on the same teacher and the same embedded traces (pipelines.pir.entropy:
one shifted forward pass per trace either way). Also checks that both give the same entropies.

    python benchmarks/pir_entropy.py [--model models/base] [--traces 128] [--batch-size 32] [--threads 1]
"""

from __future__ import annotations

import argparse
import os
import time

# Spinning OpenMP threads are much slower on a shared CPU (benchmarks/smollm2.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/base")
    parser.add_argument("--source", default="data/raw/embedded_multiwoz")
    parser.add_argument("--traces", type=int, default=128)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--device", default="cpu")
    args = parser.parse_args()

    import torch

    from pipelines.env.tools import Database
    from pipelines.llm import HFBackend, HFConfig
    from pipelines.pir.entropy import StepScorer, score_steps
    from pipelines.pir.traces import build_traces
    from catalog.multiwoz_dir import load_multiwoz

    torch.set_num_threads(args.threads)
    corpus = load_multiwoz(args.source)
    traces = build_traces(corpus.dialogues, Database(corpus.entities, corpus.taxi_options), 0, args.traces)
    teacher = HFBackend.from_config(HFConfig(model_path=args.model, device=args.device, batch_size=args.batch_size))
    batched = StepScorer(teacher)
    single = StepScorer(HFBackend(teacher.model, teacher.tokenizer, batch_size=1))
    score_steps(batched, traces[: args.batch_size])  # warm-up
    score_steps(single, traces[:2])

    runs = {}
    for name, backend in (("batched", batched), ("one at a time", single)):
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        started = time.perf_counter()
        scores = score_steps(backend, traces)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        tokens = sum(s.scored_tokens + s.context_tokens for s in scores)
        runs[name] = (seconds, scores)
        print(f"{name:>14}: {len(traces)} traces, {tokens} tokens in {seconds:.2f} s = "
              f"{len(traces) / seconds:.1f} traces/s, {tokens / seconds:.0f} tokens/s")
    # For scale: the released PIR code's way, one forward pass per step over the prefix so far.
    from pipelines.pir.entropy import teacher_context
    from pipelines.pir.traces import split_steps

    texts, contexts = [], []
    for trace in traces:
        prefix = teacher_context(single, trace)
        for start, end in split_steps(trace.reasoning):
            texts.append(trace.reasoning[start:end])
            contexts.append(prefix + trace.reasoning[:start])
    started = time.perf_counter()
    single.score(texts, contexts)
    seconds = time.perf_counter() - started
    tokens = sum(s.scored_tokens + s.context_tokens for s in runs["batched"][1])
    print(f"{'per step':>14}: {len(traces)} traces ({len(texts)} passes) in {seconds:.2f} s = "
          f"{len(traces) / seconds:.1f} traces/s, {tokens / seconds:.0f} trace tokens/s (the released code's way)")
    (fast, a), (slow, b) = runs["batched"], runs["one at a time"]
    worst = max(abs(x - y) for s, t in zip(a, b) for x, y in zip(s.entropies, t.entropies) if x is not None and y is not None)
    print(f"speed-up batched (batch {args.batch_size}) / one at a time: {slow / fast:.1f}x; / per step: {seconds / fast:.1f}x "
          f"(model {args.model}, {args.threads} threads, {args.device}); largest entropy difference {worst:.2e} nats")


if __name__ == "__main__":
    main()
