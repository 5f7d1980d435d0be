"""The ``josh`` stage's settings (params.yaml ``josh``), checked when built."""

from __future__ import annotations

from dataclasses import dataclass, field

from pipelines.episodes.formats import FORMATS
from pipelines.config import MAX_LLM_FAILURE_RATE, FanOutSpec, OutputSpec, positive_int
from pipelines.errors import ConfigError
from pipelines.evaluation.agent import PromptSpec
from pipelines.evaluation.policy import GenerationSpec, ModelEntry
from pipelines.josh.agent import RulesPolicy
from pipelines.josh.beam import BeamConfig
from pipelines.simulators.agenda import SimulatorSpec

# JOSH's ReACT prompt (Table 8), for the four ToolWOZ domains.
TOOLWOZ_TASK_PROMPT = (
    "You are a customer service agent helping a user find and book restaurants, hotels, attractions and trains "
    "in Cambridge, UK. You MUST use the apis available to you to gather information; never use your own knowledge. "
    "Ask the user for what you need to know before you search or book."
)
BACKENDS: tuple[str, ...] = ("rules", "hf", "openai")
#: How a report names each harvester: the method (M harvests its own trees) or the reference.
HARVESTER_ROLES: dict[str, str] = {
    "hf": "policy M (the method: M harvests its own trees)",
    "openai": "policy M behind an endpoint (the method)",
    "rules": "template harvester (rules agent; a reference, not the method)",
}
#: The reference row's label wherever the ToolWOZ evaluation reports it.
RULES_LABEL = f"rules: {HARVESTER_ROLES['rules']}"


@dataclass(frozen=True)
class SamplingSpec:
    """Paper: temperature 1.0 (gpt); 1.5 with top_k 50 and top_p 0.75 (llama)."""

    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int = 256


@dataclass(frozen=True)
class AgentSpec:
    """Who plays the trees. ``hf`` (the default) is the method: the policy M being trained
    (``model_path``, the model ``train.josh_sft`` then fine-tunes) harvests its own trees.
    ``openai`` is M behind an endpoint. ``rules`` is a template harvester
    (:class:`RulesToolWozAgent`): a reference for tests and comparisons, not the method, since a
    model trained on its trees learns the template's turns, not its own."""

    backend: str = "hf"
    format: str = "react"
    rules: RulesPolicy = field(default_factory=RulesPolicy)
    model_path: str | None = None  # hf: a local model directory, M (e.g. models/base)
    # hf: how M is prompted while it harvests: as train.josh_* trains it and josh_evaluate
    # plays it (the compact ReAct prompt, history cut to the context); null: the format's own
    # system message (every api's JSON schema, ~2,700 tokens, beyond a 1,024-token context).
    prompt: PromptSpec | None = field(default_factory=lambda: _toolwoz_prompt())
    device: str = "cpu"
    batch_size: int = 8
    sampling: SamplingSpec = field(default_factory=SamplingSpec)


@dataclass(frozen=True)
class TestSpec:
    """The harvesting agent on the official ToolWOZ test goals (first ``max_goals`` sorted
    ids of the test list), once per seed, no branching: average reward and 100 % success."""

    max_goals: int = 450
    seeds: tuple[int, ...] = (0,)

    def __post_init__(self) -> None:
        if self.max_goals < 1 or not self.seeds:
            raise ConfigError(f"test: max_goals must be >= 1 and seeds not empty, got {self.max_goals} and {list(self.seeds)}")


@dataclass(frozen=True)
class JoshConfig:
    source: str
    output: str
    metrics: str
    db_dir: str | None = None
    strict: bool = False
    max_goals: int | None = None
    seed: int = 0
    agent: AgentSpec = field(default_factory=AgentSpec)
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    beam: BeamConfig = field(default_factory=BeamConfig)
    concurrency: int = 8
    min_reward: float = 1.0
    task_prompt: str = TOOLWOZ_TASK_PROMPT
    work_dir: str = "data/cache/josh"
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE
    test: TestSpec = field(default_factory=TestSpec)
    fan_out: FanOutSpec = field(default_factory=FanOutSpec)
    # A harvest without training rows: false publishes empty SFT / KTO tables and the report
    # (training_data: false) and exits 0; true fails the stage instead.
    require_training_data: bool = False

    def __post_init__(self) -> None:
        if self.agent.backend not in BACKENDS:
            raise ConfigError(f"agent.backend: expected one of {list(BACKENDS)}, got {self.agent.backend!r}")
        if self.agent.format not in FORMATS:
            raise ConfigError(f"agent.format: expected one of {list(FORMATS)}, got {self.agent.format!r}")
        if self.agent.backend == "hf" and not self.agent.model_path:
            raise ConfigError("agent.model_path: required for backend 'hf' (the policy M that harvests its own trees, "
                              "e.g. models/base, the model train.josh_sft fine-tunes); backend 'rules' is the template harvester")
        positive_int(self.max_goals, "max_goals", optional=True)
        positive_int(self.concurrency, "concurrency")
        if not 0.0 < self.min_reward <= 1.0:
            raise ConfigError(f"min_reward: expected a number in (0, 1], got {self.min_reward}")




