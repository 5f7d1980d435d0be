"""The Clarifier paper's prompts (appendix 7.1) and the parsers of their answers.

* :data:`CLARIFIER_PROMPT`: the Clarifier's instruction with the dialogue so far
  (:func:`pipelines.episodes.clarify.history_text`); its answer is ``NO NEED TO ASK`` or ``YES [QUESTION]...[/QUESTION]``,
  after an optional ``<think>`` (think mode). The paper's template says "answer 'NO'" while
  its data section calls the label "NO NEED TO ASK": askflow asks for the longer label
  (a bare "NO" may begin any sentence) and reads both (:func:`parse_clarifier`).
* :data:`DPO_JUDGE_PROMPT`: the pairwise judge, ``PREFERENCE: A/B/TIE/BOTH_BAD``.
* :data:`GRPO_JUDGE_PROMPT`: the group judge, a 0-10 score per candidate.

History is rendered from episode events (:func:`pipelines.episodes.clarify.history_text`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

from pipelines.config import positive_int
from pipelines.errors import ConfigError

NO_NEED = "NO NEED TO ASK"

CLARIFIER_PROMPT = """You are a Clarification Assistant responsible for determining whether the agent needs to ask a clarifying question.

History:
{history}

Instructions:
Analyze the dialogue and decide whether clarification is needed.
If not needed, answer 'NO NEED TO ASK'.
If needed, answer:
YES [QUESTION]Your clarification question here[/QUESTION]
Ask only one concise question about user intent.
Do not ask about data retrievable from tools.
Do not repeat previous questions.

Expected output: either
- NO NEED TO ASK
or
- YES [QUESTION]...[/QUESTION]
/think"""

DPO_JUDGE_PROMPT = """You are an expert evaluator for clarification questions in customer service scenarios.

User Detailed Requirement: {requirement}

Conversation History:
{history}

Candidate A: {a}
Candidate B: {b}

Evaluate the two candidate clarification decisions above. Consider the following factors:
1. Relevance to the task and missing information.
2. Clarity and specificity.
3. Naturalness and politeness.
4. Likelihood to elicit useful information from the user.

Your task:
1. Think carefully about the evaluation.
2. Select the better question based on the factors above.

Output your judgment in exactly this format:
PREFERENCE: [A/B/TIE/BOTH_BAD]
REASON: [Brief explanation]

Rules:
1. If one question is clearly better, choose A or B.
2. If both are equally good, choose TIE.
3. If both are poor quality, choose BOTH_BAD."""

GRPO_JUDGE_PROMPT = """You are a professional question quality evaluator.

User Requirement: {requirement}

Original Dialogue:
{history}

Candidates:
{candidates}

Rank the {n} clarification decisions above from BEST to WORST based on their quality and relevance.
You must consider the user requirement and original dialogue context carefully.
- Output MUST be in English.
- Rank all {n} questions from best (1) to worst ({n}).
- Assign a score in [0, 10] to each question (higher is better).

