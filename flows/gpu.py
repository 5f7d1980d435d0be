"""The accelerator job's runner: the stages of a GPU profile, on a node without Prefect or DVC.

``askflow gpu run JOB`` (or ``python JOB/run.py`` on a node where askflow is not installed)
checks and unpacks the job (:mod:`pipelines.gpu.bootstrap`), then runs this module inside the
unpacked project. It reads params.yaml ``gpu`` (the profile the job was packed with) and runs,
top to bottom, stopping on steps and goal counts, never on time::

    convert   the starting model: SmolLM2-135M-Instruct from the job's GGUF (or models/base)
    sft       full fine-tuning from it on the SpeakER SFT rows (``epochs`` -> max_steps)
    evaluate_sft  zero-shot and SFT on the held-out test goals, before GRPO (a lease that ends
              during GRPO still leaves their table)
    grpo      GRPO from the SFT model: with an ``env`` section, multi-turn (whole conversations
              with the agenda user on the train goals, rewarded by the goal checker's verdict,
              :mod:`pipelines.rewards.dialogue`); without, single-turn on the SpeakER GRPO rows
              with SpeakRL's rewards (format + clarify_verifiable)
    evaluate  the GRPO model on the same goals, then zero-shot, SFT and GRPO together (agenda
              simulator), with bootstrap intervals over goals and paired tests, as the CPU
              ``evaluate`` stage

A profile with a ``pir_eval`` section is PIR's chain, the same shape (:class:`Chain`)::

    sft       cold-start SFT on pir_augment's traces (``pir_traces``: the trace's input as the
              user's message, the augmented trace as the reply; the simulated user's
              ``<response>`` blocks masked out of the loss)
    pir_eval_sft  PIR's metrics (section 4.1, as stage ``pir_eval``) of zero-shot and SFT
    grpo      US-GRPO from the SFT model: whole conversations, the agenda user answering the
              questions asked inside the reasoning, PIR's composite reward on the goal
              checker's verdict
    pir_eval  the same for the US-GRPO model, then all three, with each model's success and
              each against the one before it with 95 % intervals over the goals

A profile with an ``l2a_eval`` section is Learn-to-Ask's chain, the same shape::

    sft       the paper's SFT baseline on ``l2a_train`` (the expert's next turn, ``<stop />``
              where the hindsight target says stop), its val dialogues held out
    l2a_eval_sft  Table 1's proxies (as stage ``l2a_eval``) of zero-shot and SFT: greedy
              answers on the held-out test samples, scored against their hindsight targets
    grpo      GRPO from the SFT model with eq. 5 (``l2a_questions``) on the same rows
    l2a_eval  the same for the GRPO model, then all three with the reference rows, bootstrap
              intervals over the samples and each model against the one before it

With ``seeds`` (in any chain's profile: ``l2a``, ``speakrl_seeds``, ``pir_seeds``), SFT and
GRPO run once per training seed (``sft``, ``sft_s1``, ..., each GRPO from its seed's SFT model)
and the evaluations pool each trained model's seeds, as the CPU stages ``l2a_eval``,
``evaluate_seeds`` and ``pir_eval_seeds`` pool ``more_seeds``. A profile with ``base: NAME`` is profile NAME with its own sections laid
over it (:func:`based_profile`).

A profile with a ``harvest`` section is JOSH's self-improvement round instead (issue 27)::

    convert   the starting model M, as above
    harvest   M harvests its own trees on the train goals (JOSH's beam search against the
              agenda user; params.yaml ``josh`` with the section laid over it), and plays the
              test goals sampled, as the CPU stage ``josh`` does; writes the SFT / KTO rows
    sft       M' = M fine-tuned on its golden paths ("not trained" when it found none)
    kto       KTO from the SFT model on its good and bad turns (section ``kto``)
    toolwoz   M and each M' on the ToolWOZ test goals, greedy and without branching: average
              reward and 100 % success with 95 % intervals over goals, as ``josh_evaluate``

Each stage writes ``results/<stage>.json`` and ``.md`` (the SFT and GRPO reports carry
``tokens_per_s``, ``mfu``, steps/s and, for GRPO, the share of time spent generating);
``results/job.json`` has the hardware, package versions and every stage's status and wall
time; ``results/manifest.json`` a sha256 of every result file and the commit, for
``askflow gpu import``. Both are rewritten after every stage (``finished: false`` until the
end): a job stopped from outside leaves importable results of the stages it finished, and
``--resume`` (the same results directory) keeps those stages and runs the rest. A stage that fails is reported with its error and the stages that do
not need it still run (evaluation plays whichever models exist). Models stay on the node
(``work/models``). This is the same library the Prefect flows call (:mod:`pipelines.training`,
:mod:`pipelines.evaluation`); only the orchestration differs.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import math
import pickle
import shutil
import sys
import tempfile
import time
import traceback
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from catalog.io import read_params
from pipelines.config import from_params, positive_int
from pipelines.errors import AskflowError, ConfigError, DataError
from pipelines.episodes.decoding import decode_stats
from pipelines.evaluation.speed import decode_summary, stats_since
from pipelines.gpu.bootstrap import FILES, read_manifest, sha256_file
from pipelines.learn_to_ask.config import NOT_IN_GPU_SECTION as L2A_EVAL_NOT_IN_GPU_SECTION, L2aEvalParams
from pipelines.pir.evaluate import NOT_IN_GPU_SECTION as PIR_EVAL_NOT_IN_GPU_SECTION, PirEvalParams
from pipelines.training.config import (NOT_IN_GPU_SECTION, OBJECTIVES, DataSpec, ModelSpec, OutputSpec, TrainConfig, TrainSectionConfig,
                                       config_dict)
from pipelines.training.rollout import ConversationEnv

#: A profile's sections by its kind: SpeakRL's chain, JOSH's round, PIR's or Learn-to-Ask's chain
#: (``seeds`` trains each model under several seeds and pools them, :func:`training_seeds`).
PROFILE_SECTIONS: dict[str, tuple[str, ...]] = {"speakrl": ("sft", "grpo", "evaluate", "unbatched_check", "seeds"),
                                                "josh": ("harvest", "sft", "kto", "toolwoz"),
                                                "pir": ("sft", "grpo", "pir_eval", "seeds"), "l2a": ("sft", "grpo", "l2a_eval", "seeds")}
#: The section that makes a profile another kind than SpeakRL's chain.
KIND_SECTIONS = {"harvest": "josh", "pir_eval": "pir", "l2a_eval": "l2a"}

log = logging.getLogger("askflow.gpu")


def deep_merge(base: Mapping[str, Any], override: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``override`` laid over it: mappings merge key by key, anything else
    (lists included) is replaced.

    >>> deep_merge({"a": {"b": 1, "c": 2}, "d": [1]}, {"a": {"c": 3}, "d": [2]})
    {'a': {'b': 1, 'c': 3}, 'd': [2]}
    """
    merged = dict(base)
    for key, value in override.items():
        if isinstance(value, Mapping) and isinstance(merged.get(key), Mapping):
            merged[key] = deep_merge(merged[key], value)
        else:
            merged[key] = value
    return merged


def profile_params(gpu: Mapping[str, Any], name: str | None, smoke: bool) -> tuple[str, dict[str, Any]]:
    """The named profile of params.yaml ``gpu`` (default ``gpu.profile``), with its ``smoke``
    overrides applied when ``smoke``; ConfigError for an unknown name or section. A profile
    with ``base: <profile>`` is that profile with its own sections laid over it
    (:func:`deep_merge`), smoke overrides included: a variant names only what it changes."""
    profiles = gpu.get("profiles") or {}
    name = name or gpu.get("profile")
    profile = based_profile(profiles, name)
    overrides = profile.pop("smoke", None) or {}
    allowed = PROFILE_SECTIONS[profile_kind(profile)]
    unknown = sorted(set(profile) - set(allowed))
    if unknown:
        raise ConfigError(f"params.yaml gpu.profiles.{name}: unknown section(s) {unknown}; allowed: {', '.join(allowed)}, smoke")
    return name, deep_merge(profile, overrides) if smoke else profile


def based_profile(profiles: Mapping[str, Any], name: Any) -> dict[str, Any]:
    """Profile ``name`` of ``profiles`` with its ``base`` chain resolved (the base first, each
    profile laid over the one it names); ConfigError for an unknown name or a cycle.

    >>> profiles = {"a": {"sft": {"lr": 1, "epochs": 2}, "smoke": {"sft": {"epochs": 0}}},
    ...             "b": {"base": "a", "sft": {"lr": 2}, "seeds": [0, 1], "smoke": {"seeds": [0]}}}
    >>> based_profile(profiles, "b")
    {'sft': {'lr': 2, 'epochs': 2}, 'smoke': {'sft': {'epochs': 0}, 'seeds': [0]}, 'seeds': [0, 1]}
    >>> based_profile({"a": {"base": "b"}, "b": {"base": "a"}}, "a")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: params.yaml gpu.profiles.a: base profiles form a cycle: a -> b -> a
    """
    chain: list[str] = []
    while True:
        if name not in profiles:
            where = f"params.yaml gpu.profiles.{chain[-1]}.base" if chain else "params.yaml gpu.profiles"
            raise ConfigError(f"{where}: no profile {name!r}; profiles: {sorted(profiles)}")
        if name in chain:
            raise ConfigError(f"params.yaml gpu.profiles.{chain[0]}: base profiles form a cycle: {' -> '.join([*chain, name])}")
        chain.append(name)
        base = (profiles[name] or {}).get("base")
        if base is None:
            break
        name = base
    profile: dict[str, Any] = {}
    for layer in reversed(chain):
        profile = deep_merge(profile, {key: value for key, value in (profiles[layer] or {}).items() if key != "base"})
    return profile


def profile_kind(sections: Mapping[str, Any]) -> str:
    """``josh`` for a profile with a ``harvest`` section (JOSH's round), ``pir`` for one with
    a ``pir_eval`` section (PIR's chain), ``l2a`` for one with an ``l2a_eval`` section
    (Learn-to-Ask's chain), else ``speakrl`` (a profile with two of them is refused by
    :func:`profile_params`: the other's section is unknown to its kind).

    >>> profile_kind({"sft": {}, "grpo": {}, "pir_eval": {}}), profile_kind({"sft": {}, "evaluate": {}})
    ('pir', 'speakrl')
    >>> profile_kind({"sft": {}, "grpo": {}, "l2a_eval": {}})
    'l2a'
    """
    return next((KIND_SECTIONS[name] for name in sections if name in KIND_SECTIONS), "speakrl")


FROM_DATA = "from_data"
#: What a GPU section's ``env`` does not take (US-GRPO's evaluation goals; the job's evaluate stages play the test goals).
ENV_NOT_IN_GPU_SECTION = ("eval_split", "eval_goals")


def with_limit(value: Any, limit: int) -> Any:
    """``value`` with every ``from_data`` replaced by ``limit`` (the generation limit the
    training data asks for, :func:`pipelines.training.limits.generation_limit`).

    >>> with_limit({"eval": {"max_new_tokens": "from_data"}, "steps": [1, "from_data"]}, 224)
    {'eval': {'max_new_tokens': 224}, 'steps': [1, 224]}
    """
    if value == FROM_DATA:
        return limit
    if isinstance(value, Mapping):
        return {key: with_limit(item, limit) for key, item in value.items()}
    if isinstance(value, list):
        return [with_limit(item, limit) for item in value]
    return value


def data_generation_limit(sections: Mapping[str, Any], model_dir: Path) -> dict[str, Any]:
    """The generation limit of the profile's SFT data in the starting model's tokens: the
    longest training turn of any of its sources (every row, each source's completion column)
    plus 25 %, so that no turn is cut (issue 26)."""
    import pyarrow.parquet as pq

    from pipelines.training.limits import generation_limit, longest_completion_tokens
    from pipelines.training.modeling import load_tokenizer

    tokenizer = load_tokenizer(ModelSpec(path=str(model_dir)))
    sources = sections["sft"]["data"]["sources"]
    completions = []
    for source in sources:
        column = source.get("completion_column") or "completion"
        completions += pq.read_table(source["path"], columns=[column]).column(column).to_pylist()  # read once
    return {"tokens": generation_limit(completions, tokenizer), "longest": longest_completion_tokens(completions, tokenizer),
            "sources": [source["path"] for source in sources]}


def parse_section(section: Mapping[str, Any] | TrainSectionConfig, where: str) -> TrainSectionConfig:
    """A profile's training section as :class:`TrainSectionConfig` (parsed once per stage;
    a parsed one is returned as it is)."""
    if isinstance(section, TrainSectionConfig):
        return section
    return from_params(TrainSectionConfig, section, where, without=NOT_IN_GPU_SECTION)


def conversation_env(section: Mapping[str, Any] | TrainSectionConfig, method: str, where: str,
                     objective: Any = None) -> ConversationEnv | None:
    """A GRPO section's ``env`` (multi-turn: the conversations are the data), checked against
    the section's objective (``objective``: as its TrainConfig parsed it; None: parsed here);
    None for a section trained on Parquet rows."""
    params = parse_section(section, where)
    if params.env is None:
        return None
    if method != "grpo":
        raise ConfigError(f"{where}.env: whole conversations are GRPO's rollouts; {method} trains on data.sources")
    from catalog.conversations import read_environment

    # eval_split / eval_goals are US-GRPO's own evaluation: the job's evaluate stages play the test goals.
    if objective is None:
        objective = from_params(OBJECTIVES["grpo"], params.objective, f"{where}.objective")
    return read_environment(params.env, objective, where, without=ENV_NOT_IN_GPU_SECTION)


