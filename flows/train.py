"""Prefect training flows: ``train_sft``, ``train_dpo``, ``train_kto``, ``train_grpo``.

Each flow takes a :class:`~pipelines.training.config.TrainConfig` and runs one recipe,
:func:`run_training`, built from small tasks that read top to bottom::

    preflight -> load tokenizer -> load datasets -> build dataset -> load model
      -> evaluate (before) -> build trainer -> train -> evaluate (after)
      -> save model (+ model card) -> write reports (metrics JSON, curve CSV)

Tasks that touch the file system or the hub retry on transient errors (an ``OSError``
such as a network timeout or a busy file; never a :class:`~pipelines.errors.AskflowError`,
which no retry can fix). Training itself is not retried: a half-trained model cannot be
resumed from here. Progress (every ``logging_steps``: step, loss or reward, speed) goes to
the Prefect run logger, so it shows in the UI and in ``prefect flow-run logs``.

Running
-------

The DVC stages call these flows (``python -m stages.train <method>``). Without
``PREFECT_API_URL`` Prefect starts a temporary local API for the run and keeps its runs
in ``$PREFECT_HOME/prefect.db`` (the stages set ``PREFECT_HOME=.prefect``): ``PREFECT_HOME=.prefect
prefect server start`` shows them afterwards. With ``PREFECT_API_URL`` set, runs go to
that server.

Real runs (GPU)
---------------

On a GPU, bf16 and gradient checkpointing switch on by themselves (``device`` in params).
A 7B model with QLoRA and vLLM generation, in params.yaml ``train.grpo``::

    model: {hub_id: Qwen/Qwen2.5-7B-Instruct, lora: {r: 16, alpha: 32}, quantization: {}}
    device: {use_vllm: true, vllm_mode: colocate}

Several GPUs: launch the stage through accelerate (as the DVC stage's ``cmd``, or by hand)::

    prefect server start &                      # one API for all ranks
    export PREFECT_API_URL=http://127.0.0.1:4200/api
    accelerate launch --num_processes 8 -m stages.train grpo

Every rank runs the flow (one flow run per rank; the trainer synchronises them) and only the
main process writes the model and the reports. Point the ranks at one Prefect server: each
would otherwise start its own temporary API on the same ``.prefect`` database. With
``vllm_mode: server``, start the generation server first: ``trl vllm-serve --model <path>``.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines.errors import AskflowError, ConfigError
from pipelines.files import staging_directory
from pipelines.training.config import METHODS, TrainConfig
from pipelines.training.data import SourceRows, TokenCounter, build_train_dataset, joining_prompts, prepare_source
from pipelines.training.config import DeviceSpec
from pipelines.preflight import preflight
from pipelines.training.report import TrainSummary, curve_csv, training_report

_PERMANENT_OS_ERRORS = (FileNotFoundError, IsADirectoryError, NotADirectoryError, PermissionError)


def retry_on_transient(task: Any, task_run: Any, state: Any) -> bool:
    """Retry an ``OSError`` (network, hub, busy file system), not a configuration or data
    error, and not a missing file: those fail the same way every time."""
    error = state.data if isinstance(state.data, BaseException) else None
    if error is None or isinstance(error, AskflowError):
        return False
    return isinstance(error, OSError) and not isinstance(error, _PERMANENT_OS_ERRORS)


# Big in-memory objects (models, trainers) go between tasks: nothing is hashed or persisted.
_TASK = {"cache_policy": NO_CACHE, "persist_result": False}
_RETRY = {"retries": 2, "retry_delay_seconds": 3, "retry_condition_fn": retry_on_transient}


# --- Tasks -----------------------------------------------------------------------------------


@task(name="preflight", **_TASK)
def check_config(config: TrainConfig) -> DeviceSpec:
    device = preflight(config)
    get_run_logger().info(
        "%s: %s on %s (bf16=%s, gradient checkpointing=%s), %d source(s)",
        config.method, config.model.name_or_path, device.accelerator, device.bf16, device.gradient_checkpointing,
        len(config.data.sources),
    )
    return device


@task(name="load-tokenizer", **_TASK, **_RETRY)
def load_tokenizer(config: TrainConfig) -> Any:
    from pipelines.training.modeling import load_tokenizer as load

    return load(config.model)


@task(name="load-datasets", **_TASK, **_RETRY)
def load_datasets(config: TrainConfig, tokenizer: Any) -> list[SourceRows]:
    """Each Parquet source, held-out split, compacted and fitted to ``max_length``; its
    stats start with the file and its version (MD5, as in dvc.lock)."""
    from pipelines.training.card import file_md5
    from pipelines.preflight.inputs import read_prompts, read_source

    logger = get_run_logger()
    reserve = getattr(config.resolved_objective(), "max_completion_length", 0)
    count = TokenCounter(tokenizer)
    prepared = []
    for source in config.data.sources:
        # Validated by its declared schema (preflight did it; a file changed since is checked
        # again); a bad or damaged file is a DataError or ValidationFailed naming it, which
        # retry_on_transient never retries.
        table = read_source(config, source)
        records = table.to_pylist()
        versions = {"path": source.path, "md5": file_md5(source.path)}
        prompt_rows = None
        if source.prompts_from is not None:
            prompt_rows = joining_prompts(read_prompts(config, source.prompts_from), config.data.holdout.key, records)
            versions.update(prompts_from=source.prompts_from, prompts_md5=file_md5(source.prompts_from))
        rows = prepare_source(
            records, table.column_names, source, config.method, config.data, count, config.optim.max_length,
            reserve=reserve, max_heldout=config.eval.max_examples, prompt_rows=prompt_rows, workers=config.device.data_workers,
        )
        rows.stats = {**versions, **rows.stats}
        logger.info("%s: %s", source.name, rows.stats)
        prepared.append(rows)
    return prepared


@task(name="build-dataset", **_TASK)
def build_dataset(config: TrainConfig, prepared: list[SourceRows], tokenizer: Any = None) -> Any:
    loss_mask = getattr(config.resolved_objective(), "loss_mask", None)
    dataset = build_train_dataset(config.method, prepared, seed=config.data.seed, tokenizer=tokenizer, loss_mask=loss_mask)
    get_run_logger().info("%s: %d training examples, columns %s", config.method, len(dataset), dataset.column_names)
    return dataset


@task(name="load-model", **_TASK, **_RETRY)
def load_model(config: TrainConfig, device: DeviceSpec) -> Any:
    from pipelines.training.modeling import load_model as load, parameter_counts

    model = load(config.model, device)
    get_run_logger().info("%s: loaded %s (%s parameters)", config.method, config.model.name_or_path, f"{parameter_counts(model)['total']:,}")
    return model


@task(name="evaluate", **_TASK)
def evaluate(config: TrainConfig, model: Any, tokenizer: Any, prepared: list[SourceRows], when: str) -> tuple[dict, dict]:
    """Held-out metrics per source, and the generations they were computed from."""
    from pipelines.training.evaluation import evaluate_heldout
    from pipelines.training.report import flatten

    started = time.monotonic()
    metrics, generations = evaluate_heldout(model, tokenizer, prepared, config.eval, config.resolved_objective(), config.judge)
    headline = {k: round(v, 4) for k, v in flatten(metrics).items() if isinstance(v, float)}
    get_run_logger().info("%s: held-out metrics %s: %s [%.1f s]", config.method, when, headline, time.monotonic() - started)
    return metrics, generations


@task(name="build-trainer", **_TASK)
def build_trainer(
    config: TrainConfig, device: DeviceSpec, model: Any, tokenizer: Any, dataset: Any, workdir: str, budget: Any
) -> Any:
    from pipelines.training.modeling import peft_config
    from pipelines.training.trainers import build_trainer as build

    return build(config, device, model, tokenizer, dataset, peft_config(config.model.lora), workdir, [budget])


@task(name="train", **_TASK)
def train(config: TrainConfig, trainer: Any, budget: Any) -> TrainSummary:
    """``trainer.train()``, with progress in this task's log."""
    from pipelines.training.callbacks import LoggingCallback, curve_rows

    columns = curve_columns(config)
    trainer.add_callback(LoggingCallback(get_run_logger(), config.method, [c for c in columns if c.startswith("rewards/")]))
    started = time.monotonic()
    output = trainer.train()
    state = trainer.state
    losses = [entry["loss"] for entry in state.log_history if "loss" in entry]
    summary = TrainSummary(
        steps=state.global_step,
        max_steps=state.max_steps,
        stopped_by="time_budget" if budget.stopped else "max_steps",
        epochs=float(state.epoch or 0.0),
        mean_loss=output.training_loss,
        final_loss=losses[-1] if losses else None,
        runtime_s=time.monotonic() - started,
        curve=tuple(curve_rows(state.log_history, columns)),
    )
    get_run_logger().info(
        "%s: trained %d/%d steps in %.1f s (%s)", config.method, summary.steps, summary.max_steps, summary.runtime_s,
        summary.stopped_by,
    )
    return summary


