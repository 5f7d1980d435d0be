"""The Clarifier datasets as Parquet artifacts: Arrow schemas and expectation suites.

Conversational TRL layouts (messages as ``list<struct<role, content>>``); ``prompt`` is the
Clarifier prompt (appendix 7.1) with the dialogue so far. Every table has the hold-out key
``dialogue_id`` (the τ-bench task id) and ``split`` (train: retail train tasks; val: retail
dev tasks, held out by the training stages; never test).

``clarifier_sft``   prompt + completion (the teacher's think-mode answer); ``kind`` ask / no_need
``clarifier_dpo``   prompt + chosen + rejected, the judge's preference (A or B) and both finals
``clarifier_grpo``  prompt + ``history`` (x) + ``goal`` (G*, JSON) for the goal-aware reward;
                    ``screen`` is why the state was kept (A, B or BOTH_BAD)
"""

from __future__ import annotations

from typing import Any, Iterable

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, in_set, length_between, matches

MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])
MESSAGES = pa.list_(MESSAGE)
SPLITS = ("train", "val")


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


_COMMON = (_required("state_id", pa.string()), _required("dialogue_id", pa.string()), _required("split", pa.string()))
_COMMON_CHECKS = (in_set("split", SPLITS), matches("dialogue_id", r"^retail/(train|dev)/\d+$"), matches("state_id", r"#\d+@\d+$"))

CLARIFIER_SFT = ArtifactSpec(
    name="clarifier_sft",
    min_rows=1,
    description="One row per teacher consultation: the Clarifier prompt and the teacher's think-mode answer.",
    schema=pa.schema([*_COMMON, _required("tool_name", pa.string()), _required("prompt", MESSAGES),
                      _required("completion", MESSAGES), _required("kind", pa.string())]),
    keys=("state_id",),
    expectations=(*_COMMON_CHECKS, in_set("kind", ("ask", "no_need")), length_between("tool_name", 1)),
)

CLARIFIER_DPO = ArtifactSpec(
    name="clarifier_dpo",
    min_rows=1,
    description="Win/lose pairs of teacher candidates, judged against the task's ground truth (TIE and BOTH_BAD dropped).",
    schema=pa.schema([*_COMMON, _required("prompt", MESSAGES), _required("chosen", MESSAGES), _required("rejected", MESSAGES),
                      _required("chosen_final", pa.string()), _required("rejected_final", pa.string()),
                      _required("preference", pa.string())]),
    keys=("state_id",),
    expectations=(*_COMMON_CHECKS, in_set("preference", ("A", "B")), length_between("chosen_final", 1)),
)

CLARIFIER_GRPO = ArtifactSpec(
    name="clarifier_grpo",
    min_rows=1,
    description="Discriminative states (candidates differ or are both bad): the history x and the goal G* only.",
    schema=pa.schema([*_COMMON, _required("prompt", MESSAGES), _required("history", pa.string()),
                      _required("goal", pa.string()), _required("screen", pa.string())]),
    keys=("state_id",),
    expectations=(*_COMMON_CHECKS, in_set("screen", ("A", "B", "BOTH_BAD")), length_between("history", 1),
                  matches("goal", r'^\{.*"instruction".*\}$')),
)

SPECS: dict[str, ArtifactSpec] = {spec.name: spec for spec in (CLARIFIER_SFT, CLARIFIER_DPO, CLARIFIER_GRPO)}


def table(rows: Iterable[dict[str, Any]], spec: ArtifactSpec) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=spec.schema)
