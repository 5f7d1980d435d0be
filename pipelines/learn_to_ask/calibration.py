"""Auto-Prompt's tracks (EXTRACT, GRADER, ROLLOUT): anchor cases, the proposer's pools, the scores, the records.

ROLLOUT needs no human anchors: the policy samples replies with the candidate sampler prompt on
hindsight cases, and the fixed rules grader's L2A reward scores them (:func:`rollout_score`).

Anchor cases (:class:`Anchor`) are points of logged sessions with a verified I*_t. A user
curates them as a JSON Lines file, one chat-log session (the layout of
:mod:`pipelines.learn_to_ask.logs`) per line with two more fields, the assistant ``turn``
whose target is verified and that target ``info``::

    {"session_id": "a1", "goal": "...", "messages": [...], "turn": 1,
     "info": [{"field": "fever", "value": "absent"}]}

On the embedded default they are built from the corpus annotations (:func:`corpus_anchors`:
the rules extractor's I*_t, grounded in the belief states). The few-shot examples the
proposer may add come from other sessions (the calibration pool), never from an anchor's
session: a prompt must not contain the answers it is scored on.

Each candidate prompt runs the extraction pipeline (:class:`LLMExtractor`, with its JSON and
grounding checks) on the anchor cases and scores the micro F1 of its items against the
anchors' (:func:`pipelines.learn_to_ask.autoprompt.extraction_f1`).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import random
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping, Sequence

import pyarrow as pa

from pipelines.artifacts.spec import ArtifactSpec, between, in_set, length_between
from pipelines.errors import DataError
from pipelines.learn_to_ask.autoprompt import MUTATIONS, TRACKS, Candidate, Prompt, RulesProposer, calibrate, calibrated, extraction_f1, negative_mse
from pipelines.learn_to_ask.hindsight import (
    CONTINUE, SEED_EXTRACTOR_PROMPT, STOP, Info, LLMExtractor, Point, annotated_targets, case_text, decide, points,
)
from pipelines.learn_to_ask.logs import Session, parse_chat_log
from pipelines.multiwoz.ontology import ACT_SLOT
from pipelines.rewards.learn_to_ask import (
    GRADER_FORMAT,
    GRADER_INSTRUCTION,
    STOP_TOKEN,
    L2AReward,
    LLMGrader,
    RulesGrader,
    grader_case,
)

#: Rewordings of the extractor instruction the rules proposer tries (hand-written paraphrases).
EXTRACT_REWORDINGS: tuple[str, ...] = (
    "List every new fact the user states in the [Future Conversation] that the [Current Context] does not already contain.",
    "Read the user's replies in the [Future Conversation]. Write down each constraint or preference they give "
    "(what it is about, and its value) that was not known from the [Current Context].",
    "Which details did the assistant collect from the user after the [Current Context]? Give each detail once, "
    "as the topic and the user's answer.",
)
#: Output-format rules the rules proposer adds or drops.
EXTRACT_RULES: tuple[str, ...] = (
    "Copy each value as the user said it, in a few words.",
    "Only include information the user states in the [Future Conversation]; never copy the examples.",
    "List each piece of information once.",
)


@dataclass(frozen=True)
class Anchor:
    """A verified target: ``point`` (its session and turn) and its I*_t, ``info``."""

    point: Point
    info: Info


def anchor_from_record(raw: Any, source: str, position: str) -> Anchor:
    """One line of a curated anchor file (module docstring)."""
    if not isinstance(raw, Mapping):
        raise DataError(source, f"an anchor must be an object, got {type(raw).__name__}", position)
    record = str(raw.get("session_id", position))
    for required in ("turn", "info"):
        if required not in raw:
            raise DataError(source, "missing required field", record, required)
    session = parse_chat_log({k: v for k, v in raw.items() if k not in ("turn", "info")}, source, position)
    turn = raw["turn"]
    valid = {p.turn for p in points(session)}
    if isinstance(turn, bool) or not isinstance(turn, int) or turn not in valid:
        raise DataError(source, f"expected the index of an assistant message after the first user message ({sorted(valid)}), got {turn!r}", record, "turn")
    info = raw["info"]
    if not isinstance(info, list) or not all(isinstance(i, Mapping) and set(i) == {"field", "value"}
                                             and all(isinstance(i[k], str) and i[k].strip() for k in ("field", "value")) for i in info):
        raise DataError(source, f"expected a list of {{field, value}} strings, got {info!r}", record, "info")
    return Anchor(Point(session, turn), tuple((i["field"], i["value"]) for i in info))


def corpus_anchors(sessions: Sequence[Session], n_anchors: int, n_pool: int, seed: int = 0) -> tuple[list[Anchor], list[Anchor]]:
    """(anchors, pool) from annotated sessions: one point per session, drawn with ``seed``
    among those a user message follows; the anchors from the first ``n_anchors`` eligible
    sessions by id, the pool from the next ``n_pool`` (disjoint sessions)."""
    rng = random.Random(seed)
    chosen: list[Anchor] = []
    for session in sorted(sessions, key=lambda s: s.session_id):
        if len(chosen) == n_anchors + n_pool:
            break
        eligible = [p for p in points(session) if p.user_replies] if session.annotated else []
        if eligible:
            point = rng.choice(eligible)
            chosen.append(Anchor(point, annotated_targets(point)))
    if len(chosen) < n_anchors + n_pool:
        raise DataError("calibrate", f"{len(chosen)} annotated sessions with a user reply; {n_anchors} anchors and {n_pool} pool examples need {n_anchors + n_pool}")
    return chosen[:n_anchors], chosen[n_anchors:]


def as_example(anchor: Anchor) -> tuple[str, str]:
    """A pool anchor as a few-shot example: its case and the reply it should get."""
    point = anchor.point
    reply = json.dumps({"info": [{"field": f, "value": v} for f, v in anchor.info]})
    return case_text(point.session.goal, point.context, point.future), reply


def extract_score(prompt: Prompt, anchors: Sequence[Anchor], complete: Callable[[list[list[dict[str, str]]]], list[Any]],
                  name: str) -> float:
    """F1 of the extraction pipeline with ``prompt`` on the anchor cases."""
    extractions = LLMExtractor(complete, name, prompt).extract([a.point for a in anchors])
    return extraction_f1([e.info for e in extractions], [a.info for a in anchors])


# --- Records -------------------------------------------------------------------------------------

CALIBRATION_RUNS = ArtifactSpec(
    name="calibration_runs",
    min_rows=1,
    description="Auto-Prompt: every candidate prompt, its score on the anchor set, its lineage.",
    schema=pa.schema([
        pa.field("track", pa.string(), nullable=False),
        pa.field("iteration", pa.int32(), nullable=False),
        pa.field("position", pa.int32(), nullable=False),  # order within the run
        pa.field("prompt_id", pa.string(), nullable=False),
        ("parent_id", pa.string()),  # null for the seed
        pa.field("mutation", pa.string(), nullable=False),
        pa.field("score", pa.float64(), nullable=False),
        pa.field("selected", pa.bool_(), nullable=False),
        pa.field("instruction", pa.string(), nullable=False),
        pa.field("n_examples", pa.int32(), nullable=False),
        pa.field("rules", pa.list_(pa.string()), nullable=False),
        pa.field("prompt", pa.string(), nullable=False),
    ]),
    keys=("track", "position"),
    expectations=(in_set("track", TRACKS), in_set("mutation", MUTATIONS), between("iteration", 0, None),
                  length_between("prompt_id", 16, 16), length_between("instruction", 1)),
)


def runs_table(history: Iterable[Candidate]) -> pa.Table:
    rows = [
        {"track": c.track, "iteration": c.iteration, "position": i, "prompt_id": c.prompt_id, "parent_id": c.parent_id,
         "mutation": c.mutation, "score": c.score, "selected": c.selected, "instruction": c.prompt.instruction,
         "n_examples": len(c.prompt.examples), "rules": list(c.prompt.rules), "prompt": c.prompt.render()}
        for i, c in enumerate(history)
    ]
    return pa.Table.from_pylist(rows, schema=CALIBRATION_RUNS.schema)


def prompts_document(winners: Mapping[str, tuple[Candidate, float]]) -> dict[str, Any]:
    """The calibrated prompts file: per track the winning prompt's parts, its score and the
    seed's; ``version`` is a hash of the prompts, which changes exactly when one does."""
    tracks = {
        track: {"prompt_id": c.prompt_id, "instruction": c.prompt.instruction, "examples": [list(e) for e in c.prompt.examples],
                "rules": list(c.prompt.rules), "score": c.score, "seed_score": seed_score}
        for track, (c, seed_score) in sorted(winners.items())
    }
    version = hashlib.sha256(json.dumps({t: v["prompt_id"] for t, v in tracks.items()}, sort_keys=True).encode()).hexdigest()[:16]
    return {"version": version, **tracks}


