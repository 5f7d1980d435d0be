"""What a run reports: ``reports/train/<method>.json`` (DVC metrics) and the per-step curve
(``<method>_curve.csv``, a DVC plot).

The metrics are a function of the inputs (data, params, code): wall-clock timings go to
the flow's log and the model card, not here. The exception is a run that a time budget
stopped (``train.stopped_by``), which the report says plainly.
"""

from __future__ import annotations

import csv
import io
import math
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from pipelines.training.config import TrainConfig
from pipelines.training.data import SourceRows
from pipelines.training.config import DeviceSpec


@dataclass(frozen=True)
class TrainSummary:
    """What came out of ``trainer.train()``."""

    steps: int
    max_steps: int
    stopped_by: str  # "max_steps" | "time_budget"
    epochs: float
    mean_loss: float | None
    final_loss: float | None
    runtime_s: float
    curve: tuple[dict[str, Any], ...]


#: Metric names that count examples: not compared before/after.
COUNTS = frozenset({"n", "n_pairs", "n_desirable", "n_undesirable", "n_tool_calls", "n_questions", "n_clarify_needed", "n_act_here"})


def _finite(value: Any) -> Any:
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value


def flatten(metrics: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in metrics.items():
        if isinstance(value, Mapping):
            flat.update(flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat


def deltas(before: Mapping[str, Any], after: Mapping[str, Any]) -> dict[str, float]:
    """``after - before`` for every numeric metric measured both times (counts excluded)."""
    flat_before, flat_after = flatten(before), flatten(after)
    out = {}
    for name, value in flat_after.items():
        old = flat_before.get(name)
        if name.rsplit(".", 1)[-1] in COUNTS:
            continue
        if isinstance(value, (int, float)) and isinstance(old, (int, float)) and not isinstance(value, bool):
            difference = _finite(float(value) - float(old))
            if difference is not None:
                out[name] = difference
    return out


def training_report(
    config: TrainConfig,
    device: DeviceSpec,
    parameters: Mapping[str, int],
    sources: Sequence[SourceRows],
    train_examples: int,
    summary: TrainSummary,
    before: Mapping[str, Any] | None,
    after: Mapping[str, Any],
) -> dict[str, Any]:
    report = {
        "method": config.method,
        "model": {
            "start": config.model.name_or_path,
            "lora": config.model.lora is not None,
            "parameters": parameters["total"],
            "trainable_parameters": parameters["trainable"],
        },
        "device": {"accelerator": device.accelerator, "bf16": device.bf16, "gradient_checkpointing": device.gradient_checkpointing},
        "data": {
            "sources": {s.name: dict(s.stats) for s in sources},
            "train_examples": train_examples,
        },
        "train": {
            "steps": summary.steps,
            "max_steps": summary.max_steps,
            "stopped_by": summary.stopped_by,
            # False only when a user-set time cap (optim.max_time_s) ended the run before max_steps.
            "complete": summary.stopped_by != "time_budget",
            "epochs": _finite(summary.epochs),
            "mean_loss": _finite(summary.mean_loss),
            "final_loss": _finite(summary.final_loss),
        },
        "eval": {"after": _clean(after)},
    }
    if before is not None:
        report["eval"]["before"] = _clean(before)
        report["eval"]["delta"] = deltas(before, after)
    return report


def _clean(metrics: Any) -> Any:
    """NaN and infinity are not JSON (and DVC refuses them): they become null."""
    if isinstance(metrics, Mapping):
        return {k: _clean(v) for k, v in metrics.items()}
    return _finite(metrics)


def learning_signal(curve: Sequence[Mapping[str, Any]], groups_per_step: int) -> dict[str, Any]:
    """GRPO's learning signal from its curve (TRL's ``frac_reward_zero_std``, the share of a
    step's groups whose completions all got the same reward, averaged over each logging
    interval): how many groups had zero reward variance out of how many. A group with zero
    variance has zero advantage and gives no gradient; ``no_signal`` when every group did.

    >>> learning_signal([{"step": 1, "frac_reward_zero_std": 1.0}, {"step": 2, "frac_reward_zero_std": 0.5}], 4)
    {'groups': 8, 'zero_variance_groups': 6, 'no_signal': False, 'logged_steps': 2}
    >>> learning_signal([{"step": 2, "frac_reward_zero_std": 1.0}], 2)["no_signal"]
    True
    """
    groups = zero = 0.0
    previous = 0
    logged = 0
    for row in curve:
        fraction = row.get("frac_reward_zero_std")
        if fraction is None:
            continue
        steps = int(row["step"]) - previous
        previous = int(row["step"])
        groups += steps * groups_per_step
        zero += fraction * steps * groups_per_step
        logged += 1
    return {"groups": int(round(groups)), "zero_variance_groups": int(round(zero)),
            "no_signal": groups > 0 and round(zero) >= round(groups), "logged_steps": logged}


def curve_csv(rows: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> str:
    """The curve as CSV: ``step``, ``epoch`` and ``columns`` ('/' becomes '_' in headers, for
    plotting tools), empty cells where a step did not log a value."""
    buffer = io.StringIO()
    writer = csv.writer(buffer, lineterminator="\n")
    writer.writerow(["step", "epoch", *(c.replace("/", "_") for c in columns)])
    for row in rows:
        writer.writerow([_cell(row.get("step")), _cell(row.get("epoch")), *(_cell(row.get(c)) for c in columns)])
    return buffer.getvalue()


def _cell(value: Any) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        return "" if not math.isfinite(value) else f"{value:.6g}"
    return str(value)


__all__ = ["TrainSummary", "curve_csv", "deltas", "flatten", "training_report"]
