"""Machine-dependent figures stay out of everything DVC hashes: the stages' metrics and
their Parquet outputs are the same bytes on a second identical run (so `dvc metrics diff`
prints nothing), and the wall times go to reports/timings/ instead."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

#: Key names that hold clock readings or speeds.
TIMING_KEY = re.compile(r"(^|_)(s|sec|secs|seconds|time|runtime|wall|elapsed|latency)$|per_second|per_s$|throughput|^wall|latency")


def timing_keys(obj: Any, prefix: str = "") -> list[str]:
    """Every key path in ``obj`` (JSON-like) whose name looks like a clock reading or a speed."""
    found = []
    if isinstance(obj, dict):
        for key, value in obj.items():
            path = f"{prefix}.{key}" if prefix else str(key)
            if TIMING_KEY.search(str(key)):
                found.append(path)
            found += timing_keys(value, path)
    elif isinstance(obj, list):
        for i, value in enumerate(obj):
            found += timing_keys(value, f"{prefix}[{i}]")
    return found


def test_the_pattern_catches_the_figures_that_used_to_leak():
    leaked = {"models": {"sft": {"dialogues_per_second": 5.9, "wall_s": 8.4}}, "episodes_per_second": 182.0,
              "timing": {"train_s": 86.6}, "wall_seconds": 102.7, "latency_s": 0.1}
    assert timing_keys(leaked) == [
        "models.sft.dialogues_per_second", "models.sft.wall_s", "episodes_per_second", "timing.train_s", "wall_seconds", "latency_s",
    ]
    assert timing_keys({"success": {"mean": 0.1, "ci95": [0, 1]}, "turns": 9, "max_steps": 4, "stopped_by": "max_steps"}) == []


def test_gold_replay_hashes_the_same_bytes_twice_and_times_itself_apart(small_corpus_dir, tmp_path, timings_dir):
    import pyarrow.parquet as pq

    from pipelines.episodes import EPISODE_EVENTS, EPISODES
    from stages.gold_replay import run

    outputs = []
    for attempt in ("first", "second"):
        root = tmp_path / attempt
        params = {
            "source": str(small_corpus_dir), "seed": 0, "max_exchanges": 20,
            "output": str(root / "episodes"), "metrics": str(root / "gold_replay.json"),
        }
        run(params)
        outputs.append(root)
    first, second = outputs
    assert (first / "gold_replay.json").read_bytes() == (second / "gold_replay.json").read_bytes()
    for name in ("episodes.parquet", "episode_events.parquet"):
        assert (first / "episodes" / name).read_bytes() == (second / "episodes" / name).read_bytes(), name
    metrics = json.loads((first / "gold_replay.json").read_text())
    assert metrics["episodes"] > 0 and timing_keys(metrics) == []
    assert not [f.name for spec in (EPISODES, EPISODE_EVENTS) for f in spec.schema if TIMING_KEY.search(f.name)]
    assert not [n for n in pq.read_schema(first / "episodes" / "episode_events.parquet").names if TIMING_KEY.search(n)]

    timings = json.loads((Path(timings_dir) / "gold_replay.json").read_text())
    assert timings["stage"] == "gold_replay" and timings["episodes"] == metrics["episodes"] and timings["wall_s"] >= 0


def test_a_training_model_card_carries_no_wall_time():
    import inspect

    from pipelines.training.card import model_card

    assert "runtime_s" not in inspect.signature(model_card).parameters