def train_config(method: str, section: Mapping[str, Any] | TrainSectionConfig, *, model_path: str, output_dir: Path,
                 where: str) -> TrainConfig:
    """A :class:`~pipelines.training.config.TrainConfig` from a profile section
    (:class:`~pipelines.training.config.TrainSectionConfig`); the model and outputs are the job's.
    A section with an ``env`` (multi-turn GRPO) has no ``data``: the conversations are its data."""
    params = parse_section(section, where)
    if params.env is not None:
        if params.data is not None:
            raise ConfigError(f"{where}: env (whole conversations) and data (Parquet rows) exclude each other")
        data: Any = DataSpec(sources=())
    elif params.data is None:
        raise ConfigError(f"{where}: missing required key(s) ['data']")
    else:
        data = params.data
    return params.train_config(method, where, data=data, model={**(params.model or {}), "path": model_path},
                               output=OutputSpec(model_dir=str(output_dir / "model"), metrics=str(output_dir / "metrics.json"),
                                                 curve=str(output_dir / "curve.csv")))


def check_profile_inputs(root: Path) -> list[str]:
    """Every training source of every GPU profile (smoke overrides included) validated by its
    declared schema or training contract (:func:`pipelines.preflight.inputs.check_inputs`), as
    ``python -m stages.train`` does before training: run where the job is packed. Returns the
    files checked."""
    import contextlib

    from catalog import datasets
    from pipelines.preflight.inputs import check_inputs

    gpu = read_params("gpu", root / "params.yaml")
    checked = []
    with contextlib.chdir(root):
        for name in gpu.get("profiles") or {}:
            for smoke in (False, True):
                _, sections = profile_params(gpu, name, smoke)
                kind = profile_kind(sections)
                if kind == "josh":
                    # its training rows are the node's harvest: the harvest settings are checked here
                    josh_config(sections["harvest"], Path("models") / "smollm2", Path("work"), f"params.yaml gpu.profiles.{name}.harvest",
                                read_params("josh", root / "params.yaml"))
                    continue
                training_seeds(sections, f"params.yaml gpu.profiles.{name}")
                if kind == "pir":
                    pir_eval_section(with_limit(sections["pir_eval"], 1), f"params.yaml gpu.profiles.{name}.pir_eval")
                if kind == "l2a":
                    where = f"params.yaml gpu.profiles.{name}.l2a_eval"
                    samples = str(l2a_eval_section(sections["l2a_eval"], where)["samples"])
                    if samples not in (gpu.get("inputs") or ()):
                        raise ConfigError(f"{where}.samples: {samples} is not among params.yaml gpu.inputs, so the job would not carry it")
                    prompts = (read_params("hindsight", root / "params.yaml", required=False) or {}).get("prompts")
                    if prompts and prompts not in (gpu.get("inputs") or ()):
                        raise ConfigError(f"params.yaml hindsight.prompts: {prompts} (the policy prompt {where} answers under) "
                                          "is not among params.yaml gpu.inputs, so the job would not carry it")
                    if samples not in checked:
                        # whatever its name, by the catalog's entry for l2a_eval's samples: the node has no Great Expectations
                        datasets.load("l2a_eval.samples", {"samples": samples})
                        checked.append(samples)
                for method in ("sft", "grpo"):
                    where = f"params.yaml gpu.profiles.{name}.{method}"
                    section = parse_section(with_limit(sections[method], 1), where)
                    config = train_config(method, section, model_path="models/smollm2", output_dir=Path("models") / "gpu", where=where)
                    conversation_env(section, method, where, config.resolved_objective())
                    check_inputs(config)
                    checked += [s.path for s in config.data.sources if s.path not in checked]
    return checked


# --- Training ---------------------------------------------------------------------------------


class GenerationTimer:
    """Seconds spent generating GRPO's rollouts, by wrapping an instance's method: the
    model's ``generate`` for single-turn GRPO (TRL calls it on the unwrapped model, the same
    object on one device); the conversation rollout's ``play`` for multi-turn GRPO (its
    batches decode with the batched loop, not ``generate``; the simulator's turns count)."""

    def __init__(self, owner: Any, method: str = "generate"):
        self.seconds = 0.0
        self.calls = 0
        inner = getattr(owner, method)

        def timed(*args: Any, **kwargs: Any) -> Any:
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                _synchronize()
                self.seconds += time.perf_counter() - started
                self.calls += 1

        setattr(owner, method, timed)


def _synchronize() -> None:
    import torch

    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _load_source(config: Any, source: Any, tokenizer: Any, count: Any) -> Any:
    """One training source read and fitted (the inputs were validated by their expectation
    suites when the job was packed)."""
    import pyarrow.parquet as pq

    from pipelines.training.card import file_md5
    from pipelines.training.data import JOIN_COLUMN, joining_prompts, prepare_source

    table = pq.read_table(source.path)
    records = table.to_pylist()
    prompt_rows = None
    if source.prompts_from is not None:
        key = config.data.holdout.key
        prompt_rows = joining_prompts(pq.read_table(source.prompts_from, columns=[key, JOIN_COLUMN, "prompt"]), key, records)
    reserve = getattr(config.resolved_objective(), "max_completion_length", 0)
    rows = prepare_source(
        records, table.column_names, source, config.method, config.data, count, config.optim.max_length,
        reserve=reserve, max_heldout=config.eval.max_examples, prompt_rows=prompt_rows, workers=config.device.data_workers,
    )
    rows.stats = {"path": source.path, "md5": file_md5(source.path), **rows.stats}  # the version, as in dvc.lock
    return rows


def steps_for_epochs(epochs: float, examples: int, batch_size: int, accumulation: int = 1) -> int:
    """Optimizer steps for ``epochs`` passes over ``examples`` (at least one).

    >>> steps_for_epochs(2, 20_000, 64)
    625
    """
    return max(1, math.ceil(epochs * examples / (batch_size * accumulation)))


def conversations(env: ConversationEnv, tokenizer: Any) -> tuple[Any, Any, Any, dict[str, Any]]:
    """Multi-turn GRPO's data: one row per train goal's conversation start, TRL's
    ``rollout_func`` that plays each on with the policy and the agenda user (its turns
    decoded in batches of ``env.rollout.batch_size``), that rollout (its counters) and what
    the report says of the data. Each
    rollout carries the goal checker's verdict and :func:`conversation_columns` for the
    rewards of :mod:`pipelines.rewards.dialogue`, and what PIR's composite reward reads
    (``unstated_slots``: the goal's slots its opening left out; ``ttr``, ``asks``), as
    US-GRPO's flow gives it."""
    from datasets import Dataset

    from catalog.conversations import build_environment
    from pipelines.evaluation.metrics import conversation_columns
    from pipelines.pir.metrics import opening_text
    from pipelines.rewards.pir import unstated_slots
    from pipelines.training.rollout import conversation_rows, trl_rollout_func

    rollout, _, dialogues, _ = build_environment(env, tokenizer)
    rows, specs, repeated = conversation_rows(rollout, dialogues, env.seed)
    if not rows:
        raise ConfigError(f"env: no train goals in {env.source} (split {env.split!r}) to play")
    goals = {spec.episode_id: spec.goal for spec in specs.values()}

    def columns(played: Any) -> dict[str, Any]:
        goal = goals[played.episode.episode_id]
        return {**conversation_columns(played.episode, goal), "unstated_slots": unstated_slots(goal, opening_text(played)),
                "ttr": played.ttr, "asks": len(played.asks)}

    about = {"source": env.source, "split": env.split, "train_goals": len(rows), "repeated_starts_left_out": repeated}
    return Dataset.from_list(rows), trl_rollout_func(rollout, specs, columns), rollout, about


def train(config: Any, *, epochs: float | None = None, sampler: str | None = None, env: ConversationEnv | None = None) -> dict[str, Any]:
    """One training run of the library's recipe (:mod:`flows.train` without Prefect): data,
    model, held-out metrics before (if asked) and after, the trained model saved; returns
    the report with ``throughput`` (tokens/s and MFU for SFT, generation share for GRPO).
    With ``env`` (GRPO only) the data are whole conversations (:func:`conversations`); the
    report's ``conversations`` then has the rollouts' counts and the share of groups whose
    rewards varied, step by step."""
    from transformers import set_seed

    from pipelines.gpu.hardware import describe, mfu
    from pipelines.training.callbacks import CURVE_COLUMNS, LoggingCallback, curve_rows
    from pipelines.training.card import model_card
    from pipelines.training.data import TokenCounter, build_train_dataset
    from pipelines.training.evaluation import evaluate_heldout
    from catalog.models import save_model
    from pipelines.training.modeling import load_model, load_tokenizer, parameter_counts, peft_config
    from pipelines.preflight import preflight
    from pipelines.training.report import TrainSummary, curve_csv, training_report
    from pipelines.training.trainers import build_trainer, reward_functions, reward_name

    # Every row was validated by its training contract when the job was packed
    # (check_profile_inputs); the node has no Great Expectations to do it again.
    device = preflight(config, validate_inputs=False, rows=env is None)
    tokenizer = load_tokenizer(config.model)
    count = TokenCounter(tokenizer)
    prepare_started = time.perf_counter()
    objective = config.resolved_objective()
    rollout_func, rollout, played = None, None, None
    if env is None:
        prepared = [_load_source(config, source, tokenizer, count) for source in config.data.sources]
        dataset = build_train_dataset(config.method, prepared, seed=config.data.seed, tokenizer=tokenizer,
                                      loss_mask=getattr(objective, "loss_mask", None))
    else:
        prepared = []
        dataset, rollout_func, rollout, played = conversations(env, tokenizer)
    prepare_s = time.perf_counter() - prepare_started
    if epochs is not None:
        steps = steps_for_epochs(epochs, len(dataset), config.optim.batch_size, config.optim.gradient_accumulation_steps)
        config = dataclasses.replace(config, optim=dataclasses.replace(config.optim, max_steps=steps))
    log.info("%s: %d training examples, %d steps (batch %d)", config.method, len(dataset), config.optim.max_steps, config.optim.batch_size)
    set_seed(config.optim.seed)
    model = load_model(config.model, device)
    if device.bf16 and config.model.lora is None:
        # Full fine-tuning keeps float32 master weights and computes in bf16 (the trainer's
        # autocast): Adam steps of ~1e-4 relative size vanish in bf16's 8-bit mantissa.
        model = model.float()
    before = evaluate_heldout(model, tokenizer, prepared, config.eval, objective, None)[0] if config.eval.before else None

    columns = CURVE_COLUMNS[config.method]
    extra = ("num_tokens",)
    if config.method == "grpo":
        extra += tuple(f"rewards/{reward_name(f)}/mean" for f in reward_functions(objective, None)[0]) + ("frac_reward_zero_std",)
    columns = tuple(dict.fromkeys((*columns, *extra)))
    workdir = Path(tempfile.mkdtemp(prefix=f"askflow-gpu-{config.method}-"))
    try:
        built = time.perf_counter()
        trainer = build_trainer(config, device, model, tokenizer, dataset, peft_config(config.model.lora), str(workdir),
                                [LoggingCallback(log, config.method, [c for c in columns if c.startswith("rewards/")])],
                                rollout_func=rollout_func)
        trainer_init_s = time.perf_counter() - built  # TRL tokenizes the dataset here
        if sampler is not None:
            # The sampler is built when training starts: length-grouped batches pad little.
            if not hasattr(trainer.args, "train_sampling_strategy"):
                raise ConfigError(f"{config.method}: sampler {sampler!r} needs transformers >= 5 (train_sampling_strategy)")
            trainer.args.train_sampling_strategy = sampler
        timer = None
        if config.method == "grpo":
            timer = GenerationTimer(rollout, "play") if rollout is not None else GenerationTimer(trainer.model)
        _synchronize()
        started = time.perf_counter()
        output = trainer.train()
        _synchronize()
        train_s = time.perf_counter() - started
        state = trainer.state
        losses = [entry["loss"] for entry in state.log_history if "loss" in entry]
        summary = TrainSummary(
            steps=state.global_step, max_steps=state.max_steps, stopped_by="max_steps", epochs=float(state.epoch or 0.0),
            mean_loss=output.training_loss, final_loss=losses[-1] if losses else None, runtime_s=train_s,
            curve=tuple(curve_rows(state.log_history, columns)),
        )
        after, generations = evaluate_heldout(trainer.model, tokenizer, prepared, config.eval, objective, None)
        parameters = parameter_counts(trainer.model)
        report = training_report(config, device, parameters, prepared, len(dataset), summary, before, after)
        tokens = getattr(trainer, "_total_train_tokens", None) or _logged_tokens(state.log_history)
        machine = describe()
        throughput: dict[str, Any] = {
            "prepare_s": round(prepare_s, 2),
            "data_workers": device.data_workers,
            "trainer_init_s": round(trainer_init_s, 2),
            "train_s": round(train_s, 2),
            "steps_per_s": round(summary.steps / train_s, 4) if train_s else None,
            "tokens": int(tokens) if tokens else None,
            "tokens_per_s": round(tokens / train_s, 1) if tokens and train_s else None,
            "peak_bf16_flops": machine["peak_bf16_flops"],
        }
        throughput["mfu"] = (round(mfu(parameters["total"], throughput["tokens_per_s"], machine["peak_bf16_flops"]), 4)
                             if throughput["tokens_per_s"] and machine["peak_bf16_flops"] else None)
        if timer is not None:
            throughput.update(generate_s=round(timer.seconds, 2), generate_calls=timer.calls,
                              generate_share=round(timer.seconds / train_s, 4) if train_s else None)
        report["throughput"] = throughput
        if played is not None:
            varied = [round(1.0 - row["frac_reward_zero_std"], 4) for row in summary.curve
                      if row.get("frac_reward_zero_std") is not None]
            setting = {key: value for key, value in config_dict(env).items() if key not in ENV_NOT_IN_GPU_SECTION}
            report["conversations"] = {**played, "rollouts": dict(rollout.stats), "config": setting,
                                       "groups_with_reward_variance_by_step": varied}
        report["objective"] = config_dict(objective)  # the loss mask, the rewards and their weights
        # How a reward that keeps counts (PIR's composite: wrong, correct without a question, ...) scored the rollouts.
        branches = {reward_name(f): dict(sorted(f.stats.items())) for f in getattr(trainer, "reward_funcs", ()) if isinstance(getattr(f, "stats", None), Mapping)}
        if branches:
            report["reward_branches"] = branches
        report["optim"] = {"max_steps": config.optim.max_steps, "batch_size": config.optim.batch_size,
                           "learning_rate": config.optim.learning_rate, "max_length": config.optim.max_length,
                           "seed": config.optim.seed, "epochs_asked": epochs, "sampler": sampler or "random"}
        examples = {s.name: [(r["prompt"][-1]["content"][-300:], t) for r, t in zip(s.heldout, generations.get(s.name, [])[:3])]
                    for s in prepared}
        merge = config.model.lora is not None and config.model.lora.merge
        save_model(trainer.model, tokenizer, config.output.model_dir, merge_adapter=merge, card=model_card(config, report, examples))
        Path(config.output.curve).write_text(curve_csv(summary.curve, columns), encoding="utf-8")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return report