@task(name="save-model", **_TASK, **_RETRY)
def save_model(config: TrainConfig, trainer: Any, tokenizer: Any, card: str) -> str:
    from catalog.models import save_model as save

    merge = config.model.lora is not None and config.model.lora.merge
    directory = save(trainer.model, tokenizer, config.output.model_dir, merge_adapter=merge, card=card)
    get_run_logger().info("%s: model saved to %s", config.method, directory)
    return str(directory)


@task(name="write-reports", **_TASK, **_RETRY)
def write_reports(config: TrainConfig, report: dict, curve: str) -> None:
    from catalog.io import write_json_atomic, write_text_atomic

    write_json_atomic(config.output.metrics, report)
    write_text_atomic(config.output.curve, curve)
    get_run_logger().info("%s: metrics -> %s, curve -> %s", config.method, config.output.metrics, config.output.curve)


@task(name="write-timings", **_TASK)
def write_timings(config: TrainConfig, summary: TrainSummary, wall_s: float) -> None:
    """Wall times and steps per second to ``reports/timings/train_<name>.json``, ``<name>``
    the metrics file's stem (the method's, or e.g. ``josh_sft``): machine-dependent, so
    neither in the metrics nor in the model card (both hashed by DVC)."""
    from catalog.io import write_timings as write

    path = write(f"train_{Path(config.output.metrics).stem}", {
        "steps": summary.steps,
        "train_s": round(summary.runtime_s, 2),
        "steps_per_second": round(summary.steps / summary.runtime_s, 4) if summary.runtime_s else None,
        "wall_s": round(wall_s, 2),
    })
    get_run_logger().info("%s: timings -> %s", config.method, path)


