"""The Learn-to-Ask reward (paper eq. 5 with appendix F.3; the reference's concrete scoring).

For a policy output (a_t, s_t) at a sample with target (I*_t, s*_t)::

    wrong decision (s_t != s*_t)         0
    right CONTINUE                       1 + beta * content + format
    right STOP                           1 + beta + (1 if the output is exactly <stop /> else 0)

``beta`` = 2 by default (maximum 4). The output decides STOP when it contains the stop token
``<stop />`` (also written ``<stop/>``), CONTINUE otherwise. ``format`` (Omega for CONTINUE)
is 1 for exactly one question, 0.5 for two, 0 for none or more (a run of question marks is
one). ``content`` (R_a, eq. 3) comes from a grader, in {0, 0.5, 1}: the question targets an
item of I*_t precisely (1), is relevant to it but not precise (0.5), or is irrelevant (0).
Precise means coverage and precision: the rules grader gives a question that hits I*_t but
also asks about slots outside it 0.5 (at most as many outside as inside) or 0 (more), so one
fixed question listing every slot (:data:`CATCH_ALL_QUESTION`) no longer earns the maximum.

:class:`RulesGrader` verifies the question against I*_t (the ``grader`` role's ``rules``
backend): MultiWOZ slot fields through the slot cues of :mod:`pipelines.rewards.verifiable`,
other fields by their words. A grader that cannot score (a malformed or empty reference; an
LLM grader's unreadable reply) gives ``None`` for that sample, which TRL leaves out, and the
reward counts it in ``failures`` by reason: never a silent 0, nor the reference's silent 1.

The registry's rewards: ``l2a`` (the rules grader on the whole output) and ``l2a_questions``
(:class:`QuestionGrader`: R_a on the output's questions only, as the held-out metrics score it).

Dataset columns: ``decision_truth`` (``continue`` / ``stop``) and ``info_truth`` (a list of
``{field, value}``, as ``l2a_samples`` stores it; ``[field, value]`` pairs or a JSON string
of either are read too).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from pipelines.errors import DataError
from pipelines.multiwoz.ontology import BOOK_SLOTS, INFO_SLOTS
from pipelines.rewards.format import completion_text
from pipelines.rewards.verifiable import asked_slots, canonical_slot, words

logger = logging.getLogger(__name__)

CONTINUE, STOP = "continue", "stop"
STOP_TOKEN = "<stop />"
BETA = 2.0
DECISION_TRUTH, INFO_TRUTH = "decision_truth", "info_truth"
NO_QUESTION = "no_question"

_STOP = re.compile(r"<stop\s*/>")
_QUESTIONS = re.compile(r"\?+")
# Words that say nothing about what a free-form field is ("type of cough": "cough").
_FILLER = frozenset("a an the of on in at to for and or with about any your you is are was do does did has have".split())

Item = tuple[str, str]


def decision(text: str) -> str:
    """``stop`` when the output contains the stop token, else ``continue``.

    >>> decision("<stop />"), decision("Which area? <stop/>"), decision("Which area?")
    ('stop', 'stop', 'continue')
    """
    return STOP if _STOP.search(text) else CONTINUE


def format_score(text: str) -> float:
    """Omega for a CONTINUE output: 1 for one question, 0.5 for two, 0 otherwise.

    >>> format_score("Which area?"), format_score("Which area?? And price?"), format_score("Tell me more.")
    (1.0, 0.5, 0.0)
    """
    return {1: 1.0, 2: 0.5}.get(len(_QUESTIONS.findall(text)), 0.0)


@dataclass(frozen=True)
class Grade:
    """A grader's content score (None: it could not score) and the reason for it."""

    score: float | None
    reason: str


class Grader(Protocol):
    """``grade(question, info, context)``: the content score of the last assistant message
    ``question`` against I*_t ``info``; ``context`` is the sample's prompt as TRL passes it
    (a string or a list of messages), for graders that read the dialogue."""

    name: str

    def grade(self, question: str, info: Sequence[Item], context: Any = None) -> Grade: ...


# --- The rules grader --------------------------------------------------------------------------

