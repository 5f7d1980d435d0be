"""A training run, as data: what to start from, what to train on, how, and where results go.

Every setting is a frozen dataclass with the embedded (CPU, small model) defaults; the
``params.yaml`` ``train`` section is turned into these by ``stages/train.py``, the only
place that reads params. A :class:`TrainConfig` says everything one run needs::

    TrainConfig(
        method="grpo",
        model=ModelSpec(path="models/sft"),
        data=DataSpec(sources=(SourceSpec("data/processed/speaker/speaker_grpo.parquet"),)),
        output=method_outputs("grpo"),
        objective=GRPOObjective(num_generations=4),
    )

Nothing here touches torch or the file system: :mod:`pipelines.preflight`
checks a config against the machine and the data before anything is loaded.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, is_dataclass
from pathlib import Path
from typing import Any, Mapping, Union

from pipelines.config import OutputSpec, from_params, positive_int
from pipelines.errors import ConfigError

METHODS: tuple[str, ...] = ("sft", "dpo", "kto", "grpo")
#: What a training run writes (``train.<method>.output`` and every training section's).
TRAIN_OUTPUTS: tuple[str, ...] = ("model_dir", "metrics", "curve")


def method_outputs(method: str, models: str = "models", reports: str = "reports/train") -> OutputSpec:
    """A training run's outputs by its method's name: ``models/sft``, ``reports/train/sft.json``, ...

    >>> method_outputs("dpo").curve
    'reports/train/dpo_curve.csv'
    """
    return OutputSpec(f"{models}/{method}", f"{reports}/{method}.json", f"{reports}/{method}_curve.csv")


# --- Model -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class LoraSpec:
    """A LoRA adapter (PEFT). ``merge``: save the merged full model instead of the adapter
    (what a later stage or ``transformers serve`` can load without PEFT)."""

    r: int = 16
    alpha: int = 32
    dropout: float = 0.05
    target_modules: Union[str, tuple[str, ...]] = "all-linear"
    merge: bool = False


@dataclass(frozen=True)
class QuantizationSpec:
    """bitsandbytes 4-bit loading (QLoRA), for CUDA machines only; needs ``lora``."""

    quant_type: str = "nf4"
    compute_dtype: str = "bfloat16"
    double_quant: bool = True


@dataclass(frozen=True)
class ModelSpec:
    """The starting model: a local directory (``path``, Hugging Face layout, e.g. the
    ``bootstrap`` stage's ``models/base`` or ``models/sft``) or a hub id (``hub_id``), never
    both. A local path is never looked up on the hub."""

    path: str | None = "models/base"
    hub_id: str | None = None
    revision: str | None = None
    lora: LoraSpec | None = None
    quantization: QuantizationSpec | None = None

    @property
    def name_or_path(self) -> str:
        return self.hub_id if self.hub_id is not None else str(self.path)

    @property
    def local(self) -> bool:
        return self.hub_id is None


# --- Data ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class SourceSpec:
    """One Parquet dataset. ``max_rows``: training rows drawn from it (after the hold-out,
    seeded), None for all. ``completion_column``: a text column to use as the assistant's
    completion where the table has no ``completion`` messages (e.g. ``speaker_grpo``'s
    ``reference``). ``prompts_from``: another table whose ``prompt`` replaces this one's,
    row for row on (hold-out key, ``step``); e.g. ``speaker_grpo``'s reward rows with the
    chat prompts of ``speaker_sft`` at the same decision points, the format the embedded
    policy is trained and deployed with, instead of SpeakRL's Table 1 instruction.

    ``windows`` (SFT): train on whole dialogues instead of one decision per row: each
    dialogue (its last decision row's prompt and completion) is cut into windows of at most
    ``max_length`` tokens, the loss on every assistant message (``assistant_only_loss``),
    each message the target of exactly one window, its ``<think>`` reasoning kept (what a
    decision row's completion teaches; a later target's history then holds the earlier
    reasoning, as a multi-turn rollout does and evaluation's compact prompt does not).
    ``max_rows`` then counts windows. A
    window carries the system prompt once for several targets: several times the learning
    per token of decision rows. Held-out evaluation stays per decision.

    ``system_prompt``: the system prompt this source's prompts get, by name
    (:data:`pipelines.policy.prompts.SYSTEM_PROMPT_NAMES`: ``compact``, ``toolwoz_react``,
    ``own``); None: ``DataSpec.compact_prompts`` decides (``compact`` or ``own``). So a
    SpeakER source and a JOSH source (ReAct over the ToolWOZ apis) train in one run, each in
    its own format.

    ``prompt_column``: a text column to use as the prompt's one user message where the table
    has no ``prompt`` messages (e.g. ``pir_traces``' ``input``).

    ``grammar``: how held-out generations are read (:data:`pipelines.training.evaluation.GRAMMARS`):
    ``speakrl`` (SpeakER), ``react`` (JOSH's PLAN/APICALL/SPEAK) or ``clarifier`` (``NO NEED TO
    ASK`` / ``YES [QUESTION]...``).

    ``schema``: the artifact whose schema and expectation suite the file is checked by before
    training (``speaker_sft``, ``speaker_grpo``, ``speaker_dpo``, ``pir_traces``, ``josh_sft``,
    ``josh_kto``, ``l2a_train``, ``clarifier_sft``, ...), whatever the file is called; None:
    the artifact the file is named after, else the method's training contract
    (:mod:`pipelines.preflight.inputs`)."""

    path: str
    max_rows: int | None = None
    completion_column: str | None = None
    prompt_column: str | None = None
    prompts_from: str | None = None
    windows: bool = False
    system_prompt: str | None = None
    grammar: str = "speakrl"
    # Left out of config_dict (model cards) while unset: cards of runs that set none stay byte-identical.
    schema: str | None = field(default=None, metadata={"omit_if_none": True})

    def __post_init__(self) -> None:
        from pipelines.policy.prompts import SYSTEM_PROMPT_NAMES

        if self.grammar not in ("speakrl", "react", "clarifier"):
            raise ConfigError(f"{self.path}: grammar must be speakrl, react or clarifier, got {self.grammar!r}")
        if self.system_prompt is not None and self.system_prompt not in SYSTEM_PROMPT_NAMES:
            raise ConfigError(f"{self.path}: system_prompt must be one of {list(SYSTEM_PROMPT_NAMES)} or null, got {self.system_prompt!r}")

    @property
    def name(self) -> str:
        return Path(self.path).stem


@dataclass(frozen=True)
class HoldoutSpec:
    """Which rows are held out of every training stage and used for the reports: those of
    the corpus ``split`` (val), read from each row's ``split_column``. A row of the test
    split is an error (the test split is for evaluation only). A source without the column
    (a dataset with no corpus split) falls back to a hash: rows whose ``key`` (a dialogue id)
    hashes below ``fraction`` (with ``salt``) are held out. Either way the same dialogues
    are held out in every stage and every dataset."""

    key: str = "dialogue_id"
    split_column: str = "split"
    split: str = "val"
    fraction: float = 0.05
    salt: str = "askflow-holdout"


#: What tells search results apart: the fields the second and later kept results keep by default.
DISTINGUISHING_FIELDS: tuple[str, ...] = (
    "name", "area", "pricerange", "type", "food", "stars", "internet", "parking",
    "trainID", "day", "departure", "destination", "leaveAt", "arriveBy", "price",
)


@dataclass(frozen=True)
class ToolResultsSpec:
    """Shorter ``<tool_response>`` observations for a short context: at most
    ``max_results`` search results (``count`` still says how many matched), the first in
    full and the others reduced to ``fields`` (what tells candidates apart; None: every
    kept result whole, so that a phone number or postcode of the second is there to quote).
    A full SpeakER observation of five results is ~500 tokens of the embedded tokenizer,
    more than the whole context left after the system prompt and a clarification."""

    max_results: int = 3
    fields: tuple[str, ...] | None = DISTINGUISHING_FIELDS


@dataclass(frozen=True)
class DataSpec:
    """What a run trains on. Prompts get the policy's compact system prompt
    (``compact_prompts``) and at most ``max_history_messages`` messages of history; then,
    if the example is still longer than ``OptimSpec.max_length`` tokens, the oldest history
    goes first, the completion is never cut, and an example that cannot fit is dropped
    (and counted). ``tool_results``: shorten tool observations in prompts (None keeps them
    whole). ``drop_ungrounded``: leave out (and count) an SFT row whose target states a
    venue's attribute that its fitted prompt does not hold
    (:func:`pipelines.training.data.ungrounded_values`): such a row teaches the model to say
    what it has not seen."""

    sources: tuple[SourceSpec, ...]
    holdout: HoldoutSpec = HoldoutSpec()
    compact_prompts: bool = True
    max_history_messages: int | None = 6
    tool_results: ToolResultsSpec | None = None
    seed: int = 0
    drop_ungrounded: bool = field(default=False, metadata={"omit_if_default": True})


# --- Optimisation and device ----------------------------------------------------------------


@dataclass(frozen=True)
class OptimSpec:
    """The optimisation loop. ``max_time_s`` stops training at the first step boundary past
    it (a time budget on top of ``max_steps``; None for none). For GRPO ``batch_size``
    counts completions (``num_generations`` per prompt) and must be a multiple of it."""

    max_steps: int = 100
    max_time_s: float | None = None
    learning_rate: float = 1e-4
    lr_scheduler: str = "cosine"
    warmup_ratio: float = 0.1
    weight_decay: float = 0.0
    adam_beta1: float = 0.9
    adam_beta2: float = 0.999
    max_grad_norm: float = 1.0
    batch_size: int = 8
    gradient_accumulation_steps: int = 1
    max_length: int = 512
    logging_steps: int = 5
    seed: int = 0


@dataclass(frozen=True)
class DeviceSpec:
    """``bf16`` / ``gradient_checkpointing``: None chooses for the machine (on a GPU: bf16
    where supported, checkpointing on; on CPU both off, the fast choice for a small model).
    ``bf16=True`` on a machine without bf16 support is a configuration error.

    ``use_vllm`` (GRPO generation through vLLM, ``vllm_mode`` ``colocate`` or ``server``;
    a server is started with ``trl vllm-serve --model <path>``) needs CUDA and vLLM.
    Multi-GPU runs need nothing here: launch the stage with ``accelerate launch``.
    ``threads``: torch CPU threads (None: torch's default, one per core). ``data_workers``:
    processes that prepare the training rows (prompt fitting, the trainer's tokenization);
    None: one, in the training process. A GPU node's idle cores pay for this: fitting every
    SpeakER prompt took 2 of the H100 job's 6 SFT minutes on one core. ``accelerator``:
    None runs on what the machine has; ``cuda`` or ``cpu`` requires it (a run that must not
    fall back to the CPU). :func:`pipelines.training.device.resolve_device` returns this
    class with every choice made."""

    bf16: bool | None = None
    gradient_checkpointing: bool | None = None
    use_vllm: bool = False
    vllm_mode: str = "colocate"
    threads: int | None = None
    data_workers: int | None = None
    accelerator: str | None = field(default=None, metadata={"omit_if_none": True})  # cards written before it stay the same


# --- Objectives ------------------------------------------------------------------------------


@dataclass(frozen=True)
class SFTObjective:
    """Supervised fine-tuning on prompt-completion pairs; the loss covers the completion.

    ``loss_mask``: a function by import path (``package.module:name``) from a completion's
    text to the character spans ``[(start, end), ...]`` that get no loss (a token overlapping
    a span is masked), e.g. ``pipelines.pir.sft:response_spans``, the simulated user's
    ``<response>`` blocks of PIR traces. The examples are then tokenized here, with labels."""

    completion_only_loss: bool = True
    loss_mask: str | None = None


@dataclass(frozen=True)
class DPOObjective:
    """DPO on prompt/chosen/rejected pairs (TRL ``loss_type`` names)."""

    beta: float = 0.1
    loss_type: tuple[str, ...] = ("sigmoid",)


@dataclass(frozen=True)
class KTOObjective:
    """KTO on unpaired examples: ``prompt``/``completion``/``label`` rows, or preference
    pairs split into a desirable (chosen) and an undesirable (rejected) example."""

    beta: float = 0.1
    desirable_weight: float = 1.0
    undesirable_weight: float = 1.0


@dataclass(frozen=True)
class GRPOObjective:
    """GRPO with SpeakRL's rewards and their weights: registered names
    (:data:`pipelines.rewards.REWARD_FUNCTIONS`; :data:`pipelines.rewards.JUDGE_REWARDS`
    through the ``judge`` role) or, for a reward outside askflow, its import path
    (``package.module:name``; :func:`pipelines.rewards.resolve_reward`). Eq. 7 is format +
    clarification at weight 1 each. ``beta=0``: no
    KL term and no reference model (SpeakRL Table 3 used 0.04).
    ``mask_truncated_completions``: completions cut at ``max_completion_length`` (a small
    model's repetition loops) are left out of the loss rather than teaching "shorter is
    better" through a zero format reward."""

    num_generations: int = 8
    max_completion_length: int = 128
    temperature: float = 1.0
    beta: float = 0.0
    rewards: tuple[tuple[str, float], ...] = (("format", 1.0), ("clarify_verifiable", 1.0))
    loss_type: str = "dapo"
    scale_rewards: str = "group"
    mask_truncated_completions: bool = False


Objective = Union[SFTObjective, DPOObjective, KTOObjective, GRPOObjective]

#: The objective class of each method.
OBJECTIVES: dict[str, type] = {"sft": SFTObjective, "dpo": DPOObjective, "kto": KTOObjective, "grpo": GRPOObjective}


# --- Evaluation and outputs ------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSpec:
    """Held-out evaluation, before and after training, on at most ``max_examples`` held-out
    rows per source (``before``: also evaluate the starting model). ``generate``:
    generations scored by the format reward (and, for GRPO, by every training reward);
    preference data also gets the chosen-over-rejected log-probability margin.

    ``samples`` 0 decodes greedily; ``samples`` n > 0 draws n completions per prompt at
    ``temperature`` (seeded by ``seed``), so the metrics estimate the policy's expected
    reward: what GRPO maximises, and what a greedy decode of a small model can hide."""

    max_examples: int = 64
    before: bool = True
    generate: bool = True
    max_new_tokens: int = 128
    batch_size: int = 16
    samples: int = 0
    temperature: float = 1.0
    seed: int = 0


@dataclass(frozen=True)
class TrainSectionConfig:
    """A training section as params.yaml writes it (``train.<method>``, ``l2a.train.sft``,
    ``clarifier.train.grpo``, ``pir_train.grpo``, a GPU profile's ``sft`` / ``grpo``): what
    :class:`TrainConfig` is built from. Every reader takes ``model``, ``optim``, ``device``,
    ``objective`` (the method's, read by its reader) and refuses, as unknown keys, the fields
    it does not take:

    * the stages' Parquet-trained sections: ``data`` (joined by the shared ``holdout``),
      ``eval``, ``output`` (None: the method's defaults), ``allow_empty`` and
      ``source_report`` (sources without rows: the run ends before it trains);
    * US-GRPO (``pir_train.grpo``): ``env`` (``pipelines.training.rollout.ConversationEnv``'s fields),
      ``output``, ``allow_no_signal`` (true or false, checked where the run ends);
    * a GPU profile: ``data``, ``eval``, ``epochs`` (-> max_steps) and ``sampler``, or, for
      multi-turn GRPO, ``env`` in place of ``data``; no ``output``: the job's."""

    model: Any = None
    data: Any = None
    output: Any = None
    optim: OptimSpec = OptimSpec()
    device: DeviceSpec = DeviceSpec()
    eval: EvalSpec = EvalSpec()
    objective: Any = None
    allow_empty: bool = False
    source_report: str | None = None
    env: Any = None
    allow_no_signal: Any = False
    epochs: int | float | None = None
    sampler: str | None = None

    def train_config(self, method: str, where: str, *, data: Any, output: OutputSpec, model: Any = None,
                     judge: Any = None) -> "TrainConfig":
        """The run this section describes, for ``method``: ``data`` (a mapping read as a
        :class:`DataSpec`, or one), ``output``, ``model`` in place of the section's (the GPU
        job's start model), the ``judge`` role's backend; the section's optimiser, device,
        evaluation and the method's objective. The stages, US-GRPO and the GPU job build it so."""
        return TrainConfig(
            method=method,
            model=from_params(ModelSpec, self.model if model is None else model, f"{where}.model"),
            data=data if isinstance(data, DataSpec) else from_params(DataSpec, data, f"{where}.data"),
            output=output,
            optim=self.optim,
            device=self.device,
            eval=self.eval,
            objective=from_params(OBJECTIVES[method], self.objective, f"{where}.objective"),
            judge=judge,
        )


#: What each reader of a training section does not take (:class:`TrainSectionConfig`).
NOT_IN_STAGE_SECTION = ("env", "allow_no_signal", "epochs", "sampler")
NOT_IN_US_GRPO_SECTION = ("data", "eval", "allow_empty", "source_report", "epochs", "sampler")
NOT_IN_GPU_SECTION = ("output", "allow_empty", "source_report", "allow_no_signal")


@dataclass(frozen=True)
class TrainConfig:
    """One training run. ``objective`` None means the method's defaults."""

    method: str
    model: ModelSpec
    data: DataSpec
    output: OutputSpec
    optim: OptimSpec = OptimSpec()
    device: DeviceSpec = DeviceSpec()
    eval: EvalSpec = EvalSpec()
    objective: Objective | None = None
    # The ``judge`` role's backend (a pipelines.llm.BackendConfig, from params.yaml
    # llm.roles.judge): what LLM-judged GRPO rewards such as ``clarify_llm`` call.
    judge: Any = None

    def __post_init__(self) -> None:
        self.output.check("output", TRAIN_OUTPUTS)  # a run writes its model, metrics and curve
        if self.data.drop_ungrounded and (self.method != "sft" or any(source.windows for source in self.data.sources)):
            # GRPO's completions are generated, a preference pair's rejected side may state
            # anything, and each target of a dialogue window sees its own part of the window.
            raise ConfigError(f"{self.method}: data.drop_ungrounded is for sft prompt-completion rows (not dialogue windows)")

    def resolved_objective(self) -> Objective:
        return self.objective if self.objective is not None else OBJECTIVES[self.method]()


def config_dict(config: Any) -> Any:
    """A config as plain JSON-able data (dicts, lists, scalars), for reports and model cards.
    A field marked ``omit_if_none`` / ``omit_if_default`` is left out when None / its default:
    a field added later then leaves the cards and reports written before it unchanged."""
    if is_dataclass(config) and not isinstance(config, type):
        return {f.name: config_dict(getattr(config, f.name)) for f in fields(config)
                if not (f.metadata.get("omit_if_none") and getattr(config, f.name) is None)
                and not (f.metadata.get("omit_if_default") and getattr(config, f.name) == f.default)}
    if isinstance(config, (tuple, list)):
        return [config_dict(item) for item in config]
    if isinstance(config, Mapping):
        return {str(k): config_dict(v) for k, v in config.items()}
    return config


__all__ = [
    "DPOObjective",
    "DataSpec",
    "DeviceSpec",
    "EvalSpec",
    "GRPOObjective",
    "HoldoutSpec",
    "KTOObjective",
    "LoraSpec",
    "METHODS",
    "TRAIN_OUTPUTS",
    "method_outputs",
    "ModelSpec",
    "policy_model",
    "OBJECTIVES",
    "POLICY_DIRS",
    "Objective",
    "OptimSpec",
    "OutputSpec",
    "QuantizationSpec",
    "SFTObjective",
    "SourceSpec",
    "ToolResultsSpec",
    "DISTINGUISHING_FIELDS",
    "TrainConfig",
    "TrainSectionConfig",
    "config_dict",
]


# --- Policy switch ---------------------------------------------------------------------------

# The local starting policies by name; any other name is a hub model id.
POLICY_DIRS: dict[str, str] = {"base": "models/base", "smollm2": "models/smollm2"}


def policy_model(use: str, lora: LoraSpec | None = None) -> ModelSpec:
    """The starting model a policy name stands for: ``base`` (the embedded tiny policy,
    trained whole), ``smollm2`` (SmolLM2-135M-Instruct from the ``smollm2`` stage) or a hub
    id; ``lora`` applies to the latter two (a 135M model trained whole on a CPU is slow).

    >>> policy_model("base").path
    'models/base'
    >>> policy_model("smollm2", LoraSpec(r=8)).lora.r
    8
    >>> policy_model("HuggingFaceTB/SmolLM2-360M-Instruct").hub_id
    'HuggingFaceTB/SmolLM2-360M-Instruct'
    """
    if use == "base":
        return ModelSpec(path=POLICY_DIRS["base"])
    if use in POLICY_DIRS:
        return ModelSpec(path=POLICY_DIRS[use], lora=lora)
    return ModelSpec(path=None, hub_id=use, lora=lora)


def with_training_seed(config: TrainConfig, seed: int, start: str | None = None) -> TrainConfig:
    """The same run under another training seed (issue 28: the tables carry the variance
    that training brings): ``optim.seed`` (data order, initialisation of new weights,
    sampling) is ``seed``, every output gets the suffix ``_s<seed>`` (``models/l2a_sft`` ->
    ``models/l2a_sft_s1``, ``reports/train/l2a_sft.json`` -> ``reports/train/l2a_sft_s1.json``),
    and ``start`` (when given) replaces the starting model's path, e.g. the SFT model of the
    same seed for GRPO. The rows trained on and the hold-out stay the same.

    >>> config = TrainConfig("sft", ModelSpec(), DataSpec(sources=(SourceSpec("rows.parquet"),)),
    ...                      output=OutputSpec("models/sft", "reports/train/sft.json", "reports/train/sft_curve.csv"))
    >>> seeded = with_training_seed(config, 2, start="models/base_s2")
    >>> seeded.optim.seed, seeded.model.path, seeded.output.model_dir, seeded.output.curve
    (2, 'models/base_s2', 'models/sft_s2', 'reports/train/sft_curve_s2.csv')
    """
    import dataclasses
    from pathlib import PurePosixPath

    def suffixed(path: str) -> str:
        p = PurePosixPath(path)
        return str(p.with_name(f"{p.stem}_s{seed}{p.suffix}"))

    positive_int(seed, "training seed", minimum=0)
    model = config.model if start is None else dataclasses.replace(config.model, path=start, hub_id=None)
    output = OutputSpec(f"{config.output.model_dir.rstrip('/')}_s{seed}", suffixed(config.output.metrics), suffixed(config.output.curve))
    return dataclasses.replace(config, optim=dataclasses.replace(config.optim, seed=seed), output=output, model=model)