# --- The recipe ------------------------------------------------------------------------------


def curve_columns(config: TrainConfig) -> tuple[str, ...]:
    from pipelines.training.callbacks import CURVE_COLUMNS
    from pipelines.training.config import GRPOObjective

    columns = CURVE_COLUMNS[config.method]
    objective = config.resolved_objective()
    if isinstance(objective, GRPOObjective):
        from pipelines.training.trainers import reward_functions, reward_name

        names = [reward_name(f) for f in reward_functions(objective, config.judge)[0]]
        columns = (*columns, *(f"rewards/{name}/mean" for name in names))
        if objective.beta == 0:
            columns = tuple(c for c in columns if c != "kl")
    return columns


def run_training(config: TrainConfig) -> dict[str, Any]:
    """One training run, start to finish; returns the report."""
    from pipelines.training.callbacks import TimeBudget
    from pipelines.training.card import model_card
    from pipelines.training.modeling import parameter_counts

    started = time.monotonic()
    device = check_config(config)
    tokenizer = load_tokenizer(config)
    prepared = load_datasets(config, tokenizer)
    dataset = build_dataset(config, prepared, tokenizer)
    # Seeded before the model exists: TRL wraps it in a LoRA adapter (random A matrices)
    # before the Trainer seeds itself, so the adapter's start must not hang on RNG history.
    from transformers import set_seed

    set_seed(config.optim.seed)
    model = load_model(config, device)

    before = evaluate(config, model, tokenizer, prepared, "before")[0] if config.eval.before else None

    budget = TimeBudget(config.optim.max_time_s)
    # The trainer's scratch directory, named by this process: the next run removes one a
    # killed run left behind.
    workdir = staging_directory(Path(tempfile.gettempdir()) / f"askflow-train-{config.method}")
    try:
        trainer = build_trainer(config, device, model, tokenizer, dataset, str(workdir), budget)
        summary = train(config, trainer, budget)
        after, generations = evaluate(config, trainer.model, tokenizer, prepared, "after")

        report = training_report(
            config, device, parameter_counts(trainer.model), prepared, len(dataset), summary, before, after
        )
        card = model_card(config, report, _examples(prepared, generations))
        if trainer.is_world_process_zero():
            save_model(config, trainer, tokenizer, card)
            write_reports(config, report, curve_csv(summary.curve, curve_columns(config)))
            write_timings(config, summary, time.monotonic() - started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _examples(prepared: list[SourceRows], generations: dict[str, list[str]], n: int = 3) -> dict[str, list[tuple[str, str]]]:
    """(end of the prompt, generation) for the first ``n`` held-out rows of each source."""
    examples = {}
    for source in prepared:
        texts = generations.get(source.name, [])
        examples[source.name] = [(row["prompt"][-1]["content"][-300:], text) for row, text in zip(source.heldout, texts[:n])]
    return examples


def _method(config: TrainConfig, method: str) -> TrainConfig:
    if config.method != method:
        raise ConfigError(f"flow train_{method} was given a {config.method!r} config")
    return config


# --- Flows -----------------------------------------------------------------------------------

# Parameters are a TrainConfig already checked by preflight; prints (datasets, TRL) stay on stdout.
_FLOW = {"validate_parameters": False, "log_prints": False}


@flow(name="train-sft", **_FLOW)
def train_sft(config: TrainConfig) -> dict[str, Any]:
    """Supervised fine-tuning on prompt-completion data (SpeakER SFT)."""
    return run_training(_method(config, "sft"))


@flow(name="train-dpo", **_FLOW)
def train_dpo(config: TrainConfig) -> dict[str, Any]:
    """DPO on preference pairs (SpeakER-DPO: clarifying over acting on a guess)."""
    return run_training(_method(config, "dpo"))


@flow(name="train-kto", **_FLOW)
def train_kto(config: TrainConfig) -> dict[str, Any]:
    """KTO on unpaired desirable / undesirable examples (SpeakER-DPO pairs split, or JOSH)."""
    return run_training(_method(config, "kto"))


@flow(name="train-grpo", **_FLOW)
def train_grpo(config: TrainConfig) -> dict[str, Any]:
    """GRPO with SpeakRL's format and clarification rewards."""
    return run_training(_method(config, "grpo"))


FLOWS = {"sft": train_sft, "dpo": train_dpo, "kto": train_kto, "grpo": train_grpo}
assert tuple(FLOWS) == METHODS


def flow_for(method: str) -> Any:
    """The flow of ``method``; ConfigError for an unknown one."""
    if method not in FLOWS:
        raise ConfigError(f"unknown training method {method!r}; methods: {', '.join(METHODS)}")
    return FLOWS[method]


__all__ = ["FLOWS", "flow_for", "retry_on_transient", "run_training", "train_dpo", "train_grpo", "train_kto", "train_sft"]