def _logged_tokens(history: Sequence[Mapping[str, Any]]) -> float | None:
    values = [entry["num_tokens"] for entry in history if "num_tokens" in entry]
    return values[-1] if values else None


# --- Evaluation -------------------------------------------------------------------------------


def continuous_mode(section: Mapping[str, Any], where: str) -> tuple[dict[str, Any], str | None, tuple[int, int] | None]:
    """An ``evaluate`` section without its ``continuous`` key (the job's own: the CPU stages
    play in rounds), and what that key says: the attention of the slot step that batched
    episodes decode with under continuous batching (:mod:`pipelines.episodes.continuous`;
    greedy, one process), or None (rounds); and the prompt-lookup drafts its batched steps
    verify (:func:`continuous_draft`), or None. ``continuous: true`` is ``{attention: sdpa}``;
    ``{attention: auto}``: the faster of the two on this device, timed at the evaluation's
    shape (:func:`resolve_attention`, once per job). ``draft: {tokens: K, ngram: N}`` beside
    ``attention``: the drafts.

    >>> continuous_mode({"max_goals": 4, "continuous": True}, "w")
    ({'max_goals': 4}, 'sdpa', None)
    >>> continuous_mode({"continuous": {"attention": "matmul", "draft": {"tokens": 4}}}, "w")
    ({}, 'matmul', (4, 3))
    >>> continuous_mode({"continuous": False}, "w")
    ({}, None, None)
    >>> continuous_mode({"continuous": {"attention": "flash"}}, "w")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: w.continuous: expected true, false or {attention: one of ['auto', 'matmul', 'sdpa'], draft: {tokens, ngram}}, got {'attention': 'flash'}
    """
    from pipelines.episodes.continuous import ATTENTIONS

    rest = {key: value for key, value in section.items() if key != "continuous"}
    value = section.get("continuous", False)
    if value is True:
        value = {"attention": "sdpa"}
    known = sorted([*ATTENTIONS, "auto"])
    if value is not False and not (isinstance(value, Mapping) and "attention" in value and set(value) <= {"attention", "draft"}
                                   and value["attention"] in known):
        raise ConfigError(f"{where}.continuous: expected true, false or {{attention: one of {known}, draft: {{tokens, ngram}}}}, "
                          f"got {value!r}")
    draft = continuous_draft(section, where)
    if value and rest.get("workers", 1) != 1:
        raise ConfigError(f"{where}.continuous: one process decodes continuously; workers must be 1, got {rest.get('workers')!r}")
    return rest, value["attention"] if value else None, draft


def continuous_draft(section: Mapping[str, Any], where: str) -> tuple[int, int] | None:
    """The prompt-lookup drafts an ``evaluate`` section's continuous batching verifies per
    step, as ``(tokens, ngram)`` (:class:`~pipelines.episodes.continuous.SlotDecoder`
    ``draft``; ``ngram`` default 3), or None: ``continuous: {attention: ..., draft: {tokens:
    4, ngram: 3}}``. Greedy drafts change how many ids a step takes, not which
    (``benchmarks/draft_depth.py`` reads the saving off a run's recorded replies).

    >>> continuous_draft({"continuous": {"attention": "auto", "draft": {"tokens": 4}}}, "w")
    (4, 3)
    >>> continuous_draft({"continuous": True}, "w") is None
    True
    >>> continuous_draft({"continuous": {"attention": "sdpa", "draft": {"tokens": 0}}}, "w")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: w.continuous.draft: expected {tokens: n >= 1, ngram: n >= 1}, got {'tokens': 0}
    """
    value = section.get("continuous")
    draft = value.get("draft") if isinstance(value, Mapping) else None
    if draft is None:
        return None
    if not (isinstance(draft, Mapping) and set(draft) <= {"tokens", "ngram"}
            and all(type(draft.get(key, 1)) is int and draft.get(key, 1) >= 1 for key in ("tokens", "ngram")) and "tokens" in draft):
        raise ConfigError(f"{where}.continuous.draft: expected {{tokens: n >= 1, ngram: n >= 1}}, got {draft!r}")
    return draft["tokens"], draft.get("ngram", 3)


#: The prompt width :func:`timed_attention` times where an evaluation does not cap its prompts.
UNCAPPED_PROMPT_COLUMNS = 2048


def timed_attention(agent: Any, config: Any, draft: tuple[int, int] | None = None) -> dict[str, Any]:
    """Each slot-step attention timed for ``agent`` (an evaluation's loaded model) at the
    widest step ``config`` (an :class:`~pipelines.evaluation.config.EvalConfig`) can make: as
    many slots as it decodes rows (its batch size, at most its goals times seeds), as many
    columns as its longest prompt and reply need (an uncapped prompt is as long as its
    dialogue: :data:`UNCAPPED_PROMPT_COLUMNS` stand for it), with its CUDA graphs
    (:func:`~pipelines.episodes.continuous.time_attentions`), verifying ``draft``'s positions
    where the evaluation drafts. ``chosen``: the faster of those
    that ran (and captured, where graphed); ``ruled_out``: the others, with their errors.
    Which one wins is the device's kernels' business (on the H200 a float32 SDPA step of 128
    rows over 1,500 positions took 16.4 ms where reading its keys and values takes about 2),
    so the job measures instead of assuming."""
    from pipelines.episodes.continuous import time_attentions

    hf = getattr(agent, "inner", agent)
    model = hf.backend.model
    goals = (config.max_goals or config.generation.batch_size) * len(config.seeds)
    rows = max(1, min(config.generation.batch_size, goals))
    prompt = config.prompt.max_prompt_tokens or min(UNCAPPED_PROMPT_COLUMNS, decoding_positions(model))
    columns = prompt + hf.decode_spec.max_new_tokens
    times, errors = time_attentions(model, rows, columns, cuda_graphs=hf.decode_spec.cuda_graphs, draft=draft)
    for name, error in errors.items():
        log.warning("attention: %s ruled out (%s)", name, error)
    if not times:
        raise RuntimeError(f"no attention could be timed: {errors}")
    chosen = min(times, key=times.get)
    log.info("attention: %s (ms per slot step at %d rows x %d columns: %s)", chosen, rows, columns,
             ", ".join(f"{name} {ms:.2f}" for name, ms in times.items()))
    return {"chosen": chosen, "ms_per_step": times, "rows": rows, "columns": columns, **({"ruled_out": errors} if errors else {})}


def decoding_positions(model: Any) -> int:
    from pipelines.episodes.decoding import _text_config

    return int(_text_config(model).max_position_embeddings)


def resolve_attention(section: Mapping[str, Any], model_path: str | Path, where: str,
                      known: Mapping[str, Any] | None = None) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """``section`` (an ``evaluate`` section, its generation limit resolved) with
    ``continuous: {attention: auto}`` replaced by the attention :func:`timed_attention` picks
    for the model at ``model_path`` (any model of the table: the step's cost is its shape's),
    and that timing; ``known``: a timing an earlier run of the job made (a resumed run keeps its
    pick, so that its evaluations and the unbatched check decode alike). A section that names
    its attention, or plays in rounds, comes back as it is, with None."""
    from pipelines.episodes import get_format
    from pipelines.evaluation.config import EvalConfig
    from pipelines.evaluation.policy import load_policy

    rest, attention, draft = continuous_mode(section, where)
    if attention != "auto":
        return dict(section), None
    if known is None:
        config = from_params(EvalConfig, {**rest, "models": {"model": {"path": str(model_path)}}}, where)
        try:
            agent = load_policy(config.policy_specs()[0], get_format(config.agent_format), config.generation)
            known = timed_attention(agent, config, draft)
            del agent
        except Exception as error:  # noqa: BLE001 - a failed timing must not cost the job its evaluations
            log.warning("attention: timing failed (%s: %s); the evaluations use sdpa", type(error).__name__, error)
            known = {"chosen": "sdpa", "error": f"{type(error).__name__}: {error}"}
    return {**section, "continuous": {**section["continuous"], "attention": known["chosen"]}}, dict(known)


def play_timed(agent: Any, goals: Sequence[Any], simulator: Any, database: Any, plan: Any,
               continuous: str | None = None, draft: tuple[int, int] | None = None) -> tuple[list[Any], float, dict[str, Any]]:
    """``agent``'s episodes on ``goals`` (:func:`~pipelines.evaluation.play.play_policy`, or with
    ``continuous``, the attention :func:`continuous_mode` names,
    :func:`~pipelines.evaluation.continuous.play_policy_continuous`: batched, verifying
    ``draft``'s drafts where given, or one slot, one id per step, when ``plan`` is not), the wall seconds they took (the device synchronised before and after:
    queued kernels are counted) and the decoding loop's counters over them (:func:`stats_since`)."""
    from pipelines.evaluation.continuous import play_policy_continuous
    from pipelines.evaluation.play import play_policy

    _synchronize()
    before = decode_stats()
    started = time.perf_counter()
    if continuous is not None:
        played = play_policy_continuous(agent, goals, simulator, database, plan, attention=continuous, draft=draft)
    else:
        played = play_policy(agent, goals, simulator, database, plan)
    _synchronize()
    return played, time.perf_counter() - started, stats_since(before)


def agenda_world(config: Any, where: str) -> tuple[Any, list[Any], Any]:
    """The database, held-out goals and agenda user an evaluation config plays with
    (:func:`evaluate`, :func:`profile_evaluation`, :func:`unbatched_check`)."""
    from catalog.multiwoz_dir import held_out_world
    from pipelines.simulators.factory import simulator_from_config

    database, goals = held_out_world(config.source, config.db_dir, config.split, config.max_goals, where)
    return database, goals, simulator_from_config("agenda", database=database, client=None, spec=config.simulator)


