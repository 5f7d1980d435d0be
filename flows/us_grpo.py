"""Prefect flow ``train-us-grpo``: GRPO whose rollouts are whole conversations with a user
simulator (PIR's US-GRPO, section 3.2; any method's multi-turn GRPO).

    preflight -> load tokenizer -> load goals, database, simulator -> conversation prompts
      -> load model -> play the held-out goals (before) -> GRPO with rollout_func -> play them (after)
      -> save model (+ card) -> metrics JSON, curve CSV, timings

Each dataset row is a goal's conversation start (system prompt + the simulator's opening
turn). TRL's ``rollout_func`` (:func:`pipelines.training.rollout.trl_rollout_func`) plays the
conversation on from there with the policy being trained: its turns generated, the simulator's
replies (and tool results) injected and masked out of the loss with ``env_mask``, the world
grading the finished conversation (``correct``: MultiWOZ's goal checker), and the configured
rewards (``pir_composite_rules``, PIR's composite reward, :mod:`pipelines.rewards.pir`) scoring it.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task

from catalog.conversations import build_environment
from flows.train import _TASK, load_model, load_tokenizer, save_model, train, write_timings
from pipelines.files import staging_directory
from pipelines.training.config import TrainConfig, config_dict
from pipelines.training.rollout import ConversationEnv, conversation_rows


@task(name="play-held-out", **_TASK)
def evaluate_conversations(rollout: Any, model: Any, dialogues: list, seed: int, reward: Any, when: str) -> dict[str, Any]:
    started = time.monotonic()
    from pipelines.pir.metrics import play_and_score

    metrics, _ = play_and_score(rollout, model, dialogues, seed, reward)
    get_run_logger().info("us_grpo: held-out conversations %s: %s [%.1f s]", when,
                          {k: v for k, v in metrics.items() if not isinstance(v, dict)}, time.monotonic() - started)
    return metrics


@flow(name="train-us-grpo", validate_parameters=False, log_prints=False)
def train_us_grpo(config: TrainConfig, env: ConversationEnv, allow_no_signal: bool = False) -> dict[str, Any]:
    """US-GRPO (module docstring); returns the report written to ``config.output.metrics``.
    When every group of conversations had the same reward there was no gradient: the run
    fails with NoLearningSignal and publishes nothing, unless ``allow_no_signal`` (then the
    report says so in ``learning_signal``)."""
    from datasets import Dataset
    from transformers import set_seed

    from catalog.io import write_json_atomic, write_text_atomic
    from flows.train import curve_columns
    from pipelines.rewards.pir import unstated_slots
    from pipelines.training.rollout import trl_rollout_func
    from pipelines.training.callbacks import TimeBudget
    from pipelines.training.device import Machine, resolve_device
    from pipelines.training.modeling import parameter_counts
    from pipelines.preflight import check_model
    from pipelines.errors import NoLearningSignal
    from pipelines.training.report import curve_csv, learning_signal
    from pipelines.training.trainers import build_trainer, reward_functions

    logger = get_run_logger()
    started = time.monotonic()
    check_model(config)
    device = resolve_device(config.device, config.model, "grpo", Machine.detect())
    functions, _ = reward_functions(config.resolved_objective(), config.judge)
    tokenizer = load_tokenizer(config)
    rollout, greedy, train_dialogues, eval_dialogues = build_environment(env, tokenizer)
    rows, specs, repeated = conversation_rows(rollout, train_dialogues, env.seed)
    logger.info("us_grpo: %d conversation prompts (%d goals with a repeated start left out), %d held-out goals",
                len(rows), repeated, len(eval_dialogues))
    # The held-out conversations are scored by their own composite reward (the training
    # reward's judge and settings), so that the training reward's branch counts are training's.
    from pipelines.rewards.pir import PIRReward, RulesHelpfulness

    trained = next((f for f in functions if isinstance(f, PIRReward)), None)
    composite = PIRReward(trained.judge, s_base=trained.s_base, n_max=trained.n_max) if trained else PIRReward(RulesHelpfulness())
    branches_before = dict(trained.stats) if trained else {}

    set_seed(config.optim.seed)
    model = load_model(config, device)
    before = evaluate_conversations(greedy, model, eval_dialogues, env.seed, composite, "before")

    def extra(r: Any) -> dict[str, Any]:
        opening = next((e.text or "" for e in r.episode.events if e.actor == "user"), "")
        return {"unstated_slots": unstated_slots(specs_by_id[r.episode.episode_id].goal, opening),
                "ttr": r.ttr, "asks": len(r.asks)}

    specs_by_id = {spec.episode_id: spec for spec in specs.values()}
    budget = TimeBudget(config.optim.max_time_s)
    workdir = staging_directory(Path(tempfile.gettempdir()) / "askflow-train-us-grpo")
    try:
        trainer = build_trainer(config, device, model, tokenizer, Dataset.from_list(rows), None, str(workdir), [budget],
                                rollout_func=trl_rollout_func(rollout, specs, extra))
        summary = train(config, trainer, budget)
        objective = config.resolved_objective()
        signal = learning_signal(summary.curve, max(1, config.optim.batch_size // objective.num_generations))
        if signal["no_signal"]:
            message = (f"no learning signal: {signal['zero_variance_groups']} of {signal['groups']} groups had zero reward "
                       f"variance, so the model is a copy of {config.model.name_or_path}")
            if not allow_no_signal:
                raise NoLearningSignal(f"train_pir_grpo: {message}; nothing was published (a start policy that sometimes "
                                       "succeeds gives a signal; allow_no_signal: true publishes it anyway, labelled)")
            logger.warning("us_grpo: %s (allow_no_signal: published, labelled in the report)", message)
        after = evaluate_conversations(greedy, trainer.model, eval_dialogues, env.seed, composite, "after")
        columns = curve_columns(config)
        report = {
            "method": "us_grpo",
            "model": {"start": config.model.name_or_path, "parameters": parameter_counts(trainer.model)},
            # max_time_s is left out like every clock setting of a hashed report; train.stopped_by says if it stopped the run.
            "config": {"optim": {k: v for k, v in config_dict(config.optim).items() if k != "max_time_s"},
                       "objective": config_dict(config.resolved_objective()),
                       "env": config_dict(env)},
            "data": {"train_prompts": len(rows), "repeated_starts_left_out": repeated, "heldout_goals": len(eval_dialogues)},
            "learning_signal": signal,
            "train": {"steps": summary.steps, "max_steps": summary.max_steps, "stopped_by": summary.stopped_by,
                      "mean_loss": summary.mean_loss, "final_loss": summary.final_loss,
                      "rollouts": dict(rollout.stats),
                      "reward_branches": {k: v - branches_before.get(k, 0) for k, v in (trained.stats if trained else {}).items()}},
            "eval": {"before": before, "after": after},
        }
        card = (f"# {Path(config.output.model_dir).name}\n\nUS-GRPO (PIR section 3.2) from `{config.model.name_or_path}`: "
                f"{summary.steps} steps, rollouts of whole conversations with the agenda user simulator (masked), "
                f"composite reward on the goal checker's verdict.\n\nHeld-out conversations before: {before}\n\nafter: {after}\n")
        if trainer.is_world_process_zero():
            save_model(config, trainer, tokenizer, card)
            write_json_atomic(config.output.metrics, report)
            write_text_atomic(config.output.curve, curve_csv(summary.curve, columns))
            write_timings(config, summary, time.monotonic() - started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


__all__ = ["train_us_grpo"]
