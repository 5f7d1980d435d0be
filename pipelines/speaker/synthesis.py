"""SpeakER synthesis (section 3.4): seed dialogues in, clarification dialogues out.

Two backends behind one interface (:class:`Synthesizer`), both producing
:class:`~pipelines.speaker.trajectory.Trajectory` objects whose tool calls ran in a real
:class:`~pipelines.env.tools.ToolEnvironment`:

``rules`` (:class:`RulesSynthesizer`, the offline default)
    The deterministic :class:`~pipelines.speaker.writer.DialogueWriter`: grounded in the
    goal, the database and the seed's belief states, with phrasing drawn from a seeded RNG.

``openai`` (:class:`LLMSynthesizer`)
    A prompted synthesizer (LLM role ``synthesizer``). It is shown the goal, the seed
    dialogue, the planned ambiguity points and the rules writer's dialogue as a draft, and
    returns a dialogue as JSON validated against :data:`DIALOGUE_SCHEMA` (the client repairs
    invalid replies a bounded number of times). The dialogue is then *materialized*: agent
    turns rendered in the SpeakRL format, tool calls run in the environment, results
    inserted, so it is replayed and filtered exactly like a rules dialogue. A reply that
    fails for good, or whose dialogue is malformed or does not clarify where the plan says,
    is dropped with a recorded reason.

Re-running with unchanged inputs makes no request for the seeds that succeeded: their
replies are in the client's response cache. Only successful, schema-valid replies are cached:
a reply that was invalid even after repair (a garbage answer from a broken server, say) is
not remembered, so that a later run, against a server that has been fixed, asks again.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from pipelines.env.tools import TOOL_NAMES, Database
from pipelines.episodes.formats import CLARIFY, END, RESPOND, THINK, TOOL_CALL, AgentAction
from pipelines.llm.cache import ResponseCache
from pipelines.llm.client import Completion, CompletionRequest, LLMClient
from pipelines.llm.config import SamplingParams
from pipelines.records import Dialogue
from pipelines.speaker.ambiguity import AmbiguityPoint
from pipelines.speaker.trajectory import FORMAT, OBSERVATION, USER, Trajectory, TrajectoryBuilder, goal_json, tool_summary
from pipelines.speaker.writer import DialogueWriter, Plan, SynthesisError

ROLE = "synthesizer"
NO_CLARIFICATION = "no_clarification_written"


@dataclass(frozen=True)
class SeedTask:
    """One seed to synthesize from: the dialogue, its ambiguity points and the plan."""

    dialogue: Dialogue
    points: tuple[AmbiguityPoint, ...]
    plan: Plan


@dataclass(frozen=True)
class Synthesis:
    """What a backend made of one seed: a trajectory, or why there is none (``drop_reason``,
    a short code, and ``detail`` for a person)."""

    dialogue_id: str
    trajectory: Trajectory | None
    drop_reason: str | None = None
    detail: str | None = None

    def __post_init__(self) -> None:
        if (self.trajectory is None) == (self.drop_reason is None):
            raise ValueError("a synthesis has either a trajectory or a drop reason")


class Synthesizer(Protocol):
    name: str

    def synthesize(self, tasks: Sequence[SeedTask]) -> list[Synthesis]:
        """One synthesis per task, in order."""
        ...


def env_seed(seed: int, dialogue_id: str) -> int:
    """The tool environment's seed for a dialogue: stable across runs and platforms."""
    digest = hashlib.sha256(f"speaker-env:{seed}:{dialogue_id}".encode()).digest()
    return int.from_bytes(digest[:4], "big")


def write_rules(task: SeedTask, database: Database, seed: int, guess: AmbiguityPoint | None = None) -> Trajectory:
    """The rules writer's trajectory for ``task`` (the negative for ``guess`` when given).
    Raises SynthesisError for a seed it cannot write."""
    writer = DialogueWriter(
        task.dialogue, database, task.plan, seed=seed, env_seed=env_seed(seed, task.dialogue.dialogue_id), guess=guess
    )
    return writer.write()


