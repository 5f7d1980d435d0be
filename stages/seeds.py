"""DVC stage ``seeds``: a MultiWOZ-layout directory → validated Parquet artifacts.

params.yaml ``seeds``: source (the embedded corpus directory, or any MultiWOZ 2.x
directory), optionally db_dir (a database directory apart from the source), output
(directory of the Parquet files), report (validation report) and metrics.
Nothing is written unless every table passes its expectation suite. An unknown key or a
value of the wrong type stops the stage with ``error: params.yaml seeds.<key>: ...``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipelines.multiwoz.tables import SPECS, corpus_tables
from pipelines.records import Corpus
from stages.io import from_params, main_wrapper, publish, read_params, write_json_atomic
from stages.multiwoz_dir import load_multiwoz


def summary(corpus: Corpus) -> dict:
    """Counts for reports/seeds.json (DVC metrics)."""
    missing = Counter(field for d in corpus.dialogues for field in d.missing)
    return {
        "dialogues": len(corpus.dialogues),
        "turns": sum(len(d.turns) for d in corpus.dialogues),
        "splits": dict(sorted(Counter(d.split for d in corpus.dialogues).items())),
        "goal_domains": dict(sorted(Counter(g.domain for d in corpus.dialogues for g in d.goal.domains).items())),
        "multi_domain_dialogues": sum(1 for d in corpus.dialogues if len(d.goal.domains) > 1),
        "entities": {domain: len(items) for domain, items in sorted(corpus.entities.items())},
        "dialogues_missing": dict(sorted(missing.items())),
    }


@dataclass(frozen=True)
class SeedsParams:
    source: str
    output: str
    db_dir: str | None = None
    report: str | None = None
    metrics: str | None = None


def run(params: Mapping[str, Any]) -> dict:
    config = from_params(SeedsParams, params, "params.yaml seeds")
    source, output = Path(config.source), Path(config.output)
    corpus = load_multiwoz(source, config.db_dir)
    tables = corpus_tables(corpus)
    publish(
        {output / f"{name}.parquet": (table, SPECS[name]) for name, table in tables.items()},
        Path(config.report) if config.report else None,
    )
    metrics = summary(corpus)
    if config.metrics:
        write_json_atomic(Path(config.metrics), metrics)
    print(f"seeds: {metrics['dialogues']} dialogues, {metrics['turns']} turns from {source} -> {output}")
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("seeds"))


if __name__ == "__main__":
    main()