def evaluate(section: Mapping[str, Any], models: Mapping[str, str | Sequence[str]], out: Path, played_before: dict[str, Any] | None = None,
             prefix: str = "") -> dict[str, Any]:
    """Every model of ``models`` (name -> directory, or the directories of one model trained
    under several seeds) plays the profile's held-out goals; the report as the CPU
    ``evaluate`` stage writes it (a model of several seeds pooled as stage ``evaluate_seeds``
    pools it: :func:`pooled_summary`), plus ``dialogues_per_s`` per model played, and the
    episode tables as ``out/<prefix>episodes.parquet`` (and events).
    ``played_before`` (played name -> (episodes, scores, speed); a seed's model after the
    first is ``name@k``): models already played with these settings are not played again,
    and what this call plays is added to it."""
    from pipelines.episodes import episode_tables, get_format
    from pipelines.evaluation.config import EvalConfig
    from pipelines.evaluation.metrics import score_episode
    from pipelines.evaluation.policy import load_policy
    from pipelines.evaluation.report import pattern_notes, report_markdown

    section, continuous, draft = continuous_mode(section, "params.yaml gpu evaluate")
    unresolved(continuous, "params.yaml gpu evaluate")
    entries = {name: [{"path": p} for p in path] if isinstance(path, (list, tuple)) else {"path": path} for name, path in models.items()}
    config = from_params(EvalConfig, {**section, "models": entries}, "params.yaml gpu evaluate")
    if config.simulator.kind != "agenda":
        raise ConfigError("gpu evaluate: the job runs offline; simulator.kind must be agenda")
    database, goals, simulator = agenda_world(config, "gpu evaluate")
    by_id = {d.dialogue_id: d.goal for d in goals}
    played_before = {} if played_before is None else played_before
    to_play = [policy for policy in config.policy_specs() if policy.name not in played_before]
    pool = _shard_pool(config.workers) if config.workers > 1 and to_play else None
    failed: str | None = None  # why continuous batching failed in this call: the models after it play in rounds
    try:
        for policy in to_play:
            if pool is None:
                agent = load_policy(policy, get_format(config.agent_format), config.generation)
                mode = (continuous, draft) if failed is None else (None, None)
                try:
                    played, wall_s, stats = play_timed(agent, goals, simulator, database, config.plan(), *mode)
                except Exception as error:  # noqa: BLE001 - see below
                    if mode[0] is None:
                        raise
                    # A device continuous batching has not run on must not cost the job its
                    # table: this model plays again in rounds, and so do the rest.
                    failed = f"{type(error).__name__}: {error}"
                    log.exception("evaluate: %s: continuous batching failed (%s); playing in rounds", policy.name, failed)
                    played = None
                if played is None:  # out of the handler, so the failed decoder's buffers can be freed first
                    del agent
                    agent = load_policy(policy, get_format(config.agent_format), config.generation)
                    mode = (None, None)
                    played, wall_s, stats = play_timed(agent, goals, simulator, database, config.plan())
                decoded = [stats]
                del agent
            else:
                # Model loading is inside the timed part here: each process loads its own copy.
                started = time.perf_counter()
                played, decoded = play_sharded(pool, config, policy, goals)
                wall_s = time.perf_counter() - started
            speed = {"episodes": len(played), "wall_s": round(wall_s, 2), "workers": config.workers,
                     "dialogues_per_s": round(len(played) / wall_s, 3) if wall_s else None,
                     "decode": decode_summary(decoded, wall_s, config.generation.cuda_graphs)}
            if continuous and mode[0] is None:  # asked for, not done: in rounds, and why
                speed.update(continuous=False, continuous_failed=failed)
            elif continuous:  # how often the slots halved as episodes ended (each a new graph)
                speed["decode"]["slot_shrinks"] = sum(int(d.get("shrinks", 0)) for d in decoded)
            played_before[policy.name] = (played, [score_episode(e, by_id[e.dialogue_id]) for e in played], speed)
            log.info("evaluate: %s: %d episodes in %.1f s (%.2f dialogues/s, %d process%s)", policy.name, len(played), wall_s,
                     len(played) / wall_s if wall_s else 0.0, config.workers, "es" if config.workers > 1 else "")
    finally:
        if pool is not None:
            pool.shutdown()
    rows = {row: [spec.name for spec in specs] for row, specs in config.rows().items()}
    played_names = [name for names in rows.values() for name in names]
    speeds = {name: played_before[name][2] for name in played_names}
    episodes = [episode for name in played_names for episode in played_before[name][0]]
    results, statistics = pooled_summary({row: {name: played_before[name][1] for name in names} for row, names in rows.items()},
                                         config.stats)
    setup = {"source": config.source, "split": config.split, "goals": len(goals), "seeds": list(config.seeds),
             "simulator": config.simulator.kind, "max_exchanges": config.max_exchanges, "agent_format": config.agent_format,
             "temperature": config.generation.temperature, "max_new_tokens": config.generation.max_new_tokens,
             "batched": config.batched, "workers": config.workers, **decoded_by(continuous, draft),
             **played_in_rounds(speeds),
             # the decoding's numbers: bf16 transcripts batched differ from one at a time (unbatched_check)
             "dtype": config.generation.dtype, "cuda_graphs": config.generation.cuda_graphs}
    _write_episode_tables(episode_tables(episodes), out, prefix)
    markdown = report_markdown(results, setup, notes=pattern_notes(results, statistics), statistics=statistics)
    return {"setup": setup, "models": results, "statistics": statistics, "speed": speeds, "markdown": markdown}


#: The rates a pooled row reports for each of its training seeds alone (as stage ``evaluate_seeds``).
PER_SEED_RATES = ("success", "turns", "inform_rate", "request_rate", "clarifications_per_dialogue", "malformed_per_dialogue")


def pooled_summary(scores: Mapping[str, Mapping[str, Sequence[Any]]], stats: Any) -> tuple[dict[str, Any], dict[str, Any]]:
    """The table's rows and paired tests from each row's episode scores per played model
    (``scores[row][name]``; a row of several names is one model under several training seeds):
    :func:`~pipelines.evaluation.metrics.bootstrap_summary_seeds` (intervals and tests resample
    the seeds, then the goals), and where a row pools seeds, each seed's rates beside it
    (``per_training_seed``) and the comparisons the first seed alone would have made
    (``statistics["first_seed_only"]``): what a re-training keeps. Rows of one model: the
    figures of :func:`~pipelines.evaluation.metrics.bootstrap_summary`."""
    from pipelines.evaluation.metrics import avg_over_training_seeds, bootstrap_summary_seeds

    by_row = {row: list(per_name.values()) for row, per_name in scores.items()}
    options = {"resamples": stats.resamples, "seed": stats.seed, "alpha": stats.alpha}
    results, statistics = bootstrap_summary_seeds(by_row, **options)
    if any(len(per_seed) > 1 for per_seed in by_row.values()):
        _, first = bootstrap_summary_seeds({row: per_seed[:1] for row, per_seed in by_row.items()}, **options)
        statistics["first_seed_only"] = first["comparisons"]
    for row, per_name in scores.items():
        if len(per_name) > 1:
            alone = {name: avg_over_training_seeds([episodes]) for name, episodes in per_name.items()}
            results[row]["per_training_seed"] = {name: {key: (summary.get(key) or {}).get("mean") for key in PER_SEED_RATES}
                                                 for name, summary in alone.items()}
    return results, statistics


def decoded_by(continuous: str | None, draft: tuple[int, int] | None = None) -> dict[str, Any]:
    """How a report says its episodes were batched: ``continuous`` and, with it, the slot
    step's ``attention`` and the ``draft`` its batched steps verify.

    >>> decoded_by(None), decoded_by("matmul")
    ({'continuous': False}, {'continuous': True, 'attention': 'matmul'})
    >>> decoded_by("sdpa", (4, 3))
    {'continuous': True, 'attention': 'sdpa', 'draft': {'tokens': 4, 'ngram': 3}}
    """
    return {"continuous": continuous is not None, **({"attention": continuous} if continuous is not None else {}),
            **({"draft": {"tokens": draft[0], "ngram": draft[1]}} if continuous is not None and draft else {})}


def played_in_rounds(speeds: Mapping[str, Mapping[str, Any]]) -> dict[str, Any]:
    """``{"continuous_failed": {model: error}}`` for the models of ``speeds`` (an evaluation's
    ``speed``) that played in rounds because continuous batching failed (:func:`evaluate`), or
    ``{}``.

    >>> played_in_rounds({"a": {"continuous": False, "continuous_failed": "E: x"}, "b": {}})
    {'continuous_failed': {'a': 'E: x'}}
    """
    failed = {name: speed["continuous_failed"] for name, speed in speeds.items() if speed.get("continuous") is False}
    return {"continuous_failed": failed} if failed else {}


def unresolved(attention: str | None, where: str) -> None:
    """Refuse to play with ``auto`` left unresolved (:func:`resolve_attention` picks once)."""
    if attention == "auto":
        raise ConfigError(f"{where}.continuous: attention auto is chosen once for the whole job (resolve_attention), "
                          "so that every model and the unbatched check decode alike; resolve it before playing")


@dataclasses.dataclass(frozen=True)
class EvalSetting:
    """A profile's evaluation, ready to play one model: what the benchmarks time and compare."""

    config: Any
    goals: list[Any]
    database: Any
    simulator: Any
    agent: Any
    continuous: str | None = None  # batched episodes decode with continuous batching, this attention (continuous_mode)
    attention_timing: dict[str, Any] | None = None  # where the profile said auto: what timed_attention measured
    draft: tuple[int, int] | None = None  # the drafts batched continuous steps verify (continuous_draft)


def profile_evaluation(gpu: Mapping[str, Any], model_path: str | Path, profile: str | None, overrides: Mapping[str, Any],
                       where: str, smoke: bool = False) -> EvalSetting:
    """The ``evaluate`` section of profile ``profile`` of ``gpu`` (``params.yaml``'s ``gpu``; the
    default profile when None), ``overrides`` merged in and a ``from_data`` they leave resolved
    for ``model_path`` (from the profile's SFT rows), with that model loaded as the agent: the
    set-up :func:`evaluate` plays, for one model (the benchmarks time and compare it)."""
    from pipelines.episodes import get_format
    from pipelines.evaluation.config import EvalConfig
    from pipelines.evaluation.policy import load_policy

    _, sections = profile_params(gpu, profile, smoke=smoke)
    section = deep_merge(sections["evaluate"], overrides)
    if with_limit(section, -1) != section:  # a from_data left after the overrides: the SFT rows say it
        section = with_limit(section, data_generation_limit(sections, Path(model_path))["tokens"])
    section, continuous, draft = continuous_mode(section, where)
    config = from_params(EvalConfig, {**section, "models": {"model": {"path": str(model_path)}}}, where)
    database, goals, simulator = agenda_world(config, where)
    agent = load_policy(config.policy_specs()[0], get_format(config.agent_format), config.generation)
    timing = timed_attention(agent, config, draft) if continuous == "auto" else None
    return EvalSetting(config, goals, database, simulator, agent, timing["chosen"] if timing else continuous, timing, draft)


def unbatched_check_params(value: Any, models: Sequence[str], where: str) -> tuple[int, tuple[str, ...], tuple[str, ...] | None]:
    """A chain profile's ``unbatched_check``: ``{goals: n >= 1, models: [names of the table],
    dtypes: [generation dtypes]}`` (``models`` default ``[sft]``; ``dtypes`` default None: the
    evaluation's own).

    >>> unbatched_check_params({"goals": 8, "models": ["sft"]}, ["zero_shot", "sft", "grpo"], "w")
    (8, ('sft',), None)
    >>> unbatched_check_params({"goals": 4, "dtypes": ["bfloat16", "float32"]}, ["sft"], "w")
    (4, ('sft',), ('bfloat16', 'float32'))
    >>> unbatched_check_params({"goals": 8, "models": ["dpo"]}, ["zero_shot", "sft"], "w")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: w.unbatched_check.models: expected a non-empty list of ['zero_shot', 'sft'], got ['dpo']
    """
    from pipelines.evaluation.policy import GENERATION_DTYPES

    where = f"{where}.unbatched_check"
    if not isinstance(value, Mapping) or set(value) - {"goals", "models", "dtypes"}:
        raise ConfigError(f"{where}: expected {{goals: n, models: [names], dtypes: [dtypes]}}, got {value!r}")
    goals, names, dtypes = value.get("goals"), value.get("models", ["sft"]), value.get("dtypes")
    positive_int(goals, f"{where}.goals")
    if not (isinstance(names, list) and names and all(name in models for name in names) and len(set(names)) == len(names)):
        raise ConfigError(f"{where}.models: expected a non-empty list of {list(models)}, got {names!r}")
    if dtypes is not None and not (isinstance(dtypes, list) and dtypes and all(d in GENERATION_DTYPES for d in dtypes)
                                   and len(set(dtypes)) == len(dtypes)):
        raise ConfigError(f"{where}.dtypes: expected a non-empty list of {sorted(GENERATION_DTYPES)}, got {dtypes!r}")
    return goals, tuple(names), None if dtypes is None else tuple(dtypes)


def transcript_differences(batched: Sequence[Any], single: Sequence[Any], width: int = 240) -> list[dict[str, Any]]:
    """Each episode of ``single`` whose transcript is not its namesake's in ``batched``: its id,
    the first utterance that differs (its index among the utterances) and both texts there
    (cut to ``width``; None where one transcript ended before the other)."""
    by_id = {episode.episode_id: episode for episode in batched}
    differences = []
    for episode in single:
        theirs, ours = by_id[episode.episode_id].transcript(), episode.transcript()
        if theirs != ours:
            turn = next((i for i, pair in enumerate(zip(theirs, ours)) if pair[0] != pair[1]), min(len(theirs), len(ours)))
            differences.append({"episode_id": episode.episode_id, "utterance": turn,
                                "batched": theirs[turn][1][:width] if turn < len(theirs) else None,
                                "one_at_a_time": ours[turn][1][:width] if turn < len(ours) else None})
    return differences


