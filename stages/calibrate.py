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
from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.config import CalibrateParams, CalibratePolicyParams
from pipelines.learn_to_ask.autoprompt import RulesProposer, calibrate, calibrated
from pipelines.learn_to_ask.calibration import (
    EXTRACT_REWORDINGS,
    EXTRACT_RULES,
    GRADER_REWORDINGS,
    GRADER_RULES,
    POLICY_EXTRA_RULES,
    POLICY_REWORDINGS,
    SEED_GRADER_PROMPT,
    SEED_POLICY_PROMPT,
    anchor_from_record,
    as_example,
    as_grader_example,
    as_policy_example,
    corpus_anchors,
    corpus_grader_anchors,
    corpus_rollout_cases,
    extract_score,
    grader_anchor_from_record,
    grader_score,
    prompts_document,
    rollout_score,
    runs_table,
)
from pipelines.learn_to_ask.completion import completer
from pipelines.learn_to_ask.hindsight import EXTRACTION_SCHEMA, SEED_EXTRACTOR_PROMPT
from pipelines.llm import Accounting, BackendConfig
from stages.entry import main_wrapper
from catalog.io import read_jsonl, read_params, write_json_atomic, write_timings
from catalog import datasets
from catalog.learn_to_ask import load_sessions

BUILT_TRACKS = ("extract", "grader", "rollout")
ROLE_OF = {"extract": "extractor", "grader": "grader"}
SCORE_NAMES = {"extract": "f1", "grader": "negative_mse", "rollout": "mean_reward"}
# build anchors from the corpus, parse a curated line, pool anchor -> few-shot example, score, seed prompt, rewordings, rules
TRACK_PARTS = {
    "extract": (corpus_anchors, anchor_from_record, as_example, extract_score, SEED_EXTRACTOR_PROMPT, EXTRACT_REWORDINGS, EXTRACT_RULES),
    "grader": (corpus_grader_anchors, grader_anchor_from_record, as_grader_example, grader_score, SEED_GRADER_PROMPT,
               GRADER_REWORDINGS, GRADER_RULES),
    # no human anchors: the fixed rules grader scores the policy's samples
    "rollout": (corpus_rollout_cases, None, as_policy_example, rollout_score, SEED_POLICY_PROMPT, POLICY_REWORDINGS, POLICY_EXTRA_RULES),
}
# Where corpus-built anchors get their labels: never from the model or prompt under calibration.
ANCHORS_FROM = {"extract": "corpus annotations (belief states)", "grader": "corpus annotations (dialog acts)",
                "rollout": "none (scored by the fixed rules grader)"}


def policy_sampler(section: CalibratePolicyParams) -> tuple[Any, str]:
    """The rollout track's sampler: ``section.samples`` draws per context, seeded, so a
    re-run samples the same."""
    from pipelines.llm import HFConfig, SamplingParams

    samples = _count(section, "policy.samples", 1)
    sampling = SamplingParams.from_dict(section.sampling, "params.yaml calibrate.policy.sampling")
    config = HFConfig(model_path=section.model_path, batch_size=section.batch_size)
    if not Path(config.model_path).exists():
        raise ConfigError(f"params.yaml calibrate.policy.model_path: {config.model_path} does not exist (python -m stages.smollm2)")
    from pipelines.llm.hf import HFBackend

    model = HFBackend.from_config(config)

    def sample(conversations: list[list[dict[str, str]]]) -> list[list[str]]:
        # Sample s of every conversation is seeded with s: the same prompts get the same draws.
        drawn = [model.generate(conversations, sampling, seed=s) for s in range(samples)]
        return [[draws[i] for draws in drawn] for i in range(len(conversations))]
    return sample, "hf"


def _count(config: Any, key: str, minimum: int) -> int:
    return positive_int(getattr(config, key.rpartition(".")[2]), f"params.yaml calibrate.{key}", minimum=minimum)


def read_anchors(path: Path, parse: Any = anchor_from_record) -> list:
    if not path.is_file():
        raise DataError(str(path), "file not found")
    anchors = [parse(raw, str(path), where) for where, raw in read_jsonl(path)]
    if not anchors:
        raise DataError(str(path), "no anchors")
    return anchors


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


def _curated(path: Any, parse: Any) -> list | None:
    if not path:
        return None
    return read_anchors(Path(path), parse)


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
            build, parse, to_example, score, seed_prompt, rewordings, rules = TRACK_PARTS[track]
            anchors = _curated(anchor_files.get(track), parse)
            if anchors is None:
                anchors, pool = build(sessions, n_anchors, n_pool, seed)
            else:
                taken = {a.point.session.session_id for a in anchors}
                _, pool = build([s for s in sessions if s.session_id not in taken], 0, n_pool, seed)
            if track == "rollout":
                complete, kind = policy_sampler(config.policy)
            else:
                complete, kind = completer(backends[track], llm, accounting, EXTRACTION_SCHEMA if track == "extract" else None), backends[track].kind
            proposer = RulesProposer((seed_prompt.instruction, *rewordings), [to_example(a) for a in pool], (*seed_prompt.rules, *rules), seed)
            began = time.perf_counter()

            def scored(prompt: Any, score: Any = score, anchors: Any = anchors, complete: Any = complete, kind: Any = kind) -> float:
                value = score(prompt, anchors, complete, kind)
                progress.advance()
                return value

            progress.label = f"calibrate {track}"
            runs = calibrate(track, seed_prompt, proposer.propose, scored, iterations, k)
            timings[f"{track}_s"] = round(time.perf_counter() - began, 2)
            best = calibrated(runs)
            history += runs
            winners[track] = (best, runs[0].score)
            metrics[track] = {
                "backend": kind, "anchors": len(anchors), "anchors_from": ANCHORS_FROM[track] if anchor_files.get(track) is None else str(anchor_files[track]),
                "pool": len(pool), "iterations": iterations, "k": k,
                "candidates": len({c.prompt_id for c in runs}), "score": SCORE_NAMES[track],
                "seed_score": round(runs[0].score, 4), "calibrated_score": round(best.score, 4), "winner": best.prompt_id,
                "lineage": [c.mutation for c in runs if c.selected and c.mutation != "kept"],
            }
            print(f"calibrate {track}: {SCORE_NAMES[track]} {metrics[track]['seed_score']} (seed) -> {metrics[track]['calibrated_score']} "
                  f"over {metrics[track]['candidates']} prompts on {len(anchors)} anchors [{timings[f'{track}_s']:.1f}s]")
    datasets.save({"calibration_runs": runs_table(history)}, config)
    write_json_atomic(Path(output.prompts), prompts_document(winners))
    write_json_atomic(Path(config.metrics), metrics)
    write_timings("calibrate", {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    return metrics


def readme_block(metrics: Mapping[str, Any]) -> str:
    """README's Auto-Prompt figures, generated from ``reports/calibrate.json`` (a test compares them)."""
    names = {"f1": "F1", "negative_mse": "-MSE", "mean_reward": "mean reward"}
    parts = [f"{track} {names.get(m['score'], m['score'])} {m['seed_score']:g} -> {m['calibrated_score']:g} "
             f"({m['backend']}, {m['anchors']} anchors" + (f" labelled by {m['anchors_from']}" if track != "rollout" and m.get("anchors_from") else "")
             + f", {m['candidates']} prompts, winner by {' + '.join(m['lineage'])})"
             for track, m in metrics.items()]
    return "Auto-Prompt, `reports/calibrate.json`: " + "; ".join(parts) + "."


@main_wrapper
def main() -> None:
    run(read_params("calibrate"), llm=read_params("llm", required=False))


if __name__ == "__main__":
    main()
