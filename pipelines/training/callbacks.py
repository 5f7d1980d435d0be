"""Trainer callbacks: progress into a logger (the Prefect run logger in a flow), a
wall-clock budget, and the per-step curves read back from the trainer's log history."""

from __future__ import annotations

import logging
import math
import time
from typing import Any, Mapping, Sequence

from transformers import TrainerCallback

from pipelines.progress import EVERY_S, Progress

#: The curve columns of each method, as TRL logs them (GRPO's per-reward columns are added
#: from the reward names). Missing values stay empty.
CURVE_COLUMNS: dict[str, tuple[str, ...]] = {
    "sft": ("loss", "learning_rate", "grad_norm", "mean_token_accuracy", "entropy"),
    "dpo": ("loss", "learning_rate", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected"),
    "kto": ("loss", "learning_rate", "rewards/chosen", "rewards/rejected", "kl"),
    "grpo": ("loss", "learning_rate", "reward", "reward_std", "kl", "entropy", "completions/mean_length", "frac_reward_zero_std"),
}

_SHOWN = ("loss", "reward", "rewards/margins", "mean_token_accuracy", "kl", "learning_rate")


def _fmt(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


class LoggingCallback(TrainerCallback):
    """Logs the start, every logging step (step, progress, the main metrics, speed) and the
    end of training to ``logger``; and, between logging steps, the steps done with an estimate
    of the time left at least every ``every_s`` seconds (:class:`pipelines.progress.Progress`)."""

    def __init__(self, logger: logging.Logger | logging.LoggerAdapter, label: str, extra_keys: Sequence[str] = (),
                 every_s: float = EVERY_S):
        self.logger = logger
        self.label = label
        self.keys = tuple(dict.fromkeys((*_SHOWN, *extra_keys)))
        self.every_s = every_s
        self._started = 0.0
        self._progress: Progress | None = None

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.monotonic()
        self.logger.info("%s: training for at most %d steps", self.label, state.max_steps)
        if self._progress is not None:
            self._progress.close()
        self._progress = Progress(state.max_steps, f"{self.label} training", unit="steps", every_s=self.every_s,
                                  emit=lambda line: self.logger.info("%s", line)).__enter__()

    def on_step_end(self, args, state, control, **kwargs):
        if self._progress is not None:
            self._progress.update(state.global_step, state.max_steps)

    def on_log(self, args, state, control, logs=None, **kwargs):
        logs = logs or {}
        if "train_runtime" in logs:
            return
        shown = " ".join(f"{k}={_fmt(logs[k])}" for k in self.keys if k in logs)
        elapsed = time.monotonic() - self._started
        rate = state.global_step / elapsed if elapsed > 0 else 0.0
        self.logger.info(
            "%s: step %d/%d (%.0f%%) %s [%.1f s, %.2f steps/s]",
            self.label, state.global_step, state.max_steps, 100 * state.global_step / max(state.max_steps, 1),
            shown, elapsed, rate,
        )

    def on_train_end(self, args, state, control, **kwargs):
        if self._progress is not None:
            self._progress.close()
            self._progress = None
        self.logger.info("%s: finished at step %d in %.1f s", self.label, state.global_step, time.monotonic() - self._started)


class TimeBudget(TrainerCallback):
    """Stops training at the first step boundary after ``max_time_s`` seconds of it.
    ``stopped`` says whether the budget, rather than ``max_steps``, ended the run."""

    def __init__(self, max_time_s: float | None):
        self.max_time_s = max_time_s
        self.stopped = False
        self._started = 0.0

    def on_train_begin(self, args, state, control, **kwargs):
        self._started = time.monotonic()

    def on_step_end(self, args, state, control, **kwargs):
        if self.max_time_s is not None and time.monotonic() - self._started >= self.max_time_s:
            if state.global_step < state.max_steps:
                self.stopped = True
            control.should_training_stop = True
            control.should_log = True  # the last step's metrics still reach the curve
        return control


def curve_rows(log_history: Sequence[Mapping[str, Any]], columns: Sequence[str]) -> list[dict[str, Any]]:
    """One row per logged training step: ``step``, ``epoch`` and ``columns`` (None where a
    step did not log one). The trainer's end-of-training summary is left out."""
    rows = []
    for entry in log_history:
        if "train_runtime" in entry or "step" not in entry or not any(c in entry for c in columns):
            continue
        row: dict[str, Any] = {"step": entry["step"], "epoch": entry.get("epoch")}
        for column in columns:
            value = entry.get(column)
            row[column] = None if isinstance(value, float) and not math.isfinite(value) else value
        rows.append(row)
    return rows


__all__ = ["CURVE_COLUMNS", "LoggingCallback", "TimeBudget", "curve_rows"]