def unbatched_check(section: Mapping[str, Any], goals_n: int, models: Mapping[str, str], played: Mapping[str, Any],
                    dtypes: Sequence[str] | None = None) -> dict[str, Any]:
    """The first ``goals_n`` test goals played again one dialogue at a time by each model of
    ``models`` (name -> directory), under the evaluation's settings, and their transcripts
    compared with the batched ones (greedy decoding must give the same dialogues either way;
    issue 25): for the evaluation's own ``generation.dtype``, what the evaluation played
    (``played``: name -> (episodes, scores, speed), as :func:`evaluate` fills it); for each
    other dtype of ``dtypes``, the evaluation's goals played batched in that dtype here, so that
    its speed and success stand beside the evaluation's. A difference is the batch's arithmetic
    (kernels chosen by shape, bf16 rounding) or a batching fault; the second dtype tells them
    apart. Each is shown with the first utterance that differs."""
    from pipelines.episodes import get_format
    from pipelines.evaluation.config import EvalConfig
    from pipelines.evaluation.policy import load_policy

    where = "params.yaml gpu unbatched_check"
    section, continuous, draft = continuous_mode(section, where)
    unresolved(continuous, where)
    missing = sorted(set(models) - set(played))
    if missing:
        raise ConfigError(f"{where}: {missing} not played by this run's evaluation; nothing to compare with")
    base = from_params(EvalConfig, {**section, "models": {name: {"path": path} for name, path in models.items()}}, where)
    own = base.generation.dtype
    if base.generation.temperature != 0.0:
        raise ConfigError(f"{where}: the evaluation samples (temperature {base.generation.temperature}); only greedy transcripts must agree")
    database, goals, simulator = agenda_world(base, where)
    if goals_n > len(goals):
        raise ConfigError(f"{where}.goals: {goals_n} goals to play one at a time, but the evaluation played {len(goals)}")
    rows: dict[str, dict[str, Any]] = {}
    changed_between: dict[str, int] = {}
    markdown = ["| model | dtype | batched by | batched dialogues/s | success | one at a time | identical transcripts |",
                "|---|---|---|---:|---:|---:|---:|"]
    notes = []
    for name, path in models.items():
        rows[name] = {}
        # A model the evaluation played in rounds (continuous batching failed there) is checked in rounds.
        mode = (None, None) if played[name][2].get("continuous") is False else (continuous, draft)
        if continuous and mode[0] is None:
            notes.append(f"- `{name}` is checked in rounds, as the evaluation played it: continuous batching failed "
                         f"({played[name][2]['continuous_failed']}).")
        for dtype in dtypes or [own]:
            config = from_params(EvalConfig, {**deep_merge(section, {"generation": {"dtype": dtype}}), "models": {name: {"path": path}}}, where)
            agent = load_policy(config.policy_specs()[0], get_format(config.agent_format), config.generation)
            if dtype == own:
                reference, speed = played[name][0], played[name][2]["dialogues_per_s"]
            else:
                reference, wall_s, _ = play_timed(agent, goals, simulator, database, config.plan(), *mode)
                speed = round(len(reference) / wall_s, 3) if wall_s else None
            # With continuous batching, one slot of the same decoder: the same step, one row,
            # one id per step (no draft), so the check covers the batched steps' drafts too.
            single, wall_s, _ = play_timed(agent, goals[:goals_n], simulator, database, dataclasses.replace(config.plan(), batched=False),
                                           mode[0])
            del agent
            differences = transcript_differences(reference, single)
            same = len(single) - len(differences)
            success = sum(e.success for e in reference) / len(reference) if reference else None
            rows[name][dtype] = {
                "batched": {"by": "the evaluation" if dtype == own else "this check", "episodes": len(reference),
                            "dialogues_per_s": speed, "success": success,
                            "successes": {e.episode_id: bool(e.success) for e in reference}},
                "dialogues": len(single), "identical": same, "wall_s": round(wall_s, 2), "differences": differences}
            log.info("unbatched_check: %s in %s: %d of %d transcripts identical one at a time", name, dtype, same, len(single))
            markdown.append(f"| {name} | {dtype} | {rows[name][dtype]['batched']['by']} | {speed} | "
                            f"{'-' if success is None else f'{100 * success:.1f} %'} | {len(single)} in {wall_s:.1f} s | {same} |")
            notes += [f"- `{name}` in {dtype}, {d['episode_id']}, utterance {d['utterance']}: batched \"{' '.join((d['batched'] or '').split())}\", "
                      f"one at a time \"{' '.join((d['one_at_a_time'] or '').split())}\"" for d in differences[:3]]
        if len(rows[name]) > 1:
            # the same goals batched in each dtype: on how many does the verdict change?
            verdicts = [row["batched"]["successes"] for row in rows[name].values()]
            changed = sum(len({v[k] for v in verdicts}) > 1 for k in verdicts[0] if all(k in v for v in verdicts))
            changed_between[name] = changed
            notes.append(f"- `{name}`: the success verdict differs between the dtypes on {changed} of {len(verdicts[0])} goals.")
    drafted = f", verifying drafts of {draft[0]} ids" if continuous and draft else ""
    how = f" (continuous batching, {continuous} attention{drafted}; one at a time: one slot of the same decoder, one id per step)" if continuous else ""
    return {"goals": goals_n, "dtype": own, **decoded_by(continuous, draft), **played_in_rounds({name: played[name][2] for name in models}),
            "models": rows, "success_changed_between_dtypes": changed_between,
            "markdown": "\n".join(["Greedy transcripts of the first test goals played one dialogue at a time against the batched "
                                    f"ones{how} (they must be identical; "
                                    f"{own} is the evaluation's own dtype).", "", *markdown,
                                    *(["", *notes] if notes else [])])}


@dataclasses.dataclass(frozen=True)
class ShardTask:
    """One process's part of a model's evaluation: what it needs to rebuild the world (the
    corpus is read again there, a database does not pickle) and play its goals."""

    policy: Any          # PolicySpec
    agent_format: str
    generation: Any      # GenerationSpec
    agenda: Any          # SimulatorSpec
    plan: Any            # EvalPlan
    source: str
    db_dir: str | None
    dialogue_ids: tuple[str, ...]


_WORLDS: dict[tuple[str, str | None], tuple[dict[str, Any], Any]] = {}  # per worker process


def _shard_pool(workers: int) -> Any:
    """``workers`` spawned processes (CUDA cannot be forked); on a CPU each gets its share of
    the cores."""
    import multiprocessing
    import os
    from concurrent.futures import ProcessPoolExecutor

    threads = max(1, (os.cpu_count() or 1) // workers)
    return ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("spawn"), initializer=_init_shard_worker, initargs=(threads,))


def _init_shard_worker(threads: int) -> None:
    import torch

    if not torch.cuda.is_available():
        torch.set_num_threads(threads)
    logging.basicConfig(level=logging.WARNING)


def play_shard(task: ShardTask) -> tuple[list[Any], dict[str, Any]]:
    """The episodes of ``task``'s goals and the process's decoding while it played them
    (runs in a worker process)."""
    from catalog.multiwoz_dir import load_multiwoz
    from pipelines.env.tools import Database
    from pipelines.episodes import get_format
    from pipelines.evaluation.play import play_policy
    from pipelines.evaluation.policy import load_policy
    from pipelines.simulators.factory import simulator_from_config

    key = (task.source, task.db_dir)
    if key not in _WORLDS:
        corpus = load_multiwoz(Path(task.source), task.db_dir)
        _WORLDS[key] = ({d.dialogue_id: d for d in corpus.dialogues}, Database(corpus.entities, corpus.taxi_options))
    dialogues, database = _WORLDS[key]
    simulator = simulator_from_config("agenda", database=database, client=None, spec=task.agenda)
    agent = load_policy(task.policy, get_format(task.agent_format), task.generation)
    before = decode_stats()
    played = play_policy(agent, [dialogues[i] for i in task.dialogue_ids], simulator, database, task.plan)
    return played, stats_since(before)


def play_sharded(pool: Any, config: Any, policy: Any, goals: Sequence[Any]) -> tuple[list[Any], list[dict[str, Any]]]:
    """``policy``'s episodes on ``goals``, the goals split between the pool's processes, in
    :func:`~pipelines.evaluation.play.play_policy`'s order; and each process's decoding."""
    from pipelines.evaluation.play import in_play_order, shards

    plan = config.plan()
    tasks = [ShardTask(policy, config.agent_format, config.generation, config.simulator, plan, config.source, config.db_dir,
                       tuple(d.dialogue_id for d in part)) for part in shards(goals, config.workers)]
    parts = list(pool.map(play_shard, tasks))
    played = [episode for episodes, _ in parts for episode in episodes]
    return in_play_order(played, goals, plan.seeds, prefix=f"{policy.name}/"), [stats for _, stats in parts]


def pir_eval_section(section: Mapping[str, Any], where: str) -> PirEvalParams:
    """A PIR profile's ``pir_eval`` section: stage ``pir_eval``'s settings without its models
    and outputs (the job's are its own), and ``stats`` for the intervals; checked."""
    return from_params(PirEvalParams, section, where, without=PIR_EVAL_NOT_IN_GPU_SECTION).checked(where)


def evaluate_pir(section: Mapping[str, Any], models: Mapping[str, str | Sequence[str]], out: Path, played_before: dict[str, Any] | None = None,
                 prefix: str = "") -> dict[str, Any]:
    """PIR's metrics (section 4.1) of every model of ``models`` on the profile's held-out
    goals, as stage ``pir_eval`` computes them (:func:`~pipelines.pir.evaluate.play_model`:
    one greedy conversation per goal, the agenda user answering the questions asked inside
    the reasoning), plus ``dialogues_per_s`` per model played, each model's success with a
    95 % interval over the goals and each against the one before it on the same goal
    resamples (:func:`pooled_success_intervals`), and the episode tables as
    ``out/<prefix>episodes.parquet`` (and events). A model given as the directories of its
    training seeds plays once per seed (``name``, ``name@1``, ...) and its row pools them as
    stage ``pir_eval_seeds`` does (:func:`~pipelines.pir.metrics.pool_seeds`, each seed's
    metrics beside), its intervals resampling the seeds and then the goals. ``played_before``
    (played name -> (metrics, episodes, speed)): as :func:`evaluate`'s, models already played
    are not played again."""
    from catalog.multiwoz_dir import held_out_world
    from pipelines.episodes import episode_tables
    from pipelines.pir.evaluate import play_model
    from pipelines.pir.metrics import markdown_table, pool_seeds

    where = "params.yaml gpu pir_eval"
    config = pir_eval_section(section, where)
    database, goals = held_out_world(config.source, config.db_dir, config.split, config.max_goals, where)
    played_before = {} if played_before is None else played_before
    # each row's played models: one per training seed, the first named as the row
    labels = {name: [f"{name}@{k}" if k else name for k in range(len(path) if isinstance(path, (list, tuple)) else 1)]
              for name, path in models.items()}
    for name, path in models.items():
        for label, seed_path in zip(labels[name], path if isinstance(path, (list, tuple)) else [path]):
            if label in played_before:
                continue
            before = decode_stats()
            metrics, rollouts, wall_s = play_model(seed_path, label, database, goals, config.simulator, config.rollout, config.seed)
            speed = {"episodes": len(rollouts), "wall_s": round(wall_s, 2), "dialogues_per_s": round(len(rollouts) / wall_s, 3) if wall_s else None,
                     "decode": decode_summary([stats_since(before)], wall_s, config.rollout.cuda_graphs)}
            # Every model plays the same goals: its name keeps the episodes' ids apart in the tables.
            played_before[label] = (metrics, [dataclasses.replace(r.episode, episode_id=f"{label}/{r.episode.episode_id}") for r in rollouts], speed)
            log.info("pir_eval: %s: success %s, questions %s, %d conversations in %.1f s (%.2f dialogues/s)", label, metrics["success"],
                     metrics["questions"], len(rollouts), wall_s, len(rollouts) / wall_s if wall_s else 0.0)
    played = [label for names in labels.values() for label in names]
    results = {name: played_before[name][0] if len(names) == 1 else
               {**pool_seeds([played_before[label][0] for label in names]), "per_training_seed": {label: played_before[label][0] for label in names}}
               for name, names in labels.items()}
    success = {name: [[float(e.success) for e in played_before[label][1]] for label in names] for name, names in labels.items()}
    intervals = pooled_success_intervals(success, config.stats.resamples, config.stats.seed)
    _write_episode_tables(episode_tables([e for label in played for e in played_before[label][1]]), out, prefix)
    setup = {"source": config.source, "split": config.split, "goals": len(goals), "seed": config.seed,
             "simulator": config.simulator.kind, "rollout": config_dict(config.rollout)}
    rows = [f"| {name} | {row['success']:.2f} | {row['ci95'][0]:.2f} – {row['ci95'][1]:.2f} |" if row["ci95"] else f"| {name} | {row['success']:.2f} | – |"
            for name, row in intervals["models"].items()]
    pairs = [f"| {c['models'][0]} − {c['models'][1]} | {c['difference']:+.2f} | "
             + (f"{c['ci95'][0]:+.2f} – {c['ci95'][1]:+.2f}" if c["ci95"] else "–") + f" | {c['p_not_better']:.3f} |"
             for c in intervals["comparisons"]]
    pooled = [name for name, names in labels.items() if len(names) > 1]
    over = (f"{max(len(n) for n in labels.values())} training seeds of {', '.join(pooled)} (seed k with seed k) and then the goals"
            if pooled else "the goals")
    markdown = "\n".join([
        f"PIR's metrics on {len(goals)} held-out {config.split} goals, one greedy conversation each (as stage `pir_eval`"
        + (f"; {', '.join(pooled)}: the mean over the training seeds, then each seed alone, as stage `pir_eval_seeds`):" if pooled else "):"), "",
        markdown_table(results), "",
        f"Success with a 95 % bootstrap interval over {over} ({intervals['resamples']} resamples"
        + ("):" if pooled else "; one training seed):"), "",
        "| model | success | 95 % interval |", "|---|---|---|", *rows,
        *(["", f"Each model against the one before it, paired on the same {'' if pooled else 'goal '}resamples "
           "(p: share of resamples where it is not better):", "",
           "| models | difference | 95 % interval | p |", "|---|---|---|---|", *pairs] if pairs else []),
        "", "Dialogues/s: " + ", ".join(f"{label} {played_before[label][2]['dialogues_per_s']}" for label in played) + ".",
    ])
    return {"setup": setup, "results": results, "intervals": intervals, "speed": {label: played_before[label][2] for label in played},
            "markdown": markdown}


