"""DVC stage ``evaluate``: simulated collaborative evaluation of every trained model, one
Prefect flow run (:mod:`flows.evaluate`).

    python -m stages.evaluate [--params params.yaml] [--one-at-a-time] [--seeds-table NAME]

params.yaml ``evaluate`` (fields and defaults: :mod:`pipelines.evaluation.config`):
``source`` / ``db_dir`` (the corpus whose ``split`` goals are played), ``max_goals``,
``seeds`` (one run per seed: Avg@k), ``max_exchanges`` (agent turns, 20), ``agent_format``,
``batched``, ``simulator`` (``kind: agenda`` or an LLM simulator whose backend is the
``user_simulator`` role of params.yaml ``llm``), ``generation`` (decoding, batch size),
``prompt`` (the policy's compact prompts), ``models`` (``name: {path: ...}`` or
``{hub_id: ...}``, in table order) and ``output``.

Outputs: ``data/episodes/eval/episodes.parquet`` / ``episode_events.parquet`` (every
episode, ``agent`` = the model's name; ``askflow sql`` names them ``eval_episodes`` /
``eval_episode_events``), ``reports/eval.json`` (DVC metrics), ``reports/eval.md`` (the
table) and ``reports/eval_plot.csv`` (success vs turns, a DVC plot).

``--seeds-table NAME`` (stage ``evaluate_seeds``, the ``seeds`` profile): the same evaluation
with params.yaml ``evaluate_seeds.models`` (a row may list one model per training seed: pooled,
its interval and tests resample the seeds) written to ``data/episodes/NAME`` and
``reports/training_seeds/NAME{.json,.md,_plot.csv}``.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.errors import ConfigError
from pipelines.evaluation.config import EvalConfig
from stages.common import configure_prefect, evaluation_parser, for_seeds_table, with_policy
from stages.entry import main_wrapper
from catalog.io import read_params
from pipelines.config import from_params


def eval_config(params: Mapping[str, Any]) -> EvalConfig:
    """The :class:`EvalConfig` of params.yaml ``evaluate`` (ConfigError naming the key).
    ``models`` is a mapping name -> ``{path: ...}`` or ``{hub_id: ...}``, in table order."""
    where = "params.yaml evaluate"
    models = params.get("models")
    if not isinstance(models, Mapping) or not models:
        raise ConfigError(f"{where}.models: required, a mapping name -> {{path: ...}} or {{hub_id: ...}}")
    if "source" not in params:
        raise ConfigError(f"{where}.source: required (a MultiWOZ-layout directory)")
    return from_params(EvalConfig, params, where)


def simulator_client(config: EvalConfig, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """The ``user_simulator`` role's LLM client and its sampling, for an LLM simulator (None,
    None for agenda)."""
    if config.simulator.kind == "agenda":
        return None, None
    from pipelines.llm import LLMClient, ResponseCache, backends_from_dict

    # Every role of the section is checked: one that no code path uses is refused.
    backends = backends_from_dict((llm_params or {}).get("roles") or {}, "params.yaml llm.roles")
    if "user_simulator" not in backends:
        raise ConfigError(f"evaluate.simulator.kind {config.simulator.kind!r} needs params.yaml llm.roles.user_simulator")
    backend = backends["user_simulator"]
    if backend.kind != "openai":
        raise ConfigError(f"evaluate.simulator.kind {config.simulator.kind!r} needs llm.roles.user_simulator.backend: openai")
    return LLMClient(backend.client, cache=ResponseCache((llm_params or {}).get("cache_dir") or "data/cache/llm")), backend.sampling


def run(
    params: Mapping[str, Any], llm_params: Mapping[str, Any] | None = None, batched: bool | None = None,
    policy: Mapping[str, Any] | None = None,
) -> dict[str, Any]:
    config = eval_config(with_policy(params, policy))
    if batched is not None:
        config = dataclasses.replace(config, batched=batched)
    from flows.evaluate import check_inputs

    check_inputs(config)  # before Prefect starts
    client, sampling = simulator_client(config, llm_params)
    configure_prefect(Path.cwd())
    from flows.evaluate import evaluate
    from flows.local_api import local_prefect_api

    with local_prefect_api(os.environ["PREFECT_HOME"]):  # cleans up after a killed run
        report = evaluate(config, client, sampling)
    # Speeds are in the flow's log and reports/timings/evaluate.json, not in the report.
    for name, result in report["models"].items():
        print(f"evaluate: {name}: success {result['success']['mean']:.3f} ± {result['success']['std']:.3f}, "
              f"turns {result['turns']['mean']:.2f} ± {result['turns']['std']:.2f}")
    return report


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = evaluation_parser("python -m stages.evaluate", __doc__.split("\n\n")[0], "evaluate_seeds")
    parser.add_argument("--one-at-a-time", action="store_true", help="play episodes one at a time (for comparison)")
    args = parser.parse_args(argv)
    # Unlike the training stages, evaluation keeps OpenMP's default wait policy: its many
    # small decoding steps run 20-30 % faster when idle threads spin briefly before sleeping.
    evaluate_params = for_seeds_table(
        read_params("evaluate", args.params), args, "evaluate_seeds",
        {"output": {"episodes": "data/episodes/{table}", "metrics": "reports/training_seeds/{table}.json",
                    "markdown": "reports/training_seeds/{table}.md", "plot": "reports/training_seeds/{table}_plot.csv"}})
    # Read and checked even when the simulator is the agenda one: llm is a DVC param of this
    # stage, so every role of it (used or not) reaches dvc.lock once the stage succeeds.
    llm = read_params("llm", args.params)
    check_llm_roles(llm, f"{args.params} llm")
    run(evaluate_params, llm, batched=False if args.one_at_a_time else None,
        policy=read_params("policy", args.params, required=False))


def check_llm_roles(llm: Mapping[str, Any], where: str) -> None:
    """Every role of the ``llm`` section validated (a secret anywhere is refused), not only
    the one this stage uses."""
    from pipelines.llm import backends_from_dict

    roles = llm.get("roles") or {}
    backends_from_dict(roles, f"{where}.roles")


if __name__ == "__main__":
    sys.exit(main())
