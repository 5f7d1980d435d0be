"""The paper's LLM-as-judge for clarification quality (section 3.3, Figure 6).

Each question is sent, with its conversation, in the Figure 6 rubric prompt (one user
message) through :class:`~pipelines.llm.LLMClient`: the client's response cache makes a
re-run free, and greedy sampling with a fixed seed makes the score a function of the
prompt. A batch's calls run concurrently (``complete_many``), within the client's
concurrency bound.

The reply must be the rubric's answer and nothing else: ``Score: 1`` / ``Score: 0``
(``Score: [1]``, as the rubric's placeholder is written, and a bare ``1`` / ``0`` are read
too; the word "score" in any case; surrounding whitespace is ignored). Anything else
("Score: 1. Good question", a reasoning preamble) is *unparseable*.

A question without a score, because the call failed (the client's failure reason) or the
reply is unparseable, gets ``None``, is counted in :attr:`LLMJudge.stats` and logged;
with ``strict=True`` the batch raises :class:`~pipelines.rewards.clarify.JudgeError`
instead (after every call of the batch has finished, so the successes are cached).

**Event loops.** :meth:`LLMJudge.judge` is synchronous, as TRL calls reward functions: it
runs the batch with the client's sync wrapper, which needs a thread without a running
event loop (TRL's training loop is one) and raises RuntimeError otherwise. Code already
inside an event loop awaits :meth:`LLMJudge.ajudge` instead.
"""

from __future__ import annotations

import logging
import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Sequence

from pipelines.llm import Completion, CompletionRequest, Failure, LLMClient, SamplingParams
from pipelines.rewards.clarify import Clarification, ClarifyReward, JudgeError, Verdict
from pipelines.rewards.prompts import render_conversation, render_judge_prompt

logger = logging.getLogger(__name__)

#: The dataset column holding a decision point's dialogue: the text the judge shows (as
#: :func:`render_conversation` writes it) or the turns themselves. Without it the judge
#: shows the sample's prompt.
CONVERSATION = "conversation"

JUDGED = "judged"
UNPARSEABLE = "unparseable"

_SCORE = re.compile(r"(?:score\s*:\s*)?(?:\[\s*([01])\s*\]|([01]))", re.IGNORECASE)


def parse_score(reply: str) -> int | None:
    """0 or 1 from a judge reply in the rubric's format, None for anything else."""
    match = _SCORE.fullmatch(reply.strip())
    if match is None:
        return None
    return int(match.group(1) or match.group(2))


@dataclass
class JudgeStats:
    """What an :class:`LLMJudge` has done since it was made. ``calls``: questions sent
    through the client (cache hits included); ``scored``: those that got a score;
    ``failures``: failed calls by the client's failure reason; ``unparseable``: replies
    that were not a score."""

    calls: int = 0
    scored: int = 0
    unparseable: int = 0
    failures: Counter = field(default_factory=Counter)

    def as_dict(self) -> dict[str, Any]:
        return {"calls": self.calls, "scored": self.scored, "unparseable": self.unparseable, "failures": dict(self.failures)}


class LLMJudge:
    """Figure 6's binary rubric, asked of ``client`` in role ``role``.

    ``sampling`` and ``seed`` are sent with every call (and key the cache): the defaults,
    temperature 0 and seed 0, make the judge deterministic. ``strict``: raise JudgeError
    when a question cannot be scored, rather than returning None for it."""

    name = "llm"
    columns: tuple[str, ...] = (CONVERSATION,)

    def __init__(
        self,
        client: LLMClient,
        sampling: SamplingParams = SamplingParams(temperature=0.0),
        seed: int = 0,
        *,
        role: str = "judge",
        strict: bool = False,
    ):
        self.client = client
        self.sampling = sampling
        self.seed = seed
        self.role = role
        self.strict = strict
        self.stats = JudgeStats()

    def __repr__(self) -> str:
        return f"LLMJudge(model={self.client.config.model!r}, role={self.role!r}, seed={self.seed}, strict={self.strict})"

    def request(self, clarification: Clarification) -> CompletionRequest:
        """The client request that judges one question."""
        prompt = render_judge_prompt(conversation_text(clarification), clarification.question)
        return CompletionRequest([{"role": "user", "content": prompt}], self.role, self.sampling, self.seed)

    def judge(self, clarifications: Sequence[Clarification]) -> list[Verdict]:
        results = self.client.complete_many_sync([self.request(c) for c in clarifications])
        return self._verdicts(results)

    async def ajudge(self, clarifications: Sequence[Clarification]) -> list[Verdict]:
        """:meth:`judge` for callers inside a running event loop."""
        results = await self.client.complete_many([self.request(c) for c in clarifications])
        return self._verdicts(results)

    def _verdicts(self, results: Sequence[Completion | Failure]) -> list[Verdict]:
        verdicts = [self._verdict(result) for result in results]
        unscored = [v.reason for v in verdicts if v.score is None]
        if unscored and self.strict:
            raise JudgeError(
                f"the LLM judge could not score {len(unscored)} of {len(verdicts)} question(s): {dict(Counter(unscored))}"
            )
        return verdicts

    def _verdict(self, result: Completion | Failure) -> Verdict:
        self.stats.calls += 1
        if isinstance(result, Failure):
            # The client has logged the failure with its details already.
            self.stats.failures[result.reason] += 1
            return Verdict(None, result.reason)
        score = parse_score(result.text)
        if score is None:
            self.stats.unparseable += 1
            logger.warning("LLM judge reply is not a score (expected 'Score: 0' or 'Score: 1'): %r", result.text[:200])
            return Verdict(None, UNPARSEABLE)
        self.stats.scored += 1
        return Verdict(float(score), JUDGED)


def conversation_text(clarification: Clarification) -> str:
    """The dialogue the judge is shown: the ``conversation`` column (text, or turns to
    render), else the prompt (a string as it is, messages rendered)."""
    conversation = clarification.columns.get(CONVERSATION)
    if conversation is None:
        conversation = clarification.prompt
    return conversation if isinstance(conversation, str) else render_conversation(conversation)


def clarify_llm(client: LLMClient) -> ClarifyReward:
    """SpeakRL's clarification reward with Figure 6's LLM judge over ``client`` (the ``judge`` role).

    >>> from types import SimpleNamespace
    >>> class Judge:  # stands in for the LLM client: the rubric's "Score: 1" for every question
    ...     def complete_many_sync(self, requests): return [SimpleNamespace(ok=True, text="Score: 1")] * len(requests)
    >>> reward = clarify_llm(Judge())
    >>> reward.__name__, reward(["User: a hotel"] * 2, ["<think>t</think><clarify>Which area?</clarify>", "<think>t</think>"])
    ('clarify_llm', [1.0, 0.0])
    """
    return ClarifyReward(LLMJudge(client))
