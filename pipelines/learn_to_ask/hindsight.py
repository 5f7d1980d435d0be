"""Hindsight extraction (Learn-to-Ask section 3.4): what the expert went on to collect.

For every assistant turn t of a session (after the first user message), the sample holds
the **full prefix** C_{t-1} (every earlier message; the reference implementation passed only
the latest block), the future segment C \\ C_{t-1} (the expert's turn a_t onwards) and the
extracted target (I*_t, s*_t):

* I*_t, the target information set: (field, value) pairs the user reveals in the future
  segment that were not known in the context. An extractor produces it:

  - :class:`RulesExtractor` (offline default), grounded in the source's annotations: the
    values revealed after t that the dialogue goes on to use (they hold in the final state;
    a value the user later replaces is not a target), and that the context did not hold;
  - :class:`LLMExtractor`, the paper's extractor prompt (appendix G) through any backend
    that completes a conversation, decoded deterministically, its reply read as JSON
    ``{"info": [{"field", "value"}]}``. A reply that is not that, or names an item with no
    word in the future segment (:func:`ground`), is a failure with its reason, never turned
    into a string of garbage.

  No extractor is asked about a future without a user message: nothing can be revealed
  there, and eq. 1 sets I*_{T_C} = {} for the last turn.
* s*_t, the stopping decision, by ``stop_when``:

  - ``no_info`` (the paper, eq. 2): STOP when nothing is left to collect (I*_t empty);
  - ``no_user_reply`` (the reference code): STOP when no user message follows. A CONTINUE
    sample with an empty I*_t has no valid content reward and is dropped (``empty_info``),
    as the paper's appendix F.1 drops them.

Dropped samples stay in the output with ``failure`` set (``empty_info``, ``unannotated``,
``invalid_output``, ``ungrounded`` or ``llm_<reason>``) and no target, so every drop is counted and auditable.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from pipelines.learn_to_ask.autoprompt import Prompt
from pipelines.learn_to_ask.logs import ASSISTANT, USER, Message, Session

CONTINUE, STOP = "continue", "stop"
DECISIONS: tuple[str, ...] = (CONTINUE, STOP)
STOP_RULES: tuple[str, ...] = ("no_info", "no_user_reply")
EMPTY_INFO = "empty_info"
UNANNOTATED = "unannotated"
INVALID_OUTPUT = "invalid_output"
UNGROUNDED = "ungrounded"
#: Failure reasons; an LLM call that failed adds ``llm_<reason>`` (pipelines.llm.FAILURE_REASONS).
FAILURES: tuple[str, ...] = (EMPTY_INFO, UNANNOTATED, INVALID_OUTPUT, UNGROUNDED)

Info = tuple[tuple[str, str], ...]


@dataclass(frozen=True)
class Point:
    """Assistant turn ``turn`` (its index in ``session.messages``) of ``session``."""

    session: Session
    turn: int

    @property
    def context(self) -> tuple[Message, ...]:
        return self.session.messages[: self.turn]

    @property
    def future(self) -> tuple[Message, ...]:
        return self.session.messages[self.turn :]

    @property
    def user_replies(self) -> bool:
        return any(m.role == USER for m in self.future)


@dataclass(frozen=True)
class Extraction:
    """An extractor's answer for one point: ``info`` or a ``failure`` reason (and detail)."""

    info: Info | None
    failure: str | None = None
    detail: str | None = None


@dataclass(frozen=True)
class Sample:
    """One Learn-to-Ask sample. ``info_truth`` and ``decision_truth`` are None when the
    extraction failed; ``failure`` is None exactly for the samples training may use."""

    session_id: str
    split: str | None
    turn: int
    goal: str
    context: tuple[Message, ...]
    future: tuple[Message, ...]
    info_truth: Info | None
    decision_truth: str | None
    extractor: str
    failure: str | None = None
    failure_detail: str | None = None

    @property
    def expert_reply(self) -> str:
        """a_t, the expert's actual next turn (the SFT baseline's target)."""
        return self.future[0].content


