"""DVC stage ``calibrate``: Auto-Prompt (Learn-to-Ask appendix E, Algorithm 1), EXTRACT and GRADER tracks.

params.yaml ``calibrate``:

* ``source`` / ``format`` / ``db_dir``: the logs, as for stage ``hindsight``; their train
  split (or the sessions without a split) gives the anchors and the few-shot pool;
* ``tracks``: ``extract`` (F1 of extracted values against the anchors'), ``grader`` (minus
  the MSE of content grades against the anchor grades), ``rollout`` (the mean L2A reward,
  rules grader, of the policy's samples with the candidate sampler prompt);
* ``policy``: ROLLOUT's model, ``{model_path, samples, batch_size, sampling}`` (seeded);
* ``extractor`` / ``grader``: the model under calibration, an LLM backend that reads its
  prompt (``{backend: hf, model_path: models/smollm2, ...}`` offline, or ``openai``), greedy;
* ``anchors``: ``{extract: file, grader: file}``, curated anchor files (JSON Lines,
  :mod:`pipelines.learn_to_ask.calibration`), or null: ``n_anchors`` cases per track built
  from the corpus annotations (grader: the expert's turns graded by the rules grader);
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

from pipelines.config import from_params, positive_int
from pipelines.errors import ConfigError
from pipelines.learn_to_ask.config import CalibrateParams
from pipelines.learn_to_ask.calibration import (
    ANCHOR_PARSERS, BUILT_TRACKS, ROLE_OF, SCORE_NAMES, calibrate_track, prompts_document, runs_table,
)
from pipelines.learn_to_ask.completion import completer
from pipelines.learn_to_ask.hindsight import EXTRACTION_SCHEMA
from pipelines.llm import Accounting, BackendConfig
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from catalog import datasets
from catalog.learn_to_ask import load_sessions, policy_sampler, read_anchors


def _count(config: Any, key: str, minimum: int) -> int:
    return positive_int(getattr(config, key.rpartition(".")[2]), f"params.yaml calibrate.{key}", minimum=minimum)


def proposer_backend(llm: Mapping[str, Any] | None) -> BackendConfig:
    roles = (llm or {}).get("roles") or {}
    return BackendConfig.from_dict("prompt_proposer", roles.get("prompt_proposer", {"backend": "rules"}), "params.yaml llm.roles.prompt_proposer")


def _llm_backend(role: str, section: Any) -> BackendConfig:
    backend = BackendConfig.from_dict(role, section or {}, f"params.yaml calibrate.{role}")
    if backend.kind == "rules":
        raise ConfigError(f"params.yaml calibrate.{role}: the {role} under calibration must read its prompt: hf or openai")
    if not backend.sampling.greedy:
        raise ConfigError(f"params.yaml calibrate.{role}.sampling.temperature: the {role} decodes greedily; set 0.0")
    return backend


def run(params: dict, llm: Mapping[str, Any] | None = None) -> dict:
    config = from_params(CalibrateParams, params, "params.yaml calibrate")
    output = config.output.check("params.yaml calibrate.output", ("runs", "prompts"))
    tracks = list(config.tracks)
    if not tracks or not set(tracks) <= set(BUILT_TRACKS) or len(set(tracks)) != len(tracks):
        raise ConfigError(f"params.yaml calibrate.tracks: expected a list of distinct tracks among {list(BUILT_TRACKS)}, got {tracks!r}")
    n_anchors, n_pool = _count(config, "n_anchors", 1), _count(config, "n_pool", 0)
    iterations, k, seed = _count(config, "iterations", 0), _count(config, "k", 1), _count(config, "seed", 0)
    backends = {track: _llm_backend(ROLE_OF[track], getattr(config, ROLE_OF[track])) for track in tracks if track in ROLE_OF}
    if "rollout" in tracks and config.policy is None:
        raise ConfigError("params.yaml calibrate.policy: the rollout track needs the policy model")
    proposer_backend(llm)  # rules: the only proposer so far
    anchor_files = config.anchors or {}
    if not isinstance(anchor_files, Mapping) or set(anchor_files) - {"extract", "grader"}:
        raise ConfigError(f"params.yaml calibrate.anchors: expected a mapping extract / grader -> file or null, got {anchor_files!r}")

    started = time.perf_counter()
    sessions = [s for s in load_sessions({"source": config.source, "format": config.format, "db_dir": config.db_dir})
                if s.split in (None, "train")]  # val and test stay out of the prompts
    accounting = Accounting()
    history, winners, metrics, timings = [], {}, {}, {}
    from pipelines.progress import Progress

    # prompts scored at least every 30 s with the time left: at most 1 + iterations * k per
    # track (a prompt already scored is not run again)
    with Progress(len(tracks) * (1 + iterations * k), "calibrate", unit="prompts scored") as progress:
        for track in tracks:
            if track == "rollout":
                complete, kind = policy_sampler(config.policy)
            else:
                complete, kind = completer(backends[track], llm, accounting, EXTRACTION_SCHEMA if track == "extract" else None), backends[track].kind
            curated_from = anchor_files.get(track)
            began = time.perf_counter()
            progress.label = f"calibrate {track}"
            runs, best, metrics[track] = calibrate_track(
                track, sessions, complete, kind, curated=read_anchors(Path(curated_from), ANCHOR_PARSERS[track]) if curated_from else None,
                curated_from=str(curated_from) if curated_from else None, n_anchors=n_anchors, n_pool=n_pool, iterations=iterations,
                k=k, seed=seed, on_score=progress.advance)
            timings[f"{track}_s"] = round(time.perf_counter() - began, 2)
            history += runs
            winners[track] = (best, runs[0].score)
            print(f"calibrate {track}: {SCORE_NAMES[track]} {metrics[track]['seed_score']} (seed) -> {metrics[track]['calibrated_score']} "
                  f"over {metrics[track]['candidates']} prompts on {metrics[track]['anchors']} anchors [{timings[f'{track}_s']:.1f}s]")
    datasets.save({"calibration_runs": runs_table(history)}, config)
    write_json_atomic(Path(output.prompts), prompts_document(winners))
    write_json_atomic(Path(config.metrics), metrics)
    write_timings("calibrate", {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("calibrate"), llm=read_params("llm", required=False))


if __name__ == "__main__":
    main()
