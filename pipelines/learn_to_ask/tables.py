"""The Learn-to-Ask artifacts (``l2a_samples``, ``l2a_train``; ``calibration_runs`` is declared
with the calibration, :mod:`pipelines.learn_to_ask.calibration`) and the hindsight metrics.

``l2a_samples``: one row per assistant turn t of every session (key ``session_id``, ``turn``,
the index of a_t in the session's messages). ``context`` is the full prefix C_{t-1} and
``future`` the segment from a_t on (TRL conversational messages, ``list<struct<role,
content>>``); ``expert_reply`` is a_t; ``info_truth`` is I*_t as ``list<struct<field,
value>>`` and ``decision_truth`` s*_t (``continue`` / ``stop``). A dropped sample has
``failure`` (and ``failure_detail``) set, and no target when the extraction itself failed:
training reads the rows where ``failure`` is null.
"""

from __future__ import annotations

from collections import Counter
from statistics import fmean
from typing import Any, Iterable, Sequence

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, between, in_set, length_between
from pipelines.learn_to_ask.calibration import CALIBRATION_RUNS
from pipelines.learn_to_ask.hindsight import CONTINUE, DECISIONS, FAILURES, STOP, Sample
from pipelines.llm.client import FAILURE_REASONS
from pipelines.rewards.learn_to_ask import STOP_TOKEN
from pipelines.records import SPLITS

MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])
MESSAGES = pa.list_(MESSAGE)
INFO_ITEM = pa.struct([pa.field("field", pa.string(), nullable=False), pa.field("value", pa.string(), nullable=False)])
INFO = pa.list_(INFO_ITEM)
EXTRACTORS: tuple[str, ...] = ("rules", "hf", "openai")
ALL_FAILURES: tuple[str, ...] = FAILURES + tuple(f"llm_{reason}" for reason in FAILURE_REASONS)


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


L2A_SAMPLES = ArtifactSpec(
    name="l2a_samples",
    min_rows=1,
    description="Learn-to-Ask hindsight samples: full context C_{t-1}, future, target (I*_t, s*_t) or why it was dropped.",
    schema=pa.schema([
        _required("session_id", pa.string()),
        ("split", pa.string()),  # null when the source has no split
        _required("turn", pa.int32()),
        _required("goal", pa.string()),
        _required("context", MESSAGES),
        _required("future", MESSAGES),
        _required("expert_reply", pa.string()),
        ("info_truth", INFO),  # null when the extraction failed
        ("decision_truth", pa.string()),
        _required("extractor", pa.string()),
        ("failure", pa.string()),  # null: a usable sample
        ("failure_detail", pa.string()),
    ]),
    keys=("session_id", "turn"),
    expectations=(
        in_set("split", SPLITS),
        between("turn", 1, None),
        length_between("expert_reply", 1),
        in_set("decision_truth", DECISIONS),
        in_set("extractor", EXTRACTORS),
        in_set("failure", ALL_FAILURES),
    ),
)

L2A_TRAIN = ArtifactSpec(
    name="l2a_train",
    min_rows=1,
    description="Learn-to-Ask training rows (TRL prompt-completion + the l2a reward's columns): usable train/val samples.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),  # the session: the training hold-out key
        ("split", pa.string()),  # train / val, or null (a hash hold-out then)
        _required("step", pa.int32()),
        _required("prompt", MESSAGES),
        _required("completion", MESSAGES),
        _required("decision_truth", pa.string()),
        _required("info_truth", INFO),
    ]),
    keys=("dialogue_id", "step"),
    expectations=(in_set("split", ("train", "val")), in_set("decision_truth", DECISIONS), between("step", 1, None)),
)

L2A_EVAL = ArtifactSpec(
    name="l2a_eval",
    min_rows=1,
    description="Learn-to-Ask held-out outputs of each policy with their metric pieces (R_s, R_a, Omega, R; stage l2a_eval).",
    schema=pa.schema([
        _required("model", pa.string()),
        _required("session_id", pa.string()),
        _required("turn", pa.int32()),
        _required("decision_truth", pa.string()),
        _required("output", pa.string()),
        _required("decision", pa.string()),
        _required("correct", pa.float64()),  # R_s
        ("content", pa.float64()),  # R_a: null unless a right CONTINUE was graded
        _required("format", pa.float64()),  # Omega
        ("reward", pa.float64()),  # R: null when the grader could not score
        _required("reason", pa.string()),
    ]),
    keys=("model", "session_id", "turn"),
    expectations=(
        in_set("decision_truth", DECISIONS),
        in_set("decision", DECISIONS),
        in_set("correct", (0.0, 1.0)),
        in_set("content", (0.0, 0.5, 1.0)),
        in_set("format", (0.0, 0.5, 1.0)),
        between("reward", 0.0, None),
    ),
)