def prompt_from_document(document: Any, track: str, source: str) -> Prompt:
    """A track's prompt from a calibrated prompts file; DataError naming the field."""
    if not isinstance(document, Mapping) or track not in document:
        raise DataError(source, f"no calibrated {track!r} prompt", field=track)
    entry = document[track]
    try:
        return Prompt(entry["instruction"], tuple((str(a), str(b)) for a, b in entry["examples"]), tuple(entry["rules"]))
    except (KeyError, TypeError, ValueError) as exc:
        raise DataError(source, f"malformed prompt: {exc!r}", field=track) from None


# --- The GRADER track ------------------------------------------------------------------------------


#: The seed grader prompt: appendix G's content-score policy and output tags.
SEED_GRADER_PROMPT = Prompt(GRADER_INSTRUCTION, rules=(GRADER_FORMAT,))

#: Rewordings of the grading policy the rules proposer tries.
GRADER_REWORDINGS: tuple[str, ...] = (
    "Score the content of the last message against the [Reference Information]:\n"
    "- 1.0 if it asks directly about one of the listed items;\n"
    "- 0.5 if it is related to them without asking about any one of them;\n"
    "- 0.0 if it has nothing to do with them.",
    "Does the last message ask for information listed in the [Reference Information]? 1.0: yes, about an "
    "item; 0.5: about something close to an item; 0.0: no.",
)
GRADER_RULES: tuple[str, ...] = (
    "The score is exactly one of 1.0, 0.5 or 0.0.",
    "Judge only the last message, not the earlier dialogue.",
)


