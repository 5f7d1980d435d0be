"""Clarification insertion: an ``<asking>…</asking>`` + ``<response>…</response>`` pair after
each selected step, placed by character offset (the released code replaced the first match
of the step's text, which lands in the wrong place when a step's text occurs twice).

The question and the simulated user's answer come from an :class:`Inserter`:

* :class:`RulesInserter` (offline): the question about the constraint the step assumed and
  the goal's answer (:attr:`pipelines.pir.traces.Trace.asks`). A selected step that assumed
  nothing gets no pair, and is counted, rather than a question the goal cannot ground;
* :class:`LLMInserter`: an instruction-following LLM with the paper's insertion prompt
  (appendix A.5, Table 7): history, the reasoning so far and the final answer in, one
  ``Assistant: … / User: …`` round out.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Protocol, Sequence

from pipelines.pir.traces import Trace, split_steps

ASK_OPEN, ASK_CLOSE = "<asking>", "</asking>"
RESPONSE_OPEN, RESPONSE_CLOSE = "<response>", "</response>"
NO_GROUNDED_QUESTION = "no_grounded_question"
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
    """Questions grounded in the goal: only an assumption step has one (module docstring)."""

    name = "rules"

    def insertions(self, traces: Sequence[Trace], selected: Sequence[Sequence[int]]) -> list[list[Insertion | Skipped]]:
        out: list[list[Insertion | Skipped]] = []
        for trace, steps in zip(traces, selected):
            if trace.assumption_steps is None:
                raise ValueError(
                    f"trace {trace.trace_id!r} ({trace.source}): the rules inserter needs askflow's embedded traces, "
                    "which know each step's assumption; use an LLM inserter for traces from a file"
                )
            row: list[Insertion | Skipped] = []
            for step in sorted(steps):
                ask = trace.asks.get(step)
                row.append(Insertion(step, ask.question, ask.answer) if ask else Skipped(step, NO_GROUNDED_QUESTION))
            out.append(row)
        return out


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
