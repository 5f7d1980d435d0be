"""A training run whose sources hold no rows: nothing to train on, said in the stage's outputs.

A section with ``allow_empty: true`` (JOSH's ``train.josh_*``: a harvest can have no golden
path) ends such a run without loading anything: the stage writes the model directory with only
``NOT_TRAINED.json`` (never a copy of the start model, so nothing evaluates it as a trained
model), the metrics report says ``trained: false`` with the reason, and the curve has its
header only. Any other section with no rows is an error naming the files.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping

import pyarrow.parquet as pq

from pipelines.errors import ConfigError, DataError
from pipelines.training.config import TrainConfig

#: The file that marks a model directory whose run had nothing to train on.
NOT_TRAINED = "NOT_TRAINED.json"


def source_rows(config: TrainConfig) -> dict[str, int]:
    """Rows per source file (from the Parquet footers; the files were checked by preflight's
    ``check_data``)."""
    rows: dict[str, int] = {}
    for source in config.data.sources:
        try:
            rows[source.path] = rows.get(source.path, 0) + pq.read_metadata(source.path).num_rows
        except (OSError, ValueError) as exc:
            raise ConfigError(f"{config.method}: dataset {source.path!r} is not readable Parquet: {exc}") from None
    return rows


def no_rows_reason(rows: Mapping[str, int], source_report: str | None = None,
                   report: Mapping[str, Any] | None = None) -> str:
    """Why nothing was trained: the sources' row counts and, when the report of the stage that
    wrote them says why it had none (its ``no_training_data``), that.

    >>> no_rows_reason({"d/josh_sft.parquet": 0})
    '0 training rows in d/josh_sft.parquet'
    >>> no_rows_reason({"a.parquet": 0}, "r.json", {"no_training_data": "0 golden paths"})
    '0 training rows in a.parquet (r.json: 0 golden paths)'
    """
    reason = f"0 training rows in {', '.join(rows)}"
    why = (report or {}).get("no_training_data")
    if why:
        reason += f" ({source_report}: {why})"
    return reason


def check_start_model(config: TrainConfig) -> None:
    """A start model that was itself not trained (its directory holds ``NOT_TRAINED.json``) is
    an error that says so, rather than a missing ``config.json``."""
    if config.model.path is None:
        return
    marker = Path(config.model.path) / NOT_TRAINED
    if marker.is_file():
        try:
            why = json.loads(marker.read_text()).get("reason", "")
        except (OSError, ValueError, AttributeError):
            why = "unreadable note"
        raise DataError(str(marker), f"the start model {config.model.path!r} was not trained ({why}); there is no model to continue from")


def not_trained_records(config: TrainConfig, rows: Mapping[str, int], reason: str, *, section: str,
                        source_report: str | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """``NOT_TRAINED.json``'s record and the metrics report (``trained: false``) of a run with
    no rows; the stage writes them (the model directory holds the note alone)."""
    note = {"trained": False, "reason": reason, "rows": dict(rows), "source_report": source_report,
            "start_model": config.model.path or config.model.hub_id}
    report = {"method": config.method, "section": section, **note, "model_dir": config.output.model_dir,
              "model": {"start": config.model.path or config.model.hub_id},
              "data": {"sources": {path: {"rows": n} for path, n in rows.items()}, "train_examples": 0}}
    return note, report


#: The curve of a run that took no step: its header.
EMPTY_CURVE = "step,epoch,loss\n"

__all__ = ["EMPTY_CURVE", "NOT_TRAINED", "check_start_model", "no_rows_reason", "not_trained_records", "source_rows"]