class Extractor(Protocol):
    name: str

    def extract(self, points: Sequence[Point]) -> list[Extraction]: ...


# --- Rules -----------------------------------------------------------------------------------


def _state(messages: Sequence[Message]) -> dict[str, str]:
    state: dict[str, str] = {}
    for message in messages:
        for field, value in message.info or ():
            state[field] = value
    return state


def annotated_targets(point: Point) -> Info:
    """I*_t from the annotations (module docstring), in the order the future reveals them."""
    known, final = _state(point.context), _state(point.session.messages)
    targets: list[tuple[str, str]] = []
    for message in point.future:
        for item in message.info or ():
            field, value = item
            if final.get(field) == value and known.get(field) != value and item not in targets:
                targets.append(item)
    return tuple(targets)


class RulesExtractor:
    """I*_t from the source's annotations (module docstring); a session whose user
    messages are not all annotated fails with ``unannotated`` rather than being guessed."""

    name = "rules"

    def extract(self, points: Sequence[Point]) -> list[Extraction]:
        return [
            Extraction(annotated_targets(p)) if p.session.annotated
            else Extraction(None, UNANNOTATED, "a user message has no info annotation; use an LLM extractor")
            for p in points
        ]


# --- LLM -------------------------------------------------------------------------------------

EXTRACTOR_SYSTEM = (
    "You are an expert information analyst. Your task is to identify the new, goal-relevant "
    "information a professional gathered in a conversation."
)
EXTRACTOR_INSTRUCTION = (
    "Based on the [Future Conversation], list the critical new pieces of information the "
    "assistant elicited from the user, which were not in the [Current Context]. Leave out "
    "generic information that any conversation would collect."
)
EXTRACTOR_FORMAT = (
    'Answer with JSON only: {"info": [{"field": "<what the information is about>", "value": "<what the user said>"}]}; '
    '{"info": []} when the user revealed nothing new.'
)
#: The reply's JSON schema (the openai backend enforces it; every reply is checked against it).
EXTRACTION_SCHEMA: Mapping[str, Any] = {
    "type": "object",
    "properties": {
        "info": {
            "type": "array",
            "items": {
                "type": "object",
                "properties": {"field": {"type": "string", "minLength": 1}, "value": {"type": "string", "minLength": 1}},
                "required": ["field", "value"],
                "additionalProperties": False,
            },
        }
    },
    "required": ["info"],
    "additionalProperties": False,
}


def _transcript(messages: Sequence[Message]) -> str:
    return "\n".join(f'{"User" if m.role == USER else "Assistant"}: "{m.content}"' for m in messages) or "(nothing yet)"


def case_text(goal: str, context: Sequence[Message], future: Sequence[Message]) -> str:
    """One extraction case as the extractor reads it: the goal, the context, the future."""
    return (
        f"[Goal] {goal or '(not given)'}\n\n"
        f"[Current Context]\n{_transcript(context)}\n\n"
        f"[Future Conversation]\n{_transcript(future)}"
    )


#: The worked example of the paper's seed prompt (appendix G), shown as one exchange before
#: the real request: a small instruct model copies its output format.
EXAMPLE_CASE = case_text(
    "The user wants to find medication for a cold with a cough.",
    (Message(USER, "I have a cold and a bad cough."),
     Message(ASSISTANT, "Okay, I understand. To help you better, I need more details.")),
    (Message(ASSISTANT, "Do you have a fever?"), Message(USER, "No, no fever."),
     Message(ASSISTANT, "Is your cough productive, meaning are you coughing up phlegm?"),
     Message(USER, "Yes, and it's yellow.")),
)
EXAMPLE_REPLY = json.dumps({"info": [
    {"field": "fever", "value": "absent"}, {"field": "type of cough", "value": "productive"},
    {"field": "color of phlegm", "value": "yellow"},
]})
#: The seed extractor prompt (appendix G): what Auto-Prompt's EXTRACT track starts from.
SEED_EXTRACTOR_PROMPT = Prompt(EXTRACTOR_INSTRUCTION, examples=((EXAMPLE_CASE, EXAMPLE_REPLY),), rules=(EXTRACTOR_FORMAT,))