def pooled_success_intervals(success: Mapping[str, Sequence[Sequence[float]]], resamples: int, seed: int) -> dict[str, Any]:
    """:func:`~pipelines.pir.evaluate.success_intervals` where a model may pool several
    training seeds (``success[name][k]``: seed k's 0/1 per goal, the goals in one order): a
    resample draws the goals and, for such models, the seeds, seed k of one model with seed k
    of another, as the SpeakRL table's (:func:`~pipelines.evaluation.metrics.bootstrap_summary_seeds`,
    the same draws); ``training_seeds`` counts them. Models of one seed each: exactly
    ``success_intervals``.

    >>> one = pooled_success_intervals({"a": [[0, 0, 1, 0]], "b": [[1, 0, 1, 1]]}, 200, 0)
    >>> from pipelines.pir.evaluate import success_intervals
    >>> one == success_intervals({"a": [0, 0, 1, 0], "b": [1, 0, 1, 1]}, 200, 0)
    True
    >>> two = pooled_success_intervals({"a": [[0, 0, 1, 0]], "b": [[1, 0, 1, 1], [0, 0, 1, 0]]}, 200, 0)
    >>> two["models"]["b"]["success"], two["training_seeds"], two["comparisons"][0]["difference"]
    (0.5, {'a': 1, 'b': 2}, 0.25)
    """
    import numpy as np

    from pipelines.pir.evaluate import success_intervals
    from pipelines.stats import interval, resample_indices, seed_draws

    counts = {name: len(per_seed) for name, per_seed in success.items()}
    k = max(counts.values(), default=1)
    if k == 1:
        return success_intervals({name: per_seed[0] for name, per_seed in success.items()}, resamples, seed)
    if any(n not in (1, k) for n in counts.values()):
        raise ValueError(f"models trained under several seeds must have as many to be paired: {counts}")
    values = {name: np.asarray(per_seed, dtype=float) for name, per_seed in success.items()}  # seeds x goals
    goals = {v.shape[1] for v in values.values()}
    if len(goals) != 1:
        raise ValueError(f"pooled_success_intervals: every model needs one value per goal, got {sorted(goals)} goals")
    indices = resample_indices(goals.pop(), resamples, seed)
    draws = seed_draws(k, resamples, seed)
    columns = np.arange(resamples)

    def resampled(v: Any) -> Any:
        per_seed = v[:, indices].mean(axis=2)  # seeds x resamples
        return per_seed[0] if len(v) == 1 else per_seed[draws.T, columns].mean(axis=0)

    means = {name: resampled(v) for name, v in values.items()}
    names = list(success)
    models = {name: {"success": round(float(values[name].mean()), 4), "ci95": interval(means[name])} for name in names}
    comparisons = []
    for before, after in zip(names, names[1:]):
        difference = means[after] - means[before]
        comparisons.append({"models": [after, before], "difference": round(float(values[after].mean() - values[before].mean()), 4),
                            "ci95": interval(difference), "p_not_better": round(float(np.mean(difference <= 0)), 4)})
    return {"resamples": resamples, "seed": seed, "training_seeds": counts, "models": models, "comparisons": comparisons}


def l2a_eval_section(section: Mapping[str, Any], where: str) -> dict[str, Any]:
    """A Learn-to-Ask profile's ``l2a_eval`` section: stage ``l2a_eval``'s settings without its
    models, comparisons, model grader and outputs (the job's are its own); checked."""
    return from_params(L2aEvalParams, section, where, without=L2A_EVAL_NOT_IN_GPU_SECTION).settings(where)


def evaluate_l2a(section: Mapping[str, Any], models: Mapping[str, str | Sequence[str]], out: Path,
                 played_before: dict[str, Any] | None = None, prefix: str = "") -> dict[str, Any]:
    """Learn-to-Ask's Table 1 proxies of every model of ``models`` (name -> directory, or the
    directories of one model trained under several seeds: pooled, intervals resampling seeds
    then samples), as stage ``l2a_eval`` computes them: greedy answers to the profile's
    held-out samples (the policy prompt the training rows carry: params.yaml
    ``hindsight.prompts``' ROLLOUT prompt, else the paper's), scored against their hindsight
    targets by the rules grader, with the reference rows (the expert's own turn, whose
    decisions are an oracle's, and the catch-all question), bootstrap intervals over the
    samples and each model against the one before it, paired; plus ``samples_per_s`` per
    model and the scored answers as ``out/<prefix>answers.parquet``. ``played_before``
    (name -> (answers per seed, speed)): as :func:`evaluate`'s."""
    import pyarrow.parquet as pq

    from catalog.learn_to_ask import policy_prompt
    from pipelines.evaluation.learn_to_ask import GRADER_RULE, answer, held_out_samples, markdown, policy_prompts, rounded, score_answers
    from pipelines.learn_to_ask.metrics import QuestionGrader
    from pipelines.learn_to_ask.tables import eval_table
    from pipelines.rewards.learn_to_ask import RulesGrader

    where = "params.yaml gpu l2a_eval"
    settings = l2a_eval_section(section, where)
    samples = held_out_samples(pq.read_table(settings["samples"]).to_pylist(), settings["split"], settings["max_samples"])
    if not samples:
        raise DataError(str(settings["samples"]), f"no usable sample in split {settings['split']!r}")
    prompts = policy_prompts(samples, policy_prompt((read_params("hindsight", required=False) or {}).get("prompts")).render())
    paths = {name: [dirs] if isinstance(dirs, str) else list(dirs) for name, dirs in models.items()}
    played_before = {} if played_before is None else played_before
    for name, dirs in paths.items():
        if name in played_before:
            continue
        started = time.perf_counter()
        per_seed, too_long = [], 0
        for directory in dirs:
            texts, dropped = answer(Path(directory), prompts, settings)
            per_seed.append(texts)
            too_long += dropped
        wall_s = time.perf_counter() - started  # loading the models included: one load per seed
        answered = len(prompts) * len(dirs)
        played_before[name] = (per_seed, {"samples": len(prompts), "seeds": len(dirs), "too_long": too_long, "wall_s": round(wall_s, 2),
                                          "samples_per_s": round(answered / wall_s, 3) if wall_s else None})
        log.info("l2a_eval: %s: %d samples x %d seed(s) in %.1f s (%.1f samples/s)", name, len(prompts), len(dirs), wall_s,
                 answered / wall_s if wall_s else 0.0)
    names = list(models)
    scores = score_answers(samples, prompts, {name: played_before[name][0] for name in names},
                           {name: [Path(d) for d in paths[name]] for name in names}, QuestionGrader(RulesGrader()),
                           beta=settings["beta"], stats=settings["stats"], compare=list(zip(names[1:], names)))
    temporary = out / f".{prefix}answers.parquet.tmp"
    pq.write_table(eval_table(scores.rows(samples)), temporary, compression="zstd")
    temporary.replace(out / f"{prefix}answers.parquet")
    report = rounded({
        "setup": {"samples_file": str(settings["samples"]), "split": settings["split"], "max_samples": settings["max_samples"]},
        "split": settings["split"], "samples": len(samples), "dropped_too_long": len(samples) - len(scores.kept),
        "grader": QuestionGrader(RulesGrader()).name, "grader_rule": GRADER_RULE, "beta": settings["beta"],
        "decoding": {"greedy": True, "max_new_tokens": settings["max_new_tokens"], "max_prompt_tokens": settings["max_prompt_tokens"]},
        "stats": settings["stats"], "models": scores.results, "references": scores.reference_results, "compare": scores.comparisons,
        "speed": {name: played_before[name][1] for name in names},
    })
    speeds = ", ".join(f"{name} {report['speed'][name]['samples_per_s']}" for name in names)
    return {**report, "markdown": markdown(report).replace("# Learn-to-Ask", "## Learn-to-Ask", 1) + f"\nSamples/s: {speeds}.\n"}


def _write_episode_tables(tables: Mapping[str, Any], out: Path, prefix: str) -> None:
    import pyarrow.parquet as pq

    for name, table in tables.items():
        # A new name per stage, written whole then renamed: a job stopped mid-write leaves
        # the files its last checkpoint listed intact.
        temporary = out / f".{prefix}{name}.parquet.tmp"
        pq.write_table(table, temporary, compression="zstd")
        temporary.replace(out / f"{prefix}{name}.parquet")


# --- JOSH's round -----------------------------------------------------------------------------


class NotTrained(AskflowError):
    """A training stage with no rows to train on: reported "not trained" with the reason, not
    as a failure (the round's M found no golden path)."""


def josh_config(section: Mapping[str, Any], start: Path, work: Path, where: str, josh: Mapping[str, Any] | None = None) -> Any:
    """The harvest's :class:`~pipelines.josh.config.JoshConfig`: params.yaml ``josh`` (or the
    section given as ``josh``) with the profile's ``harvest`` section laid over it; the
    harvester is M, the job's start model (``hf``, on the accelerator where there is one), its
    checkpoints under ``work``, no fan-out (one process, ``concurrency`` trees in play)."""
    import torch

    from pipelines.josh.config import JoshConfig

    params = deep_merge(josh if josh is not None else read_params("josh"), section)
    params = deep_merge(params, {"agent": {"backend": "hf", "model_path": str(start), "device": "cuda" if torch.cuda.is_available() else "cpu"},
                                 "work_dir": str(work / "josh_checkpoints"), "fan_out": {"workers": 0}})
    return from_params(JoshConfig, params, where)


def harvest_trees(config: Any, start_name: str) -> dict[str, Any]:
    """M harvests the train goals (resuming from the checkpoints of an earlier try on this
    node), writes ``josh_trees`` / ``josh_sft`` / ``josh_kto`` Parquet under ``config.output``,
    then plays the test goals sampled without branching; the report has stage ``josh``'s
    fields (the round's table reads them) and the harvest's speed."""
    import pyarrow.parquet as pq

    from catalog.josh import open_workspace
    from pipelines.josh.tables import josh_tables

    workspace = open_workspace(config, None)
    done = workspace.done()
    todo = [g for g in workspace.goals if g.goal_id not in done]
    log.info("harvest: %d train goals (%d from an earlier try), beam %d, branching %d, %d turns, %d trees in play",
             len(workspace.goals), len(done), config.beam.max_beam, config.beam.branching_factor, config.beam.max_turns, config.concurrency)
    _synchronize()
    started = time.perf_counter()
    fresh = workspace.harvest(todo, on_tree=lambda tree: log.info("harvest: %s: %d nodes, tree reward %.2f", tree.goal_id,
                                                                   len(tree.nodes), tree.reward))
    _synchronize()
    wall_s = time.perf_counter() - started
    harvested = workspace.done()
    trees = [harvested[g.goal_id] for g in workspace.goals if g.goal_id in harvested]
    tables = josh_tables(trees, config.min_reward)
    output = Path(config.output)
    output.mkdir(parents=True, exist_ok=True)
    for name in ("josh_trees", "josh_sft", "josh_kto"):
        pq.write_table(tables[name], output / f"{name}.parquet", compression="zstd")
    report = workspace.report(trees, tables, workspace.play_test(workspace.test_goals()), model_name=start_name)
    report["training_data"] = tables["josh_sft"].num_rows > 0
    calls = sum(t.agent_calls for t in fresh)
    report["speed"] = {"trees": len(fresh), "wall_s": round(wall_s, 2), "trees_per_s": round(len(fresh) / wall_s, 4) if wall_s else None,
                       "agent_calls": calls, "agent_calls_per_s": round(calls / wall_s, 2) if wall_s else None}
    report["settings"] = {"max_goals": config.max_goals, "beam": dataclasses.asdict(config.beam), "min_reward": config.min_reward,
                          "sampling": dataclasses.asdict(config.agent.sampling), "test": dataclasses.asdict(config.test)}
    log.info("harvest: %d trees, %d golden paths, %d SFT rows in %.1f s; M on %d test goals (sampled): avg reward %.3f",
             len(trees), report["golden_paths"], report["sft_rows"], wall_s, report["test"]["goals"], report["test"]["avg_reward"])
    return report


def trained_on_harvest(method: str, section: Mapping[str, Any], start: Path, stage_dir: Path, where: str) -> dict[str, Any]:
    """SFT / KTO on the harvest's rows; NotTrained when the harvest made none."""
    import pyarrow.parquet as pq

    params = parse_section(section, where)
    config = train_config(method, params, model_path=str(start), output_dir=stage_dir, where=where)
    rows = {s.path: pq.read_metadata(s.path).num_rows for s in config.data.sources}
    if not any(rows.values()):
        raise NotTrained(f"the harvest has no {method.upper()} rows ({', '.join(rows)}): M found no golden path to train M' on")
    return train(config, epochs=params.epochs, sampler=params.sampler)


def evaluate_toolwoz(section: Mapping[str, Any], models: Mapping[str, str], out: Path, harvest: Mapping[str, Any] | None,
                     start: str, trained: Sequence[str], not_trained: Mapping[str, str]) -> dict[str, Any]:
    """Every model of ``models`` (name -> directory; M is ``start``) plays the ToolWOZ test
    goals greedily without branching against the agenda user, as stage ``josh_evaluate``;
    the report has its fields, the round, ``dialogues_per_s`` per model and the round's table."""
    import pyarrow.parquet as pq

    from catalog.josh import open_toolwoz_test
    from pipelines.evaluation.policy import load_policy
    from pipelines.josh.agent import RulesToolWozAgent
    from pipelines.josh.config import RULES_LABEL, ToolWozEvalConfig
    from pipelines.josh.evaluate import toolwoz_summary
    from pipelines.josh.report import round_markdown
    from pipelines.josh.tables import eval_table

    where = "params.yaml gpu toolwoz"
    config = from_params(ToolWozEvalConfig, {**section, "models": {name: {"path": path} for name, path in models.items()}}, where)
    if config.simulator.kind != "agenda":
        raise ConfigError(f"{where}.simulator.kind: the job runs offline; it must be agenda")
    test = open_toolwoz_test(config, None)
    players: list[tuple[str, Any]] = [("rules", None)] if config.rules is not None else []
    players += [(name, entry) for name, entry in config.models]
    results, speeds, episodes = {}, {}, []
    for name, entry in players:
        agent = RulesToolWozAgent(test.database, test.fmt, config.rules) if entry is None else load_policy(
            entry.policy(name, config.prompt), test.fmt, config.generation)
        _synchronize()
        started = time.perf_counter()
        played = test.play(agent, name)
        _synchronize()
        wall_s = time.perf_counter() - started
        del agent
        episodes += played
        results[name] = toolwoz_summary(played)
        speeds[name] = {"episodes": len(played), "wall_s": round(wall_s, 2), "dialogues_per_s": round(len(played) / wall_s, 3) if wall_s else None}
        log.info("toolwoz: %s: avg reward %.3f, 100%% success %.3f (%d episodes, %.1f s)", name, results[name]["avg_reward"],
                 results[name]["success_rate"], len(played), wall_s)
    pq.write_table(eval_table(episodes), out / "toolwoz_episodes.parquet", compression="zstd")
    report = {"goals": len(test.goals), "seeds": list(config.seeds), "simulator": config.simulator.kind, "format": config.format,
              "models": results, "labels": {"rules": RULES_LABEL} if "rules" in results else {},
              "round": {"start": start, "trained": list(trained), "not_trained": dict(not_trained)}, "speed": speeds}
    if harvest is not None:
        report["markdown"] = round_markdown(harvest, report)
    return report


