"""The ``pir_traces`` artifact: one row per reasoning trace with its steps, their entropies,
the selected steps, the inserted pairs and the augmented trace.

``augmented_trace`` is what cold-start SFT trains on: ``<think>`` + the reasoning with the
``<asking>``/``<response>`` pairs + ``</think>`` + the final answer. ``assumption_steps`` is
null for traces read from a file (nobody knows them) and the known steps for askflow's
embedded traces (the fidelity check's ground truth).
"""

from __future__ import annotations

from typing import Any, Sequence

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, between, in_set, length_between
from pipelines.pir.entropy import SCOPES, StepScores
from pipelines.pir.insertion import Insertion, Skipped, insert_pairs
from pipelines.pir.traces import Trace, split_steps

THINK_OPEN, THINK_CLOSE = "<think>", "</think>"
_INTS = pa.list_(pa.int32())
_STRINGS = pa.list_(pa.string())


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


PIR_TRACES = ArtifactSpec(
    name="pir_traces",
    min_rows=1,
    keys=("trace_id",),
    description="PIR reasoning traces with step entropies (one shifted forward pass each), top-k% steps and inserted clarification pairs.",
    schema=pa.schema([
        _required("trace_id", pa.string()),
        _required("source", pa.string()),  # "embedded" or the input file
        ("dialogue_id", pa.string()),
        ("split", pa.string()),
        ("kind", pa.string()),
        _required("input", pa.string()),
        _required("reasoning_content", pa.string()),
        _required("content", pa.string()),
        _required("steps", _STRINGS),
        _required("step_entropies", pa.list_(pa.float64())),  # mean NLL per step (nats); null for a step without tokens
        _required("step_tokens", _INTS),
        _required("selected_steps", _INTS),
        ("assumption_steps", _INTS),
        _required("inserted_steps", _INTS),
        _required("questions", _STRINGS),
        _required("answers", _STRINGS),
        _required("skipped_reasons", _STRINGS),  # one per selected step that got no pair
        _required("n_insertions", pa.int32()),
        _required("augmented_reasoning", pa.string()),
        _required("augmented_trace", pa.string()),
        _required("teacher", pa.string()),
        _required("inserter", pa.string()),
        _required("k_percent", pa.float64()),
        _required("scope", pa.string()),
    ]),
    expectations=(
        length_between("trace_id", 1),
        length_between("reasoning_content", 1),
        length_between("augmented_trace", 1),
        length_between("teacher", 1),
        between("n_insertions", 0),
        between("k_percent", 0.0, 100.0),
        in_set("scope", SCOPES),
        in_set("split", ("train", "val")),
        in_set("inserter", ("rules", "openai")),
    ),
)

SPECS = {PIR_TRACES.name: PIR_TRACES}


def augmented_trace(augmented_reasoning: str, content: str) -> str:
    return f"{THINK_OPEN}\n{augmented_reasoning}\n{THINK_CLOSE}\n\n{content}"


def pir_rows(
    traces: Sequence[Trace], scores: Sequence[StepScores], selected: Sequence[Sequence[int]],
    pairs: Sequence[Sequence[Insertion | Skipped]], *, teacher: str, inserter: str, k_percent: float, scope: str,
) -> list[dict[str, Any]]:
    rows = []
    for trace, score, chosen, made in zip(traces, scores, selected, pairs):
        inserted = [p for p in made if isinstance(p, Insertion)]
        augmented = insert_pairs(trace.reasoning, inserted)
        rows.append({
            "trace_id": trace.trace_id, "source": trace.source, "dialogue_id": trace.dialogue_id, "split": trace.split,
            "kind": trace.kind, "input": trace.input, "reasoning_content": trace.reasoning, "content": trace.content,
            "steps": [trace.reasoning[a:b] for a, b in split_steps(trace.reasoning)],
            "step_entropies": list(score.entropies), "step_tokens": list(score.token_counts),
            "selected_steps": list(chosen),
            "assumption_steps": None if trace.assumption_steps is None else list(trace.assumption_steps),
            "inserted_steps": [p.step for p in inserted], "questions": [p.question for p in inserted],
            "answers": [p.answer for p in inserted], "skipped_reasons": [p.reason for p in made if isinstance(p, Skipped)],
            "n_insertions": len(inserted), "augmented_reasoning": augmented,
            "augmented_trace": augmented_trace(augmented, trace.content),
            "teacher": teacher, "inserter": inserter, "k_percent": float(k_percent), "scope": scope,
        })
    return rows


def pir_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=PIR_TRACES.schema)