@dataclass(frozen=True)
class GraderAnchor:
    """A verified grade: the assistant message ``question`` after ``point``'s context, the
    reference ``info`` and the ``grade`` (0, 0.5 or 1) a person gave it."""

    point: Point
    question: str
    info: Info
    grade: float

    @property
    def case(self) -> str:
        context = [{"role": m.role, "content": m.content} for m in self.point.context]
        return grader_case(context, self.question, self.info)


def grader_anchor_from_record(raw: Any, source: str, position: str) -> GraderAnchor:
    """A curated grader anchor: an extract anchor's fields plus ``question`` (the message
    graded; the expert's own turn when absent) and ``grade``."""
    if not isinstance(raw, Mapping):
        raise DataError(source, f"an anchor must be an object, got {type(raw).__name__}", position)
    record = str(raw.get("session_id", position))
    grade = raw.get("grade")
    if grade not in (0, 0.5, 1) or isinstance(grade, bool):
        raise DataError(source, f"expected 0, 0.5 or 1, got {grade!r}", record, "grade")
    anchor = anchor_from_record({k: v for k, v in raw.items() if k not in ("question", "grade")}, source, position)
    question = raw.get("question", anchor.point.session.messages[anchor.point.turn].content)
    if not isinstance(question, str) or not question.strip():
        raise DataError(source, f"expected a non-empty string, got {question!r}", record, "question")
    return GraderAnchor(anchor.point, question, anchor.info, float(grade))


def _act_slot(field: str) -> tuple[str, str, bool]:
    """(domain, dialog-act slot code, is a booking slot) of an I*_t field such as
    ``hotel-pricerange`` or ``hotel-book-people`` (the hindsight extractor's belief slots)."""
    domain, *middle, slot = field.split("-")
    return domain, ACT_SLOT.get(slot, slot).lower(), "book" in middle