def _request(case: str, prompt: Prompt) -> str:
    rules = "\n".join(f"- {rule}" for rule in prompt.rules) or "- (none)"
    return f"{case}\n\n[Instruction] {prompt.instruction}\n\n[Output Format]\n{rules}"


def extractor_messages(case: str, prompt: Prompt = SEED_EXTRACTOR_PROMPT) -> list[dict[str, str]]:
    """The extractor's conversation for one case (:func:`case_text`): the prompt's few-shot
    examples as earlier exchanges, each with the prompt's instruction and output rules,
    then the case itself."""
    messages = [{"role": "system", "content": EXTRACTOR_SYSTEM}]
    for example_case, reply in prompt.examples:
        messages += [{"role": "user", "content": _request(example_case, prompt)}, {"role": "assistant", "content": reply}]
    return messages + [{"role": "user", "content": _request(case, prompt)}]


_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_extraction(text: str) -> Extraction:
    """The reply as an :class:`Extraction`: the outermost JSON object in it (a model may
    wrap it in a code fence), checked against :data:`EXTRACTION_SCHEMA`; anything else is
    ``invalid_output`` with what was wrong.

    >>> parse_extraction('{"info": [{"field": "fever", "value": "absent"}]}').info
    (('fever', 'absent'),)
    >>> parse_extraction('- fever: absent').failure
    'invalid_output'
    """
    found = _JSON_OBJECT.search(text)
    if found is None:
        return Extraction(None, INVALID_OUTPUT, f"no JSON object in the reply: {text[:200]!r}")
    try:
        value = json.loads(found.group(0))
    except json.JSONDecodeError as exc:
        return Extraction(None, INVALID_OUTPUT, f"invalid JSON ({exc.msg}): {text[:200]!r}")
    items = value.get("info") if isinstance(value, dict) and set(value) == {"info"} else None
    if not isinstance(items, list):
        return Extraction(None, INVALID_OUTPUT, f'expected {{"info": [...]}}, got {found.group(0)[:200]!r}')
    info: list[tuple[str, str]] = []
    for item in items:
        if not (isinstance(item, dict) and set(item) == {"field", "value"}
                and all(isinstance(item[k], str) and item[k].strip() for k in ("field", "value"))):
            return Extraction(None, INVALID_OUTPUT, f"an info item is not {{field, value}} strings: {item!r}")
        pair = (item["field"].strip(), item["value"].strip())
        if pair not in info:
            info.append(pair)
    return Extraction(tuple(info))


_WORDS = re.compile(r"[a-z0-9]+")
_FILLER = frozenset("the and for with about any your you are was has have not what which this that type kind".split())


def _words(text: str) -> set[str]:
    return {w for w in _WORDS.findall(text.lower()) if (len(w) > 2 or w.isdigit()) and w not in _FILLER}


def ground(extraction: Extraction, point: Point) -> Extraction:
    """The extraction, or an ``ungrounded`` failure when an item shares no word (field or
    value) with the future segment: the model made it up, e.g. copied the worked example,
    and the whole reply is suspect.

    >>> p = Point(Session("s", (Message(USER, "Hi"), Message(ASSISTANT, "Fever?"), Message(USER, "No."))), 1)
    >>> ground(Extraction((("fever", "absent"),)), p).failure is None
    True
    >>> ground(Extraction((("phlegm colour", "yellow"),)), p).failure
    'ungrounded'
    """
    if not extraction.info:
        return extraction
    said = _words(" ".join(m.content for m in point.future))
    made_up = [item for item in extraction.info if not _words(" ".join(item)) & said]
    if made_up:
        return Extraction(None, UNGROUNDED, f"item(s) with no word in the future conversation: {made_up!r}")
    return extraction


