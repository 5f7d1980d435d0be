"""DVC stage ``train_pir_grpo``: PIR's US-GRPO, one Prefect flow run (:mod:`flows.us_grpo`).

    python -m stages.pir_grpo [--params params.yaml] [--seed N [--start DIR]]

params.yaml ``pir_train.grpo``: ``model`` (``{path: models/pir_sft}``), ``env`` (the MultiWOZ
directory, the train goals, the held-out goals played before and after, the agenda
simulator, and ``rollout``: conversation limits and sampling,
:class:`pipelines.training.rollout.RolloutConfig`), ``optim``, ``device``, ``objective``
(GRPO's settings; ``rewards: {pir_composite_rules: 1.0}``) and
``output``. ``--seed N`` / ``--start DIR``: the same run under training seed N (``optim.seed``,
outputs ``_s<N>``) from another start model (``models/pir_sft_s<N>``), as ``stages.train``'s
(stage ``train_pir_grpo_seeds``, the ``seeds`` profile). A bad setting fails here with ``error: <message>`` and exit status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from catalog.io import read_params
from pipelines.config import from_params
from pipelines.errors import ConfigError
from pipelines.training.config import NOT_IN_US_GRPO_SECTION, TRAIN_OUTPUTS, DataSpec, OutputSpec, TrainConfig, TrainSectionConfig, with_training_seed
from stages.entry import main_wrapper

WHERE = "params.yaml pir_train.grpo"


def us_grpo_section(section: Mapping[str, Any]) -> TrainSectionConfig:
    """params.yaml ``pir_train.grpo``, checked: a training section with an ``env`` and an
    ``output``, without the keys US-GRPO does not take."""
    params = from_params(TrainSectionConfig, section, WHERE, without=NOT_IN_US_GRPO_SECTION)
    missing = [key for key in ("env", "output") if getattr(params, key) is None]
    if missing:
        raise ConfigError(f"{WHERE}: missing required key(s) {missing}")
    if not isinstance(params.allow_no_signal, bool):
        raise ConfigError(f"{WHERE}.allow_no_signal: true or false, got {params.allow_no_signal!r}")
    return params


def grpo_config(section: Mapping[str, Any] | TrainSectionConfig, llm: Mapping[str, Any] | None = None,
                seed: int | None = None, start: str | None = None) -> tuple[TrainConfig, Any]:
    """The run's :class:`TrainConfig` (no Parquet source: the conversations are the data)
    and its :class:`pipelines.training.rollout.ConversationEnv`; under training seed ``seed`` from
    ``start`` when given (:func:`pipelines.training.config.with_training_seed`)."""
    from catalog.conversations import read_environment
    from stages.common import judge_backend

    where = WHERE
    params = section if isinstance(section, TrainSectionConfig) else us_grpo_section(section)
    config = params.train_config("grpo", where, data=DataSpec(sources=()), judge=judge_backend(llm),
                                 output=from_params(OutputSpec, params.output, f"{where}.output").check(f"{where}.output", TRAIN_OUTPUTS))
    if seed is not None:  # another training seed of the same run: its own outputs (``_s<seed>``)
        config = with_training_seed(config, seed, start)
    elif start is not None:
        raise ConfigError("--start names the start model of another training seed: give --seed too")
    objective = config.resolved_objective()
    env = read_environment(params.env, objective, where)
    if config.optim.batch_size % objective.num_generations:
        raise ConfigError(f"{where}: optim.batch_size ({config.optim.batch_size}) must be a multiple of "
                          f"objective.num_generations ({objective.num_generations})")
    from pipelines.preflight import check_model
    from pipelines.training.trainers import reward_functions

    check_model(config)
    reward_functions(objective, config.judge)
    return config, env


def run(section: Mapping[str, Any], llm: Mapping[str, Any] | None = None,
        seed: int | None = None, start: str | None = None) -> dict[str, Any]:
    from stages.common import configure_prefect

    params = us_grpo_section(section)
    config, env = grpo_config(params, llm, seed, start)
    configure_prefect(Path.cwd())
    from flows.local_api import local_prefect_api
    from flows.us_grpo import train_us_grpo

    with local_prefect_api(os.environ["PREFECT_HOME"]):
        report = train_us_grpo(config, env, params.allow_no_signal)
    before, after = report["eval"]["before"], report["eval"]["after"]
    signal = report["learning_signal"]
    if signal["no_signal"]:
        print(f"train_pir_grpo: NO LEARNING SIGNAL: {signal['zero_variance_groups']} of {signal['groups']} groups had zero "
              f"reward variance; {config.output.model_dir} is a copy of {config.model.name_or_path} (allow_no_signal: true)")
    print(f"train_pir_grpo: {report['train']['steps']} steps -> {config.output.model_dir}; held-out conversations "
          f"success {before['success']} -> {after['success']}, reward {before['reward']} -> {after['reward']}, "
          f"questions {before['questions']} -> {after['questions']}, TTR {before['ttr']} -> {after['ttr']}")
    return report


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.pir_grpo", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--seed", type=int, default=None,
                        help="another training seed of the run (optim.seed); outputs get the suffix _s<seed>")
    parser.add_argument("--start", default=None, help="with --seed: the start model of that seed (its PIR SFT model)")
    args = parser.parse_args(argv)
    from stages.common import configure_threads

    configure_threads()
    section = read_params("pir_train", args.params).get("grpo")
    if not isinstance(section, Mapping):
        raise ConfigError("params.yaml pir_train.grpo: missing (or not a mapping)")
    run(section, read_params("llm", args.params, required=False), seed=args.seed, start=args.start)


if __name__ == "__main__":
    sys.exit(main())