def annotated_grade(requests: Sequence[tuple[str, str]] | None, info: Info) -> float | None:
    """Appendix G's content score of an assistant message, read from the annotators' dialog
    acts (the message's ``requests``), never from a grader: 1.0 when it requests an item of
    I*_t (``info``), 0.5 when it requests something else of a domain I*_t is about ("highly
    relevant"), 0.0 when its requests concern other domains only or it asks for nothing in
    particular (``general-reqmore``, "Anything else?"); None (no grade) when the message has no
    request annotation or I*_t is empty.

    >>> annotated_grade([("hotel", "Price")], (("hotel-pricerange", "cheap"),))
    1.0
    >>> annotated_grade([("booking", "People")], (("hotel-book-people", "4"),))
    1.0
    >>> annotated_grade([("hotel", "Area")], (("hotel-pricerange", "cheap"),))
    0.5
    >>> annotated_grade([("general", "reqmore")], (("train-day", "monday"),))
    0.0
    >>> annotated_grade([], (("train-day", "monday"),)) is None
    True
    """
    if not requests or not info:
        return None
    items = [_act_slot(field) for field, _ in info]
    wanted = {(domain, code) for domain, code, _ in items}
    for domain, code in requests:
        code = code.lower()
        if (domain, code) in wanted or (domain == "booking" and any(c == code and book for _, c, book in items)):
            return 1.0
    domains = {domain for domain, _, _ in items}
    booking = any(book for _, _, book in items)
    if any(domain in domains or (domain == "booking" and booking) for domain, _ in requests):
        return 0.5
    return 0.0


def corpus_grader_anchors(sessions: Sequence[Session], n_anchors: int, n_pool: int, seed: int = 0) -> tuple[list[GraderAnchor], list[GraderAnchor]]:
    """(anchors, pool): the expert's own turns at points with something to collect, graded
    from the corpus's annotations (:func:`annotated_grade`: the dialog acts of the turn against
    the annotated I*_t), so no grader, and in particular not the one being calibrated, decides
    an anchor's grade; as evenly over the grades 0, 0.5 and 1 as the sessions allow; one point
    per session, anchors and pool from different sessions."""
    rng = random.Random(seed)
    by_grade: dict[float, list[GraderAnchor]] = {0.0: [], 0.5: [], 1.0: []}
    for session in sorted(sessions, key=lambda s: s.session_id):
        eligible = [p for p in points(session) if p.user_replies] if session.annotated else []
        rng.shuffle(eligible)
        for point in eligible:
            info = annotated_targets(point)
            grade = annotated_grade(point.future[0].requests, info)
            if grade is not None:
                by_grade[grade].append(GraderAnchor(point, point.future[0].content, info, grade))
                break
    # 0, 0.5, 1, 0, 0.5, 1, ... over the grades that occur (a corpus may lack one)
    chosen = [a for turn in itertools.zip_longest(*by_grade.values()) for a in turn if a is not None][: n_anchors + n_pool]
    if len(chosen) < n_anchors + n_pool:
        raise DataError("calibrate", f"{len(chosen)} points with annotated requests; {n_anchors} anchors and {n_pool} pool examples "
                        f"need {n_anchors + n_pool} (logs without dialogue acts, e.g. chat logs: give graded anchors in "
                        "params.yaml calibrate.anchors.grader, or leave the grader track out of calibrate.tracks)")
    anchors = sorted(chosen[:n_anchors], key=lambda a: a.point.session.session_id)
    return anchors, chosen[n_anchors:]


def as_grader_example(anchor: GraderAnchor) -> tuple[str, str]:
    return anchor.case, f"<think>the reference grade of this message</think><content_score>{anchor.grade}</content_score>"


def grader_score(prompt: Prompt, anchors: Sequence[GraderAnchor], complete: Callable[[list[list[dict[str, str]]]], list[Any]],
                 name: str) -> float:
    """Minus the MSE of the grades the LLM grader with ``prompt`` gives the anchors."""
    grades = LLMGrader(complete, name, prompt).grade_many([a.case for a in anchors])
    return negative_mse([g.score for g in grades], [a.grade for a in anchors])


# --- The ROLLOUT track -----------------------------------------------------------------------------

