"""The SpeakER artifacts: Arrow schemas, expectation suites, pipeline result -> tables.

Training sets in TRL's conversational formats, messages as ``list<struct<role, content>>``:

``speaker_sft``
    One row per agent decision of a kept dialogue (prompt-completion), then the rows of its
    contrasts (:mod:`pipelines.speaker.contrast`; steps after the dialogue's last): ``prompt`` is the
    system message (task, tool schemas, SpeakRL output format) and the conversation so far,
    ``completion`` the agent's output in SpeakRL's tokens. ``kind`` says what it does;
    ``ask_needed`` whether the decision is a question the goal needs (the clarify rows);
    ``goal`` the hidden goal (JSON), for the audit and the held-out proxies (clarify
    precision and recall against the goal). A needless question (the user turns out to have
    no preference) has no row of its own: it is in the prompts of the rows that follow; so
    has a recommendation made before the user had said enough, which the user corrects (the
    rows after it teach searching again with everything said). A slot-filling question (a taxi's missing pickup, destination or time) is a clarify row with
    ``ask_needed`` true and no ``ambiguity_type``.
``speaker_grpo``
    One row per clarification decision: ``prompt`` is Table 1's instruction with the
    conversation so far substituted (:func:`pipelines.rewards.prompts.render_speakrl_prompt`),
    plus the columns the rewards read (:mod:`pipelines.rewards.verifiable`):
    ``discriminating_slots``, ``candidate_values`` (JSON slot -> values),
    ``known_slots``, and ``goal`` (JSON). ``reference`` is the synthesized output there.
    Act-here rows (:mod:`pipelines.speaker.act`) have ``ask_needed`` false, no ambiguity
    type and no discriminating slot: the synthesized tool call is the reference, and a
    question there is over-asking.
``speaker_dpo``
    One row per SpeakER-DPO pair: ``prompt`` (system message and conversation), ``chosen``
    (the clarification) and ``rejected`` (acting on a guess); at act-here points
    (``ask_needed`` false) ``chosen`` is the tool call and ``rejected`` a needless question.

Every training table has the seed's corpus ``split`` (train or val; never test): the
training stages hold out the val split.

``speaker_dialogues`` is for inspection (DuckDB): one row per seed with its outcome,
drop reason, ambiguity points and the synthesized dialogue as JSON.
"""

from __future__ import annotations

import json
from typing import Any, Iterable

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, Reference, between, in_set, length_between
from pipelines.episodes.formats import DEFAULT_TASK_PROMPT
from pipelines.records import SPLITS, TRAIN, VAL
from pipelines.rewards.prompts import render_conversation, render_speakrl_prompt
from pipelines.speaker.ambiguity import AMBIGUITY_TYPES
from pipelines.speaker.contrast import contrast_messages
from pipelines.speaker.pipeline import DROP_REASONS, SeedOutcome, SpeakerResult
from pipelines.speaker.trajectory import AGENT_KINDS, ChatTurn, goal_json, system_message, visible_conversation

TRAINING_SPLITS: tuple[str, ...] = (TRAIN, VAL)

MESSAGE = pa.struct([pa.field("role", pa.string(), nullable=False), pa.field("content", pa.string(), nullable=False)])
MESSAGES = pa.list_(MESSAGE)
_STRINGS = pa.list_(pa.string())


def _required(name: str, data_type: pa.DataType) -> pa.Field:
    return pa.field(name, data_type, nullable=False)