class RulesSynthesizer:
    name = "rules"

    def __init__(self, database: Database, seed: int = 0):
        self.database = database
        self.seed = seed

    def synthesize(self, tasks: Sequence[SeedTask]) -> list[Synthesis]:
        return [self.synthesize_one(task) for task in tasks]

    def synthesize_one(self, task: SeedTask) -> Synthesis:
        dialogue_id = task.dialogue.dialogue_id
        try:
            trajectory = write_rules(task, self.database, self.seed)
        except SynthesisError as error:
            return Synthesis(dialogue_id, None, error.reason, error.detail)
        if not trajectory.clarifications:
            # Every planned point turned out unambiguous in the dialogue as written.
            return Synthesis(dialogue_id, None, NO_CLARIFICATION, "no planned point was ambiguous in the written dialogue")
        return Synthesis(dialogue_id, trajectory)


# --------------------------------------------------------------------------------------
# The prompted synthesizer
# --------------------------------------------------------------------------------------

_USER_TURN = {
    "type": "object",
    "properties": {"speaker": {"const": "user"}, "text": {"type": "string", "minLength": 1}},
    "required": ["speaker", "text"],
    "additionalProperties": False,
}
_AGENT_TURN = {
    "type": "object",
    "properties": {
        "speaker": {"const": "agent"},
        "think": {"type": "string", "minLength": 1},
        "action": {"enum": ["clarify", "respond", "tool_call", "end"]},
        "text": {"type": "string", "minLength": 1},
        "tool": {"enum": list(TOOL_NAMES)},
        "arguments": {"type": "object"},
    },
    "required": ["speaker", "think", "action"],
    "additionalProperties": False,
    "allOf": [
        {
            "if": {"properties": {"action": {"const": "tool_call"}}},
            "then": {"required": ["tool", "arguments"], "not": {"required": ["text"]}},
            "else": {"required": ["text"], "not": {"anyOf": [{"required": ["tool"]}, {"required": ["arguments"]}]}},
        }
    ],
}
#: What the synthesizer LLM must return: the dialogue, turn by turn. Tool results are not
#: written by the model; they come from the environment when the dialogue is materialized.
DIALOGUE_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {"turns": {"type": "array", "minItems": 2, "items": {"oneOf": [_USER_TURN, _AGENT_TURN]}}},
    "required": ["turns"],
    "additionalProperties": False,
}

SYSTEM_PROMPT = (
    "You write training dialogues for a travel agent in Cambridge, UK, that learns to ask clarification questions "
    "when a request is ambiguous instead of guessing. You rewrite a draft dialogue into a natural one, keeping its "
    "structure: the same tool calls with the same arguments in the same order, and the clarification questions at the "
    "same places. Reply with JSON only."
)
_INSTRUCTIONS = """Rewrite the draft below as a natural dialogue.
- Turns alternate between the user and the agent; the agent may take several turns in a row when it calls tools.
- Every agent turn has "think" (private reasoning) and an "action": "tool_call" (with "tool" and "arguments"), "clarify" (a question, in "text"), "respond" (a reply, in "text") or "end" (the last reply, in "text").
- Keep every tool call of the draft, with exactly the same tool and arguments, in the same order. Tool results are inserted automatically; do not write them.
- Where the draft's agent recommends something the user then corrects, keep that recommendation and the correction, and search again with everything the user has said.
- Ask exactly the questions the draft asks, at the same points (a question for a taxi's missing pickup, destination or time asks for just that). At a clarification: in "think", say what the user has and has not said, how many options there are and what differs between them (reasons the agent can check without knowing the user's mind); in "text", ask one clear question about it. The user's answers must state the same values as in the draft; where the draft's user has no preference, the agent recommends one of the options it already found, without searching again.
- Quote names, times, prices and reference numbers exactly as the tool results give them.
- End with one agent turn whose action is "end"."""