#: The policy sampler prompt of appendix G (response generation), without the medical domain.
POLICY_INSTRUCTION = (
    "You are an assistant. Your task is to understand the ongoing conversation and continue the inquiry "
    "in English, asking for what you still need to act on the user's request."
)
POLICY_RULES: tuple[str, ...] = (
    "Each response must contain exactly one clear and concise question with 2 to 3 answer choices.",
    "Do not repeat any previous question.",
    "Your response must be a single sentence.",
    "If enough information has been gathered to act on the request, output only: <stop />",
)
SEED_POLICY_PROMPT = Prompt(POLICY_INSTRUCTION, rules=POLICY_RULES)
POLICY_REWORDINGS: tuple[str, ...] = (
    "You help a user with a request. Read the conversation and ask the one question whose answer you need next; "
    "when nothing is missing, stop.",
    "Continue the conversation as the assistant: ask for the next missing detail of the user's request.",
)
POLICY_EXTRA_RULES: tuple[str, ...] = (
    "Never ask about something the user has already said.",
    "Ask about one thing only.",
)


@dataclass(frozen=True)
class RolloutCase:
    """A context to sample the policy on, with its hindsight target (I*_t, s*_t)."""

    point: Point
    info: Info
    decision: str


def corpus_rollout_cases(sessions: Sequence[Session], n_cases: int, n_pool: int, seed: int = 0) -> tuple[list[RolloutCase], list[RolloutCase]]:
    """(cases, pool): one point per annotated session with its rules target (eq. 2), alternating
    CONTINUE and STOP targets where the sessions allow; the pool (few-shot examples: the
    expert's turn, or the stop token) from other sessions."""
    rng = random.Random(seed)
    by_decision: dict[str, list[RolloutCase]] = {CONTINUE: [], STOP: []}
    for session in sorted(sessions, key=lambda s: s.session_id):
        eligible = points(session) if session.annotated else []
        rng.shuffle(eligible)
        if eligible:
            point = eligible[0]
            info = annotated_targets(point)
            decision, _ = decide(point, info, "no_info")
            by_decision[decision].append(RolloutCase(point, info, decision))
    order = [c for pair in zip(by_decision[CONTINUE], by_decision[STOP]) for c in pair]
    rest = [c for cases in by_decision.values() for c in cases if c not in order]
    chosen = (order + rest)[: n_cases + n_pool]
    if len(chosen) < n_cases + n_pool:
        raise DataError("calibrate", f"{len(chosen)} annotated sessions; {n_cases} cases and {n_pool} pool examples need {n_cases + n_pool}")
    return chosen[:n_cases], chosen[n_cases:]


def _policy_case(point: Point) -> str:
    return "\n".join(f"{m.role}: {m.content}" for m in point.context)


def as_policy_example(case: RolloutCase) -> tuple[str, str]:
    return _policy_case(case.point), STOP_TOKEN if case.decision == "stop" else case.point.future[0].content


def policy_messages(prompt: Prompt, point: Point) -> list[dict[str, str]]:
    """The policy's conversation: the prompt (examples and rules included) as the system
    message, then the full context C_{t-1}."""
    return [{"role": "system", "content": prompt.render()}, *({"role": m.role, "content": m.content} for m in point.context)]


def rollout_score(prompt: Prompt, cases: Sequence[RolloutCase], sample: Callable[[list[list[dict[str, str]]]], list[Any]],
                  name: str) -> float:
    """The mean L2A reward (rules grader, beta 2) of the policy's samples with ``prompt``;
    ``sample`` returns, per conversation, a list of sampled replies. Unscored samples (None)
    are left out of the mean, as TRL leaves them out."""
    reward = L2AReward(RulesGrader())
    samples = sample([policy_messages(prompt, c.point) for c in cases])
    values: list[float] = []
    for case, replies in zip(cases, samples):
        info = [{"field": f, "value": v} for f, v in case.info]
        scored = reward([None] * len(replies), list(replies), decision_truth=[case.decision] * len(replies), info_truth=[info] * len(replies))
        values += [v for v in scored if v is not None]
    return sum(values) / len(values) if values else 0.0


# --- One calibration track, as stage calibrate runs it --------------------------------------

