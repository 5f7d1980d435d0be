"""SpeakER's synthesis fanned out over workers as a Prefect flow (``speaker.fan_out``).

A seed dialogue's outcome (ambiguity points, plan, synthesized dialogue, success filter,
:func:`pipelines.speaker.pipeline.synthesize_seeds`) depends only on the seed and the settings.
With ``speaker.fan_out.workers`` n >= 1 the flow ``speaker-synthesis`` splits the seeds into
chunks of ``chunk_size`` and submits one task per chunk to the task runner of
:mod:`flows.runners` (threads for an openai synthesizer's overlapping requests, processes or a
Dask cluster for the CPU-bound rules synthesizer). Each task loads the corpus once per worker
process, builds its own synthesizer and LLM accounting, and returns its outcomes and counts;
the stage concatenates the outcomes in seed order, merges the counts and finishes in its own
process (the near-duplicate filter needs every seed), so the tables are those of one process.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines.config import FanOutSpec
from pipelines.env.tools import Database
from pipelines.llm import Accounting
from pipelines.llm.accounting import RoleUsage
from pipelines.records import Dialogue
from catalog.speaker import make_synthesizer, speaker_config
from pipelines.speaker.pipeline import SeedOutcome, synthesize_seeds
from pipelines.speaker.synthesis import LLMSynthesizer
from catalog.multiwoz_dir import load_multiwoz
from flows.runners import task_runner


@dataclass
class ChunkResult:
    outcomes: list[SeedOutcome]
    usage: dict[str, RoleUsage] = field(default_factory=dict)  # the chunk's LLM accounting
    seeds_sent: int = 0  # seeds an openai synthesizer handed to its client


@functools.lru_cache(maxsize=2)
def _corpus(source: str, db_dir: str | None) -> tuple[dict[str, Dialogue], Database]:
    """The seeds by id and the database, loaded once per worker process."""
    corpus = load_multiwoz(Path(source), db_dir)
    return {d.dialogue_id: d for d in corpus.dialogues}, Database(corpus.entities, corpus.taxi_options)


@task(name="synthesize-seeds", cache_policy=NO_CACHE, persist_result=False)
def synthesize_chunk(params_json: str, dialogue_ids: list[str]) -> ChunkResult:
    """The outcomes of the seeds ``dialogue_ids``, in that order, with the chunk's LLM counts."""
    params = json.loads(params_json)
    dialogues, database = _corpus(str(params["source"]), params.get("db_dir"))
    config = speaker_config(params)
    accounting = Accounting()
    synthesizer = make_synthesizer(params, database, config.seed, accounting)
    outcomes = synthesize_seeds([dialogues[i] for i in dialogue_ids], database, synthesizer, config)
    sent = synthesizer.stats.seeds_sent if isinstance(synthesizer, LLMSynthesizer) else 0
    return ChunkResult(outcomes, accounting.snapshot(), sent)


@flow(name="speaker-synthesis")
def speaker_synthesis(params_json: str, dialogue_ids: list[str], chunk_size: int) -> list[ChunkResult]:
    """One task per chunk of seeds; the chunks' results in seed order."""
    chunks = [dialogue_ids[i : i + chunk_size] for i in range(0, len(dialogue_ids), chunk_size)]
    get_run_logger().info("%d seeds in %d chunks", len(dialogue_ids), len(chunks))
    futures = [synthesize_chunk.submit(params_json, chunk) for chunk in chunks]
    return [f.result() for f in futures]


def run_fan_out(params: Mapping[str, Any], fan_out: FanOutSpec, dialogue_ids: Sequence[str]) -> ChunkResult:
    """The seeds' outcomes (in ``dialogue_ids`` order) and the merged counts, from the flow
    on ``fan_out``'s task runner."""
    params_json = json.dumps(dict(params), sort_keys=True, default=str)
    results = speaker_synthesis.with_options(task_runner=task_runner(fan_out, "speaker.fan_out"))(
        params_json, list(dialogue_ids), fan_out.chunk_size)
    merged = Accounting()
    for result in results:
        merged.merge(result.usage)
    return ChunkResult([o for r in results for o in r.outcomes], merged.snapshot(), sum(r.seeds_sent for r in results))