PRECISE, RELEVANT, IRRELEVANT, EMPTY_REFERENCE = "targets_item", "relevant_not_precise", "irrelevant", "empty_reference"
#: Reasons of a question that hits an item of I*_t but also asks about slots outside it:
#: at most half of what it asks is beyond I*_t (0.5), or more than half is (0).
BEYOND_TARGET, MOSTLY_BEYOND_TARGET = "beyond_target", "mostly_beyond_target"
_DOMAIN_SLOTS: Mapping[str, frozenset[str]] = {
    domain: frozenset(INFO_SLOTS.get(domain, ())) | frozenset(BOOK_SLOTS.get(domain, ())) for domain in INFO_SLOTS
}

#: One fixed question that names every slot's cue words, asked whatever the context: the
#: reference row ``catch_all`` of ``l2a_eval``, and what a grader that rewards coverage alone
#: scores as a precise question nearly every time.
CATCH_ALL_QUESTION = (
    "Could you tell me the area, price range, type of food, name, type, star rating, parking, internet, "
    "number of people, day, time, number of nights, departure station, destination, leave time and arrival time?"
)


#: Slots a question offers as alternatives of one answer ("when do you want to leave or arrive
#: by?"): asking about the other one of a target's alternatives is not beyond I*_t.
_ALTERNATIVES: Mapping[str, str] = {"leaveAt": "travel_time", "arriveBy": "travel_time"}


def _content_words(text: str) -> set[str]:
    return {w for w in words(text).split() if len(w) > 2 and w not in _FILLER}


def _slot(field: str) -> tuple[str | None, str | None]:
    """(domain, canonical slot) of a MultiWOZ belief-state field, else (None, None)."""
    domain = field.split("-", 1)[0] if "-" in field else None
    try:
        return (domain if domain in _DOMAIN_SLOTS else None), canonical_slot(field)
    except ValueError:
        return None, None


def precision_grade(hits: int, beyond: int) -> Grade:
    """The grade of a question that asks about ``hits`` items of I*_t and ``beyond`` slots
    outside it: precision hits / (hits + beyond) of 1 scores 1, of at least 1/2 scores 0.5,
    below that 0 (a question that lists every slot hits I*_t nearly always, at a precision
    near 0).

    >>> precision_grade(1, 0), precision_grade(1, 1).score, precision_grade(2, 13).score
    (Grade(score=1.0, reason='targets_item'), 0.5, 0.0)
    """
    if hits < 1:
        raise ValueError(f"precision_grade: expected at least one hit, got {hits}")
    if beyond == 0:
        return Grade(1.0, PRECISE)
    if hits >= beyond:
        return Grade(0.5, BEYOND_TARGET)
    return Grade(0.0, MOSTLY_BEYOND_TARGET)


