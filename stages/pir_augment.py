"""DVC stage ``pir_augment``: reasoning traces -> ``pir_traces`` (PIR section 3.1.1).

params.yaml ``pir``:

* ``traces``: a PIR-layout file (``.jsonl``, ``.json`` array or ``.parquet``; records with
  string ``input``, ``reasoning_content``, ``content`` and an optional ``id``), or null for
  askflow's embedded traces, built by the rules teacher from ``source`` (a MultiWOZ-layout
  directory; ``db_dir`` optional) with ``seed``, at most ``max_traces``;
* ``teacher``: the scoring model, ``{backend: hf, model_path, device, dtype, batch_size}``
  (traces per forward pass); ``threads``: torch CPU threads;
* ``top_k_percent`` and ``scope`` (``trace``: k % of each trace's steps, at least one;
  ``corpus``: k % of all steps, ranked together);
* ``inserter``: ``{backend: rules}`` (embedded traces only: a question written from each
  selected step, answered from the simulated user's goal; never the ground truth) or ``{backend: openai, ...}``
  with the paper's insertion prompt; ``cache_dir`` and ``max_llm_failure_rate`` for it;
* ``output`` (directory of ``pir_traces.parquet``) and ``metrics`` (JSON).

A bad trace file stops the stage with the file, record and field; nothing is written unless
the table passes its expectation suite.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

from pipelines.config import from_params, positive_int
from pipelines.env.tools import Database
from pipelines.errors import ConfigError, DataError
from pipelines.llm import Accounting, BackendConfig, HFBackend, LLMClient, ResponseCache
from pipelines.llm.accounting import check_failure_rate
from pipelines.pir.insertion import LLMInserter, RulesInserter
from pipelines.pir.entropy import StepScorer
from pipelines.pir.pipeline import PirConfig, run_pir
from pipelines.pir.tables import pir_table
from pipelines.pir.traces import Trace, build_traces, traces_from_records
from pipelines.progress import Progress
from stages.entry import main_wrapper
from catalog.io import read_jsonl, read_parquet, read_params, write_json_atomic, write_timings
from catalog import datasets

# Spinning OpenMP threads are much slower on a shared CPU (benchmarks/smollm2.py); set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

def read_trace_file(path: Path) -> list[Trace]:
    """PIR-layout records from ``path``; DataError naming the file, record and field."""
    source = str(path)
    if path.suffix == ".parquet":
        records: list[Any] = read_parquet(path).to_pylist()
    elif path.suffix == ".jsonl":
        records = [record for _, record in read_jsonl(path)]
    elif path.suffix == ".json":
        from catalog.io import read_json

        records = read_json(path)
        if not isinstance(records, list):
            raise DataError(source, f"expected a JSON array of records, got {type(records).__name__}")
    else:
        raise ConfigError(f"params.yaml pir.traces: {path}: expected a .jsonl, .json or .parquet file")
    return traces_from_records(records, source)


def load_traces(params: PirConfig) -> list[Trace]:
    max_traces = positive_int(params.max_traces, "params.yaml pir.max_traces", optional=True)
    if params.traces:
        traces = read_trace_file(Path(params.traces))
        return traces[:max_traces] if max_traces else traces
    from catalog.multiwoz_dir import load_multiwoz

    source = params.source
    if source is None:
        raise ConfigError("params.yaml pir: 'source' is required when 'traces' is null")
    corpus = load_multiwoz(source, params.db_dir)
    traces = build_traces(corpus.dialogues, Database(corpus.entities, corpus.taxi_options), params.seed, max_traces)
    if not traces:
        raise DataError(str(source), "no decision point with an unstated constraint: no embedded trace to augment")
    return traces


def make_inserter(params: PirConfig, accounting: Accounting) -> RulesInserter | LLMInserter:
    backend = BackendConfig.from_dict("pir_inserter", params.inserter or {"backend": "rules"}, "pir.inserter")
    if backend.kind == "rules":
        return RulesInserter(params.seed)
    client = LLMClient(backend.client, cache=ResponseCache(params.cache_dir or "data/cache/llm"), accounting=accounting)
    return LLMInserter(client, backend.sampling, params.seed)


def make_teacher(params: PirConfig) -> tuple[HFBackend, str]:
    backend = BackendConfig.from_dict("pir_teacher", params.teacher or {}, "pir.teacher")
    if not Path(backend.hf.model_path).exists():
        raise ConfigError(f"params.yaml pir.teacher.model_path: {backend.hf.model_path} does not exist")
    teacher = HFBackend.from_config(backend.hf)
    if not getattr(teacher.tokenizer, "is_fast", False):
        raise ConfigError(f"params.yaml pir.teacher: {backend.hf.model_path} has no fast tokenizer (character offsets are needed)")
    return teacher, backend.hf.model_path


def run(section: dict) -> dict:
    config = from_params(PirConfig, section, "params.yaml pir")
    output, metrics_path = Path(config.output), Path(config.metrics)
    max_failure_rate = config.max_llm_failure_rate
    check_failure_rate(Accounting(), max_failure_rate, "params.yaml pir")
    accounting = Accounting()
    inserter = make_inserter(config, accounting)  # a bad inserter section fails before the model loads
    started = time.perf_counter()
    # A line at least every 30 s from here on: loading the teacher, then scoring the traces.
    with Progress(None, "pir_augment", unit="traces scored") as progress:
        traces = load_traces(config)
        if isinstance(inserter, RulesInserter) and any(t.user_goal is None for t in traces):
            raise ConfigError("params.yaml pir.inserter: the rules inserter needs the embedded traces (traces: null); "
                              "traces from a file need an openai inserter")
        import torch

        if config.threads is not None:  # else the top-level params.yaml threads (stages/__init__.py)
            torch.set_num_threads(config.threads)
        teacher, teacher_name = make_teacher(config)
        loaded = time.perf_counter()
        progress.update(0, len(traces))
        result = run_pir(traces, StepScorer(teacher, on_scored=progress.advance), inserter, config, teacher_name)
    check_failure_rate(accounting, max_failure_rate, "pir")
    scored = time.perf_counter()
    datasets.save({"pir_traces": pir_table(result.rows)}, config)
    metrics = result.metrics
    metrics["llm"] = accounting.as_dict()
    write_json_atomic(metrics_path, metrics)
    done = time.perf_counter()
    tokens = metrics["tokens"]["reasoning"] + metrics["tokens"]["context"]
    write_timings("pir_augment", {"load_s": round(loaded - started, 2), "augment_s": round(scored - loaded, 2),
                                  "wall_s": round(done - started, 2), "traces_per_s": round(len(traces) / (scored - loaded), 2),
                                  "tokens_per_s": round(tokens / (scored - loaded), 1)})
    fid = metrics.get("fidelity", {}).get("headline")
    print(
        f"pir_augment: {metrics['traces']} traces, {metrics['steps']} steps, {metrics['selected_steps']} selected "
        f"(top {config.k_percent:g} %, {config.scope}), {metrics['insertions']} pairs inserted -> {output}"
        + (f"; fidelity precision {fid['precision']['value']} vs random {fid['random_precision']['value']} "
           f"(difference 95 % interval [{fid['precision_minus_random']['ci95_low']}, {fid['precision_minus_random']['ci95_high']}]), "
           f"recall {fid['recall']['value']} vs {fid['random_recall']['value']}" if fid else "")
        + f" [load {loaded - started:.1f}s, score+insert {scored - loaded:.1f}s]"
    )
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("pir"))


if __name__ == "__main__":
    main()
