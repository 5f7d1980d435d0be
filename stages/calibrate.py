"""DVC stage ``calibrate``: Auto-Prompt (Learn-to-Ask appendix E, Algorithm 1), EXTRACT track.

params.yaml ``calibrate``:

* ``source`` / ``format`` / ``db_dir``: the logs, as for stage ``hindsight``; their train
  split (or the sessions without a split) gives the anchors and the few-shot pool;
* ``extractor``: the extractor under calibration, an LLM backend that reads its prompt
  (``{backend: hf, model_path: models/smollm2, ...}`` offline, or ``openai``), greedy;
* ``anchors``: a curated anchor file (JSON Lines, :mod:`pipelines.learn_to_ask.calibration`)
  or null: ``n_anchors`` cases built from the corpus annotations;
* ``n_pool``: few-shot examples the proposer may add, from other sessions than the anchors;
* ``iterations``, ``k`` (candidates per iteration), ``seed`` (the proposer's draws);
* ``output.runs`` (``calibration_runs`` Parquet: every candidate, score, lineage),
  ``output.prompts`` (the winning prompts, versioned JSON; stage ``hindsight`` reads it through
  ``hindsight.prompts``), ``metrics`` (F1 of the seed prompt and of the calibrated one).

The proposer is the ``prompt_proposer`` role of ``llm.roles``: ``rules``, deterministic
mutations (rewordings, anchor-pool examples as few-shot, output-format rules).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.autoprompt import RulesProposer, calibrate, calibrated
from pipelines.learn_to_ask.calibration import (
    CALIBRATION_RUNS,
    EXTRACT_REWORDINGS,
    EXTRACT_RULES,
    anchor_from_record,
    as_example,
    corpus_anchors,
    extract_score,
    prompts_document,
    runs_table,
)
from pipelines.learn_to_ask.hindsight import EXTRACTOR_INSTRUCTION, SEED_EXTRACTOR_PROMPT
from pipelines.llm import Accounting, BackendConfig
from stages.hindsight import completer, load_sessions
from stages.io import main_wrapper, publish, read_params, read_text, write_json_atomic, write_timings

_KEYS = {"source", "format", "db_dir", "extractor", "anchors", "n_anchors", "n_pool", "iterations", "k", "seed", "output", "metrics"}


def _count(params: Mapping[str, Any], key: str, default: int, minimum: int) -> int:
    value = params.get(key, default)
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"params.yaml calibrate.{key}: expected an integer >= {minimum}, got {value!r}")
    return value


def read_anchors(path: Path) -> list:
    import json

    if not path.is_file():
        raise DataError(str(path), "file not found")
    anchors = []
    for number, line in enumerate(read_text(path).splitlines(), start=1):
        if not line.strip():
            continue
        try:
            raw = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DataError(str(path), f"invalid JSON: {exc.msg} at column {exc.colno}", f"line {number}") from None
        anchors.append(anchor_from_record(raw, str(path), f"line {number}"))
    if not anchors:
        raise DataError(str(path), "no anchors")
    return anchors


def proposer_backend(llm: Mapping[str, Any] | None) -> BackendConfig:
    roles = (llm or {}).get("roles") or {}
    return BackendConfig.from_dict("prompt_proposer", roles.get("prompt_proposer", {"backend": "rules"}), "params.yaml llm.roles.prompt_proposer")


def run(params: dict, llm: Mapping[str, Any] | None = None) -> dict:
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise ConfigError(f"params.yaml calibrate: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    output = params.get("output") or {}
    if "source" not in params or not isinstance(output, Mapping) or set(output) != {"runs", "prompts"} or "metrics" not in params:
        raise ConfigError("params.yaml calibrate: source, output: {runs, prompts} and metrics are required")
    n_anchors, n_pool = _count(params, "n_anchors", 8, 1), _count(params, "n_pool", 3, 0)
    iterations, k, seed = _count(params, "iterations", 2, 0), _count(params, "k", 2, 1), _count(params, "seed", 0, 0)
    backend = BackendConfig.from_dict("extractor", params.get("extractor") or {}, "params.yaml calibrate.extractor")
    if backend.kind == "rules":
        raise ConfigError("params.yaml calibrate.extractor: the extractor under calibration must read its prompt: hf or openai")
    if not backend.sampling.greedy:
        raise ConfigError("params.yaml calibrate.extractor.sampling.temperature: the extractor decodes greedily; set 0.0")
    proposer_backend(llm)  # rules: the only proposer so far

    started = time.perf_counter()
    sessions = [s for s in load_sessions({k: params[k] for k in ("source", "format", "db_dir") if k in params})
                if s.split in (None, "train")]  # val and test stay out of the prompts
    curated = (params.get("anchors") or {}).get("extract")
    if curated:
        anchors = read_anchors(Path(curated))
        taken = {a.point.session.session_id for a in anchors}
        _, pool = corpus_anchors([s for s in sessions if s.session_id not in taken], 0, n_pool, seed)
    else:
        anchors, pool = corpus_anchors(sessions, n_anchors, n_pool, seed)
    accounting = Accounting()
    complete = completer(backend, llm, accounting)
    proposer = RulesProposer((EXTRACTOR_INSTRUCTION, *EXTRACT_REWORDINGS), [as_example(a) for a in pool],
                             (*SEED_EXTRACTOR_PROMPT.rules, *EXTRACT_RULES), seed)
    loaded = time.perf_counter()
    history = calibrate("extract", SEED_EXTRACTOR_PROMPT, proposer.propose,
                        lambda prompt: extract_score(prompt, anchors, complete, backend.kind), iterations, k)
    searched = time.perf_counter()
    best = calibrated(history)
    publish({Path(output["runs"]): (runs_table(history), CALIBRATION_RUNS)})
    write_json_atomic(Path(output["prompts"]), prompts_document({"extract": (best, history[0].score)}))
    metrics = {"extract": {
        "extractor": backend.kind, "anchors": len(anchors), "pool": len(pool), "iterations": iterations, "k": k,
        "candidates": len({c.prompt_id for c in history}), "seed_f1": round(history[0].score, 4),
        "calibrated_f1": round(best.score, 4), "winner": best.prompt_id,
        "lineage": [c.mutation for c in history if c.selected and c.mutation != "kept"],
    }}
    write_json_atomic(Path(params["metrics"]), metrics)
    done = time.perf_counter()
    write_timings("calibrate", {"load_s": round(loaded - started, 2), "search_s": round(searched - loaded, 2), "wall_s": round(done - started, 2)})
    print(f"calibrate: extract F1 {metrics['extract']['seed_f1']} (seed) -> {metrics['extract']['calibrated_f1']} "
          f"over {metrics['extract']['candidates']} prompts on {len(anchors)} anchors [search {searched - loaded:.1f}s]")
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("calibrate"), llm=read_params("llm", required=False))


if __name__ == "__main__":
    main()