BUILT_TRACKS = ("extract", "grader", "rollout")
ROLE_OF = {"extract": "extractor", "grader": "grader"}  # the llm role under calibration
SCORE_NAMES = {"extract": "f1", "grader": "negative_mse", "rollout": "mean_reward"}
# build anchors from the corpus, pool anchor -> few-shot example, score, seed prompt, rewordings, rules
TRACK_PARTS = {
    "extract": (corpus_anchors, as_example, extract_score, SEED_EXTRACTOR_PROMPT, EXTRACT_REWORDINGS, EXTRACT_RULES),
    "grader": (corpus_grader_anchors, as_grader_example, grader_score, SEED_GRADER_PROMPT, GRADER_REWORDINGS, GRADER_RULES),
    # no human anchors: the fixed rules grader scores the policy's samples
    "rollout": (corpus_rollout_cases, as_policy_example, rollout_score, SEED_POLICY_PROMPT, POLICY_REWORDINGS, POLICY_EXTRA_RULES),
}
#: How a curated anchor file's lines are read, per track (rollout has no human anchors).
ANCHOR_PARSERS = {"extract": anchor_from_record, "grader": grader_anchor_from_record}
# Where corpus-built anchors get their labels: never from the model or prompt under calibration.
ANCHORS_FROM = {"extract": "corpus annotations (belief states)", "grader": "corpus annotations (dialog acts)",
                "rollout": "none (scored by the fixed rules grader)"}


def calibrate_track(track: str, sessions: Sequence[Session], complete: Callable[..., Any], kind: str, *, curated: Sequence[Any] | None,
                    curated_from: str | None, n_anchors: int, n_pool: int, iterations: int, k: int, seed: int,
                    on_score: Callable[[], Any] | None = None) -> tuple[list[Candidate], Candidate, dict[str, Any]]:
    """Auto-Prompt on one track: the anchors (``curated``, read from ``curated_from``, or
    ``n_anchors`` built from the corpus annotations) and a few-shot pool from other sessions,
    the rules proposer, ``iterations`` rounds of ``k`` candidates scored with ``complete`` (the
    model under calibration, or the rollout track's sampler; ``on_score`` after each score).
    Every candidate, the winner, and the track's report."""
    build, to_example, score, seed_prompt, rewordings, rules = TRACK_PARTS[track]
    if curated is None:
        anchors, pool = build(sessions, n_anchors, n_pool, seed)
    else:
        anchors, taken = list(curated), {a.point.session.session_id for a in curated}
        _, pool = build([s for s in sessions if s.session_id not in taken], 0, n_pool, seed)
    proposer = RulesProposer((seed_prompt.instruction, *rewordings), [to_example(a) for a in pool], (*seed_prompt.rules, *rules), seed)

    def scored(prompt: Any) -> float:
        value = score(prompt, anchors, complete, kind)
        if on_score is not None:
            on_score()
        return value

    runs = calibrate(track, seed_prompt, proposer.propose, scored, iterations, k)
    best = calibrated(runs)
    report = {
        "backend": kind, "anchors": len(anchors), "anchors_from": ANCHORS_FROM[track] if curated_from is None else curated_from,
        "pool": len(pool), "iterations": iterations, "k": k,
        "candidates": len({c.prompt_id for c in runs}), "score": SCORE_NAMES[track],
        "seed_score": round(runs[0].score, 4), "calibrated_score": round(best.score, 4), "winner": best.prompt_id,
        "lineage": [c.mutation for c in runs if c.selected and c.mutation != "kept"],
    }
    return runs, best, report


def readme_block(metrics: Mapping[str, Any]) -> str:
    """README's Auto-Prompt figures, generated from ``reports/calibrate.json`` (a test compares them)."""
    names = {"f1": "F1", "negative_mse": "-MSE", "mean_reward": "mean reward"}
    parts = [f"{track} {names.get(m['score'], m['score'])} {m['seed_score']:g} -> {m['calibrated_score']:g} "
             f"({m['backend']}, {m['anchors']} anchors" + (f" labelled by {m['anchors_from']}" if track != "rollout" and m.get("anchors_from") else "")
             + f", {m['candidates']} prompts, winner by {' + '.join(m['lineage'])})"
             for track, m in metrics.items()]
    return "Auto-Prompt, `reports/calibrate.json`: " + "; ".join(parts) + "."
