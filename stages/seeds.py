"""DVC stage ``seeds``: a MultiWOZ-layout directory → validated Parquet artifacts.

params.yaml ``seeds``: source (the embedded corpus directory, or any MultiWOZ 2.x
directory), optionally db_dir (a database directory apart from the source), strict
(default false), output (directory of the Parquet files), report (validation report) and
metrics. Nothing is written unless every table passes its expectation suite.

Real data has oddities that should not block a corpus of thousands of dialogues: unknown
domain-goal fields (skipped, in ``dialogues.ignored``), missing annotations (in
``dialogues.missing``) and split-list ids that name no dialogue (a warning). The
validation report's ``input`` section counts each kind; ``strict: true`` stops the stage
on an unknown goal field or split id instead, before anything is written.
An unknown key or a value of the wrong type stops the stage with
``error: params.yaml seeds.<key>: ...``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from pipelines.multiwoz.tables import corpus_tables
from pipelines.records import Corpus
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic
from pipelines.config import from_params
from catalog import datasets
from catalog.multiwoz_dir import SHOW_IDS, load_multiwoz


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
        "dialogues_ignored": dict(sorted(Counter(path for d in corpus.dialogues for path in d.ignored).items())),
        "unknown_split_ids": {name: len(ids) for name, ids in sorted(corpus.unknown_split_ids.items())},
    }


def tolerated(corpus: Corpus, strict: bool, show: int = SHOW_IDS) -> dict:
    """The validation report's ``input`` section: every oddity of the source that was
    loaded around rather than refused, counted by kind, with the details behind each count.

    Kinds: ``unknown_goal_field`` (one per dialogue and field), ``unknown_split_id`` (one per
    id), and ``missing:<field>`` (one per dialogue lacking that annotation)."""
    ignored = Counter(path for d in corpus.dialogues for path in d.ignored)
    missing = Counter(field for d in corpus.dialogues for field in d.missing)
    kinds = {
        "unknown_goal_field": sum(ignored.values()),
        "unknown_split_id": sum(len(ids) for ids in corpus.unknown_split_ids.values()),
        **{f"missing:{field}": n for field, n in sorted(missing.items())},
    }
    return {
        "source": corpus.source,
        "strict": strict,
        "tolerated": kinds,
        "unknown_goal_fields": dict(sorted(ignored.items())),
        "unknown_split_ids": {
            name: {"count": len(ids), "first": list(ids[:show])} for name, ids in sorted(corpus.unknown_split_ids.items())
        },
    }


@dataclass(frozen=True)
class SeedsParams:
    source: str
    output: str
    db_dir: str | None = None
    strict: bool = False
    report: str | None = None
    metrics: str | None = None


def run(params: Mapping[str, Any]) -> dict:
    config = from_params(SeedsParams, params, "params.yaml seeds")
    source, output = Path(config.source), Path(config.output)
    strict = config.strict
    corpus = load_multiwoz(source, config.db_dir, strict=strict)
    tables = corpus_tables(corpus)
    notes = tolerated(corpus, strict)
    datasets.save(tables, config, report=config.report or None, notes={"input": notes})
    metrics = summary(corpus)
    if config.metrics:
        write_json_atomic(Path(config.metrics), metrics)
    print(f"seeds: {metrics['dialogues']} dialogues, {metrics['turns']} turns from {source} -> {output}")
    odd = ", ".join(f"{kind} {n}" for kind, n in notes["tolerated"].items() if n)
    if odd:
        print(f"seeds: tolerated in the input (see the validation report's 'input'): {odd}")
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("seeds"))


if __name__ == "__main__":
    main()