SPEAKER_DIALOGUES = ArtifactSpec(
    name="speaker_dialogues",
    min_rows=1,
    description="One row per seed dialogue: what synthesis made of it, why it was dropped, and the dialogue as JSON.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),
        _required("split", pa.string()),
        _required("backend", pa.string()),
        _required("kept", pa.bool_()),
        ("drop_reason", pa.string()),
        ("drop_detail", pa.string()),
        _required("domains", _STRINGS),
        _required("n_ambiguity_points", pa.int32()),
        _required("ambiguity_points_json", pa.string()),  # every point found in the seed
        _required("n_planned", pa.int32()),
        _required("n_clarifications", pa.int32()),
        _required("n_needless_questions", pa.int32()),  # asked where the user has no preference (not trained on)
        _required("n_slot_questions", pa.int32()),  # for what an action needs and the user had not said (a taxi's pickup)
        _required("clarification_types", _STRINGS),
        _required("clarification_questions", _STRINGS),
        _required("n_turns", pa.int32()),
        _required("n_tool_calls", pa.int32()),
        ("success", pa.bool_()),  # the goal checker on replay; null when nothing was synthesized
        ("turns_json", pa.string()),  # null when nothing was synthesized
        _required("dpo_pairs", pa.int32()),
        _required("dpo_dropped", _STRINGS),  # one reason per clarified point without a pair
    ]),
    keys=("dialogue_id",),
    expectations=(
        in_set("split", SPLITS),
        in_set("drop_reason", DROP_REASONS),
        *(between(c, 0, None) for c in ("n_ambiguity_points", "n_planned", "n_clarifications", "n_needless_questions", "n_slot_questions", "n_turns", "n_tool_calls", "dpo_pairs")),
    ),
)

SPEAKER_SFT = ArtifactSpec(
    name="speaker_sft",
    min_rows=1,
    description="SFT (TRL prompt-completion, conversational): every agent decision of a kept dialogue.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),
        _required("split", pa.string()),
        _required("step", pa.int32()),
        _required("kind", pa.string()),
        ("ambiguity_type", pa.string()),  # clarify rows: the ambiguity resolved
        _required("prompt", MESSAGES),
        _required("completion", MESSAGES),
        _required("ask_needed", pa.bool_()),  # the decision is a question the goal needs
        _required("goal", pa.string()),  # JSON {domain: {info, book, reqt, ...}}: hidden from the policy
    ]),
    keys=("dialogue_id", "step"),
    expectations=(
        in_set("kind", AGENT_KINDS), in_set("ambiguity_type", AMBIGUITY_TYPES), between("step", 0, None), in_set("split", TRAINING_SPLITS),
    ),
    references=(Reference("dialogue_id", "speaker_dialogues", "dialogue_id"),),
)

SPEAKER_GRPO = ArtifactSpec(
    name="speaker_grpo",
    min_rows=1,
    description="GRPO prompts (SpeakRL Table 1) at clarification and act-here decisions, with the columns the rewards read.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),
        _required("split", pa.string()),
        _required("step", pa.int32()),
        _required("prompt", MESSAGES),
        _required("ask_needed", pa.bool_()),  # false at act-here points: a question is over-asking
        ("ambiguity_type", pa.string()),  # null at act-here points
        _required("domain", pa.string()),
        _required("discriminating_slots", _STRINGS),
        _required("candidate_values", pa.string()),  # JSON {slot: [values]}
        _required("known_slots", _STRINGS),
        _required("goal", pa.string()),  # JSON {domain: {info, book, reqt, ...}}
        _required("reference", pa.string()),  # the synthesized output at that point
    ]),
    keys=("dialogue_id", "step"),
    expectations=(
        in_set("ambiguity_type", AMBIGUITY_TYPES), between("step", 0, None), length_between("candidate_values", 2),
        in_set("split", TRAINING_SPLITS),
    ),
    references=(Reference("dialogue_id", "speaker_dialogues", "dialogue_id"),),
)

SPEAKER_DPO = ArtifactSpec(
    name="speaker_dpo",
    min_rows=1,
    description="SpeakER-DPO (TRL preference, conversational): clarifying vs acting on a guess, and acting vs a needless question or a search that drops what the user said.",
    schema=pa.schema([
        _required("dialogue_id", pa.string()),
        _required("split", pa.string()),
        _required("step", pa.int32()),
        _required("ask_needed", pa.bool_()),  # false: chosen acts, rejected asks needlessly or drops a said constraint
        ("ambiguity_type", pa.string()),  # null at act-here points
        _required("domain", pa.string()),
        _required("prompt", MESSAGES),
        _required("chosen", MESSAGES),
        _required("rejected", MESSAGES),
        _required("negative_failure", _STRINGS),  # why the negative trajectory failed the goal (empty at act-here points)
    ]),
    keys=("dialogue_id", "step"),
    expectations=(in_set("ambiguity_type", AMBIGUITY_TYPES), between("step", 0, None), in_set("split", TRAINING_SPLITS)),
    references=(Reference("dialogue_id", "speaker_dialogues", "dialogue_id"),),
)

