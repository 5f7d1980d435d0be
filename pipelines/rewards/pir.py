"""US-GRPO's composite reward (PIR section 3.2.2) as a TRL reward callable: the registry's
``pir_composite_rules`` (:mod:`pipelines.rewards`), and its helpfulness judges.

R = 0 when the final answer / task is wrong; S_base when it is right and nothing was asked;
S_base + S_base · E(r) · H(r) when it is right and at least one question was asked, with
E(r) = (N_max − n) / (N_max − 1) clipped at 0 (the released code went negative past N_max)
and H(r) ∈ [0, 1] the helpfulness of the asking from the ``judge`` role.

Correctness comes from the rollout as a column, ``correct`` (bool; on MultiWOZ the goal
checker's verdict on the finished conversation), since only the environment knows it. A
sample the judge cannot score (call failure, unparsable reply) or whose correctness is
unknown gets None, which TRL leaves out of the group: never a silent 0 (the released code
zeroed ~1 in 64 samples that way). Questions are the ``<asking>…</asking>`` blocks of the
policy's text (every assistant message of a multi-turn rollout).
"""

from __future__ import annotations

import json
import logging
import re
from collections import Counter
from dataclasses import dataclass
from typing import Any, Mapping, Protocol, Sequence

from pipelines.episodes.formats import ASK_CLOSE, ASK_OPEN
from pipelines.records import Goal

logger = logging.getLogger(__name__)

_ASKING = re.compile(re.escape(ASK_OPEN) + r"(.*?)" + re.escape(ASK_CLOSE), re.DOTALL)
WRONG, NO_QUESTION, ASKED, UNKNOWN_CORRECTNESS, UNSCORED = "wrong", "correct_no_question", "correct_asked", "unknown_correctness", "unscored"


def policy_text(completion: str | Sequence[Mapping[str, Any]]) -> str:
    """The policy's own text: the string, or every assistant message of a conversation
    (the simulated user's messages are not the policy's)."""
    if isinstance(completion, str):
        return completion
    return "\n".join(str(m.get("content") or "") for m in completion if m.get("role") == "assistant")


def questions(completion: str | Sequence[Mapping[str, Any]]) -> list[str]:
    """The non-empty ``<asking>`` questions of a completion.

    >>> questions("<think>a<asking>Which area?</asking><response>North.</response>b<asking> </asking></think>x")
    ['Which area?']
    """
    return [q.strip() for q in _ASKING.findall(policy_text(completion)) if q.strip()]


def efficiency(n: int, n_max: int) -> float:
    """E(r) = (N_max − n) / (N_max − 1), clipped to [0, 1].

    >>> [efficiency(n, 5) for n in (1, 3, 5, 7)]
    [1.0, 0.5, 0.0, 0.0]
    """
    if n_max < 2:
        raise ValueError(f"n_max must be >= 2, got {n_max}")
    return min(1.0, max(0.0, (n_max - n) / (n_max - 1)))


@dataclass(frozen=True)
class HelpItem:
    """What the helpfulness judge sees: the user's intent, the conversation before the
    response, and the response (the policy's asking turns)."""

    intent: str
    history: str
    response: str
    columns: Mapping[str, Any]


class HelpfulnessJudge(Protocol):
    name: str

    def helpfulness(self, items: Sequence[HelpItem]) -> list[tuple[float | None, str]]:
        """(H in [0, 1] or None, reason) per item."""
        ...