SPECS: dict[str, ArtifactSpec] = {s.name: s for s in (L2A_SAMPLES, L2A_TRAIN, L2A_EVAL, CALIBRATION_RUNS)}


def eval_table(rows: Sequence[dict[str, Any]]) -> pa.Table:
    """``l2a_eval`` rows: ``model``, ``session_id``, ``turn``, ``output`` and a
    :class:`~pipelines.learn_to_ask.metrics.Scored`'s fields."""
    columns = {name: [] for name in L2A_EVAL.schema.names}
    for row in rows:
        scored = row["scored"]
        values = {"model": row["model"], "session_id": row["session_id"], "turn": row["turn"], "output": row["output"],
                  "decision_truth": scored.truth, "decision": scored.decision, "correct": scored.correct,
                  "content": scored.content, "format": scored.fmt, "reward": scored.reward, "reason": scored.reason}
        for name in columns:
            columns[name].append(values[name])
    return pa.Table.from_pydict(columns, schema=L2A_EVAL.schema)


def train_table(samples: Sequence[Sample], system_prompt: str) -> pa.Table:
    """The usable samples outside the test split, for training: ``prompt`` is the policy's
    system prompt and the full context C_{t-1}; ``completion`` the SFT baseline's target,
    the expert's actual turn a_t (the stop token where s*_t is STOP, as the policy is asked
    to answer there); GRPO reads ``decision_truth`` and ``info_truth`` (reward ``l2a``)."""
    kept = [s for s in samples if s.failure is None and s.split != "test"]
    return pa.Table.from_pydict({
        "dialogue_id": [s.session_id for s in kept],
        "split": [s.split for s in kept],
        "step": [s.turn for s in kept],
        "prompt": [[{"role": "system", "content": system_prompt}, *_messages(s.context)] for s in kept],
        "completion": [[{"role": "assistant", "content": STOP_TOKEN if s.decision_truth == STOP else s.expert_reply}] for s in kept],
        "decision_truth": [s.decision_truth for s in kept],
        "info_truth": [[{"field": f, "value": v} for f, v in s.info_truth or ()] for s in kept],
    }, schema=L2A_TRAIN.schema)


def _messages(messages: Iterable[Any]) -> list[dict[str, str]]:
    return [{"role": m.role, "content": m.content} for m in messages]


def samples_table(samples: Sequence[Sample]) -> pa.Table:
    rows = {
        "session_id": [s.session_id for s in samples],
        "split": [s.split for s in samples],
        "turn": [s.turn for s in samples],
        "goal": [s.goal for s in samples],
        "context": [_messages(s.context) for s in samples],
        "future": [_messages(s.future) for s in samples],
        "expert_reply": [s.expert_reply for s in samples],
        "info_truth": [None if s.info_truth is None else [{"field": f, "value": v} for f, v in s.info_truth] for s in samples],
        "decision_truth": [s.decision_truth for s in samples],
        "extractor": [s.extractor for s in samples],
        "failure": [s.failure for s in samples],
        "failure_detail": [s.failure_detail for s in samples],
    }
    return pa.Table.from_pydict(rows, schema=L2A_SAMPLES.schema)


def hindsight_metrics(samples: Sequence[Sample], sessions: int) -> dict[str, Any]:
    """Counts of what the stage kept and dropped, a function of the inputs only."""
    kept = [s for s in samples if s.failure is None]
    decisions = Counter(s.decision_truth for s in kept)
    continuing = [len(s.info_truth or ()) for s in kept if s.decision_truth == CONTINUE]
    by_split: dict[str, dict[str, int]] = {}
    for s in kept:
        counts = by_split.setdefault(s.split or "none", {CONTINUE: 0, STOP: 0})
        counts[s.decision_truth or ""] += 1
    return {
        "sessions": sessions,
        "samples": len(samples),
        "kept": len(kept),
        "dropped": dict(sorted(Counter(s.failure for s in samples if s.failure is not None).items())),
        "decisions": {CONTINUE: decisions.get(CONTINUE, 0), STOP: decisions.get(STOP, 0)},
        "stop_rate": round(decisions.get(STOP, 0) / len(kept), 4) if kept else None,
        "info_items_per_continue": round(fmean(continuing), 4) if continuing else None,
        "by_split": dict(sorted(by_split.items())),
        "context_messages_mean": round(fmean(len(s.context) for s in kept), 4) if kept else None,
    }