class RulesGrader:
    """Content against I*_t, verifiable (module docstring), coverage and precision:

    ======  ================================================================================
    1       it asks about an item's slot (MultiWOZ fields: the slot's cue words or a choice of
            its values) or names a free-form item's field, and about no slot outside I*_t
    0.5     it hits an item but asks about as many slots outside I*_t as inside, or at most
            that many (``beyond_target``); or it hits none but asks about another slot of an
            item's domain, or names an item's value
    0       anything else, including a question that hits an item while most of what it asks
            is outside I*_t (``mostly_beyond_target``: a catch-all list of slots)
    ======  ================================================================================

    The slots a question asks about are read by the MultiWOZ slot cues
    (:func:`pipelines.rewards.verifiable.asked_slots`); a free-form field (a chat log's
    "fever") counts as a hit when the question names it, and free-form fields outside I*_t
    are not seen, so precision is over MultiWOZ slots only. A departure and an arrival time
    are alternatives: "leave or arrive by?" is not beyond a target that holds either.

    >>> grader = RulesGrader()
    >>> grader.grade("What area would you like?", [("restaurant-area", "north")]).score
    1.0
    >>> grader.grade("What area and price range would you like?", [("restaurant-area", "north")])
    Grade(score=0.5, reason='beyond_target')
    >>> grader.grade(CATCH_ALL_QUESTION, [("restaurant-area", "north"), ("restaurant-food", "thai")])
    Grade(score=0.0, reason='mostly_beyond_target')
    >>> grader.grade("How many people?", [("restaurant-area", "north")]).score
    0.5
    >>> grader.grade("When do you want to leave or arrive by?", [("train-arriveBy", "12:00")]).score
    1.0
    >>> grader.grade("Do you have a fever?", [("fever", "absent")]).score
    1.0
    """

    name = "rules"

    def grade(self, question: str, info: Sequence[Item], context: Any = None) -> Grade:
        if not info:
            return Grade(None, EMPTY_REFERENCE)
        asked = asked_slots(question)
        said = _content_words(question)
        slots, domains, free_hits = set(), set(), 0
        for field, value in info:
            domain, slot = _slot(field)
            if slot is not None:
                slots.add(slot)
                if domain is not None:
                    domains.add(domain)
            elif _content_words(field) & said:
                free_hits += 1
        hits = len(asked & slots) + free_hits
        if hits:
            covered = {_ALTERNATIVES.get(s, s) for s in slots}
            return precision_grade(hits, sum(_ALTERNATIVES.get(s, s) not in covered for s in asked))
        related = {s for s in asked if any(s in _DOMAIN_SLOTS[d] for d in domains)}
        if related and len(related) >= len(asked - related):
            return Grade(0.5, RELEVANT)
        if not asked and any(_content_words(v) & said for _, v in info):
            return Grade(0.5, RELEVANT)
        return Grade(0.0, IRRELEVANT)


# --- R_a on the output's questions only (the held-out metrics' grading and ``l2a_questions``)

# A question: a run of text ending in question marks, after the previous sentence's end or a line break.
_QUESTION_TEXT = re.compile(r"[^.!?\n]*\?+")


def questions(text: str) -> list[str]:
    """The questions of an output, in order.

    >>> questions("I have 5 hotels. Which area would you like? Or a price range?")
    ['Which area would you like?', 'Or a price range?']
    >>> questions('<tool_call>{"arguments": {"area": "north"}}</tool_call>')
    []
    """
    return [q.strip() for q in _QUESTION_TEXT.findall(text) if q.strip(" ?")]


class QuestionGrader:
    """``grader`` on the output's questions only; 0 (``no_question``) when it asks none.

    >>> grader = QuestionGrader(RulesGrader())
    >>> area = [("hotel-area", "north")]
    >>> grader.grade("Which area would you like?", area).score, grader.grade("I found 3 hotels in the north area.", area)
    (1.0, Grade(score=0.0, reason='no_question'))
    """

    def __init__(self, grader: Grader):
        self.grader = grader
        self.name = f"{grader.name}_questions"

    def grade(self, question: str, info: Any, context: Any = None) -> Grade:
        asked = questions(question)
        if not asked:
            return Grade(0.0, NO_QUESTION) if info else self.grader.grade(question, info, context)
        return self.grader.grade(" ".join(asked), info, context)


# --- The LLM grader (appendix G's grading prompt) ------------------------------------------------

GRADER_SYSTEM = (
    "You are an evaluation assistant. The user will provide a dialogue history between an assistant and a "
    "user. You must analyze the dialogue and evaluate the assistant's last message."
)
GRADER_INSTRUCTION = (
    "Content Score:\n"
    "- 1.0: The question(s) directly ask about any item in the [Reference Information].\n"
    "- 0.5: The question(s) are highly relevant to, but not directly asking about, any item in the [Reference Information].\n"
    "- 0.0: The question(s) are irrelevant to all items in the [Reference Information]."
)
GRADER_FORMAT = (
    "Output <think>your reasoning in one sentence</think> then <content_score>the score: 1.0, 0.5 or 0.0</content_score>, "
    "and nothing else."
)
_CONTENT_SCORE = re.compile(r"<content_score>\s*([0-9.]+)\s*</content_score>", re.DOTALL)


def _dialogue(context: Any) -> str:
    if isinstance(context, str):
        return context
    lines = [f"{m.get('role', '?')}: {m.get('content', '')}" for m in context or () if isinstance(m, Mapping) and m.get("role") != "system"]
    return "\n".join(lines) or "(nothing yet)"