# --- ToolWOZ evaluation of models (stage josh_evaluate) ----------------------------------------


def _toolwoz_prompt() -> PromptSpec:
    # JOSH's ReAct prompt in its compact form (what train.josh_* trains with); ToolWOZ
    # observations are single results (APIRETURN), nothing to shorten.
    return PromptSpec(compact=True, system_prompt="toolwoz_react", max_prompt_tokens=896, max_tool_results=None)


#: What the ToolWOZ evaluation writes (``josh_evaluate.output``), and where by default; the
#: episodes: every model's, josh_eval's schema.
TOOLWOZ_OUTPUTS: dict[str, str] = {"episodes": "data/episodes/toolwoz_eval.parquet", "metrics": "reports/josh_eval.json",
                                   "markdown": "reports/josh_eval.md"}


@dataclass(frozen=True)
class RoundSpec:
    """One self-improvement round as the evaluation reports it: ``harvest`` is stage josh's
    report (who harvested, how many trees, golden paths and training rows), ``start`` the
    model M that harvested, ``trained`` the models M' trained on that harvest. When the
    harvest had no training data, the M' rows say "not trained" instead of being played."""

    harvest: str = "reports/josh.json"
    start: str = "base"
    trained: tuple[str, ...] = ()


@dataclass(frozen=True)
class ToolWozEvalConfig:
    """Every model (and, with ``rules``, JOSH's harvesting rules agent as a reference) plays
    the official ToolWOZ test goals (the first ``max_goals`` sorted test ids) once per seed
    against the user simulator, without branching; scores as the paper's Table 1."""

    source: str
    models: tuple[tuple[str, ModelEntry], ...]
    db_dir: str | None = None
    strict: bool = False
    max_goals: int = 450
    seeds: tuple[int, ...] = (0,)
    max_turns: int = 12
    format: str = "react"
    task_prompt: str = TOOLWOZ_TASK_PROMPT
    rules: RulesPolicy | None = field(default_factory=RulesPolicy)  # None: no reference row
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    generation: GenerationSpec = field(default_factory=lambda: _generation())
    prompt: PromptSpec = field(default_factory=_toolwoz_prompt)
    output: OutputSpec = field(default_factory=OutputSpec)
    max_llm_failure_rate: float = MAX_LLM_FAILURE_RATE
    round: RoundSpec | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "output", self.output.check("output", tuple(TOOLWOZ_OUTPUTS), TOOLWOZ_OUTPUTS))
        if not self.models and self.rules is None:
            raise ConfigError("models: at least one model (or rules) is required")
        for name, entry in self.models:
            if (entry.path is None) == (entry.hub_id is None):
                raise ConfigError(f"models.{name}: give exactly one of path and hub_id")
            if name == "rules" and self.rules is not None:
                raise ConfigError("models.rules: the name is the rules reference agent's; call the model something else")
        if self.max_goals < 1 or not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ConfigError(f"max_goals must be >= 1 and seeds distinct and not empty, got {self.max_goals} and {list(self.seeds)}")
        positive_int(self.max_turns, "max_turns")
        if self.format not in FORMATS:
            raise ConfigError(f"format: expected one of {list(FORMATS)}, got {self.format!r}")
        if self.round is not None:
            names = [name for name, _ in self.models]
            for name in (self.round.start, *self.round.trained):
                if name not in names:
                    raise ConfigError(f"round: {name!r} is not one of the models {names}")


def _generation() -> GenerationSpec:
    return GenerationSpec(temperature=0.0, max_new_tokens=96, batch_size=64, threads=2)

