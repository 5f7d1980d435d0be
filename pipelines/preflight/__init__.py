"""Checks a run before anything heavy is loaded: a bad configuration fails in a second,
with a :class:`~pipelines.errors.ConfigError` that says what to change, never minutes into
training.

Checked: the method and its objective, the numbers (steps, batch, lengths, GRPO's group
size), the starting model's directory, every dataset file and its columns, the rewards, the
device settings against the machine, and last every dataset's rows against its declared
schema (:mod:`pipelines.preflight.inputs`: by the source's ``schema``, whatever the file is
called), so that a bad file stops the run before the Prefect server and the tokenizer start.
"""

from __future__ import annotations

from pathlib import Path

import pyarrow.parquet as pq

from pipelines.config import positive_int
from pipelines.errors import ConfigError
from pipelines.training.config import METHODS, OBJECTIVES, DeviceSpec, GRPOObjective, TrainConfig
from pipelines.training.data import JOIN_COLUMN, reward_columns, source_layout
from pipelines.training.device import Machine, resolve_device
from pipelines.preflight.inputs import check_inputs, check_schema_name
from pipelines.training.trainers import reward_functions

#: Files that make a directory a loadable model: full weights' config, or a PEFT adapter.
MODEL_MARKERS = ("config.json", "adapter_config.json")


def check_method(method: str) -> None:
    if method not in METHODS:
        raise ConfigError(f"unknown training method {method!r}; methods: {', '.join(METHODS)}")


def check_model(config: TrainConfig) -> None:
    model = config.model
    if (model.path is None) == (model.hub_id is None):
        raise ConfigError("model: give exactly one of path (a local directory) and hub_id")
    if model.local:
        path = Path(model.path)
        if not path.is_dir():
            hint = " (run `dvc repro bootstrap` first)" if path.name == "base" else ""
            raise ConfigError(f"model path {str(path)!r} does not exist{hint}; set model.path, or model.hub_id for a hub model")
        if not any((path / marker).is_file() for marker in MODEL_MARKERS):
            raise ConfigError(f"model path {str(path)!r} is not a Hugging Face model directory (no {' or '.join(MODEL_MARKERS)})")


def check_numbers(config: TrainConfig, *, rows: bool = True) -> None:
    """The run's numbers. ``rows=False``: GRPO whose rollouts are whole conversations (the
    conversations are its data): no data source, and no prompt-plus-completion length to fit."""
    optim, objective = config.optim, config.resolved_objective()
    positive = {
        "optim.max_steps": optim.max_steps,
        "optim.batch_size": optim.batch_size,
        "optim.gradient_accumulation_steps": optim.gradient_accumulation_steps,
        "optim.max_length": optim.max_length,
        "optim.logging_steps": optim.logging_steps,
    }
    for name, value in positive.items():
        positive_int(value, name)
    if not optim.learning_rate > 0:
        raise ConfigError(f"optim.learning_rate must be positive, got {optim.learning_rate!r}")
    if optim.max_time_s is not None and not optim.max_time_s > 0:
        raise ConfigError(f"optim.max_time_s must be positive (or null), got {optim.max_time_s!r}")
    if not 0 < config.data.holdout.fraction < 1:
        raise ConfigError(f"data.holdout.fraction must be between 0 and 1, got {config.data.holdout.fraction!r}")
    if rows and not config.data.sources:
        raise ConfigError(f"{config.method}: data.sources is empty")
    if config.method == "kto" and optim.batch_size < 2:
        raise ConfigError("kto: optim.batch_size must be at least 2 (KTO estimates its KL term across a batch)")
    if isinstance(objective, GRPOObjective):
        if objective.num_generations < 2:
            raise ConfigError(f"grpo: num_generations must be at least 2, got {objective.num_generations}")
        completions = optim.batch_size * optim.gradient_accumulation_steps
        if completions % objective.num_generations:
            raise ConfigError(
                f"grpo: optim.batch_size x gradient_accumulation_steps ({completions}) must be a multiple of "
                f"num_generations ({objective.num_generations}): the batch counts completions, a group per prompt"
            )
        if rows and objective.max_completion_length >= optim.max_length:
            raise ConfigError(
                f"grpo: max_completion_length ({objective.max_completion_length}) must be below optim.max_length "
                f"({optim.max_length}), which also holds the prompt"
            )


def check_data(config: TrainConfig) -> None:
    objective = config.resolved_objective()
    for index, source in enumerate(config.data.sources):
        check_schema_name(source.schema, f"{config.method}: data.sources[{index}].schema")
        path = Path(source.path)
        if not path.is_file():
            raise ConfigError(f"{config.method}: dataset {source.path!r} does not exist")
        try:
            columns = pq.read_schema(path).names
        except Exception as exc:  # pyarrow raises several types for a file that is not Parquet
            raise ConfigError(f"{config.method}: dataset {source.path!r} is not readable Parquet: {exc}") from None
        source_layout(config.method, source, columns, config.data.holdout.key)
        if source.prompts_from is not None:
            _check_prompts_from(config, source.path, source.prompts_from, columns)
        if isinstance(objective, GRPOObjective):
            missing = [c for c in reward_columns(objective) if c not in columns]
            if missing:
                raise ConfigError(
                    f"grpo: dataset {source.path!r} lacks column(s) {', '.join(map(repr, missing))} that the rewards "
                    f"read (columns: {', '.join(columns)})"
                )


def _check_prompts_from(config: TrainConfig, path: str, prompts_from: str, columns: list[str]) -> None:
    keys = (config.data.holdout.key, JOIN_COLUMN)
    if JOIN_COLUMN not in columns:
        raise ConfigError(f"{config.method}: dataset {path!r} needs a {JOIN_COLUMN!r} column to take prompts from {prompts_from!r}")
    if not Path(prompts_from).is_file():
        raise ConfigError(f"{config.method}: prompts_from {prompts_from!r} does not exist")
    other = pq.read_schema(prompts_from).names
    missing = [c for c in (*keys, "prompt") if c not in other]
    if missing:
        raise ConfigError(f"{config.method}: prompts_from {prompts_from!r} lacks column(s) {', '.join(map(repr, missing))}")


def preflight(config: TrainConfig, machine: Machine | None = None, *, validate_inputs: bool = True, rows: bool = True) -> DeviceSpec:
    """Every check; the device settings the run will use. ``validate_inputs=False`` leaves out
    reading every row through its expectation suite, for inputs validated before they were
    carried (the GPU job validates them when it is packed: its node has no Great Expectations).
    ``rows=False``: multi-turn GRPO, trained on conversations (:func:`check_numbers`)."""
    check_method(config.method)
    expected = OBJECTIVES[config.method]
    if config.objective is not None and not isinstance(config.objective, expected):
        raise ConfigError(f"{config.method}: objective must be a {expected.__name__}, got {type(config.objective).__name__}")
    check_numbers(config, rows=rows)
    if isinstance(config.resolved_objective(), GRPOObjective):
        reward_functions(config.resolved_objective(), config.judge)
    loss_mask = getattr(config.resolved_objective(), "loss_mask", None)
    if loss_mask is not None:
        from pipelines.training.data import loss_mask_function

        loss_mask_function(loss_mask)  # an unimportable span function fails before anything loads
    check_model(config)
    check_data(config)
    device = resolve_device(config.device, config.model, config.method, machine or Machine.detect())
    if validate_inputs:
        check_inputs(config)  # reads and validates every row: after the checks that take a second
    return device


__all__ = ["MODEL_MARKERS", "check_data", "check_method", "check_model", "check_numbers", "preflight"]
