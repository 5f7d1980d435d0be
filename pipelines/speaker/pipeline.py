"""The SpeakER pipeline (section 3.4): seeds in, filtered clarification dialogues and
preference pairs out. Records in, records out; the stage does the I/O.

1. **Ambiguity points** of every seed (:func:`~pipelines.speaker.ambiguity.find_ambiguity_points`);
   a seed without one, or with a domain the agent has no tools for, is dropped.
2. **Plan**: which points each dialogue clarifies (one to ``max_clarifications``, seeded).
3. **Synthesis** by the configured backend (:mod:`pipelines.speaker.synthesis`).
4. **Success filter**: every trajectory is replayed in a fresh environment
   (:func:`~pipelines.speaker.trajectory.replay_trajectory`) and kept only when the goal
   checker says it succeeded.
5. **Redundancy filter**: :func:`~pipelines.speaker.dedup.near_duplicates` over each kept
   dialogue's clarification questions, in seed order.
6. **SpeakER-DPO**: for every clarified point of a kept dialogue, a negative trajectory with
   the same goal in which the agent does not ask there but acts on its best guess
   (:class:`~pipelines.speaker.writer.DialogueWriter` with ``guess``). The pair is kept only
   when the negative *fails* on replay and had the same tool calls and observations as the
   positive up to the decision, so that chosen (the clarification) and rejected (the
   acting output) answer the same state. Every dropped pair has a recorded reason.
7. **Act-here points** (:mod:`pipelines.speaker.act`): up to ``act_points`` tool calls per
   kept dialogue where the user has said enough, for the GRPO and DPO data, so that asking
   where it is not needed is penalised; and every search after a correction, whose DPO pair
   rejects the same search without a constraint the user had said.
8. **Contrasts** (:mod:`pipelines.speaker.contrast`): up to ``contrast_points`` per kept
   dialogue, the situation of a clarification with the asked slot already stated, where the
   agent searches and recommends (SFT rows), so that a question is tied to a slot not said.

Only seeds of ``splits`` (train and val) are synthesized: the test split is for evaluation
alone, and the training stages hold out the val split.
"""

from __future__ import annotations

import json
import random
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from pipelines.config import MAX_LLM_FAILURE_RATE, FanOutSpec, positive_int
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.episodes.formats import CLARIFY, RESPOND, TOOL_CALL, Malformed
from pipelines.llm.client import FAILURE_REASONS
from pipelines.records import Dialogue
from pipelines.speaker.act import ActPoint, act_points
from pipelines.speaker.ambiguity import AmbiguityPoint, find_ambiguity_points
from pipelines.speaker.contrast import Contrast, contrasts
from pipelines.speaker.dedup import near_duplicates
from pipelines.speaker.synthesis import NO_CLARIFICATION, SeedTask, Synthesizer, write_rules
from pipelines.speaker.trajectory import FORMAT, OBSERVATION, ChatTurn, ReplayOutcome, Trajectory, replay_trajectory
from pipelines.speaker.writer import Plan, SynthesisError, plan_clarifications

TOOL_DOMAINS: frozenset[str] = frozenset({"restaurant", "hotel", "attraction", "train", "taxi"})

# Why a seed yields no dialogue.
UNSUPPORTED_DOMAIN = "unsupported_domain"
NO_AMBIGUITY_POINT = "no_ambiguity_point"
REPLAY_INVALID = "replay_invalid"
GOAL_NOT_MET = "goal_not_met"
NEAR_DUPLICATE = "near_duplicate"
DROP_REASONS: tuple[str, ...] = (
    UNSUPPORTED_DOMAIN, NO_AMBIGUITY_POINT, "goal_unsatisfiable", "booking_failed", NO_CLARIFICATION,
    *(f"llm_{reason}" for reason in FAILURE_REASONS), "llm_dialogue_invalid",
    REPLAY_INVALID, GOAL_NOT_MET, NEAR_DUPLICATE,
)
# Why a clarified point yields no preference pair.
PAIR_DROP_REASONS: tuple[str, ...] = (
    "negative_unwritable", "guess_not_reached", "prefix_differs", "negative_invalid", "guess_succeeded",
)