class PIRReward:
    """The composite reward (module docstring). ``judge`` gives H; ``s_base`` and ``n_max``
    as in the paper (its settings: N_max = 5 turns). ``stats`` counts the branches taken.

    >>> class Half:
    ...     name = "half"
    ...     def helpfulness(self, items): return [(0.5, "judged")] * len(items)
    >>> reward = PIRReward(Half(), s_base=1.0, n_max=5)
    >>> reward(["p"] * 4, ["x", "<asking>Area?</asking>", "<asking>A?</asking>" * 3, "<asking>A?</asking>"], correct=[True, True, True, False])
    [1.0, 1.5, 1.25, 0.0]
    """

    __name__ = "pir_composite"

    def __init__(self, judge: HelpfulnessJudge, *, s_base: float = 1.0, n_max: int = 5):
        efficiency(1, n_max)  # validates n_max
        if s_base <= 0:
            raise ValueError(f"s_base must be > 0, got {s_base}")
        self.judge = judge
        self.s_base = float(s_base)
        self.n_max = n_max
        self.stats: Counter = Counter()

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], correct: Sequence[bool | None] | None = None, **columns: Any) -> list[float | None]:
        if correct is None:
            raise ValueError("pir_composite needs the 'correct' column (the task checker's verdict per completion) from the rollout")
        if len(correct) != len(completions):
            raise ValueError(f"'correct' has {len(correct)} values for {len(completions)} completions")
        rewards: list[float | None] = [None] * len(completions)
        asked: list[tuple[int, HelpItem, int]] = []
        for i, (completion, ok) in enumerate(zip(completions, correct)):
            if ok is None:
                self.stats[UNKNOWN_CORRECTNESS] += 1
                continue
            if not ok:
                self.stats[WRONG] += 1
                rewards[i] = 0.0
                continue
            found = questions(completion)
            if not found:
                self.stats[NO_QUESTION] += 1
                rewards[i] = self.s_base
                continue
            row = {k: (v[i] if isinstance(v, Sequence) and not isinstance(v, str) and len(v) == len(completions) else v) for k, v in columns.items()}
            history = _text(prompts[i])
            intent = str(row.get("intent") or history)
            asked.append((i, HelpItem(intent, history, "\n".join(found), row), len(found)))
        if asked:
            # Only correct samples that asked need the judge: the others' rewards do not depend on it.
            for (i, _, n), (score, reason) in zip(asked, self.judge.helpfulness([item for _, item, _ in asked])):
                if score is None:
                    self.stats[f"{UNSCORED}:{reason}"] += 1
                    continue
                self.stats[ASKED] += 1
                rewards[i] = self.s_base + self.s_base * efficiency(n, self.n_max) * score
        return rewards


def _text(prompt: Any) -> str:
    if isinstance(prompt, str):
        return prompt
    return "\n".join(f"{m.get('role')}: {m.get('content')}" for m in prompt)


def unstated_slots(goal: Goal, opening: str) -> list[str]:
    """The goal's constraint slots whose values the user's opening turn does not state: what
    a helpful question can ask about (the ``unstated_slots`` column :class:`RulesHelpfulness` reads).

    >>> from pipelines.records import DomainGoal
    >>> unstated_slots(Goal("d1", (DomainGoal("restaurant", {"food": "thai", "area": "north"}),)), "some thai food please")
    ['area']
    """
    from pipelines.multiwoz.ontology import is_dont_care
    from pipelines.rewards.verifiable import words

    said = f" {words(opening)} "
    slots: dict[str, bool] = {}
    for domain in goal.domains:
        for part in (domain.info, domain.book):
            for slot, value in part.items():
                if is_dont_care(value):
                    continue
                needle = words(str(value))
                slots[slot] = slots.get(slot, False) or bool(needle) and f" {needle} " in said
    return sorted(s for s, stated in slots.items() if not stated)


class RulesHelpfulness:
    """Offline H: the share of questions that ask about a constraint the user had not stated
    (column ``unstated_slots``: the goal's slots still unknown at the start, a list or a JSON
    list), read with the verifiable judge's slot cues. A row without the column is unscored."""

    name = "rules"

    def helpfulness(self, items: Sequence[HelpItem]) -> list[tuple[float | None, str]]:
        from pipelines.rewards.verifiable import asked_slots

        out: list[tuple[float | None, str]] = []
        for item in items:
            unstated = item.columns.get("unstated_slots")
            if isinstance(unstated, str):
                unstated = json.loads(unstated)
            if unstated is None:
                out.append((None, "missing_unstated_slots"))
                continue
            asks = [q for q in item.response.split("\n") if q.strip()]
            useful = sum(bool(asked_slots(q) & set(unstated)) for q in asks)
            out.append((useful / len(asks), "judged"))
        return out


