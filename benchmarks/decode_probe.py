"""Where an evaluation's time goes on the accelerator: the decode step by dtype and attention,
and a profiled evaluation (issue 25's 5 dialogues/s; the H200 run of 2026-11-30 decoded at
26.9 ms per step zero-shot and 36.2 ms after SFT, with every step replayed as a CUDA graph).

    python benchmarks/decode_probe.py --model models/smollm2 [--rows 128] [--prompt 1500] [--steps 64] [--goals 30]
        [--kernels 16] [--skip-steps] [--grid-rows 32 64 128 --grid-prompts 500 1000 1500] [--attention matmul]
        [--out probe.json]

1. The decode step: ``--rows`` rows of about ``--prompt`` random prompt tokens, no stop token,
   ``--steps`` new tokens, static steps (``cuda_graphs``), for float32 and bfloat16 weights and
   three attentions (:func:`static_attention`): the static steps' packed grouped-query SDPA
   (``decoding.packed_gqa_sdpa``), transformers' SDPA (keys and values repeated per query
   head) and the grouped matrix products of continuous batching's slot step
   (``continuous.grouped_matmul_attention``). Per step: the wall time of the call less that of
   a one-token call (its prefill), over the steps; with CUDA synchronised.
2. ``--kernels N``: N static steps of the same batch in each dtype under ``torch.profiler``,
   run eagerly (no capture: the graph replays the same kernels, but the profiler then sees
   one launch), and the kernels that took a step's device time, most first: what a float32
   step spends in attention, matrix products and the rest. Parts 2 and 3 attend with
   ``--attention`` (``packed`` or ``matmul``, the default; the GPU profile times both and takes the faster).
3. ``--grid-rows`` x ``--grid-prompts``: the static step's time at each batch size and prompt
   length, per dtype, and a least-squares split of it into a fixed part, a part per row and a
   part per row and buffer position (:func:`step_cost_model`): whether fewer rows (stopped
   rows leaving, continuous batching) or fewer positions (attention over each row's own
   length, not the buffer's) would cut the step.
4. An evaluation of ``--goals`` test goals with the GPU profile's settings (``load_policy`` as
   the job loads it), the agent's turns run in the calling thread so that cProfile sees them:
   dialogues/s, the decode summary, and the functions that took the time.

Without CUDA it runs the same on the CPU (use small counts) and says so.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import io
import json
import pstats
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def random_batch(model_path: str, rows: int, prompt: int) -> list[list[int]]:
    """``rows`` rows of 90-100 % of ``prompt`` seeded random ordinary tokens (within the
    model's vocabulary: ids 100-40,000 for SmolLM2)."""
    from transformers import AutoConfig

    vocabulary = AutoConfig.from_pretrained(model_path).vocab_size
    low, high = min(100, vocabulary // 2), min(40000, vocabulary)
    rnd = random.Random(0)
    return [[rnd.randrange(low, high) for _ in range(rnd.randrange(int(prompt * 0.9), prompt + 1))] for _ in range(rows)]


def decode_seconds(model, batch: list[list[int]], new: int, graphs: bool) -> float:
    """Wall seconds of one decode of ``new`` tokens per row (no stop), CUDA synchronised."""
    import torch

    from pipelines.episodes.decoding import DecodeSpec, decode

    cuda = next(model.parameters()).device.type == "cuda"
    if cuda:
        torch.cuda.synchronize()
    started = time.perf_counter()
    decode(model, batch, DecodeSpec(new, frozenset(), cuda_graphs=graphs, compact_share=None), pad_id=0)
    if cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - started


def per_step_ms(model, batch: list[list[int]], steps: int, graphs: bool) -> tuple[float, float]:
    """(prefill ms, ms per step): a warm-up, the best of two one-token calls (the prefill and
    the first pick), and a call of ``steps`` + 1 tokens less that, over ``steps``."""
    decode_seconds(model, batch, 2, graphs)  # warm-up: kernels chosen, allocator filled
    prefill = min(decode_seconds(model, batch, 1, graphs) for _ in range(2))
    whole = decode_seconds(model, batch, steps + 1, graphs)
    return prefill * 1000, (whole - prefill) / steps * 1000


@contextlib.contextmanager
def static_attention(name: str):
    """The rounds' static steps attend with ``name`` inside the block: ``packed`` (their own
    grouped-query SDPA), ``repeated`` (transformers' SDPA, keys and values repeated per query
    head) or ``matmul`` (continuous batching's slot step: ``continuous.grouped_matmul_attention``)."""
    from pipelines.episodes import continuous, decoding

    packed = decoding._packed_attention
    decoding._packed_attention = {"packed": packed, "repeated": lambda: "sdpa",
                                  "matmul": lambda: continuous._registered("matmul")}[name]
    try:
        yield
    finally:
        decoding._packed_attention = packed


def step_times(model_path: str, rows: int, prompt: int, steps: int, log) -> list[dict]:
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    batch = random_batch(model_path, rows, prompt)

    figures = []
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        for attention, graphs in (("matmul", True), ("packed", True), ("repeated", True), ("packed", False)):
            with static_attention(attention):
                prefill, step = per_step_ms(model, batch, steps, graphs)
            row = {"dtype": str(dtype).replace("torch.", ""), "attention": attention, "cuda_graphs": graphs and device == "cuda",
                   "static": graphs, "rows": rows, "prompt_tokens": prompt, "steps": steps,
                   "prefill_ms": round(prefill, 2), "ms_per_step": round(step, 3)}
            log(row)
            figures.append(row)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return figures


def step_cost_model(points: list[dict]) -> dict:
    """Least squares of ``ms_per_step = fixed + per_row * rows + per_position * rows * positions``
    over the grid's points (positions: the buffer's capacity, prompt + new tokens): what a
    step pays whatever its batch (launches, the weights read once), per row (matrix products,
    the vocabulary projection) and per row and buffer position (attention reading the keys
    and values, padding included); with each point's residual."""
    import numpy as np

    design = np.array([[1.0, p["rows"], p["rows"] * p["positions"]] for p in points])
    observed = np.array([p["ms_per_step"] for p in points])
    (fixed, per_row, per_position), *_ = np.linalg.lstsq(design, observed, rcond=None)
    fitted = design @ np.array([fixed, per_row, per_position])
    return {"fixed_ms": round(float(fixed), 3), "per_row_us": round(float(per_row) * 1000, 3),
            "per_row_and_position_ns": round(float(per_position) * 1e6, 4),
            "residual_ms": [round(float(r), 3) for r in observed - fitted]}


def grid_times(model_path: str, rows_grid: list[int], prompt_grid: list[int], steps: int, log, attention: str = "matmul") -> list[dict]:
    """Per dtype: the static step's ms (``attention``, CUDA graphs where there is CUDA) at
    every batch of ``rows_grid`` rows x ``prompt_grid`` prompt tokens, and
    :func:`step_cost_model` over them: which of rows, buffer positions or neither a step's time
    follows, so that the next cut (fewer rows: compaction; fewer positions: attention over
    each row's own length; neither: the kernels' count) is the one that pays."""
    import torch
    from transformers import AutoModelForCausalLM

    device = "cuda" if torch.cuda.is_available() else "cpu"
    figures = []
    for dtype in (torch.float32, torch.bfloat16):
        model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
        points = []
        for prompt in prompt_grid:
            full = random_batch(model_path, max(rows_grid), prompt)
            for rows in rows_grid:
                with static_attention(attention):
                    _, step = per_step_ms(model, full[:rows], steps, graphs=True)
                point = {"rows": rows, "prompt_tokens": prompt, "positions": prompt + steps + 1, "ms_per_step": round(step, 3)}
                log({"dtype": str(dtype).replace("torch.", ""), **point})
                points.append(point)
        row = {"dtype": str(dtype).replace("torch.", ""), "attention": attention, "steps": steps, "cuda_graphs": device == "cuda", "points": points,
               "model": step_cost_model(points)}
        log({"dtype": row["dtype"], "model": row["model"]})
        figures.append(row)
        del model
        if device == "cuda":
            torch.cuda.empty_cache()
    return figures


def _kernel_self_times(model, batch: list[list[int]], new: int, cuda: bool) -> dict[str, tuple[int, float]]:
    """One static-step decode of ``new`` tokens under torch.profiler: kernel -> (calls,
    microseconds of self time on the device; on the CPU without one)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    from pipelines.episodes.decoding import DecodeSpec, decode

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=activities) as prof:
        decode(model, batch, DecodeSpec(new, frozenset(), cuda_graphs=True, compact_share=None), pad_id=0)
        if cuda:
            torch.cuda.synchronize()
    return {e.key: (e.count, (getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0.0))
                    if cuda else e.self_cpu_time_total) for e in prof.key_averages()}


def kernel_times(model_path: str, rows: int, prompt: int, steps: int, log, top: int = 15, attention: str = "matmul") -> list[dict]:
    """Per dtype: the device time of ``steps`` eager static steps attending with ``attention``
    by kernel (self time, the ``top`` largest), per step, and their share of all kernels' time."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.episodes import decoding

    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    batch = random_batch(model_path, rows, prompt)
    figures = []
    with decoding.eager_static_steps(), static_attention(attention):  # the profiler sees each kernel
        for dtype in (torch.float32, torch.bfloat16):
            model = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype, attn_implementation="sdpa").to(device).eval()
            _kernel_self_times(model, batch, 2, cuda)  # warm-up
            # The steps alone: a decode of steps + 1 tokens less one of 1 (the prefill and the first pick).
            whole, prefill = _kernel_self_times(model, batch, steps + 1, cuda), _kernel_self_times(model, batch, 1, cuda)
            spent = {key: (calls - prefill.get(key, (0, 0.0))[0], time - prefill.get(key, (0, 0.0))[1]) for key, (calls, time) in whole.items()}
            total = sum(max(time, 0.0) for _, time in spent.values()) or 1.0
            ranked = sorted(spent.items(), key=lambda item: item[1][1], reverse=True)[:top]
            row = {"dtype": str(dtype).replace("torch.", ""), "attention": attention, "rows": rows, "prompt_tokens": prompt, "steps": steps,
                   "device_time": "cuda" if cuda else "cpu (no CUDA device)", "ms_per_step": round(total / 1000 / steps, 3),
                   "kernels": [{"name": key[:120], "calls_per_step": round(calls / steps, 2), "ms_per_step": round(time / 1000 / steps, 3),
                                "share": round(time / total, 3)} for key, (calls, time) in ranked]}
            log(row)
            figures.append(row)
            del model
            if cuda:
                torch.cuda.empty_cache()
    return figures


def profiled_evaluation(model_path: str, goals_n: int, log) -> dict:
    from catalog.io import read_params
    from flows.gpu import play_timed, profile_evaluation
    from pipelines.evaluation.speed import decode_summary

    setting = profile_evaluation(read_params("gpu"), model_path, None, {"max_goals": goals_n, "seeds": [0]}, "decode_probe evaluate")
    config, goals, simulator, database, agent = setting.config, setting.goals, setting.simulator, setting.database, setting.agent

    async def here(function, *args, **kwargs):  # the agent's turns in this thread, where cProfile looks
        return function(*args, **kwargs)

    threaded, asyncio.to_thread = asyncio.to_thread, here
    profile = cProfile.Profile()
    try:
        profile.enable()
        played, wall_s, stats = play_timed(agent, goals, simulator, database, config.plan(), setting.continuous)
        profile.disable()
    finally:
        asyncio.to_thread = threaded
    text = io.StringIO()
    view = pstats.Stats(profile, stream=text)
    view.sort_stats("cumulative").print_stats(r"pipelines|flows|decoding|agents|tokeniz|to\(|tolist|replay|synchronize", 40)
    view.sort_stats("tottime").print_stats(20)
    result = {"goals": len(goals), "wall_s": round(wall_s, 2), "dialogues_per_s": round(len(played) / wall_s, 3),
              "events": sum(len(e.events) for e in played), "decode": decode_summary([stats], wall_s, config.generation.cuda_graphs)}
    log(result)
    print(text.getvalue())
    return {**result, "profile": text.getvalue()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default="models/smollm2")
    parser.add_argument("--rows", type=int, default=128)
    parser.add_argument("--prompt", type=int, default=1500)
    parser.add_argument("--steps", type=int, default=64)
    parser.add_argument("--goals", type=int, default=30)
    parser.add_argument("--kernels", type=int, default=0, help="profile this many static steps per dtype (0: none)")
    parser.add_argument("--skip-steps", action="store_true", help="leave out part 1 (the step times)")
    parser.add_argument("--grid-rows", type=int, nargs="*", default=[], help="with --grid-prompts: step times over rows x prompt tokens")
    parser.add_argument("--grid-prompts", type=int, nargs="*", default=[])
    parser.add_argument("--attention", choices=["packed", "matmul"], default="matmul", help="the attention of parts 2 and 3")
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()

    import torch

    from pipelines.gpu.hardware import describe

    machine = describe()
    print(f"decode_probe: {machine['device']} ({'GPU' if torch.cuda.is_available() else 'CPU figures: no CUDA device here'})", flush=True)

    def log(row: dict) -> None:
        print(json.dumps(row), flush=True)

    report = {"machine": machine}
    if not args.skip_steps:
        report["steps"] = step_times(args.model, args.rows, args.prompt, args.steps, log)
    if args.grid_rows and args.grid_prompts:
        report["grid"] = grid_times(args.model, args.grid_rows, args.grid_prompts, args.steps, log, args.attention)
    if args.kernels:
        report["kernels"] = kernel_times(args.model, args.rows, args.prompt, args.kernels, log, attention=args.attention)
    if args.goals:
        report["evaluation"] = profiled_evaluation(args.model, args.goals, log)
    if args.out is not None:
        args.out.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
