"""Clarification insertion: an ``<asking>…</asking>`` + ``<response>…</response>`` pair after
each selected step, placed by character offset (the released code replaced the first match
of the step's text, which lands in the wrong place when a step's text occurs twice).

The question and the simulated user's answer come from an :class:`Inserter`:

* :class:`RulesInserter` (offline): a pair after every selected step, the question written
  from the step's own text (the slot it commits to, else a generic question about it) and
  answered by the simulated user from its goal. It never reads the trace's ground-truth
  assumption steps: a misplaced pick keeps its (misplaced) question, as the method makes it;
* :class:`LLMInserter`: an instruction-following LLM with the paper's insertion prompt
  (appendix A.5, Table 7): history, the reasoning so far and the final answer in, one
  ``Assistant: … / User: …`` round out.
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from typing import Mapping, Protocol, Sequence

from pipelines.episodes.formats import ASK_CLOSE, ASK_OPEN, RESPONSE_CLOSE, RESPONSE_OPEN
from pipelines.pir.traces import Trace, committed_value, split_steps
from pipelines.speaker import phrasing

LLM_FAILURE = "llm_failure"
UNPARSABLE = "unparsable"


@dataclass(frozen=True)
class Insertion:
    """One pair to insert after step ``step``; ``question`` and ``answer`` are plain text."""

    step: int
    question: str
    answer: str


@dataclass(frozen=True)
class Skipped:
    """A selected step that got no pair, and why."""

    step: int
    reason: str


def render_pair(question: str, answer: str) -> str:
    return f"{ASK_OPEN}{question.strip()}{ASK_CLOSE}\n{RESPONSE_OPEN}{answer.strip()}{RESPONSE_CLOSE}"


def insert_pairs(reasoning: str, insertions: Sequence[Insertion]) -> str:
    """``reasoning`` with each insertion's pair as a paragraph right after its step, by the
    step's end offset; at most one pair per step.

    >>> insert_pairs("Step one.\\n\\nStep one.\\n\\nDone.", [Insertion(1, "Which?", "That.")])
    'Step one.\\n\\nStep one.\\n\\n<asking>Which?</asking>\\n<response>That.</response>\\n\\nDone.'
    """
    spans = split_steps(reasoning)
    steps = [i.step for i in insertions]
    if len(set(steps)) != len(steps):
        raise ValueError(f"more than one insertion for a step: {sorted(steps)}")
    text = reasoning
    # Right to left: an insertion never moves the offsets of the ones still to come.
    for insertion in sorted(insertions, key=lambda i: -i.step):
        if not 0 <= insertion.step < len(spans):
            raise ValueError(f"step {insertion.step} out of range (the reasoning has {len(spans)} steps)")
        end = spans[insertion.step][1]
        text = f"{text[:end]}\n\n{render_pair(insertion.question, insertion.answer)}{text[end:]}"
    return text


class Inserter(Protocol):
    name: str

    def insertions(self, traces: Sequence[Trace], selected: Sequence[Sequence[int]]) -> list[list[Insertion | Skipped]]:
        """Per trace, one Insertion or Skipped per selected step, in step order."""
        ...


class RulesInserter:
    """The offline inserter: a pair after EVERY selected step, whatever the trace's
    ground-truth annotations say (it never reads :attr:`Trace.assumption_steps`; a wrong
    pick gets its question as the method would write it).

    The question comes from the step's own text and the input the agent saw: the value the
    step commits to (:func:`pipelines.pir.traces.committed_value`), else an option of the
    input's listed values, else a slot the step names, gives a question about that slot
    (offering the input's values); a step about none of these gets a generic question about
    its content. The simulated user answers from its goal (:attr:`Trace.user_goal`): the
    goal's value of the slot asked, no preference for a slot its goal does not constrain, and
    for a generic question a confirmation of the goal values the step mentions, else that it
    does not know."""

    name = "rules"

    def __init__(self, seed: int = 0):
        self.seed = seed

    def insertions(self, traces: Sequence[Trace], selected: Sequence[Sequence[int]]) -> list[list[Insertion | Skipped]]:
        out: list[list[Insertion | Skipped]] = []
        for trace, steps in zip(traces, selected):
            if trace.user_goal is None:
                raise ValueError(
                    f"trace {trace.trace_id!r} ({trace.source}): the rules inserter needs askflow's embedded traces, "
                    "whose simulated user has a goal; use an LLM inserter for traces from a file"
                )
            spans = split_steps(trace.reasoning)
            row: list[Insertion | Skipped] = []
            for step in sorted(steps):
                if not 0 <= step < len(spans):
                    raise ValueError(f"trace {trace.trace_id!r}: step {step} out of range (the reasoning has {len(spans)} steps)")
                rng = random.Random(f"{self.seed}:{trace.trace_id}:{step}")
                text = trace.reasoning[slice(*spans[step])]
                question, answer = rules_pair(rng, trace.input, trace.domain or "", text, trace.user_goal)
                row.append(Insertion(step, question, answer))
            out.append(row)
        return out


_LISTED = re.compile(r"Values of the matches:\s*(?P<body>.*?)\.?\s*$", re.MULTILINE)
_EARLIER = re.compile(r"Earlier in the conversation:\s*(?P<a>.+?) and (?P<b>.+?)\.\s*$", re.MULTILINE)
_SLOT_OF_WORD = {word: slot for slot, word in phrasing.SLOT_WORDS.items()}
_TIME_SLOTS = ("leaveAt", "arriveBy")


def listed_options(text: str) -> dict[str, list[str]]:
    """The slots and values an input lists for the matches (``Values of the matches: area:
    centre, north; price range: cheap ...``), by slot name.

    >>> listed_options("Database (hotel): 9 matches. Values of the matches: area: centre, north; price range: cheap, expensive ....")
    {'area': ['centre', 'north'], 'pricerange': ['cheap', 'expensive']}
    """
    match = _LISTED.search(text)
    options: dict[str, list[str]] = {}
    for part in (match["body"].split("; ") if match else []):
        word, _, values = part.partition(": ")
        slot = _SLOT_OF_WORD.get(word.strip())
        if slot and values:
            options[slot] = [v.strip() for v in values.replace("...", "").split(",") if v.strip()]
    return options


def _mentions(text: str, phrase: str) -> bool:
    return re.search(rf"(?<!\w){re.escape(phrase)}(?!\w)", text, re.IGNORECASE) is not None


def step_slot(step: str, input_text: str) -> str | None:
    """The slot a step is about, from its text and the input alone: the value it commits to,
    else an option of the input's listed values it mentions, else a listed slot it names.

    >>> listed = "Values of the matches: area: centre, north; price range: cheap, moderate."
    >>> [step_slot(s, listed) for s in ("I'll go with the north of town.", "A cheap one, then.", "They differ in price range.", "I'll suggest amber inn.")]
    ['area', 'pricerange', 'pricerange', None]
    """
    committed = committed_value(step)
    if committed:
        return committed[0]
    options = listed_options(input_text)
    for slot, values in options.items():
        if any(_mentions(step, v) for v in values):
            return slot
    for slot in options:
        if _mentions(step, phrasing.SLOT_WORDS.get(slot, slot)):
            return slot
    return None


def rules_pair(rng: random.Random, input_text: str, domain: str, step: str, goal: Mapping[str, str]) -> tuple[str, str]:
    """The rules inserter's question after ``step`` and the simulated user's answer from
    ``goal`` (:class:`RulesInserter`).

    >>> listed = "Database (hotel): 5 matches. Values of the matches: area: centre, north."
    >>> rules_pair(random.Random(0), listed, "hotel", "I will look in the centre.", {"area": "north"})[1]
    'The north, please.'
    >>> rules_pair(random.Random(0), listed, "hotel", "I will look in the centre.", {"parking": "yes"})[1]
    "I don't mind about the area."
    >>> print(*rules_pair(random.Random(0), listed, "hotel", "I'll suggest amber inn.", {"area": "north"}), sep="\\n")
    I was going to say: "I'll suggest amber inn." Is there anything I should know about that?
    I don't know, I have no preference about that.
    """
    slot = step_slot(step, input_text)
    if slot == "departure" or (slot is None and domain == "taxi" and committed_value(step)):
        places = _EARLIER.search(input_text)
        a, b = (places["a"], places["b"]) if places else ("the first place", "the second")
        question = phrasing.pick(rng, (f"Should the taxi go from {a} to {b}, or from {b} to {a}?",
                                       "Where should the taxi pick you up, and where are you going?"))
        if "departure" in goal and "destination" in goal:
            return question, phrasing.taxi_answer(rng, goal["departure"], goal["destination"])
        return question, phrasing.no_preference(rng, "departure")
    if slot is not None:
        question = phrasing.question(rng, domain, slot, listed_options(input_text).get(slot, ()))
        wanted = [s for s in (_TIME_SLOTS if slot in _TIME_SLOTS else (slot,)) if s in goal]
        if wanted:
            return question, phrasing.answer(rng, domain, {s: goal[s] for s in wanted})
        return question, phrasing.no_preference(rng, slot)
    question = f'I was going to say: "{step}" Is there anything I should know about that?'
    said = [value for value in goal.values() if _mentions(step, value)]
    if said:
        return question, phrasing.capitalise(f"yes, {phrasing.join(said)}.")
    return question, "I don't know, I have no preference about that."


# The paper's insertion prompt (appendix A.5, Table 7), verbatim apart from the layout.
INSERTION_PROMPT = """Your task is to transform the given "self-thinking process" and "final answer", together with the possible "dialogue history", into a single round of interactive Assistant–User dialogue, in order to enhance interactivity.

## 1. Rules:
1. Dialogue Generation:
  - Generate one round: Assistant asks, User answers.
  - Must fully reflect the reasoning logic and conclusion.
  - Do not add information absent from the reasoning/answer/history.

## 2. Questioning Rules
- If reasoning shows ambiguity, multiple options, or missing info: ask the User.
- If multiple options: let the User choose (must match final answer).
- If missing info: ask the User to provide it.
- No omissions: each gap = a question.

## 3. Expression Standards
- Questions should be natural, human-like, and context-relevant.
- After each question, provide a simulated User reply consistent with the final answer.
- Dialogue must convey actual information, not empty agreement.
- Format strictly:
  - Assistant: ...
  - User: ...
- No fabrication beyond given reasoning/answer.
- Keep concise, no redundancy.

## 4. Dialogue History
- Input may contain history (or be empty).
- Respect history: avoid repetition, ensure coherence.
- If history solved a point, don't repeat. If unresolved, follow-up required.
- If history already provides info, omit and focus on remaining gaps.
- If no history, directly use reasoning + final answer.

## 5. Input & Output
- Input includes: history (str), self-thinking process (question), final answer (answer).
- Output: exactly one round of Assistant–User dialogue that meets these rules."""

_ROUND = re.compile(r"^\W*Assistant\W*:\s*(?P<q>.+?)\s*^\W*User\W*:\s*(?P<a>.+?)\s*$", re.DOTALL | re.MULTILINE | re.IGNORECASE)


def insertion_messages(trace: Trace, step: int, history: Sequence[Insertion]) -> list[dict[str, str]]:
    """The chat for the pair after ``step``: the reasoning up to and including it, the final
    answer, and the pairs inserted before it in this trace as the history."""
    end = split_steps(trace.reasoning)[step][1]
    history_text = "\n".join(f"Assistant: {h.question}\nUser: {h.answer}" for h in history)
    user = (f"history:\n{history_text}\n\nself-thinking process:\n{trace.input}\n\n{trace.reasoning[:end]}\n\n"
            f"final answer:\n{trace.content}")
    return [{"role": "system", "content": INSERTION_PROMPT}, {"role": "user", "content": user}]


def parse_round(text: str) -> tuple[str, str] | None:
    """(question, answer) from an ``Assistant: … / User: …`` round; None when it is not one.

    >>> parse_round("- Assistant: Which area?\\n- User: The north, please.")
    ('Which area?', 'The north, please.')
    >>> parse_round("Sure!") is None
    True
    """
    match = _ROUND.search(text.strip())
    if not match:
        return None
    question, answer = match["q"].strip(), match["a"].strip()
    return (question, answer) if question and answer else None


class LLMInserter:
    """The paper's insertion by an instruction-following LLM through :class:`pipelines.llm.LLMClient`
    (role ``pir_inserter``). The k-th selected steps of all traces go out together, so each
    call sees the pairs inserted before it in its trace. A failed call or an unparsable reply
    skips that step (counted by reason); ``failures`` counts the client's failures for the
    stage's outage check."""

    name = "openai"
    role = "pir_inserter"

    def __init__(self, client, sampling, seed: int = 0):
        self.client = client
        self.sampling = sampling
        self.seed = seed
        self.failures = 0

    def insertions(self, traces: Sequence[Trace], selected: Sequence[Sequence[int]]) -> list[list[Insertion | Skipped]]:
        from pipelines.llm import CompletionRequest

        out: list[list[Insertion | Skipped]] = [[] for _ in traces]
        rounds = max((len(s) for s in selected), default=0)
        for k in range(rounds):
            todo = [(t, sorted(selected[t])[k]) for t in range(len(traces)) if len(selected[t]) > k]
            requests = [
                CompletionRequest(
                    insertion_messages(traces[t], step, [i for i in out[t] if isinstance(i, Insertion)]),
                    self.role, self.sampling, self.seed,
                )
                for t, step in todo
            ]
            for (t, step), result in zip(todo, self.client.complete_many_sync(requests)):
                if not result.ok:
                    self.failures += 1
                    out[t].append(Skipped(step, LLM_FAILURE))
                    continue
                pair = parse_round(result.text)
                out[t].append(Insertion(step, *pair) if pair else Skipped(step, UNPARSABLE))
        return out
