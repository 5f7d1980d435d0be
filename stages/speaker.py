"""DVC stage ``speaker``: MultiWOZ seed dialogues -> the SpeakER datasets (SpeakRL section 3.4).

params.yaml ``speaker``:

* ``source`` (a MultiWOZ-layout directory) and optionally ``db_dir``;
* ``synthesizer``: the backend, ``{backend: rules}`` (offline default) or ``{backend: openai,
  base_url, model, ..., sampling: {...}}`` (any OpenAI-compatible endpoint; see
  :class:`pipelines.llm.ClientConfig`);
* ``seed``, ``max_clarifications``, ``dedup: {threshold, ngram}``, ``act_points`` (act-here
  decision points per dialogue for the GRPO and DPO data), ``contrast_points`` (contrasts per
  dialogue for the SFT data: a clarification's situation with the asked slot stated);
* ``output`` (directory of the Parquet files), ``metrics`` (JSON: counts that depend on the
  inputs only, with ``audit``: the ``speaker_sft`` rows by kind, :mod:`pipelines.speaker.audit`; the run's LLM accounting goes to ``reports/timings/speaker.json``), ``cache_dir``
  (LLM response cache; a re-run with unchanged inputs sends no request);
* ``max_llm_failure_rate`` (default 0.05): more failed LLM calls than this (the model's own
  invalid output included: a reply that does not validate, or makes no playable dialogue) is
  an outage, and the stage exits non-zero without publishing;
* ``min_yield`` (default 0.5): the least share of the planned seeds (those with an ambiguity
  point, in a domain with tools) that must end as kept dialogues; below it the stage exits
  non-zero without publishing (the rules backend keeps about 0.83 of them on the embedded corpus);
* ``fan_out`` (:class:`pipelines.config.FanOutSpec`, default ``workers: 0``, in process): the
  seeds' synthesis as the Prefect flow ``speaker-synthesis`` (:mod:`flows.speaker`), chunks of
  ``chunk_size`` seeds on ``workers`` thread / process workers or a Dask cluster; the tables
  are the same bytes as in process.

Only train and val seeds are synthesized; nothing is written unless every table passes its
expectation suite (which requires rows) and no table holds a test-split dialogue id (the leak check).
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path

from pipelines.config import rate
from pipelines.artifacts.leakage import check_no_test_dialogues
from pipelines.env.tools import Database
from pipelines.errors import LowYield
from pipelines.llm import Accounting
from pipelines.llm.accounting import check_failure_rate
from pipelines.records import TEST
from pipelines.speaker.audit import audit_sft
from catalog.speaker import make_synthesizer, speaker_config
from pipelines.speaker.pipeline import SpeakerResult, finish_speaker, synthesize_seeds
from pipelines.speaker.synthesis import LLMSynthesizer
from pipelines.speaker.tables import speaker_tables
from pipelines.progress import Progress
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from catalog import datasets
from catalog.multiwoz_dir import load_multiwoz



def run(params: dict) -> dict:
    config = speaker_config(params)
    source, output, metrics_path = Path(config.source), Path(config.output), Path(config.metrics)
    fan_out = config.fan_out
    max_failure_rate = rate(config.max_llm_failure_rate, "params.yaml speaker.max_llm_failure_rate")
    min_yield = rate(config.min_yield, "params.yaml speaker.min_yield")
    started = time.perf_counter()
    # A line at least every 30 s while it loads, synthesizes and filters (here, or fanned out).
    with Progress(None, "speaker", unit="seeds") as progress:
        corpus = load_multiwoz(source, config.db_dir)
        database = Database(corpus.entities, corpus.taxi_options)
        accounting = Accounting()
        synthesizer = make_synthesizer(config, database, config.seed, accounting)
        loaded = time.perf_counter()
        if fan_out.workers:
            from flows.local_api import local_prefect_api
            from flows.speaker import run_fan_out
            from stages.common import configure_prefect

            configure_prefect(Path.cwd())
            with local_prefect_api(os.environ["PREFECT_HOME"]):  # cleans up after a killed run
                fanned = run_fan_out(params, fan_out, [d.dialogue_id for d in corpus.dialogues if d.split in config.splits])
            accounting.merge(fanned.usage)
            if isinstance(synthesizer, LLMSynthesizer):
                synthesizer.stats.seeds_sent += fanned.seeds_sent
            outcomes = fanned.outcomes
        else:
            progress.update(0, sum(1 for d in corpus.dialogues if d.split in config.splits))
            outcomes = synthesize_seeds(corpus.dialogues, database, synthesizer, config, on_seed=progress.advance)
        result = finish_speaker(outcomes, synthesizer.name, database, config)
    check_failure_rate(accounting, max_failure_rate, "speaker", count_invalid_output=True)
    check_yield(result, min_yield)
    tables = speaker_tables(result)
    test_ids = {dialogue_id for dialogue_id, split in corpus.splits.items() if split == TEST}
    check_no_test_dialogues(
        {str(datasets.path(name, config)): table.column("dialogue_id").to_pylist() for name, table in tables.items()}, test_ids
    )
    synthesized = time.perf_counter()
    datasets.save(tables, config)

    metrics = result.metrics()
    metrics["rows"] = {name: table.num_rows for name, table in tables.items()}
    metrics["audit"] = audit_sft(tables["speaker_sft"].to_pylist())
    write_json_atomic(metrics_path, metrics)
    done = time.perf_counter()
    # Timings and the run's LLM accounting (requests, retries, cache hits, tokens: they depend
    # on the server's faults and the cache's state) go to the log and reports/timings/, not to
    # the metrics: metrics stay a function of the inputs, and `dvc metrics diff` is empty
    # between two runs that produced the same data.
    llm = {**accounting.as_dict(), **({"synthesizer": synthesizer.stats.as_dict()} if isinstance(synthesizer, LLMSynthesizer) else {})}
    write_timings("speaker", {"load_s": round(loaded - started, 2), "synthesis_s": round(synthesized - loaded, 2),
                              "publish_s": round(done - synthesized, 2), "wall_s": round(done - started, 2), "llm": llm})
    print(
        f"speaker: {metrics['seeds']} seeds -> {metrics['dialogues']['kept']} dialogues kept, "
        f"{metrics['clarifications']['total']} clarifications, {metrics['dpo']['pairs']} DPO pairs "
        f"({metrics['rows']['speaker_sft']} SFT rows) -> {output} "
        f"[load {loaded - started:.1f}s, synthesis+tables {synthesized - loaded:.1f}s, publish {done - synthesized:.1f}s]"
    )
    return metrics


def check_yield(result: SpeakerResult, min_yield: float) -> None:
    """Raise ``LowYield`` when fewer than ``min_yield`` of the planned seeds became kept dialogues."""
    planned = sum(1 for outcome in result.outcomes if outcome.plan is not None)
    kept = len(result.kept)
    if planned and kept / planned < min_yield:
        drops = Counter(o.drop_reason for o in result.outcomes if o.plan is not None and not o.kept)
        detail = ", ".join(f"{reason}: {count}" for reason, count in sorted(drops.items()))
        raise LowYield(
            f"speaker: {kept} of {planned} planned seeds made a kept dialogue ({kept / planned:.0%}), less than "
            f"params.yaml speaker.min_yield ({min_yield:.0%}); dropped: {detail}; nothing was published"
        )


@main_wrapper
def main() -> None:
    run(read_params("speaker"))


if __name__ == "__main__":
    main()
