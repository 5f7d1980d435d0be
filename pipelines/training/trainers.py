"""The TRL trainer of each method, configured from a :class:`TrainConfig`.

Sequences arrive already fitted to ``max_length`` (:mod:`pipelines.training.data`), so the
trainers are told not to truncate: a completion is never cut. Nothing is checkpointed
during training; the flow saves the final model itself.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

from pipelines.errors import ConfigError
from pipelines.rewards import resolve_reward
from pipelines.training.config import DPOObjective, GRPOObjective, KTOObjective, SFTObjective, TrainConfig
from pipelines.training.config import DeviceSpec


def training_arguments(config: TrainConfig, device: DeviceSpec, output_dir: str) -> dict[str, Any]:
    """The ``TrainingArguments`` every method shares."""
    from transformers import TrainingArguments

    optim = config.optim
    fields = TrainingArguments.__dataclass_fields__
    # transformers 5 renamed gradient checkpointing and folded warmup_ratio into warmup_steps.
    checkpointing = "activation_checkpointing" if "activation_checkpointing" in fields else "gradient_checkpointing"
    warmup = "warmup_ratio" if "warmup_ratio" in fields else "warmup_steps"  # a float < 1: a ratio of max_steps
    return {
        "output_dir": output_dir,
        "max_steps": optim.max_steps,
        "learning_rate": optim.learning_rate,
        "lr_scheduler_type": optim.lr_scheduler,
        warmup: optim.warmup_ratio,
        "weight_decay": optim.weight_decay,
        "adam_beta1": optim.adam_beta1,
        "adam_beta2": optim.adam_beta2,
        "max_grad_norm": optim.max_grad_norm,
        "per_device_train_batch_size": optim.batch_size,
        "gradient_accumulation_steps": optim.gradient_accumulation_steps,
        "logging_steps": optim.logging_steps,
        "logging_first_step": True,
        "seed": optim.seed,
        "bf16": device.bf16,
        checkpointing: device.gradient_checkpointing,
        "save_strategy": "no",
        "report_to": "none",
        "disable_tqdm": True,
        "dataloader_pin_memory": device.accelerator == "cuda",
    }


def judge_client(judge: Any) -> Any:
    """The LLM client of the ``judge`` role (a :class:`pipelines.llm.BackendConfig`), or None
    when the role has no LLM backend."""
    if judge is None or judge.kind != "openai":
        return None
    from pipelines.llm import LLMClient

    return LLMClient(judge.client)


def reward_functions(objective: GRPOObjective, judge: Any = None) -> tuple[list[Callable[..., list]], list[float]]:
    """The configured reward callables (:func:`pipelines.rewards.resolve_reward`: registered
    names, or import paths for rewards outside askflow; LLM-judged rewards over the ``judge`` role's backend) and their
    weights; ConfigError for a name that resolves to nothing."""
    functions, weights = [], []
    client = judge_client(judge)
    for name, weight in objective.rewards:
        functions.append(resolve_reward(name, client))
        weights.append(float(weight))
    if not functions:
        raise ConfigError("grpo needs at least one reward")
    return functions, weights


def reward_name(function: Callable[..., Any]) -> str:
    """The name TRL logs a reward function under (``rewards/<name>/mean``)."""
    return getattr(function, "__name__", type(function).__name__)


def build_trainer(
    config: TrainConfig,
    device: DeviceSpec,
    model: Any,
    tokenizer: Any,
    train_dataset: Any,
    peft_config: Any,
    output_dir: str,
    callbacks: Sequence[Any] = (),
    rollout_func: Callable[..., dict] | None = None,
) -> Any:
    """The TRL trainer for ``config.method``, ready to ``train()``. Its progress goes to
    the callbacks (e.g. :class:`~pipelines.training.callbacks.LoggingCallback`), not to
    stdout. ``rollout_func`` (GRPO): TRL's custom rollouts, e.g. whole conversations with a
    user simulator (:func:`pipelines.training.rollout.trl_rollout_func`)."""
    from transformers import PrinterCallback

    shared = {
        "model": model,
        "train_dataset": train_dataset,
        "processing_class": tokenizer,
        "peft_config": peft_config,
        "callbacks": list(callbacks),
    }
    if rollout_func is not None:
        shared["rollout_func"] = rollout_func
    trainer = _trainer(config.resolved_objective(), training_arguments(config, device, output_dir), shared, device, config.judge)
    trainer.remove_callback(PrinterCallback)
    return trainer


def _trainer(objective: Any, common: dict[str, Any], shared: dict[str, Any], device: DeviceSpec, judge: Any = None) -> Any:
    """The objective's TRL config (``common``: the TrainingArguments every method shares)
    and trainer (``shared``: the arguments every trainer takes)."""
    # The trainers that tokenize their dataset do it in device.data_workers processes.
    tokenizing = {"dataset_num_proc": device.data_workers} if device.data_workers and device.data_workers > 1 else {}
    if isinstance(objective, SFTObjective):
        from trl import SFTConfig, SFTTrainer

        # Dialogue windows ({"messages"}): the loss covers every assistant message.
        windows = "messages" in shared["train_dataset"].column_names
        args = SFTConfig(
            **common, **tokenizing, max_length=None, completion_only_loss=objective.completion_only_loss, assistant_only_loss=windows
        )
        return SFTTrainer(args=args, **shared)
    if isinstance(objective, DPOObjective):
        from trl import DPOConfig, DPOTrainer

        args = DPOConfig(**common, **tokenizing, max_length=None, beta=objective.beta, loss_type=list(objective.loss_type))
        return DPOTrainer(args=args, **shared)
    if isinstance(objective, KTOObjective):
        from trl import KTOConfig, KTOTrainer

        args = KTOConfig(
            **common,
            **tokenizing,
            max_length=None,
            beta=objective.beta,
            desirable_weight=objective.desirable_weight,
            undesirable_weight=objective.undesirable_weight,
        )
        return KTOTrainer(args=args, **shared)
    if isinstance(objective, GRPOObjective):
        from trl import GRPOConfig, GRPOTrainer

        functions, weights = reward_functions(objective, judge)
        args = GRPOConfig(
            **common,
            num_generations=objective.num_generations,
            max_completion_length=objective.max_completion_length,
            temperature=objective.temperature,
            beta=objective.beta,
            reward_weights=weights,
            loss_type=objective.loss_type,
            scale_rewards=objective.scale_rewards,
            mask_truncated_completions=objective.mask_truncated_completions,
            use_vllm=device.use_vllm,
            vllm_mode=device.vllm_mode,
        )
        return GRPOTrainer(reward_funcs=functions, args=args, **shared)
    raise ConfigError(f"no trainer for objective {type(objective).__name__}")


__all__ = ["build_trainer", "judge_client", "reward_functions", "reward_name", "training_arguments"]