@dataclass(frozen=True)
class SpeakerConfig:
    """params.yaml ``speaker``. Synthesis: ``seed`` (plans, phrasing and environments),
    ``max_clarifications`` (clarification turns per dialogue at most), ``dedup``
    (``{threshold, ngram}``: the redundancy filter's Jaccard threshold and word n-gram size),
    ``act_points`` and ``contrast_points`` (per kept dialogue, at most), the seed ``splits``
    synthesized (never test). The stage's: the corpus (``source``, ``db_dir``), the
    ``synthesizer`` (a backend section, :meth:`pipelines.llm.BackendConfig.from_dict`; None:
    rules) and its ``cache_dir``, the outputs, the LLM failure and yield bounds (numbers in
    [0, 1], checked by the stage), the ``fan_out``."""

    source: str
    output: str
    metrics: str
    db_dir: str | None = None
    synthesizer: Any = None
    cache_dir: str | None = None
    seed: int = 0
    max_clarifications: int = 3
    dedup: Any = None  # {threshold: 0.8, ngram: 3}
    act_points: int = 1
    contrast_points: int = 3
    splits: tuple[str, ...] = ("train", "val")
    max_llm_failure_rate: Any = MAX_LLM_FAILURE_RATE
    min_yield: Any = 0.5
    fan_out: FanOutSpec = field(default_factory=FanOutSpec)

    def __post_init__(self) -> None:
        positive_int(self.contrast_points, "contrast_points", minimum=0)
        positive_int(self.act_points, "act_points", minimum=0)
        if "test" in self.splits:
            raise ValueError("splits must not include test: the test split is for evaluation only")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        positive_int(self.max_clarifications, "max_clarifications")
        dedup = self.dedup or {}
        if not isinstance(dedup, Mapping) or set(dedup) - {"threshold", "ngram"}:
            raise ConfigError(f"dedup: expected a mapping with threshold and ngram, got {dedup!r}")
        if not 0 < self.dedup_threshold <= 1:
            raise ValueError(f"dedup_threshold must be in (0, 1], got {self.dedup_threshold!r}")
        positive_int(self.dedup_ngram, "dedup.ngram")

    @property
    def dedup_threshold(self) -> float:
        return float((self.dedup or {}).get("threshold", 0.8))

    @property
    def dedup_ngram(self) -> int:
        return (self.dedup or {}).get("ngram", 3)


@dataclass(frozen=True)
class PreferencePair:
    """A SpeakER-DPO pair at one decision point: ``prompt`` is the conversation before it,
    ``chosen`` the clarification, ``rejected`` the output that acts on a guess instead;
    ``negative`` is the whole negative trajectory and ``negative_reasons`` say why it failed."""

    dialogue_id: str
    point: AmbiguityPoint
    step: int  # the chosen output's position among the agent outputs
    prompt: tuple[ChatTurn, ...]
    chosen: ChatTurn
    rejected: ChatTurn
    negative: Trajectory
    negative_reasons: tuple[str, ...]


@dataclass
class SeedOutcome:
    """Everything the pipeline did with one seed."""

    dialogue: Dialogue
    points: tuple[AmbiguityPoint, ...] = ()
    plan: Plan | None = None
    trajectory: Trajectory | None = None
    replay: ReplayOutcome | None = None
    drop_reason: str | None = None
    drop_detail: str | None = None
    pairs: list[PreferencePair] = field(default_factory=list)
    pair_drops: Counter = field(default_factory=Counter)
    acts: list[ActPoint] = field(default_factory=list)
    contrasts: list[Contrast] = field(default_factory=list)

    @property
    def kept(self) -> bool:
        return self.drop_reason is None and self.trajectory is not None

    def drop(self, reason: str, detail: str | None) -> None:
        self.drop_reason, self.drop_detail = reason, detail

    @property
    def questions(self) -> list[str]:
        return clarification_questions(self.trajectory) if self.trajectory else []