def grader_case(context: Any, question: str, info: Sequence[Item]) -> str:
    """What the grader reads: the dialogue, the assistant's last message, the reference."""
    reference = "\n".join(f"- {field}: {value}" for field, value in info) or "- (none)"
    return f"[Dialogue]\n{_dialogue(context)}\n\n[Last Message]\n{question}\n\n[Reference Information]\n{reference}"


def parse_grade(text: str) -> Grade:
    r"""The content score in ``<content_score>`` (DOTALL: the tags may span lines); anything
    but 0, 0.5 or 1 there is no grade.

    >>> parse_grade("<think>asks the area</think>\n<content_score>\n1.0\n</content_score>")
    Grade(score=1.0, reason='llm')
    >>> parse_grade("<content_score>0.7</content_score>").score is None
    True
    """
    found = _CONTENT_SCORE.search(text)
    if found is None:
        return Grade(None, "unreadable_grade")
    try:
        value = float(found.group(1))
    except ValueError:
        return Grade(None, "unreadable_grade")
    return Grade(value, "llm") if value in (0.0, 0.5, 1.0) else Grade(None, "grade_out_of_range")


class LLMGrader:
    """The grading prompt of appendix G (content score) through ``complete``: conversations
    in, a reply or a ``(reason, detail)`` failure each out. ``prompt`` is an Auto-Prompt
    :class:`~pipelines.learn_to_ask.autoprompt.Prompt`-like object with ``instruction``,
    ``examples`` ((case, reply) pairs) and ``rules``."""

    def __init__(self, complete: Callable[[list[list[dict[str, str]]]], list[Any]], name: str, prompt: Any):
        self.complete = complete
        self.name = name
        self.prompt = prompt

    def messages(self, case: str) -> list[dict[str, str]]:
        rules = "\n".join(f"- {rule}" for rule in self.prompt.rules) or "- (none)"

        def request(text: str) -> str:
            return f"[Grading Policy]\n{self.prompt.instruction}\n\n{text}\n\n[Output Format]\n{rules}"

        messages = [{"role": "system", "content": GRADER_SYSTEM}]
        for example, reply in self.prompt.examples:
            messages += [{"role": "user", "content": request(example)}, {"role": "assistant", "content": reply}]
        return messages + [{"role": "user", "content": request(case)}]

    def grade_many(self, cases: Sequence[str]) -> list[Grade]:
        replies = self.complete([self.messages(case) for case in cases]) if cases else []
        if len(replies) != len(cases):
            raise RuntimeError(f"{self.name} grader: {len(replies)} replies for {len(cases)} cases")
        return [Grade(None, f"llm_{r[0]}") if isinstance(r, tuple) else parse_grade(r) for r in replies]

    def grade(self, question: str, info: Sequence[Item], context: Any = None) -> Grade:
        if not info:
            return Grade(None, EMPTY_REFERENCE)
        return self.grade_many([grader_case(context, question, info)])[0]


# --- The reward --------------------------------------------------------------------------------


class _Malformed(ValueError):
    pass