#: The splits a training table may hold: the test split is for evaluation only.
TRAINING_SPECS: tuple[str, ...] = ("speaker_sft", "speaker_grpo", "speaker_dpo")

SPECS: dict[str, ArtifactSpec] = {s.name: s for s in (SPEAKER_DIALOGUES, SPEAKER_SFT, SPEAKER_GRPO, SPEAKER_DPO)}


def speaker_tables(result: SpeakerResult, task_prompt: str = DEFAULT_TASK_PROMPT) -> dict[str, pa.Table]:
    """The four artifacts of a pipeline result, keyed by artifact name."""
    system = system_message(task_prompt)
    rows: dict[str, dict[str, list]] = {name: {f: [] for f in spec.schema.names} for name, spec in SPECS.items()}
    for outcome in result.outcomes:
        _append(rows["speaker_dialogues"], _dialogue_row(outcome, result.backend))
        if not outcome.kept:
            continue
        for row in _sft_rows(outcome, system):
            _append(rows["speaker_sft"], row)
        for row in _grpo_rows(outcome):
            _append(rows["speaker_grpo"], row)
        for row in _dpo_rows(outcome, system):
            _append(rows["speaker_dpo"], row)
    for name in TRAINING_SPECS:
        rows[name] = _sorted(rows[name])
    return {name: pa.Table.from_pydict(columns, schema=SPECS[name].schema) for name, columns in rows.items()}


def _dpo_rows(outcome: SeedOutcome, system: dict[str, str]) -> Iterable[dict[str, Any]]:
    """Clarification pairs (chosen: the question) then act-here pairs (chosen: the action,
    rejected: a needless question, or after a correction the search without a said constraint)."""
    split = outcome.dialogue.split

    def row(dialogue_id, step, ask_needed, ambiguity_type, domain, prompt, chosen, rejected, failures):
        return {"dialogue_id": dialogue_id, "split": split, "step": step, "ask_needed": ask_needed,
                "ambiguity_type": ambiguity_type, "domain": domain, "prompt": [system, *prompt],
                "chosen": [chosen], "rejected": [rejected], "negative_failure": list(failures)}

    for pair in outcome.pairs:
        yield row(pair.dialogue_id, pair.step, True, pair.point.type, pair.point.domain,
                  [t.message for t in pair.prompt], pair.chosen.message, pair.rejected.message, pair.negative_reasons)
    messages = outcome.trajectory.messages()
    for act in outcome.acts:
        yield row(act.dialogue_id, act.step, False, None, act.domain, messages[: act.index],
                  messages[act.index], {"role": "assistant", "content": act.rejected}, ())


def _append(columns: dict[str, list], row: dict[str, Any]) -> None:
    for name, values in columns.items():
        values.append(row[name])