@dataclass
class SpeakerResult:
    backend: str
    config: SpeakerConfig
    outcomes: list[SeedOutcome]
    duplicates_removed: int = 0

    @property
    def kept(self) -> list[SeedOutcome]:
        return [o for o in self.outcomes if o.kept]

    def metrics(self) -> dict[str, Any]:
        """Summary counts for reports/speaker.json (rows and LLM accounting are the stage's)."""
        points = [p for o in self.outcomes for p in o.points]
        kept = self.kept
        clarified = [t.point for o in kept for _, t in o.trajectory.clarifications]
        per_dialogue = Counter(len(o.trajectory.clarifications) for o in kept)
        pairs = [pair for o in kept for pair in o.pairs]
        pair_drops = sum((o.pair_drops for o in kept), Counter())
        acts = [a for o in kept for a in o.acts]
        # Shown searches: a search that dropped a said constraint, or a name among another kind.
        shown_calls = [t.call for o in kept for _, t in o.trajectory.shown_outputs if t.kind == TOOL_CALL]
        by_name = sum(c is not None and set(c.arguments or {}) == {"name"} for c in shown_calls)
        contrasted = [c for o in kept for c in o.contrasts]
        return {
            "backend": self.backend,
            "seeds": len(self.outcomes),
            "seeds_by_split": _counts(o.dialogue.split for o in self.outcomes),
            "ambiguity_points": {
                "total": len(points),
                "by_type": _counts(p.type for p in points),
                "by_action": _counts(f"{p.type}/{p.action}" for p in points),
                "by_origin": _counts(p.origin for p in points),
                "by_domain": _counts(p.domain for p in points),
                "dialogues_with_points": sum(1 for o in self.outcomes if o.points),
            },
            "planned_points": sum(len(o.plan.points) for o in self.outcomes if o.plan),
            "dialogues": {
                "synthesized": sum(1 for o in self.outcomes if o.trajectory is not None),
                "kept": len(kept),
                "dropped": len(self.outcomes) - len(kept),
                "dropped_by_reason": _counts(o.drop_reason for o in self.outcomes if o.drop_reason),
            },
            "clarifications": {
                "total": len(clarified),
                "by_type": _counts(p.type for p in clarified if p is not None),
                "per_dialogue_mean": round(len(clarified) / len(kept), 4) if kept else 0.0,
                "per_dialogue_histogram": {str(n): per_dialogue[n] for n in sorted(per_dialogue)},
                # Questions where the user has no preference: shown with the recommendation that
                # follows, never a training target.
                "no_preference_shown": sum(len(o.trajectory.needless_questions) for o in kept),
                # Questions for what a taxi booking needs and the user had not said: slot filling,
                # taught but not counted above.
                "slot_filling": sum(len(o.trajectory.slot_questions) for o in kept),
                # Recommendations made on part of the request, which the user corrects: in the
                # prompts, never a target; the search after the correction is.
                "corrected_offers": sum(t.kind == RESPOND for o in kept for _, t in o.trajectory.shown_outputs),
                # Searches after a correction that left out what the user had said (and whose
                # recommendation the user corrects): context; the search after the reminder is taught.
                "forgotten_constraints": len(shown_calls) - by_name,
                # Venues asked for by name without their kind, first looked up among another kind
                # of place that has nothing by that name: context; the search of the next kind is taught.
                "other_kind_first": by_name,
            },
            "dedup": {
                "threshold": self.config.dedup_threshold,
                "ngram": self.config.dedup_ngram,
                "duplicates_removed": self.duplicates_removed,
            },
            "dpo": {
                "pairs": len(pairs),
                "pairs_by_type": _counts(p.point.type for p in pairs),
                "dropped_by_reason": dict(sorted(pair_drops.items())),
                "act_here_pairs": len(acts),
            },
            # Decision points where acting is right (GRPO rows with ask_needed false, DPO pairs
            # preferring the action over a needless question, or, at a search after a correction
            # or a reminder, over the same search without a constraint the user had said).
            "act_here": {
                "points": len(acts),
                "by_domain": _counts(a.domain for a in acts),
                "by_rejected": _counts(a.rejected_kind for a in acts),
                "grpo_rows": len(acts),
                "dpo_pairs": len(acts),
                "clarify_points": len(clarified),
            },
            # The situation of a clarification with the asked slot stated: the agent recommends.
            "contrast": {
                "points": len(contrasted),
                "by_domain": _counts(c.domain for c in contrasted),
                "sft_rows": sum(sum(t.role == "assistant" for t in c.turns) for c in contrasted),
                "underspecification_questions": sum(1 for p in clarified if p is not None and p.type == "underspecification"),
            },
        }