def draft_turns(trajectory: Trajectory) -> tuple[list[dict[str, Any]], list[str]]:
    """The draft in the reply's own JSON shape, and the tool results in call order."""
    turns: list[dict[str, Any]] = []
    results: list[str] = []
    pending: AgentAction | None = None
    for turn in trajectory.turns:
        if turn.kind == USER:
            turns.append({"speaker": "user", "text": turn.content})
            continue
        if turn.kind == OBSERVATION:
            if pending is not None:
                results.append(tool_summary(pending, turn.content))
            pending = None
            continue
        actions = FORMAT.parse(turn.content)
        entry: dict[str, Any] = {"speaker": "agent", "think": next((a.text for a in actions if a.kind == THINK), "")}
        body = [a for a in actions if a.kind != THINK]
        if body[0].kind == TOOL_CALL:
            pending = body[0]
            entry.update(action="tool_call", tool=body[0].tool_name, arguments=dict(body[0].arguments or {}))
        else:
            entry.update(action="end" if any(a.kind == END for a in body) else body[0].kind, text=" ".join(a.text for a in body if a.text))
        turns.append(entry)
    return turns, results


def synthesis_prompt(task: SeedTask, draft: Trajectory) -> list[dict[str, str]]:
    seed = "\n".join(f"{'User' if t.speaker == 'user' else 'System'}: {t.text}" for t in task.dialogue.turns)
    points = "\n".join(
        f"- {p.type} in the {p.domain} ({p.action}): the user leaves open {', '.join(p.slots)}; "
        f"possible values {json.dumps({s: list(v) for s, v in p.candidates.items()}, ensure_ascii=False)}; "
        f"the goal wants {json.dumps(dict(p.goal_values), ensure_ascii=False)}"
        for p in task.plan.points
    )
    turns, results = draft_turns(draft)
    body = "\n\n".join([
        f"## User goal (hidden from the agent)\n{goal_json(task.dialogue.goal)}",
        f"## Seed dialogue\n{seed}",
        f"## Ambiguity points to clarify\n{points}",
        "## Draft\n" + json.dumps({"turns": turns}, ensure_ascii=False),
        "## Tool results of the draft, in call order\n" + "\n".join(f"{i + 1}. {r}" for i, r in enumerate(results)),
        _INSTRUCTIONS,
    ])
    return [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": body}]


class DialogueShapeError(ValueError):
    """A synthesized dialogue that cannot be played: turns out of order, no ending."""


def materialize(data: Mapping[str, Any], task: SeedTask, draft: Trajectory, database: Database) -> Trajectory:
    """The LLM's dialogue as a trajectory: agent turns rendered in the SpeakRL format, tool
    calls run in the environment (seeded as the draft's, so that a dialogue keeping the
    draft's calls gets its references), clarifications annotated with the draft's points in
    order. Raises DialogueShapeError for a dialogue the runner could not have produced."""
    builder = TrajectoryBuilder(task.dialogue.dialogue_id, task.dialogue.goal, database, draft.env_seed)
    # Every question of the draft in order, the needless ones (the user has no preference) and
    # the slot-filling ones (a taxi's missing pickup) included.
    points = [(t.point, t.needless, t.slot_filling) for t in draft.turns if t.kind == CLARIFY]
    # A recommendation the user corrects (never taught) is known by the tool calls before it,
    # a mistaken search by its own place among them: the rewrite keeps the draft's calls in order.
    shown_after = {sum(u.kind == TOOL_CALL for u in draft.turns[:i]) for i, t in draft.shown_outputs if t.kind == RESPOND}
    shown_calls = {sum(u.kind == TOOL_CALL for u in draft.turns[:i]) for i, t in draft.shown_outputs if t.kind == TOOL_CALL}
    calls = 0
    turns = list(data["turns"])
    if not turns or turns[0]["speaker"] != "user":
        raise DialogueShapeError("the dialogue must open with the user")
    if turns[-1]["speaker"] != "agent" or turns[-1]["action"] != "end":
        raise DialogueShapeError("the dialogue must close with an agent turn whose action is 'end'")
    clarified = 0
    previous: Mapping[str, Any] | None = None
    for index, turn in enumerate(turns):
        if turn["speaker"] == "user":
            if previous is not None and (previous["speaker"] == "user" or previous["action"] == TOOL_CALL):
                raise DialogueShapeError(f"turn {index}: the user speaks out of turn")
            builder.user(turn["text"].strip())
        else:
            if previous is not None and previous["speaker"] == "agent" and previous["action"] != TOOL_CALL:
                raise DialogueShapeError(f"turn {index}: the agent speaks again before the user answers")
            if turn["action"] == END and index != len(turns) - 1:
                raise DialogueShapeError(f"turn {index}: the dialogue goes on after 'end'")
            actions = [AgentAction.think(turn["think"].strip())]
            if turn["action"] == TOOL_CALL:
                actions.append(AgentAction.tool_call(turn["tool"], turn["arguments"]))
                kind = TOOL_CALL
            elif turn["action"] == CLARIFY:
                actions.append(AgentAction.clarify(turn["text"].strip()))
                kind = CLARIFY
            else:
                actions.append(AgentAction.respond(turn["text"].strip()))
                kind = RESPOND
                if turn["action"] == END:
                    actions.append(AgentAction.end())
                    kind = END
            point, needless, slot_filling, shown = None, False, False, False
            if kind == CLARIFY:
                point, needless, slot_filling = points[clarified] if clarified < len(points) else (None, False, False)
                clarified += 1
            elif kind == RESPOND and calls in shown_after:
                shown_after.discard(calls)
                shown = True
            elif kind == TOOL_CALL:
                shown = calls in shown_calls
            calls += kind == TOOL_CALL
            content, _ = FORMAT.render(actions)
            # Text that itself contains format tags ("<clarify>" inside a thought), or only
            # blanks, would render into an output that parses differently, or not at all.
            if FORMAT.parse(content) != tuple(actions):
                raise DialogueShapeError(f"turn {index}: the agent's text is blank or contains format tags")
            builder.raw_agent(content, kind, point, needless, slot_filling, shown)
        previous = turn
    if clarified != len(points):
        raise DialogueShapeError(f"{clarified} clarification(s) where the plan has {len(points)}")
    return builder.build()


@dataclass
class LLMSynthesisStats:
    """What the prompted synthesizer did beyond the client's accounting."""

    seeds_sent: int = 0  # seeds handed to the client (its cache hits included)

    def as_dict(self) -> dict[str, Any]:
        return {"seeds_sent": self.seeds_sent}


class LLMSynthesizer:
    """The prompted synthesizer (module docstring). ``cache``: the client's response cache,
    kept for callers that pass it; failures are never written to it."""

    name = "openai"

    def __init__(self, client: LLMClient, sampling: SamplingParams, database: Database, seed: int = 0, cache: ResponseCache | None = None):
        self.client = client
        self.sampling = sampling
        self.database = database
        self.seed = seed
        self.cache = cache
        self.rules = RulesSynthesizer(database, seed)
        self.stats = LLMSynthesisStats()

    def synthesize(self, tasks: Sequence[SeedTask]) -> list[Synthesis]:
        results: list[Synthesis | None] = [None] * len(tasks)
        pending: list[tuple[int, SeedTask, Trajectory, CompletionRequest]] = []
        for i, task in enumerate(tasks):
            draft = self.rules.synthesize_one(task)
            if draft.trajectory is None:
                results[i] = draft  # nothing to rewrite: the seed drops as it would with rules
                continue
            request = CompletionRequest(synthesis_prompt(task, draft.trajectory), ROLE, self.sampling, self.seed, 1, DIALOGUE_SCHEMA)
            pending.append((i, task, draft.trajectory, request))
        self.stats.seeds_sent += len(pending)
        replies = self.client.complete_many_sync([request for *_, request in pending]) if pending else []
        for (i, task, draft, request), reply in zip(pending, replies):
            if not isinstance(reply, Completion):
                results[i] = self._drop(task, f"llm_{reply.reason}", reply.last_error)
                continue
            try:
                trajectory = materialize(reply.parsed[0], task, draft, self.database)
            except DialogueShapeError as error:
                # The model's output is unusable as much as a reply that failed validation:
                # counted as a failure, for the stage's failure-rate check.
                self.client.accounting.record_failure(ROLE, "invalid_dialogue")
                results[i] = self._drop(task, "llm_dialogue_invalid", str(error))
                continue
            results[i] = Synthesis(task.dialogue.dialogue_id, trajectory)
        return [r for r in results if r is not None]

    @staticmethod
    def _drop(task: SeedTask, reason: str, detail: str) -> Synthesis:
        return Synthesis(task.dialogue.dialogue_id, None, reason, detail)