# --- The job ----------------------------------------------------------------------------------

#: How a chain runs one of its stages: ``stage(name, body)`` -> the report, or None when the
#: stage did not finish ok (:func:`run_stage` with the job's checkpoint and resume).
StageRunner = Callable[[str, Callable[[], dict[str, Any]]], "dict[str, Any] | None"]


@dataclasses.dataclass
class StageResult:
    """One stage's state as the job goes. ``makes``: what it leaves on the node that later
    stages read (a model directory); ``kept``: finished by an earlier run of this job and
    taken over by a resumed one (:class:`Resume`)."""

    name: str
    status: str = "pending"         # ok | failed | skipped | not trained (no rows: not a failure)
    wall_s: float | None = None
    error: str | None = None
    needs: tuple[str, ...] = ()
    makes: tuple[Path, ...] = ()
    kept: bool = False

    @property
    def failed(self) -> bool:
        return self.status not in ("ok", "not trained")


class Resume:
    """What an earlier, stopped run of the same job finished (``--resume``): its ``job.json``
    stages. A resumed run keeps the longest prefix of stages that finished ok, whose report
    is still in ``out`` and whose ``makes`` are still on the node; from the first stage it
    cannot keep on, every stage runs again (a later stage's results rest on what it made).
    A stage cut short is never kept: no checkpoint recorded it as ok."""

    def __init__(self, earlier: Mapping[str, Mapping[str, Any]] | None = None):
        self.earlier = dict(earlier or {})

    def keep(self, result: StageResult, out: Path) -> dict[str, Any] | None:
        """The stage's earlier report when it is kept, else None (and nothing after it is)."""
        before = self.earlier.pop(result.name, None)
        report = out / f"{result.name}.json"
        if before is None or before.get("status") != "ok" or not report.is_file() or not all(p.exists() for p in result.makes):
            self.earlier.clear()
            return None
        result.status, result.wall_s, result.kept = "ok", before.get("wall_s"), True
        return json.loads(report.read_text(encoding="utf-8"))


def run_stage(result: StageResult, results: dict[str, StageResult], out: Path, body: Callable[[], dict[str, Any]],
              checkpoint: Callable[[], None] = lambda: None, resume: Resume | None = None) -> dict[str, Any] | None:
    """Run one stage unless a stage it needs failed; its report (with ``status``, ``wall_s``
    and, on failure, ``error``) goes to ``out/<name>.json`` and ``.md``, then ``checkpoint``
    runs (the job's: job.json and the results' manifest rewritten, so that a job stopped from
    outside, a lease that ends, leaves importable results of every stage it finished).
    With ``resume``, a stage an earlier run finished is kept instead (:class:`Resume`)."""
    kept = resume.keep(result, out) if resume is not None else None
    if kept is not None:
        log.info("stage %s: ok in an earlier run of this job, kept (%s s then)", result.name, result.wall_s)
        checkpoint()
        return kept
    missing = [need for need in result.needs if results[need].status != "ok"]
    if missing:
        # after a stage with nothing to train on, what builds on it is not trained either
        quiet = all(results[need].status == "not trained" for need in missing)
        result.status = "not trained" if quiet else "skipped"
        result.error = "needs " + ", ".join(f"{need} ({results[need].status})" for need in missing)
        log.warning("stage %s: %s (%s)", result.name, result.status, result.error)
        _write_stage(out, result, {})
        checkpoint()
        return None
    log.info("stage %s: start", result.name)
    started = time.perf_counter()
    try:
        report = body()
        result.status = "ok"
    except NotTrained as why:
        report = {}
        result.status, result.error = "not trained", str(why)
        log.warning("stage %s: not trained: %s", result.name, why)
    except Exception as error:  # a failed stage is reported; the stages that do not need it run
        report = {"traceback": traceback.format_exc(limit=8)}
        result.status, result.error = "failed", f"{type(error).__name__}: {error}"
        log.error("stage %s: failed: %s", result.name, result.error)
    result.wall_s = round(time.perf_counter() - started, 2)
    _write_stage(out, result, report)
    log.info("stage %s: %s in %.1f s", result.name, result.status, result.wall_s)
    checkpoint()
    return report if result.status == "ok" else None


def _write_stage(out: Path, result: StageResult, report: Mapping[str, Any]) -> None:
    report = dict(report)
    markdown = report.pop("markdown", None)
    body = {"stage": result.name, "status": result.status, "wall_s": result.wall_s, "error": result.error, **report}
    _write_json(out / f"{result.name}.json", body)
    lines = [f"# GPU job stage `{result.name}`: {result.status}", ""]
    if result.wall_s is not None:
        lines.append(f"Wall time: {result.wall_s:.1f} s.")
    if result.error:
        lines += ["", f"{'Why' if result.status == 'not trained' else 'Error'}: `{result.error}`"]
    if markdown:
        lines += ["", markdown]
    elif result.status == "ok":
        lines += ["", stage_summary(result.name, report)]
    (out / f"{result.name}.md").write_text("\n".join(lines).rstrip() + "\n", encoding="utf-8")


def stage_summary(name: str, report: Mapping[str, Any]) -> str:
    """A few lines for a training or conversion stage's markdown."""
    if name == "convert":
        return f"Start model `{report.get('model')}`: {report.get('parameters', 0):,} parameters ({report.get('source')})."
    if name == "harvest":
        test, speed = report.get("test") or {}, report.get("speed") or {}
        return "\n".join([
            f"- {report.get('goals')} trees, {report.get('nodes')} nodes, {report.get('successful_nodes')} nodes that met a goal API, "
            f"{report.get('golden_paths')} golden paths: {report.get('sft_rows')} SFT rows, KTO {report.get('kto_rows')}",
            f"- {speed.get('agent_calls')} agent calls in {speed.get('wall_s')} s ({speed.get('agent_calls_per_s')} calls/s)",
            f"- M on {test.get('goals')} test goals (sampled, no branching): avg reward {test.get('avg_reward')}, "
            f"100 % success {test.get('success_rate')}",
        ])
    throughput = report.get("throughput") or {}
    train = report.get("train") or {}
    after = json.dumps(report.get("eval", {}).get("after", {}), sort_keys=True)[:1500]
    return "\n".join([
        f"- steps: {train.get('steps')} ({train.get('epochs', 0):.2f} epochs), final loss {train.get('final_loss')}",
        f"- tokens/s: {throughput.get('tokens_per_s')}, MFU: {throughput.get('mfu')}, steps/s: {throughput.get('steps_per_s')}",
        *([f"- share of time generating: {throughput['generate_share']}"] if "generate_share" in throughput else []),
        f"- held-out after: `{after}`",
    ])


def _write_json(path: Path, obj: Any) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    temporary.write_text(json.dumps(obj, indent=2, ensure_ascii=False, allow_nan=False, default=str) + "\n", encoding="utf-8")
    temporary.replace(path)


def convert_model(job: Path, manifest: Mapping[str, Any], target: Path) -> dict[str, Any]:
    """The starting model: the job's GGUF converted (``gpu.model: smollm2``), or the packed
    ``models/base`` as it is (``base``)."""
    kind = manifest["model"]["kind"]
    if kind == "base":
        path = Path(manifest["model"]["path"])
        if not (path / "config.json").is_file():
            raise ConfigError(f"gpu model base: {path} has no config.json")
        from transformers import AutoConfig

        config = AutoConfig.from_pretrained(path)
        return {"model": str(path), "source": "models/base (packed)", "parameters": None, "architecture": config.model_type}
    parameters = gguf_checkpoint(job / FILES / manifest["model"]["file"], target)
    return {"model": str(target), "source": f"{manifest['model']['file']} (sha256 {manifest['files'][manifest['model']['file']]['sha256'][:16]})",
            "parameters": parameters}


def gguf_checkpoint(gguf: Path, target: Path) -> int:
    """``gguf`` converted (float32) and saved as a Hugging Face checkpoint in ``target``; its
    parameter count (``convert``'s way, and ``benchmarks/batch_agreement.py --gguf``'s)."""
    from pipelines.llm.gguf import convert
    from catalog.models import save_model

    model, tokenizer = convert(gguf, "float32")
    save_model(model, tokenizer, target)
    return sum(p.numel() for p in model.parameters())


@dataclasses.dataclass(frozen=True)
class Chain:
    """What a chain (SFT -> evaluation before GRPO -> GRPO -> evaluation) plays and how:
    ``models``, in table order, as (name in the table, the stage that makes it, its folder
    under ``work/models``; None: the start model); ``evaluation``, the section that sets the
    evaluation and the last stage's name (the one before GRPO adds ``_sft``); ``evaluate``,
    the function that plays and scores (:func:`evaluate` or :func:`evaluate_pir`)."""

    models: tuple[tuple[str, str, str | None], ...]
    evaluation: str
    evaluate: Callable[..., dict[str, Any]]


#: The chains by profile kind: SpeakRL's (issue 25), PIR's (cold-start SFT, US-GRPO, PIR's
#: metrics) and Learn-to-Ask's (SFT on the expert's turns, GRPO with eq. 5, Table 1's proxies).
CHAINS = {
    "speakrl": Chain((("zero_shot", "convert", None), ("sft", "sft", "sft"), ("grpo", "grpo", "grpo")), "evaluate", evaluate),
    "pir": Chain((("zero_shot", "convert", None), ("pir_sft", "sft", "pir_sft"), ("pir_grpo", "grpo", "pir_grpo")), "pir_eval", evaluate_pir),
    "l2a": Chain((("zero_shot", "convert", None), ("l2a_sft", "sft", "l2a_sft"), ("l2a_grpo", "grpo", "l2a_grpo")), "l2a_eval", evaluate_l2a),
}


def training_seeds(sections: Mapping[str, Any], where: str) -> list[int | None]:
    """A chain profile's ``seeds``: each trained model of the chain is trained once per seed
    (:func:`seeded`), and the evaluation pools them (every chain: :data:`CHAINS`);
    absent: one run under the sections' own seed, ``[None]``.

    >>> training_seeds({"seeds": [0, 1, 2]}, "w"), training_seeds({}, "w")
    ([0, 1, 2], [None])
    >>> training_seeds({"seeds": [1, 1]}, "w")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: w.seeds: expected a list of distinct integers >= 0, got [1, 1]
    """
    seeds = sections.get("seeds")
    if seeds is None:
        return [None]
    if not (isinstance(seeds, list) and seeds and len(set(seeds)) == len(seeds)
            and all(isinstance(k, int) and not isinstance(k, bool) and k >= 0 for k in seeds)):
        raise ConfigError(f"{where}.seeds: expected a list of distinct integers >= 0, got {seeds!r}")
    return list(seeds)


def seeded(section: Mapping[str, Any], seed: int) -> dict[str, Any]:
    """What training seed ``seed`` sets in a chain's training section: ``optim.seed`` (data
    order, new weights, the trainer's sampling) and, for multi-turn GRPO, the rollouts'
    sampling seed too (each conversation's seed derives from it), so that a re-training
    samples other conversations; the goals trained on stay the same (``env.seed``).

    >>> seeded({"optim": {}}, 2), seeded({"env": {"seed": 0}}, 2)
    ({'optim': {'seed': 2}}, {'optim': {'seed': 2}, 'env': {'rollout': {'seed': 2}}})
    """
    return {"optim": {"seed": seed}, **({"env": {"rollout": {"seed": seed}}} if section.get("env") is not None else {})}