def _counts(values: Iterable[str]) -> dict[str, int]:
    return dict(sorted(Counter(values).items()))


def clarification_questions(trajectory: Trajectory) -> list[str]:
    """The question inside each ``<clarify>`` of a trajectory, in order."""
    questions = []
    for _, turn in trajectory.clarifications:
        parsed = FORMAT.parse(turn.content)
        if not isinstance(parsed, Malformed):
            questions.extend(a.text for a in parsed if a.kind == CLARIFY)
    return questions


# --------------------------------------------------------------------------------------
# The run
# --------------------------------------------------------------------------------------


def run_speaker(dialogues: Sequence[Dialogue], database: Database, synthesizer: Synthesizer, config: SpeakerConfig) -> SpeakerResult:
    """SpeakER in one process: :func:`synthesize_seeds` over every seed, then
    :func:`finish_speaker`."""
    return finish_speaker(synthesize_seeds(dialogues, database, synthesizer, config), synthesizer.name, database, config)


def synthesize_seeds(dialogues: Sequence[Dialogue], database: Database, synthesizer: Synthesizer, config: SpeakerConfig,
                     on_seed: Callable[[int], Any] | None = None) -> list[SeedOutcome]:
    """Each seed of ``config.splits`` on its own: its ambiguity points and plan, the
    synthesized dialogue and the success filter. A seed's outcome depends on nothing but the
    seed and the settings, so chunks of seeds may run anywhere (``speaker.fan_out``) and
    their outcomes, concatenated in seed order, are the one-process outcomes. ``on_seed(n)``
    is told as seeds are done (a stage's progress): those without a plan at once, then each
    planned one once synthesized and filtered."""
    outcomes = [_analyse(dialogue, database, config) for dialogue in dialogues if dialogue.split in config.splits]
    planned = [o for o in outcomes if o.plan is not None]
    tasks = [SeedTask(o.dialogue, o.points, o.plan) for o in planned]
    if on_seed is not None:
        on_seed(len(outcomes) - len(planned))
    for outcome, synthesis in zip(planned, synthesizer.synthesize(tasks)):
        if synthesis.trajectory is None:
            outcome.drop(synthesis.drop_reason, synthesis.detail)
        else:
            outcome.trajectory = synthesis.trajectory
            _success_filter(outcome, database)
        if on_seed is not None:
            on_seed(1)
    return outcomes


def finish_speaker(outcomes: list[SeedOutcome], synthesizer_name: str, database: Database, config: SpeakerConfig) -> SpeakerResult:
    """What needs every seed at once: the near-duplicate filter over the kept dialogues, then
    each kept dialogue's preference pairs, act-here points and contrasts."""
    result = SpeakerResult(synthesizer_name, config, outcomes)
    result.duplicates_removed = _redundancy_filter(result.kept, config)
    for outcome in result.kept:
        _preference_pairs(outcome, database, config.seed)
        rng = random.Random(f"speaker-act:{config.seed}:{outcome.dialogue.dialogue_id}")
        outcome.acts = act_points(outcome.trajectory, rng, config.act_points)
        outcome.contrasts = contrasts(outcome.trajectory, outcome.dialogue, database, config.seed, config.contrast_points)
    return result


def _analyse(dialogue: Dialogue, database: Database, config: SpeakerConfig) -> SeedOutcome:
    outcome = SeedOutcome(dialogue)
    unsupported = sorted(set(dialogue.goal.domain_names) - TOOL_DOMAINS)
    if unsupported:
        outcome.drop(UNSUPPORTED_DOMAIN, f"no tools for {', '.join(unsupported)}")
        return outcome
    outcome.points = tuple(find_ambiguity_points(dialogue, database))
    if not outcome.points:
        outcome.drop(NO_AMBIGUITY_POINT, "every request of the seed pins its goal down")
        return outcome
    rng = random.Random(f"speaker-plan:{config.seed}:{dialogue.dialogue_id}")
    outcome.plan = plan_clarifications(outcome.points, rng, config.max_clarifications)
    return outcome