# The paper's helpfulness prompt (appendix A.5, Table 9).
HELPFULNESS_PROMPT = """You are a helpful and meticulous conversation evaluator. Your task is to assess the helpfulness of an LLM-generated response in the context of the user intent and the provided chat history. Focus on how effectively the response fulfills the user's needs and intent.

Provided Information:

<|The Start of The User Intent|>
{question}
<|The End of The User Intent|>

<|The Start of The Historical Conversation|>
{chat_history}
<|The End of The Historical Conversation|>

<|The Start of The Response to be Evaluated|>
{response}
<|The End of The Response to be Evaluated|>

You should evaluate the follow-up conversation based on the following criteria: Evaluate the response using the provided information below. Your evaluation should consider the following aspects of helpfulness:
1. Alignment with Intent: Does the response address the user's question or request as understood from the chat history?
2. Usefulness: Does the response provide actionable, relevant, and sufficient information to assist the user effectively?
3. Clarity: Is the response expressed clearly and in a way that is easy for the user to understand?

Scoring Criteria:
- 0.0: The response is completely unhelpful. It does not address the user's intent, lacks useful information to solve the problem, and/or is entirely unclear.
- 0.2: The response is minimally helpful. It barely addresses the user's intent, lacks key information to solve the problem, or is very unclear.
- 0.4: The response is somewhat helpful. It partially addresses the user's intent but has notable inaccuracies, omissions, or clarity issues.
- 0.6: The response is moderately helpful. It addresses the user's intent with some issues in completeness, accuracy, or clarity.
- 0.8: The response is quite helpful. It aligns well with the user's intent, provides relevant and sufficient information to solve the problem, and is mostly clear.
- 1.0: The response is very helpful. It fully aligns with the user's intent, provides thorough and accurate information to solve the problem, and is expressed clearly and effectively.

Output Format:
{{
  "thought": "<How helpful is the assistant in the conversation?>",
  "helpfulness": <score>
}}

Important Notes:
- The "User Intent" and "Historical Conversation" is provided only for reference to help you understand the context of the response. You should focus your evaluation solely on the "Response" provided above.
- Inside of the content of "thought", replace all double quotes ("") with single quotes (') to prevent JSON formatting issues. For example, you can output "thought": "'Hello' is a common phrase."

Your evaluation:"""

_JSON_OBJECT = re.compile(r"\{.*\}", re.DOTALL)


def parse_helpfulness(reply: str) -> float | None:
    """The ``helpfulness`` number of the judge's JSON reply, in [0, 1]; None otherwise.

    >>> parse_helpfulness('{"thought": "ok", "helpfulness": 0.8}')
    0.8
    >>> [parse_helpfulness(r) for r in ('{"helpfulness": 1.4}', 'helpful!', '{"helpfulness": "high"}')]
    [None, None, None]
    """
    match = _JSON_OBJECT.search(reply)
    if not match:
        return None
    try:
        value = json.loads(match.group(0)).get("helpfulness")
    except (json.JSONDecodeError, AttributeError):
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        return None
    return float(value)


class LLMHelpfulness:
    """H from an LLM in the ``judge`` role with Table 9's prompt (greedy, seeded: the response
    cache makes re-runs free). A failed call or an unparsable reply is (None, reason)."""

    name = "llm"

    def __init__(self, client: Any, sampling: Any = None, seed: int = 0, *, role: str = "judge"):
        from pipelines.llm import SamplingParams

        self.client = client
        self.sampling = sampling or SamplingParams(temperature=0.0)
        self.seed = seed
        self.role = role
        self.stats: Counter = Counter()

    def helpfulness(self, items: Sequence[HelpItem]) -> list[tuple[float | None, str]]:
        from pipelines.llm import CompletionRequest

        requests = [
            CompletionRequest([{"role": "user", "content": HELPFULNESS_PROMPT.format(question=i.intent, chat_history=i.history, response=i.response)}],
                              self.role, self.sampling, self.seed)
            for i in items
        ]
        out: list[tuple[float | None, str]] = []
        for result in self.client.complete_many_sync(requests):
            if not result.ok:
                self.stats[result.reason] += 1
                out.append((None, result.reason))
                continue
            score = parse_helpfulness(result.text)
            if score is None:
                self.stats["unparsable"] += 1
                logger.warning("helpfulness judge reply is not the JSON asked for: %r", result.text[:200])
                out.append((None, "unparsable"))
                continue
            self.stats["judged"] += 1
            out.append((score, "judged"))
        return out


pir_composite_rules = PIRReward(RulesHelpfulness())
pir_composite_rules.__doc__ = """PIR's composite reward with the offline helpfulness judge (TRL logs it as ``pir_composite``).

An LLM judge instead: ``PIRReward(LLMHelpfulness(client))``.

>>> pir_composite_rules(["p"] * 3, ["North.", "<asking>Which area?</asking>", "<asking>Which area?</asking>"],
...                     correct=[True, True, False], unstated_slots=[["area"]] * 3)
[1.0, 2.0, 0.0]
"""

#: The registered reward's example, run by doctest (an instance's docstring is not collected).
__test__ = {"pir_composite_rules": pir_composite_rules.__doc__}