def run_chain(chain: Chain, stages: dict[str, StageResult], sections: Mapping[str, Any], out: Path, models: Path, start_path: Path,
              where: str, manifest: Mapping[str, Any], stage: StageRunner, info: dict[str, Any]) -> None:
    """sft -> <evaluation>_sft -> grpo -> <evaluation> after convert; the generation limit the
    data set goes into ``info`` (job.json) before the first checkpoint. The zero-shot and SFT
    models are evaluated before GRPO starts, so a lease that ends during GRPO still leaves
    their table (the results are checkpointed after every stage); the last evaluation then
    plays the GRPO model only and reports all three (a resumed run that kept the first
    evaluation takes what it played from the node). With ``seeds`` (:func:`training_seeds`),
    SFT and GRPO run once per seed (the first seed's stages and models keep the plain names,
    the others' end in ``_s<seed>``; GRPO of a seed starts from the SFT model of that seed) and
    the evaluations get each trained model as its list of seed directories."""
    seeds = training_seeds(sections, where)
    runs = [(seed, "" if i == 0 else f"_s{seed}") for i, seed in enumerate(seeds)]
    folder_of = {maker: folder for _, maker, folder in chain.models if folder is not None}
    trained_dir = {f"{maker}{suffix}": models / f"{folder}{suffix}" / "model" for maker, folder in folder_of.items() for _, suffix in runs}
    # each model of the table: the stages that make it and where (one per seed)
    made = {name: [("convert", start_path)] if folder is None else [(f"{maker}{suffix}", trained_dir[f"{maker}{suffix}"]) for _, suffix in runs]
            for name, maker, folder in chain.models}
    before_grpo = f"{chain.evaluation}_sft"
    stages.update({f"sft{suffix}": StageResult(f"sft{suffix}", needs=("convert",), makes=(trained_dir[f"sft{suffix}"],)) for _, suffix in runs})
    stages[before_grpo] = StageResult(before_grpo)
    stages.update({f"grpo{suffix}": StageResult(f"grpo{suffix}", needs=(f"sft{suffix}",), makes=(trained_dir[f"grpo{suffix}"],))
                   for _, suffix in runs})
    stages[chain.evaluation] = StageResult(chain.evaluation)
    check = sections.get("unbatched_check")
    if check is not None:
        check_goals, check_models, check_dtypes = unbatched_check_params(check, [name for name, _, _ in chain.models], where)
        makers = tuple(dict.fromkeys(made[name][0][0] for name in check_models))
        stages["unbatched_check"] = StageResult("unbatched_check", needs=(chain.evaluation, *makers))

    def trained(method: str, seed: int | None, suffix: str, start: Path) -> Callable[[], dict[str, Any]]:
        def body() -> dict[str, Any]:
            section = sections[method] if seed is None else deep_merge(sections[method], seeded(sections[method], seed))
            stage_dir = trained_dir[f"{method}{suffix}"].parent
            stage_dir.mkdir(parents=True, exist_ok=True)
            params = parse_section(section, f"{where}.{method}")
            config = train_config(method, params, model_path=str(start), output_dir=stage_dir, where=f"{where}.{method}")
            env = conversation_env(params, method, f"{where}.{method}", config.resolved_objective())
            report = train(config, epochs=params.epochs, sampler=params.sampler, env=env)
            shutil.copyfile(config.output.curve, out / f"{method}{suffix}_curve.csv")
            return report
        return body

    if stages["convert"].status == "ok":  # recorded even where a profile (smoke) sets its own limits
        info["generation_limit"] = limit = data_generation_limit(sections, start_path)
        sections = with_limit(sections, limit["tokens"])
        log.info("generation limit from the training data: %d tokens (longest turn %d)", limit["tokens"], limit["longest"])
        # continuous: {attention: auto}: timed once with the start model, before any evaluation
        resolved, timing = resolve_attention(sections[chain.evaluation], start_path, f"{where}.{chain.evaluation}", info.get("attention"))
        if timing is not None:
            sections = {**sections, chain.evaluation: resolved}
            info["attention"] = timing
    played: dict[str, Any] = {}  # the models the first evaluation played, not played again by the last
    # What the first evaluation played, kept on the node beside the models: a resumed run's
    # last evaluation takes it instead of playing the zero-shot and SFT models again.
    cache = models / f"{before_grpo}_played.pkl"
    stages[before_grpo].makes = (cache,)

    def evaluation(name: str) -> None:
        playable: dict[str, Any] = {}
        for model, makers in made.items():
            paths = [str(path) for maker, path in makers if stages[maker].status == "ok"]
            if paths:
                # trained under several seeds: the evaluation pools each trained model's seed directories
                playable[model] = paths if seeds != [None] and makers[0][0] != "convert" else paths[0]
        if playable:
            prefix = "" if name == "evaluate" else f"{name}_"

            def body() -> dict[str, Any]:
                report = chain.evaluate(sections[chain.evaluation], playable, out, played, prefix)
                if name == before_grpo:
                    temporary = cache.with_name(f".{cache.name}.tmp")
                    temporary.write_bytes(pickle.dumps(played))
                    temporary.replace(cache)
                return report
            stage(name, body)
        else:
            stages[name].needs = ("convert",)
            stage(name, dict)

    for seed, suffix in runs:
        stage(f"sft{suffix}", trained("sft", seed, suffix, start_path))
    evaluation(before_grpo)
    if stages[before_grpo].kept:
        played.update(pickle.loads(cache.read_bytes()))
    for seed, suffix in runs:
        stage(f"grpo{suffix}", trained("grpo", seed, suffix, trained_dir[f"sft{suffix}"]))
    evaluation(chain.evaluation)
    if check is not None:
        # Last: a lease cut short loses only this check, never a model or the table.
        models_of = {name: str(made[name][0][1]) for name in check_models}
        stage("unbatched_check", lambda: unbatched_check(sections[chain.evaluation], check_goals, models_of, played, check_dtypes))


def run_josh_round(stages: dict[str, StageResult], sections: Mapping[str, Any], out: Path, models: Path, start_path: Path,
                   where: str, manifest: Mapping[str, Any], stage: StageRunner, info: dict[str, Any]) -> None:
    """harvest -> sft -> kto -> toolwoz after convert: one JOSH self-improvement round."""
    stages.update({"harvest": StageResult("harvest", needs=("convert",)),
                   "sft": StageResult("sft", needs=("harvest",), makes=(models / "josh_sft" / "model",)),
                   "kto": StageResult("kto", needs=("sft",), makes=(models / "josh_kto" / "model",)),
                   "toolwoz": StageResult("toolwoz", needs=("convert",))})
    start = str(manifest["model"]["kind"])  # M's name in the table: smollm2 (or base)
    harvest = stage("harvest", lambda: harvest_trees(
        josh_config(sections["harvest"], start_path, models.parent, f"{where}.harvest"), start))

    def trained(method: str, from_dir: Path) -> Callable[[], dict[str, Any]]:
        def body() -> dict[str, Any]:
            stage_dir = models / f"josh_{method}"
            stage_dir.mkdir(parents=True, exist_ok=True)
            report = trained_on_harvest(method, sections[method], from_dir, stage_dir, f"{where}.{method}")
            shutil.copyfile(stage_dir / "curve.csv", out / f"{method}_curve.csv")
            return report
        return body

    stage("sft", trained("sft", start_path))
    stage("kto", trained("kto", models / "josh_sft" / "model"))
    dirs = {start: start_path, "josh_sft": models / "josh_sft" / "model", "josh_kto": models / "josh_kto" / "model"}
    stage_of = {start: "convert", "josh_sft": "sft", "josh_kto": "kto"}
    playable = {name: str(path) for name, path in dirs.items() if stages[stage_of[name]].status == "ok"}
    not_trained = {f"josh_{s}": f"{stages[s].status}: {stages[s].error}" for s in ("sft", "kto") if stages[s].status != "ok"}
    stage("toolwoz", lambda: evaluate_toolwoz(sections["toolwoz"], playable, out, harvest, start, ("josh_sft", "josh_kto"), not_trained))


def run_job(job: Path, out: Path, profile: str | None, smoke: bool, resume: bool = False) -> int:
    """Every stage of the profile; 0 when all succeeded, 1 otherwise (2: not runnable).
    ``resume``: ``out`` holds the results of an earlier run of this job that was stopped (a
    lease's call that ran out); the stages it finished are kept (:class:`Resume`), the rest
    run, and ``job.json`` counts both runs' wall time."""
    import torch

    from pipelines.gpu.hardware import describe

    manifest = read_manifest(job)
    gpu = read_params("gpu")
    name, sections = profile_params(gpu, profile, smoke)
    if not smoke and not torch.cuda.is_available():
        raise ConfigError("no CUDA accelerator on this machine: the GPU profile needs one (--smoke runs the same path on a CPU with tiny counts)")
    earlier = earlier_run(out, manifest, name, smoke) if resume else None
    out.mkdir(parents=True, exist_ok=True)
    if earlier is not None:
        discard_unlisted(out)
    models = job / "work" / "models"
    started_at = datetime.now(timezone.utc).isoformat(timespec="seconds")
    started = time.perf_counter()
    machine = describe()
    log.info("job %s, profile %s%s on %s (%s)", manifest["commit"][:12], name, " (smoke)" if smoke else "", machine["device"], machine["accelerator"])
    start_dir = models / "start"
    start_path = start_dir if manifest["model"]["kind"] != "base" else Path(manifest["model"]["path"])
    stages = {"convert": StageResult("convert", makes=(start_dir,) if manifest["model"]["kind"] != "base" else ())}
    # What a chain learns as it goes (the data's generation limit, the attention it timed: a
    # resumed run keeps the earlier run's pick).
    info: dict[str, Any] = {"generation_limit": None, **({"attention": earlier["attention"]} if (earlier or {}).get("attention") else {})}
    # Each run of the job (one, or the earlier ones and this resumed one): when, how long, where.
    runs = [*(earlier or {}).get("runs", []), {"started": started_at, "wall_s": 0.0, "device": machine["device"]}]
    resumer = Resume((earlier or {}).get("stages")) if earlier is not None else None

    def write_summary(finished: bool) -> dict[str, Any]:
        runs[-1]["wall_s"] = round(time.perf_counter() - started, 2)
        summary = {
            "commit": manifest["commit"], "code_tar_sha256": manifest["code_tar_sha256"], "profile": name, "smoke": smoke,
            "started": runs[0]["started"], "wall_s": round(sum(r["wall_s"] for r in runs), 2), "finished": finished,
            "machine": machine, "model": manifest["model"], "job_manifest_sha256": sha256_file(job / "manifest.json"), **info,
            "stages": {s.name: {"status": s.status, "wall_s": s.wall_s, "error": s.error, **({"kept": True} if s.kept else {})}
                       for s in stages.values()},
            **({"runs": runs} if len(runs) > 1 else {}),
        }
        _write_json(out / "job.json", summary)
        write_results_manifest(out, manifest)
        return summary

    def stage(stage_name: str, body: Callable[[], dict[str, Any]]) -> dict[str, Any] | None:
        return run_stage(stages[stage_name], stages, out, body, lambda: write_summary(False), resumer)

    stage("convert", lambda: convert_model(job, manifest, start_dir))
    kind, where = profile_kind(sections), f"params.yaml gpu.profiles.{name}"
    if kind == "josh":
        run_josh_round(stages, sections, out, models, start_path, where, manifest, stage, info)
    else:
        run_chain(CHAINS[kind], stages, sections, out, models, start_path, where, manifest, stage, info)
    summary = write_summary(True)
    failed = [s.name for s in stages.values() if s.failed]
    log.info("job finished in %.1f s: %s", summary["wall_s"], "all stages ok" if not failed else f"not ok: {', '.join(failed)}")
    return 1 if failed else 0


RESULTS_MANIFEST = "manifest.json"


def earlier_run(out: Path, manifest: Mapping[str, Any], profile: str, smoke: bool) -> dict[str, Any]:
    """``out/job.json`` of a stopped run of this job, to resume: the same commit, code,
    profile and smoke setting, not finished; its ``runs`` (one entry for a run that had none)."""
    path = out / "job.json"
    if not path.is_file():
        raise ConfigError(f"{path}: nothing to resume (no job.json; run without --resume)")
    try:
        summary = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as error:
        raise ConfigError(f"{path}: not JSON ({error})") from error
    wanted = {"commit": manifest["commit"], "code_tar_sha256": manifest["code_tar_sha256"], "profile": profile, "smoke": smoke}
    for field, value in wanted.items():
        if summary.get(field) != value:
            raise ConfigError(f"{path}: field {field!r} is {summary.get(field)!r}, this job's is {value!r}: not a run of this job to resume")
    if summary.get("finished"):
        raise ConfigError(f"{path}: that run finished; nothing to resume")
    summary.setdefault("runs", [{"started": summary.get("started"), "wall_s": summary.get("wall_s"),
                                 "device": (summary.get("machine") or {}).get("device")}])
    # A stopped run's wall time is up to its last checkpoint: the stage it was cut short in
    # ran longer than that (the lease's own record of the call bounds it).
    summary["runs"][-1]["stopped"] = True
    return summary


def discard_unlisted(out: Path) -> list[str]:
    """Remove the result files the results' manifest does not list: what a stage cut short
    left (no checkpoint vouches for it), so that a resumed run's manifest does not take it in.
    Returns their names."""
    listed = set(json.loads((out / RESULTS_MANIFEST).read_text(encoding="utf-8"))["files"]) if (out / RESULTS_MANIFEST).is_file() else set()
    gone = []
    for path in sorted(out.rglob("*")):
        name = str(path.relative_to(out))
        if path.is_file() and name not in listed and path.name not in (RESULTS_MANIFEST, "job.json"):
            path.unlink()
            gone.append(name)
    if gone:
        log.info("resume: %d file(s) of a stage cut short removed: %s", len(gone), ", ".join(gone))
    return gone


def write_results_manifest(out: Path, manifest: Mapping[str, Any]) -> None:
    """``out/manifest.json``: the commit and code hash the results claim, and every result
    file's sha256 (``askflow gpu import`` checks both)."""
    files = {str(p.relative_to(out)): {"size": p.stat().st_size, "sha256": sha256_file(p)}
             for p in sorted(out.rglob("*")) if p.is_file() and p.name != RESULTS_MANIFEST and not p.name.startswith(".")}
    _write_json(out / RESULTS_MANIFEST, {"format": "askflow-gpu-results/1", "commit": manifest["commit"],
                                         "code_tar_sha256": manifest["code_tar_sha256"], "files": files})


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m flows.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--job", type=Path, required=True, help="the job directory")
    parser.add_argument("--profile", default=None, help="a profile of params.yaml gpu.profiles (default: gpu.profile)")
    parser.add_argument("--smoke", action="store_true", help="tiny counts; runs on a CPU")
    parser.add_argument("--out", type=Path, default=None, help="results directory (default: JOB/results)")
    parser.add_argument("--resume", action="store_true",
                        help="OUT holds a stopped run of this job: keep the stages it finished, run the rest")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s", datefmt="%H:%M:%S", stream=sys.stdout, force=True)
    for noisy in ("httpx", "transformers", "datasets"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    out = (args.out or args.job / "results").resolve()
    try:
        return run_job(args.job.resolve(), out, args.profile, args.smoke, args.resume)
    except AskflowError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
