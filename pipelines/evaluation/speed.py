"""How long a batched evaluation must take, read off its episodes: the sequential decode steps.

The batched runner plays every open dialogue in rounds: each round decodes the next agent call
of every dialogue waiting for one as one batch, and a batch's decoding lasts as many steps as
its longest reply has tokens. A step of a small model on a GPU costs about the same whatever
the batch (it is bound by Python and kernel launches), so an evaluation's wall time is close to
its number of sequential steps times the cost of one: for SmolLM2-135M on the H100 of
2026-11-26, 36.9 s for 1,414 steps (26.1 ms each) zero-shot and 72.8 s for 2,716 (26.8 ms)
after SFT. Splitting the goals between processes shortens the path only by the rounds and
replies the longest part still has (:func:`lockstep_steps` with ``parts``); no batching can go
below the longest single dialogue (:func:`longest_dialogue_steps`).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable, Mapping, Sequence

from pipelines.episodes.decoding import decode_stats


def agent_calls(events: Iterable[Mapping[str, Any]]) -> dict[str, list[int]]:
    """Each episode's agent calls in order, as their completion tokens (rows of an
    ``episode_events`` table: one agent event per call carries ``completion_tokens``).

    >>> agent_calls([{"episode_id": "a", "event_index": 1, "actor": "agent", "completion_tokens": 7},
    ...              {"episode_id": "a", "event_index": 0, "actor": "agent", "completion_tokens": 5},
    ...              {"episode_id": "a", "event_index": 2, "actor": "user", "completion_tokens": None}])
    {'a': [5, 7]}
    """
    calls: dict[str, list[tuple[int, int]]] = defaultdict(list)
    for row in events:
        if row["actor"] == "agent" and row.get("completion_tokens") is not None:
            calls[row["episode_id"]].append((row["event_index"], int(row["completion_tokens"])))
    return {episode: [tokens for _, tokens in sorted(found)] for episode, found in calls.items()}


def lockstep_steps(calls: Mapping[str, Sequence[int]], order: Sequence[str], parts: int = 1) -> int:
    """Sequential decode steps of the batched runner over the episodes ``order`` (play order)
    split into ``parts`` contiguous parts played side by side: per part, the sum over rounds of
    the round's longest reply; the longest part.

    >>> calls = {"a": [3, 5], "b": [4], "c": [2, 2, 9]}
    >>> lockstep_steps(calls, ["a", "b", "c"]), lockstep_steps(calls, ["a", "b", "c"], parts=3)
    (18, 13)
    """
    from pipelines.evaluation.play import shards

    def steps(part: Sequence[str]) -> int:
        rounds = max((len(calls[e]) for e in part), default=0)
        return sum(max(calls[e][r] for e in part if len(calls[e]) > r) for r in range(rounds))

    return max((steps(part) for part in shards(list(order), parts)), default=0)


def longest_dialogue_steps(calls: Mapping[str, Sequence[int]]) -> int:
    """The floor under any batching: the most tokens one dialogue's agent writes.

    >>> longest_dialogue_steps({"a": [3, 5], "b": [4], "c": [2, 2, 9]})
    13
    """
    return max((sum(tokens) for tokens in calls.values()), default=0)


def stats_since(before: Mapping[str, Any]) -> dict[str, Any]:
    """This process's decoding (:func:`~pipelines.episodes.decoding.decode_stats`) since ``before``."""
    now = decode_stats()
    counts = {key: value - before.get(key, 0) for key, value in now.items() if isinstance(value, int)}
    error = now.get("graph_error") if now.get("graph_error") != before.get("graph_error") else None
    return {**counts, **({"graph_error": error} if error else {})}


def decode_summary(decoded: Sequence[Mapping[str, Any]], wall_s: float, cuda_graphs: bool) -> dict[str, Any]:
    """A model's decoding over its processes: the sequential decode steps of the longest
    process (the evaluation's critical path), the wall time per such step (an upper bound on
    a step's latency: it includes the simulator, the prefills and, with workers, the model
    loads), the device's time where the decoder timed it (``device_s``), and with CUDA graphs
    how many calls captured one and how many ran eagerly.

    >>> decode_summary([{"calls": 3, "steps": 40}, {"calls": 2, "steps": 50}], 1.0, False)
    {'cuda_graphs': False, 'steps': 50, 'wall_ms_per_step': 20.0, 'steps_per_process': [40, 50]}

    Continuous batching also says where the wall time went: the device's prefills and steps,
    and the rest (the host's).

    >>> decode_summary([{"steps": 100, "step_us": 600_000, "prefill_us": 150_000, "prefill_tokens": 900}], 1.0, False)["device_s"]
    {'prefill': 0.15, 'steps': 0.6, 'ms_per_step': 6.0, 'prefill_tokens': 900, 'host': 0.25}

    And where its steps verified drafts, how many ids a row took per step.

    >>> decode_summary([{"steps": 10, "drafted_rows": 40, "drafted": 100, "draft_accepted": 30}], 1.0, False)["draft"]
    {'row_steps': 40, 'drafted_ids': 100, 'confirmed_ids': 30, 'confirmed_share': 0.3, 'ids_per_row_step': 1.75}
    """
    steps = [int(d.get("steps", 0)) for d in decoded]
    summary: dict[str, Any] = {"cuda_graphs": cuda_graphs, "steps": max(steps, default=0),
                               "wall_ms_per_step": round(1000 * wall_s / max(steps), 2) if steps and max(steps) else None,
                               "steps_per_process": steps}
    if any(d.get("step_us") for d in decoded):
        # continuous batching times its device work (pipelines.episodes.continuous.PhaseTimer):
        # what the wall time holds beyond it is the host's
        prefill_s, step_s = (sum(int(d.get(key, 0)) for d in decoded) / 1e6 for key in ("prefill_us", "step_us"))
        summary["device_s"] = {"prefill": round(prefill_s, 2), "steps": round(step_s, 2),
                               "ms_per_step": round(1000 * step_s / max(steps), 2) if steps and max(steps) else None,
                               "prefill_tokens": sum(int(d.get("prefill_tokens", 0)) for d in decoded),
                               "host": round(max(wall_s - prefill_s - step_s, 0.0), 2)}
    if any(d.get("drafted_rows") for d in decoded):
        # steps that verified prompt-lookup drafts (pipelines.episodes.continuous.SlotDecoder draft)
        rows, drafted, confirmed = (sum(int(d.get(key, 0)) for d in decoded) for key in ("drafted_rows", "drafted", "draft_accepted"))
        summary["draft"] = {"row_steps": rows, "drafted_ids": drafted, "confirmed_ids": confirmed,
                            "confirmed_share": round(confirmed / drafted, 3) if drafted else None,
                            "ids_per_row_step": round((rows + confirmed) / rows, 3)}
    if cuda_graphs:
        summary["graphs"] = sum(int(d.get("graphs", 0)) for d in decoded)
        summary["graph_failures"] = sum(int(d.get("graph_failures", 0)) for d in decoded)
        summary["not_static"] = sum(int(d.get("not_static", 0)) for d in decoded)
        errors = [d["graph_error"] for d in decoded if d.get("graph_error")]
        if errors:
            summary["graph_error"] = errors[0]
    return summary


__all__ = ["agent_calls", "decode_summary", "lockstep_steps", "longest_dialogue_steps", "stats_since"]