Expected output:
"Ranking": [candidate numbers, best first]
"Scores": [one score per candidate, in candidate order]"""

PREFERENCES: tuple[str, ...] = ("A", "B", "TIE", "BOTH_BAD")

_THINK = re.compile(r"^\s*<think>(.*?)</think>", re.DOTALL)
_QUESTION = re.compile(r"^YES\s*\[QUESTION\](.+?)\[/QUESTION\]$", re.DOTALL)
_NO = re.compile(r"^NO(?: NEED TO ASK)?\.?$", re.IGNORECASE)


@dataclass(frozen=True)
class ClarifierDecision:
    """What the Clarifier said at one state: ``question`` (None: no need to ask), its
    reasoning (think mode), the raw text, and ``malformed`` (the answer was neither form:
    treated as no question, and counted)."""

    question: str | None
    reasoning: str = ""
    raw: str = ""
    malformed: bool = False

    @property
    def asks(self) -> bool:
        return self.question is not None

    @property
    def final(self) -> str:
        """The extracted final output the judges see (never the reasoning)."""
        return NO_NEED if self.question is None else f"YES [QUESTION]{self.question}[/QUESTION]"


def render_decision(question: str | None, reasoning: str = "") -> str:
    """A think-mode answer: ``<think>reasoning</think>`` then the final output.

    >>> render_decision(None, "Nothing is missing.")
    '<think>Nothing is missing.</think>\\nNO NEED TO ASK'
    """
    final = NO_NEED if question is None else f"YES [QUESTION]{question}[/QUESTION]"
    return f"<think>{reasoning}</think>\n{final}" if reasoning else final


def parse_clarifier(text: str) -> ClarifierDecision:
    """Read a Clarifier answer; anything else is ``malformed`` (and asks nothing).

    >>> parse_clarifier("<think>The order id is missing.</think> YES [QUESTION]Which order?[/QUESTION]").question
    'Which order?'
    >>> parse_clarifier("NO").asks, parse_clarifier("Maybe ask?").malformed
    (False, True)
    """
    reasoning = ""
    body = text
    think = _THINK.match(text)
    if think:
        reasoning, body = think.group(1).strip(), text[think.end():]
    body = body.strip()
    match = _QUESTION.match(body)
    if match and match.group(1).strip():
        return ClarifierDecision(" ".join(match.group(1).split()), reasoning, text)
    if _NO.match(body):
        return ClarifierDecision(None, reasoning, text)
    return ClarifierDecision(None, reasoning, text, malformed=True)


def cut_tool_outputs(history: str, max_tool_chars: int | None = None, max_tool_outputs: int | None = None) -> str:
    r"""The history with each ``Tool[...]:`` output cut to ``max_tool_chars`` characters and only
    the latest ``max_tool_outputs`` outputs kept (an older one becomes ``…``); None keeps all of
    it. A small Clarifier's positions run out on τ-bench's JSON outputs long before they run out
    on what the user said, and the decision follows the latest tool call.

    >>> cut_tool_outputs('User: hi\nTool[find]: "u1"\nTool[get_user_details]: {"name": "Ann Lee", "zip": "10001"}', 16, 1)
    'User: hi\nTool[find]: …\nTool[get_user_details]: {"name": "Ann Le…'
    """
    lines = history.splitlines()
    tools = [i for i, line in enumerate(lines) if line.startswith("Tool[")]
    older = set(tools[:-max_tool_outputs] if max_tool_outputs else []) if max_tool_outputs is not None else set()
    for i in tools:
        head, _, output = lines[i].partition("]: ")
        limit = 0 if i in older else max_tool_chars
        if limit is not None and len(output) > limit:
            lines[i] = f"{head}]: {output[:limit]}…"
    return "\n".join(lines)


def fit_history(history: str, fits: Callable[[str], bool]) -> str:
    r"""The history with its oldest lines dropped until ``fits`` accepts it: agent and tool
    lines first, then user lines, never the opening request; each dropped run becomes ``…``.
    What the user said is what a Clarifier must not ask for again, so it goes last.

    >>> h = "User: hi\nAgent: go on\nUser: order #1\nTool[get]: {}\nUser: thanks"
    >>> fit_history(h, lambda text: len(text) <= 40)
    'User: hi\n…\nUser: order #1\n…\nUser: thanks'
    """
    lines = history.splitlines()
    order = [i for i, line in enumerate(lines) if i and not line.startswith("User: ")]
    order += [i for i, line in enumerate(lines) if i and line.startswith("User: ")]
    dropped: set[int] = set()

    def text() -> str:
        return "\n".join("…" if i in dropped else line for i, line in enumerate(lines) if i not in dropped or i - 1 not in dropped)

    for i in order:
        if fits(text()):
            break
        dropped.add(i)
    return text()


def clarifier_messages(history: str, max_tool_chars: int | None = None, max_tool_outputs: int | None = None) -> list[dict[str, str]]:
    """The Clarifier's request: one user message, the paper's template filled in (tool outputs
    cut, :func:`cut_tool_outputs`)."""
    return [{"role": "user", "content": CLARIFIER_PROMPT.format(history=cut_tool_outputs(history, max_tool_chars, max_tool_outputs))}]


def prompt_cut(prompt: Any) -> tuple[int | None, int | None]:
    """``clarifier.prompt``: ``max_tool_chars`` and ``max_tool_outputs``, how a model Clarifier's
    prompt cuts tool outputs, the same in the training rows and in evaluation (null: uncut)."""
    prompt = prompt or {}
    keys = ("max_tool_chars", "max_tool_outputs")
    if not isinstance(prompt, Mapping) or set(prompt) - set(keys):
        raise ConfigError(f"params.yaml clarifier.prompt: expected {{max_tool_chars: <int | null>, max_tool_outputs: <int | null>}}, got {prompt!r}")
    for key in keys:
        positive_int(prompt.get(key), f"params.yaml clarifier.prompt.{key}", optional=True)
    return prompt.get("max_tool_chars"), prompt.get("max_tool_outputs")


def user_text(history: str) -> str:
    """What the user has said, from a rendered history (the ``User:`` lines)."""
    return "\n".join(line[len("User: "):] for line in history.splitlines() if line.startswith("User: "))


_PREFERENCE = re.compile(r"PREFERENCE\s*:\s*\[?\s*(BOTH_BAD|TIE|A|B)\b", re.IGNORECASE)


def parse_preference(reply: str) -> str | None:
    """``A``, ``B``, ``TIE`` or ``BOTH_BAD`` from a DPO judge reply; None when absent.

    >>> parse_preference("PREFERENCE: [BOTH_BAD]\\nREASON: neither asks for the order"), parse_preference("A is better")
    ('BOTH_BAD', None)
    """
    match = _PREFERENCE.search(reply)
    return None if match is None else match.group(1).upper()


_SCORES = re.compile(r"\"?Scores\"?\s*:\s*\[([^\]]*)\]", re.IGNORECASE)


def parse_scores(reply: str, n: int) -> list[float] | None:
    """The ``n`` scores of a GRPO judge reply, each clipped to [0, 10]; None when there are
    not exactly ``n`` numbers.

    >>> parse_scores('"Ranking": [2, 1]\\n"Scores": [3, 9.5]', 2), parse_scores('Scores: [1]', 2)
    ([3.0, 9.5], None)
    """
    match = _SCORES.search(reply)
    if match is None:
        return None
    numbers = re.findall(r"-?\d+(?:\.\d+)?", match.group(1))
    if len(numbers) != n:
        return None
    return [min(10.0, max(0.0, float(x))) for x in numbers]


def candidates_block(finals: Sequence[str]) -> str:
    return "\n".join(f"{i + 1}. {text}" for i, text in enumerate(finals))
