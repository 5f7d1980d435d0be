"""DVC stage ``pir_eval``: PIR's metrics (section 4.1) for the starting policy and its PIR
fine-tunes on held-out goals.

    python -m stages.pir_eval [--params params.yaml] [--seeds-table NAME]

Every model of params.yaml ``pir_eval.models`` plays the first ``max_goals`` goals of the
``split`` (test; those that need the tools) once, greedily, with US-GRPO's conversation player
(:class:`pipelines.training.rollout.ConversationRollout`: the agenda user simulator answers
its visible turns and the questions it asks inside its reasoning; the goal checker grades the
conversation). Written: ``reports/pir_eval.json`` (metrics per model: success, TTR, tokens,
questions, helpfulness from the rules judge, composite reward, and what ended the
conversations) and ``reports/pir_eval.md`` (the table); wall times in
``reports/timings/pir_eval.json``.

A model may be a list of directories, one per training seed (stage ``pir_eval_seeds`` of the
``seeds`` profile, ``--seeds-table NAME``: params.yaml ``pir_eval_seeds.models``, written to
``reports/training_seeds/NAME.{json,md}``): every seed's model plays the goals, the row pools them
(:func:`pipelines.pir.metrics.pool_seeds`: the mean over seeds and each metric's range) and
each seed's numbers are kept beside it.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping, Sequence

from catalog.io import read_params, write_json_atomic, write_text_atomic, write_timings
from pipelines.config import from_params
from pipelines.errors import ConfigError
from pipelines.pir.evaluate import NOT_IN_STAGE, PirEvalParams
from pipelines.training.rollout import RolloutConfig
from pipelines.simulators.agenda import SimulatorSpec
from stages.common import evaluation_parser, for_seeds_table
from stages.entry import main_wrapper

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def check(params: Mapping[str, Any]) -> tuple[RolloutConfig, SimulatorSpec, dict[str, str]]:
    config, models = pir_eval_params(params)
    return config.rollout, config.simulator, models


def pir_eval_params(params: Mapping[str, Any]) -> tuple[PirEvalParams, dict[str, list[str]]]:
    """The section, checked (ConfigError naming the setting), and its models as name -> the
    directories of its training seeds (one for a single model)."""
    where = "params.yaml pir_eval"
    config = from_params(PirEvalParams, params, where, without=NOT_IN_STAGE).checked(where)
    if config.output is None:
        raise ConfigError(f"{where}: missing required key(s) ['output']")
    models = config.models
    if not isinstance(models, Mapping) or not models:
        raise ConfigError(f"{where}.models: expected a mapping of name -> model directory")
    dirs: dict[str, list[str]] = {}
    for name, paths in models.items():
        paths = [paths] if isinstance(paths, str) else paths
        if not isinstance(paths, list) or not paths or len(set(map(str, paths))) != len(paths):
            raise ConfigError(f"{where}.models.{name}: expected a model directory or a list of distinct ones (one per training seed), got {paths!r}")
        for path in paths:
            if not (Path(str(path)) / "config.json").is_file():
                raise ConfigError(f"{where}.models.{name}: {path} is not a model directory (run its training stage first)")
        dirs[str(name)] = [str(p) for p in paths]
    config = replace(config, output=config.output.check(f"{where}.output", ("metrics", "markdown")))
    return config, dirs


def run(params: Mapping[str, Any]) -> dict[str, Any]:
    config, models = pir_eval_params(params)
    import torch

    from catalog.multiwoz_dir import held_out_world
    from pipelines.pir.evaluate import play_model
    from pipelines.pir.metrics import markdown_table, pool_seeds

    if config.threads is not None:  # else the top-level params.yaml threads (stages/__init__.py)
        torch.set_num_threads(config.threads)
    started = time.perf_counter()
    split, seed = config.split, config.seed
    database, dialogues = held_out_world(config.source, config.db_dir, split, config.max_goals, "params.yaml pir_eval")
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name, paths in models.items():
        per_seed: dict[str, dict[str, Any]] = {}
        for k, path in enumerate(paths):  # one per training seed; the first named as the row
            label = f"{name}@{k}" if k else name
            t0 = time.perf_counter()
            metrics, _, _ = play_model(path, label, database, dialogues, config.simulator, config.rollout, seed)
            per_seed[label] = metrics
            timings[f"{label}_s"] = round(time.perf_counter() - t0, 2)
            print(f"pir_eval: {label}: success {metrics['success']}, TTR {metrics['ttr']}, tokens {metrics['tokens']}, "
                  f"questions {metrics['questions']}, helpfulness {metrics['helpfulness']} [{timings[f'{label}_s']:.1f}s]")
        if len(paths) == 1:
            results[name] = per_seed[name]
        else:
            results[name] = {**pool_seeds(list(per_seed.values())), "per_training_seed": per_seed}
    report = {"split": split, "goals": len(dialogues), "seed": seed,
              "models": {name: paths[0] if len(paths) == 1 else paths for name, paths in models.items()}, "results": results}
    output = config.output
    write_json_atomic(output.metrics, report)
    table = markdown_table(results)
    pooled = [name for name, paths in models.items() if len(paths) > 1]
    seeds_note = (f"Training seeds: {', '.join(pooled)} each pool {max(len(p) for p in models.values())} models trained under "
                  "different seeds (the row: the mean over them; then each seed alone; report: each metric's range "
                  "over the seeds), so a difference smaller than the seeds' spread is not one a re-training keeps.\n\n"
                  if pooled else "")
    write_text_atomic(output.markdown, (
        f"# PIR metrics on {len(dialogues)} held-out {split} goals (one greedy conversation each)\n\n{seeds_note}{table}\n\n"
        "success: the goal checker's verdict; TTR: the simulator's replies after its opening (answers to questions "
        "asked inside the reasoning included); tokens: what the policy wrote; questions: in its reasoning and as "
        "visible clarifications; help.: the rules judge's H over the conversations that asked; reward: PIR's "
        "composite reward (0 unless the goal is met).\n"))
    # named after the report (pir_eval, or a seeds table's name): a table never overwrites another's
    write_timings(Path(output.metrics).stem, {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    return report


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    args = evaluation_parser("python -m stages.pir_eval", __doc__.split("\n\n")[0], "pir_eval_seeds").parse_args(argv)
    run(for_seeds_table(read_params("pir_eval", args.params), args, "pir_eval_seeds",
                        {"output": {"metrics": "reports/training_seeds/{table}.json", "markdown": "reports/training_seeds/{table}.md"}}))


if __name__ == "__main__":
    sys.exit(main())
