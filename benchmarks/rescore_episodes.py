"""Clarification questions of played episodes read again with today's checks
(:func:`pipelines.evaluation.metrics.clarification_checks`), per model.

    python benchmarks/rescore_episodes.py reports/gpu/<run>/evaluate [--source data/raw/embedded_multiwoz] [--out FILE]

Reads ``episodes.parquet`` and ``episode_events.parquet`` of an evaluation (the CPU stage's or
the GPU job's), the goals from the corpus they were played on, and prints per model the
questions, the needless ones and their share, and the checks' reasons. Used when a check
changes after a run (issue 26: questions read per domain, not over the whole goal), so that
a committed run is read with the current definition beside the one it was reported with.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("episodes", type=Path, help="folder with episodes.parquet and episode_events.parquet")
    parser.add_argument("--source", default="data/raw/embedded_multiwoz", help="the corpus the goals come from")
    parser.add_argument("--out", type=Path, default=None, help="also write the figures here (JSON)")
    args = parser.parse_args()

    import pyarrow.parquet as pq

    from catalog.multiwoz_dir import load_multiwoz
    from pipelines.episodes.records import EpisodeEvent
    from pipelines.evaluation.metrics import clarification_checks

    goals = {d.dialogue_id: d.goal for d in load_multiwoz(Path(args.source)).dialogues}
    episodes = pq.read_table(args.episodes / "episodes.parquet").to_pylist()
    events: dict[str, list[EpisodeEvent]] = defaultdict(list)
    for row in pq.read_table(args.episodes / "episode_events.parquet").to_pylist():
        events[row["episode_id"]].append(EpisodeEvent(**row))
    figures: dict[str, dict] = {}
    for episode in episodes:
        played = type("Played", (), {"events": sorted(events[episode["episode_id"]], key=lambda e: e.event_index)})
        checks = clarification_checks(played, goals[episode["dialogue_id"]])
        model = figures.setdefault(episode["agent"], {"episodes": 0, "questions": 0, "needless": 0, "reasons": Counter()})
        model["episodes"] += 1
        model["questions"] += len(checks)
        model["needless"] += sum(c.needless for c in checks)
        model["reasons"].update(c.reason for c in checks)
    for name, model in figures.items():
        model["needless_share"] = round(model["needless"] / model["questions"], 4) if model["questions"] else None
        model["needless_per_dialogue"] = round(model["needless"] / model["episodes"], 4)
        model["reasons"] = dict(sorted(model["reasons"].items()))
        print(json.dumps({"model": name, **model}))
    if args.out is not None:
        args.out.write_text(json.dumps(figures, indent=2) + "\n", encoding="utf-8")


if __name__ == "__main__":
    main()