def _dialogue_row(outcome: SeedOutcome, backend: str) -> dict[str, Any]:
    trajectory = outcome.trajectory
    clarified = trajectory.clarifications if trajectory else []
    return {
        "dialogue_id": outcome.dialogue.dialogue_id,
        "split": outcome.dialogue.split,
        "backend": backend,
        "kept": outcome.kept,
        "drop_reason": outcome.drop_reason,
        "drop_detail": outcome.drop_detail,
        "domains": list(outcome.dialogue.goal.domain_names),
        "n_ambiguity_points": len(outcome.points),
        "ambiguity_points_json": json.dumps([p.as_dict() for p in outcome.points], ensure_ascii=False),
        "n_planned": len(outcome.plan.points) if outcome.plan else 0,
        "n_clarifications": len(clarified),
        "n_needless_questions": len(trajectory.needless_questions) if trajectory else 0,
        "n_slot_questions": len(trajectory.slot_questions) if trajectory else 0,
        "clarification_types": [t.point.type if t.point else "unannotated" for _, t in clarified],
        "clarification_questions": outcome.questions,
        "n_turns": len(trajectory.turns) if trajectory else 0,
        "n_tool_calls": outcome.replay.n_tool_calls if outcome.replay else 0,
        "success": outcome.replay.success if outcome.replay else None,
        "turns_json": trajectory.turns_json() if trajectory else None,
        "dpo_pairs": len(outcome.pairs),
        "dpo_dropped": sorted(outcome.pair_drops.elements()),
    }


def _agent_turns(turns: Iterable[ChatTurn]) -> Iterable[tuple[int, int, ChatTurn]]:
    """(step, turn index, turn) for every agent output."""
    step = 0
    for index, turn in enumerate(turns):
        if turn.role == "assistant":
            yield step, index, turn
            step += 1


def _sft_rows(outcome: SeedOutcome, system: dict[str, str]) -> Iterable[dict[str, Any]]:
    trajectory = outcome.trajectory
    messages = trajectory.messages()
    goal = goal_json(outcome.dialogue.goal)
    step = -1
    for step, index, turn in _agent_turns(trajectory.turns):
        if turn.needless or turn.shown:
            continue  # in the prompts that follow, never taught
        yield {
            "dialogue_id": trajectory.dialogue_id,
            "split": outcome.dialogue.split,
            "step": step,
            "kind": turn.kind,
            "ambiguity_type": turn.point.type if turn.point else None,
            "prompt": [system, *messages[:index]],
            "completion": [turn.message],
            "ask_needed": turn.kind == "clarify",
            "goal": goal,
        }
    for contrast in outcome.contrasts:
        for prompt, turn in contrast_messages(trajectory, contrast):
            step += 1
            yield {
                "dialogue_id": trajectory.dialogue_id, "split": outcome.dialogue.split, "step": step, "kind": turn.kind,
                "ambiguity_type": None, "prompt": [system, *prompt], "completion": [turn.message], "ask_needed": False, "goal": goal,
            }


def _grpo_rows(outcome: SeedOutcome) -> Iterable[dict[str, Any]]:
    """GRPO rows at clarification points (asking is right), then at act-here points (nothing
    discriminates, the user's slots are known: a question is over-asking)."""
    trajectory = outcome.trajectory
    goal = goal_json(outcome.dialogue.goal)

    def row(step, index, ask_needed, ambiguity_type, domain, slots, candidates, known):
        conversation = render_conversation(visible_conversation(trajectory.turns[:index]))
        return {"dialogue_id": trajectory.dialogue_id, "split": outcome.dialogue.split, "step": step,
                "prompt": [{"role": "user", "content": render_speakrl_prompt(conversation)}],
                "ask_needed": ask_needed, "ambiguity_type": ambiguity_type, "domain": domain,
                "discriminating_slots": list(slots), "candidate_values": json.dumps(candidates, ensure_ascii=False),
                "known_slots": list(known), "goal": goal, "reference": trajectory.turns[index].content}

    for step, index, turn in _agent_turns(trajectory.turns):
        if turn.point is not None and turn.kind == "clarify":
            point = turn.point
            yield row(step, index, True, point.type, point.domain, point.slots,
                      {s: list(v) for s, v in point.candidates.items()}, point.known)
    for act in outcome.acts:
        yield row(act.step, act.index, False, None, act.domain, (), {}, act.known)


def _sorted(columns: dict[str, list]) -> dict[str, list]:
    """Rows in (dialogue, step) order: act-here rows among the clarification rows."""
    order = sorted(range(len(columns["dialogue_id"])), key=lambda i: (columns["dialogue_id"][i], columns["step"][i]))
    return {name: [values[i] for i in order] for name, values in columns.items()}