class LLMExtractor:
    """The paper's extractor through ``complete``: conversations in, one reply each out,
    a reply being the text or a ``(reason, detail)`` pair for a call that failed (recorded
    as ``llm_<reason>``). ``name`` is the backend's (``hf``, ``openai``)."""

    def __init__(self, complete: Callable[[list[list[dict[str, str]]]], list[Any]], name: str,
                 prompt: Prompt = SEED_EXTRACTOR_PROMPT):
        self.complete = complete
        self.name = name
        self.prompt = prompt

    def extract(self, points: Sequence[Point]) -> list[Extraction]:
        results: list[Extraction | None] = [None if p.user_replies else Extraction(()) for p in points]
        asked = [i for i, r in enumerate(results) if r is None]
        cases = [case_text(points[i].session.goal, points[i].context, points[i].future) for i in asked]
        replies = self.complete([extractor_messages(case, self.prompt) for case in cases]) if asked else []
        if len(replies) != len(asked):
            raise RuntimeError(f"{self.name} extractor: {len(replies)} replies for {len(asked)} conversations")
        for i, reply in zip(asked, replies):
            if isinstance(reply, tuple):
                reason, detail = reply
                results[i] = Extraction(None, f"llm_{reason}", detail)
            else:
                results[i] = ground(parse_extraction(reply), points[i])
        return [r for r in results if r is not None]


# --- Samples ---------------------------------------------------------------------------------


def points(session: Session) -> list[Point]:
    """Every assistant turn after the session's first user message (a greeting before the
    user has spoken has no context to act on)."""
    first_user = next((i for i, m in enumerate(session.messages) if m.role == USER), None)
    if first_user is None:
        return []
    return [Point(session, t) for t, m in enumerate(session.messages) if m.role == ASSISTANT and t > first_user]


def decide(point: Point, info: Info, stop_when: str) -> tuple[str, str | None]:
    """s*_t and the drop reason (``empty_info``) for an extracted I*_t (module docstring)."""
    if stop_when == "no_info":
        return (STOP if not info else CONTINUE), None
    if stop_when == "no_user_reply":
        if not point.user_replies:
            return STOP, None
        return CONTINUE, (EMPTY_INFO if not info else None)
    raise ValueError(f"stop_when must be one of {list(STOP_RULES)}, got {stop_when!r}")


def hindsight_samples(sessions: Sequence[Session], extractor: Extractor, stop_when: str = "no_info") -> list[Sample]:
    """One sample per point of every session, in session and turn order (module docstring)."""
    if stop_when not in STOP_RULES:
        raise ValueError(f"stop_when must be one of {list(STOP_RULES)}, got {stop_when!r}")
    all_points = [p for s in sessions for p in points(s)]
    extractions = extractor.extract(all_points)
    if len(extractions) != len(all_points):
        raise RuntimeError(f"extractor {extractor.name!r} returned {len(extractions)} results for {len(all_points)} points")
    samples = []
    for point, extraction in zip(all_points, extractions):
        session = point.session
        common = dict(session_id=session.session_id, split=session.split, turn=point.turn, goal=session.goal,
                      context=point.context, future=point.future, extractor=extractor.name)
        if extraction.info is None:
            samples.append(Sample(**common, info_truth=None, decision_truth=None,
                                  failure=extraction.failure, failure_detail=extraction.detail))
            continue
        decision, dropped = decide(point, extraction.info, stop_when)
        samples.append(Sample(**common, info_truth=extraction.info, decision_truth=decision, failure=dropped,
                              failure_detail="CONTINUE with nothing to collect has no content reward" if dropped else None))
    return samples
