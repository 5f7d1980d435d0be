"""PIR's evaluation of one model (section 4.1), shared by the DVC stage ``pir_eval`` and the GPU
job's ``pir_eval`` stages: the model plays each held-out goal once with US-GRPO's conversation
player (the agenda user answers its visible turns and the questions it asks inside its
reasoning; the goal checker grades the conversation), and the numbers of
:func:`pipelines.pir.metrics.conversation_metrics` are taken over the conversations.

:func:`success_intervals` adds what a table of one training seed can say about its models:
each model's success with a 95 % bootstrap interval over the goals, and each model against
the one before it, paired on the same goal resamples.

:class:`PirEvalParams` is what both read from their params section (params.yaml ``pir_eval``;
a GPU profile's ``pir_eval``): one vocabulary, one set of checks.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np

from pipelines.config import OutputSpec, positive_int
from pipelines.errors import ConfigError
from pipelines.evaluation.config import StatsSpec
from pipelines.pir.metrics import play_and_score
from pipelines.simulators.agenda import SimulatorSpec
from pipelines.stats import interval, resample_indices
from pipelines.training.rollout import RolloutConfig


#: What each reader of :class:`PirEvalParams` does not take: a GPU profile's section plays the
#: job's own models and writes the job's own reports; the DVC stage reports no intervals.
NOT_IN_GPU_SECTION: tuple[str, ...] = ("models", "output", "threads")
NOT_IN_STAGE: tuple[str, ...] = ("stats",)


@dataclass(frozen=True)
class PirEvalParams:
    """PIR's evaluation settings: params.yaml ``pir_eval`` (read without ``stats``) and a GPU
    profile's ``pir_eval`` section (read without ``models``, ``output``, ``threads``).

    What is played: the first ``max_goals`` goals of ``source``'s ``split`` (those that need the
    tools; the database from ``db_dir`` where it is not beside the dialogues), one greedy
    conversation each (``rollout``, temperature 0) against the agenda user (``simulator``),
    seeded by ``seed``. The stage's ``models``: name -> model directory (or a list: one per
    training seed); ``output``: ``{metrics, markdown}``; ``threads``: None takes the top-level
    params.yaml ``threads``. The job's ``stats``: :func:`success_intervals`' resamples and seed."""

    source: str
    db_dir: str | None = None
    split: str = "test"
    max_goals: int = 20
    seed: int = 0
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    rollout: RolloutConfig = field(default_factory=RolloutConfig)
    models: Any = None
    output: OutputSpec | None = None
    threads: int | None = None
    stats: StatsSpec = field(default_factory=StatsSpec)

    def __post_init__(self) -> None:
        if self.simulator.kind != "agenda":
            raise ConfigError(f"simulator.kind: PIR's evaluation plays the agenda user simulator, got {self.simulator.kind!r}")
        if self.rollout.temperature != 0:
            raise ConfigError(f"rollout.temperature: PIR's evaluation is greedy (0), got {self.rollout.temperature}")
        positive_int(self.max_goals, "max_goals")
        positive_int(self.threads, "threads", optional=True)

    def checked(self, where: str) -> "PirEvalParams":
        """These settings, once their ``source`` is there (a ConfigError naming ``where`` if not)."""
        if not Path(self.source).exists():
            raise ConfigError(f"{where}.source: {self.source} does not exist")
        return self


def play_model(path: str, label: str, database: Any, dialogues: Sequence[Any], simulator: Any, rollout_config: Any,
               seed: int) -> tuple[dict[str, Any], list[Any], float]:
    """The model in ``path`` (float32; on the accelerator where there is one) plays
    ``dialogues``' goals once with ``rollout_config`` against the agenda user with the
    settings ``simulator``; returns PIR's numbers, with ``reward_branches`` (how the
    composite reward scored them), the rollouts and the seconds the playing took (loading
    the model left out). ``label`` is the episodes' agent name."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.rewards.pir import PIRReward, RulesHelpfulness
    from pipelines.simulators.agenda import AgendaSimulator
    from pipelines.training.config import ModelSpec
    from pipelines.training.modeling import load_tokenizer
    from pipelines.training.rollout import ConversationRollout

    tokenizer = load_tokenizer(ModelSpec(path=path))  # as the model was trained
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if torch.cuda.is_available():
        model.to("cuda")
    rollout = ConversationRollout(database, AgendaSimulator(database, simulator), tokenizer, rollout_config, name=label)
    # A fresh reward per model: its branch counts are that model's.
    reward = PIRReward(RulesHelpfulness())
    started = time.perf_counter()
    metrics, played = play_and_score(rollout, model, dialogues, seed, reward)
    seconds = time.perf_counter() - started  # the rollout copies every step's tokens to the host: nothing is left queued
    metrics["reward_branches"] = dict(sorted(reward.stats.items()))
    return metrics, played, seconds


def success_intervals(success: Mapping[str, Sequence[float]], resamples: int, seed: int) -> dict[str, Any]:
    """Each model's success rate with its 95 % percentile interval over ``resamples``
    resamples of the goals, and each model minus the one before it (in ``success``'s order)
    on the same resamples: a paired interval, and the share of resamples where the later
    model is not better (a one-sided bootstrap p). ``success``: model -> one 0/1 per goal,
    the goals in the same order for every model.

    >>> out = success_intervals({"a": [0, 0, 1, 0], "b": [1, 0, 1, 1]}, 200, 0)
    >>> out["models"]["b"]["success"], out["comparisons"][0]["models"], out["comparisons"][0]["difference"]
    (0.75, ['b', 'a'], 0.5)
    """
    names = list(success)
    values = {name: np.asarray(success[name], dtype=float) for name in names}
    goals = {len(v) for v in values.values()}
    if len(goals) != 1:
        raise ValueError(f"success_intervals: every model needs one value per goal, got lengths {sorted(goals)}")
    indices = resample_indices(goals.pop(), resamples, seed)
    means = {name: values[name][indices].mean(axis=1) for name in names}
    models = {name: {"success": round(float(values[name].mean()), 4), "ci95": interval(means[name])} for name in names}
    comparisons = []
    for before, after in zip(names, names[1:]):
        difference = means[after] - means[before]
        comparisons.append({"models": [after, before], "difference": round(float(values[after].mean() - values[before].mean()), 4),
                            "ci95": interval(difference), "p_not_better": round(float(np.mean(difference <= 0)), 4)})
    return {"resamples": resamples, "seed": seed, "models": models, "comparisons": comparisons}