def _items(value: Any) -> list[Item]:
    """info_truth as (field, value) pairs; _Malformed for anything else."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError as exc:
            raise _Malformed(f"not valid JSON ({exc.msg})") from None
    if value is None or isinstance(value, (str, bytes)) or not isinstance(value, Sequence):
        raise _Malformed(f"expected a list of {{field, value}}, got {value!r}")
    items = []
    for item in value:
        if isinstance(item, Mapping) and isinstance(item.get("field"), str) and isinstance(item.get("value"), str):
            items.append((item["field"], item["value"]))
        elif isinstance(item, Sequence) and not isinstance(item, str) and len(item) == 2 and all(isinstance(x, str) for x in item):
            items.append((item[0], item[1]))
        else:
            raise _Malformed(f"an item is not a field and a value: {item!r}")
    return items


class L2AReward:
    """The TRL reward callable ``reward(prompts, completions, decision_truth, info_truth,
    **columns) -> list[float | None]`` (module docstring). ``failures`` counts the samples
    a grader could not score, by reason; a ``decision_truth`` other than continue / stop is
    a dataset error (DataError), as a row without a target must never reach training.

    >>> reward = L2AReward(RulesGrader())
    >>> reward(["p"] * 4, ["What area would you like?", "<stop />", "<stop />", "Sure. <stop />"],
    ...        decision_truth=["continue", "continue", "stop", "stop"],
    ...        info_truth=[[{"field": "hotel-area", "value": "north"}], [], [], []])
    [4.0, 0.0, 4.0, 3.0]
    """

    required_columns: tuple[str, ...] = (DECISION_TRUTH, INFO_TRUTH)

    def __init__(self, grader: Grader, beta: float = BETA, name: str = "l2a"):
        self.grader = grader
        self.beta = float(beta)
        self.__name__ = name
        self.failures: Counter[str] = Counter()

    def __repr__(self) -> str:
        return f"L2AReward({self.grader.name}, beta={self.beta})"

    def score(self, completion: Any, truth: Any, info: Any, prompt: Any = None) -> tuple[float | None, str]:
        """The reward of one output and why (``wrong_decision``, ``stop``, a grade reason)."""
        if truth not in (CONTINUE, STOP):
            raise DataError("l2a reward dataset row", f"expected 'continue' or 'stop', got {truth!r}", field=DECISION_TRUTH)
        text = completion_text(completion)
        if decision(text) != truth:
            return 0.0, "wrong_decision"
        if truth == STOP:
            return 1.0 + self.beta + (1.0 if text.strip() == STOP_TOKEN else 0.0), "stop"
        try:
            grade = self.grader.grade(text, _items(info), prompt)
        except _Malformed as exc:
            grade = Grade(None, "malformed_reference")
            logger.warning("%s: info_truth %s", self.__name__, exc)
        if grade.score is None:
            return None, grade.reason
        return 1.0 + self.beta * grade.score + format_score(text), grade.reason

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **columns: Any) -> list[float | None]:
        for column in self.required_columns:
            if column not in columns:
                raise DataError("l2a reward dataset", "the column is missing", field=column)
        if not len(prompts) == len(completions) == len(columns[DECISION_TRUTH]) == len(columns[INFO_TRUTH]):
            raise ValueError("prompts, completions and the target columns differ in length")
        scored = [self.score(c, t, i, p) for p, c, t, i in zip(prompts, completions, columns[DECISION_TRUTH], columns[INFO_TRUTH])]
        unscored = Counter(reason for value, reason in scored if value is None)
        if unscored:
            self.failures.update(unscored)
            logger.warning("%s: %d sample(s) got no score: %s", self.__name__, sum(unscored.values()), dict(unscored))
        log_metric = columns.get("log_metric")
        if log_metric is not None:
            log_metric(f"{self.__name__}/unscored", float(sum(unscored.values())))
        return [value for value, _ in scored]


l2a = L2AReward(RulesGrader())
l2a.__doc__ = """Learn-to-Ask's reward (eq. 5, beta 2) with the rules grader on the whole output; reads l2a_samples' targets.

>>> l2a(["p"] * 2, ["Which area would you like?", "3 hotels are in the north area."],
...     decision_truth=["continue"] * 2, info_truth=[[{"field": "hotel-area", "value": "north"}]] * 2)
[4.0, 3.0]
"""

l2a_questions = L2AReward(QuestionGrader(RulesGrader()), name="l2a_questions")
l2a_questions.__doc__ = """Learn-to-Ask's reward (eq. 5, beta 2) with R_a on the output's questions only (appendix G).

``l2a`` grades the whole output, so an output that asks nothing but names a slot of I*_t (a
tool call's arguments, "I found 3 hotels in the north area.") scores as a precise question:
1 + beta. Here an output without a question gets R_a = 0, as the held-out metrics score it.

>>> l2a_questions(["p"] * 2, ["Which area would you like?", "3 hotels are in the north area."],
...               decision_truth=["continue"] * 2, info_truth=[[{"field": "hotel-area", "value": "north"}]] * 2)
[4.0, 1.0]
"""

#: The registered rewards' examples, run by doctest (an instance's docstring is not collected).
__test__ = {"l2a": l2a.__doc__, "l2a_questions": l2a_questions.__doc__}