def _success_filter(outcome: SeedOutcome, database: Database) -> None:
    outcome.replay = replay_trajectory(outcome.trajectory, database)
    if outcome.replay.problem is not None:
        outcome.drop(REPLAY_INVALID, outcome.replay.problem)
    elif not outcome.replay.success:
        outcome.drop(GOAL_NOT_MET, "; ".join(outcome.replay.failure_reasons))


def _redundancy_filter(kept: Sequence[SeedOutcome], config: SpeakerConfig) -> int:
    documents = [" ".join(o.questions) for o in kept]
    dedup = near_duplicates(documents, config.dedup_threshold, ngram=config.dedup_ngram, seed=config.seed)
    for index, original in dedup.duplicate_of.items():
        kept[index].drop(NEAR_DUPLICATE, f"clarifications near-duplicate those of {kept[original].dialogue.dialogue_id}")
    return dedup.n_removed


def _preference_pairs(outcome: SeedOutcome, database: Database, seed: int) -> None:
    positive = outcome.trajectory
    task = SeedTask(outcome.dialogue, outcome.points, outcome.plan)
    agent_steps = _agent_steps(positive)
    seen: set[tuple[str, str, str]] = set()
    for _, turn in positive.clarifications:
        point = turn.point
        if point is None or point.key in seen:
            continue  # a second question at the same point is not a new decision
        seen.add(point.key)
        reason, pair = _pair(task, positive, point, agent_steps, database, seed)
        if pair is None:
            outcome.pair_drops[reason] += 1
        else:
            outcome.pairs.append(pair)


def _pair(
    task: SeedTask, positive: Trajectory, point: AmbiguityPoint, agent_steps: dict[int, int], database: Database, seed: int
) -> tuple[str | None, PreferencePair | None]:
    try:
        negative = write_rules(task, database, seed, guess=point)
    except SynthesisError:
        return "negative_unwritable", None
    chosen_at = positive.decision(point)
    rejected_at = negative.decision(point)
    if negative.guessed is None or rejected_at is None:
        return "guess_not_reached", None
    if _calls(positive.turns[:chosen_at]) != _calls(negative.turns[:rejected_at]):
        return "prefix_differs", None
    replayed = replay_trajectory(negative, database)
    if replayed.problem is not None:
        return "negative_invalid", None
    if replayed.success:
        return "guess_succeeded", None
    pair = PreferencePair(
        positive.dialogue_id, positive.turns[chosen_at].point, agent_steps[chosen_at], positive.turns[:chosen_at],
        positive.turns[chosen_at], negative.turns[rejected_at], negative, replayed.failure_reasons,
    )
    return None, pair


def _calls(turns: Sequence[ChatTurn]) -> list[tuple[str, str]]:
    """The tool calls and observations of a conversation: the agent's information state,
    whatever the wording around it."""
    out = []
    for turn in turns:
        if turn.kind == OBSERVATION:
            out.append((OBSERVATION, turn.content))
        elif turn.kind == TOOL_CALL:
            call = turn.call
            out.append((call.tool_name, json.dumps(dict(call.arguments or {}), sort_keys=True)))
    return out


def _agent_steps(trajectory: Trajectory) -> dict[int, int]:
    """Turn index -> position among the agent outputs, for every agent turn."""
    steps: dict[int, int] = {}
    for index, turn in enumerate(trajectory.turns):
        if turn.role == "assistant":
            steps[index] = len(steps)
    return steps


__all__ = [
    "DROP_REASONS",
    "PAIR_DROP_REASONS",
    "PreferencePair",
    "SeedOutcome",
    "SpeakerConfig",
    "SpeakerResult",
    "clarification_questions",
    "run_speaker",
]
