"""The evaluation's configuration: data for the ``evaluate`` section of params.yaml."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.config import MAX_LLM_FAILURE_RATE, OutputSpec, positive_int, rate
from pipelines.errors import ConfigError
from pipelines.evaluation.agent import PromptSpec
from pipelines.evaluation.play import EvalPlan
from pipelines.evaluation.policy import GenerationSpec, ModelEntry, PolicySpec
from pipelines.simulators.agenda import SimulatorSpec


@dataclass(frozen=True)
class StatsSpec:
    """Confidence intervals and significance (:func:`pipelines.evaluation.metrics.bootstrap_summary`):
    ``resamples`` of the goals with replacement from a generator seeded with ``seed``;
    differences are significant below ``alpha`` (Holm-adjusted p-value)."""

    resamples: int = 2000
    seed: int = 0
    alpha: float = 0.05

    def __post_init__(self) -> None:
        if self.resamples < 100:
            raise ConfigError(f"evaluate.stats.resamples: expected >= 100, got {self.resamples}")
        if not 0.0 < self.alpha < 1.0:
            raise ConfigError(f"evaluate.stats.alpha: expected between 0 and 1, got {self.alpha}")


#: What the evaluation writes (``evaluate.output``), and where by default.
EVAL_OUTPUTS: dict[str, str] = {"episodes": "data/episodes/eval", "metrics": "reports/eval.json",
                                "markdown": "reports/eval.md", "plot": "reports/eval_plot.csv"}


@dataclass(frozen=True)
class EvalConfig:
    """Every model plays ``max_goals`` goals of ``split`` once per seed (Avg@k); ``stats``
    sets the confidence intervals over goals and the paired tests between models."""

    source: str
    # name -> one model, or a list: one policy trained under several seeds (a row pooled over them)
    models: tuple[tuple[str, ModelEntry | tuple[ModelEntry, ...]], ...]
    db_dir: str | None = None
    split: str = "test"
    max_goals: int | None = 100
    seeds: tuple[int, ...] = (0, 1, 2, 3, 4)
    max_exchanges: int = 20
    max_steps: int = 6
    malformed_retries: int = 2
    agent_format: str = "speakrl"
    batched: bool = True
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    generation: GenerationSpec = field(default_factory=GenerationSpec)
    prompt: PromptSpec = field(default_factory=PromptSpec)
    stats: StatsSpec = field(default_factory=StatsSpec)
    output: OutputSpec = field(default_factory=OutputSpec)
    # More failed LLM simulator calls than this share is an outage: the stage publishes nothing.
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE
    # Processes that play a model's goals, each with its own copy of the model (the GPU job,
    # flows/gpu.py): one process decoding a batch at a time leaves a GPU mostly waiting on
    # Python. The goals are split between them; the episodes are the same (decoding.py).
    workers: int = 1

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", self.output.check("evaluate.output", tuple(EVAL_OUTPUTS), EVAL_OUTPUTS))
        rate(self.max_llm_failure_rate, "evaluate.max_llm_failure_rate")
        if not self.models:
            raise ConfigError("evaluate.models: at least one model is required")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"evaluate.seeds: distinct seeds, at least one; got {list(self.seeds)}")
        positive_int(self.max_goals, "evaluate.max_goals", optional=True)
        positive_int(self.workers, "evaluate.workers")
        positive_int(self.max_exchanges, "evaluate.max_exchanges")
        for name, entries in self.models:
            if isinstance(entries, tuple) and not entries:
                raise ConfigError(f"evaluate.models.{name}: an empty list (give the model of each training seed)")
            for entry in entries if isinstance(entries, tuple) else (entries,):
                if (entry.path is None) == (entry.hub_id is None):
                    raise ConfigError(f"evaluate.models.{name}: give exactly one of path and hub_id")
        from pipelines.episodes import FORMATS

        if self.agent_format not in FORMATS:
            raise ConfigError(f"evaluate.agent_format: unknown {self.agent_format!r}; one of {sorted(FORMATS)}")
        from pipelines.simulators.factory import SIMULATOR_KINDS

        if self.simulator.kind not in SIMULATOR_KINDS:
            raise ConfigError(f"evaluate.simulator.kind: unknown {self.simulator.kind!r}; one of {list(SIMULATOR_KINDS)}")

    def rows(self) -> dict[str, list[PolicySpec]]:
        """Each table row's models as :class:`PolicySpec` s, with their own prompt settings or
        the shared ones: one for a single model (named as the row), one per training seed for
        a list (the first named as the row, the others ``row@k``, k their place in the list, as
        Learn-to-Ask's table names them)."""
        rows: dict[str, list[PolicySpec]] = {}
        for name, entries in self.models:
            many = isinstance(entries, tuple)
            rows[name] = [entry.policy(f"{name}@{k}" if k else name, self.prompt) for k, entry in enumerate(entries if many else (entries,))]
        return rows

    def policy_specs(self) -> list[PolicySpec]:
        """Every model to play, row by row (:meth:`rows`)."""
        return [spec for specs in self.rows().values() for spec in specs]

    def plan(self) -> EvalPlan:
        """The seeds, the runner's limits and the batching of every model's play."""
        from pipelines.episodes.runner import RunnerConfig

        runner = RunnerConfig(max_exchanges=self.max_exchanges, max_steps=self.max_steps, malformed_retries=self.malformed_retries)
        return EvalPlan(seeds=tuple(self.seeds), runner=runner, batched=self.batched)
