"""SpeakRL's clarification reward (section 3.3): a judge scores the question inside
``<clarify></clarify>``; an output without one scores 0 ("no question" is the rubric's 0),
and the judge is not consulted for it.

:class:`ClarifyReward` is the TRL reward callable; what it does with a question is the
judge's business, behind one small interface (:class:`Judge`):

* :class:`~pipelines.rewards.verifiable.VerifiableJudge`: a rule, from the decision point's
  annotations (which slots discriminate between the remaining candidates, which are known);
* :class:`~pipelines.rewards.llm_judge.LLMJudge`: the paper's LLM-as-judge with the
  Figure 6 rubric.

At a decision point where asking is not needed (the dataset column ``ask_needed`` false:
an act-here point, where the user has said enough), the judge is not consulted either: a
question there is over-asking and scores 0 (``needless_question``), an output that acts
scores 1 (``acted``), an output the grammar rejects 0 (``malformed``). So the reward says
when to ask as well as what to ask, and an always-ask policy no longer scores best.

A judge may be unable to score a question (the LLM call failed, its reply could not be
read): the reward is then ``None`` for that sample, which TRL leaves out of the
advantage computation, never a silent 0 that would teach the policy something false.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from typing import Any, Callable, Mapping, Protocol, Sequence

from pipelines.errors import AskflowError
from pipelines.episodes.formats import END, RESPOND, TOOL_CALL, decision
from pipelines.rewards.format import ASK_NEEDED, clarification_question, completion_text

logger = logging.getLogger(__name__)

#: The reason of the 0 given to an output without a clarification question.
NO_QUESTION = "no_question"
#: Where asking is not needed: a question (0), an action (1), an unreadable output (0).
NEEDLESS_QUESTION = "needless_question"
ACTED = "acted"
MALFORMED = "malformed"


class JudgeError(AskflowError):
    """A strict judge could not score a question."""


@dataclass(frozen=True)
class Clarification:
    """One question to judge. ``prompt``: the sample's prompt as TRL passed it (a string or
    a list of messages); ``columns``: this sample's values of the dataset columns the judge
    declared (absent columns are absent here)."""

    question: str
    prompt: Any
    columns: Mapping[str, Any]


@dataclass(frozen=True)
class Verdict:
    """A judge's answer for one question: ``score`` (None when it could not score) and
    ``reason``, a short code saying which rule gave the score or why there is none."""

    score: float | None
    reason: str


class Judge(Protocol):
    """``name`` names the reward (``clarify_<name>``); ``columns`` are the dataset columns
    the judge reads; ``judge`` returns one verdict per clarification, in order."""

    name: str
    columns: tuple[str, ...]

    def judge(self, clarifications: Sequence[Clarification]) -> list[Verdict]: ...


class ClarifyReward:
    """A TRL reward function: ``reward(prompts=, completions=, **columns) -> list[float | None]``.

    ``__name__`` (``clarify_<judge name>`` unless ``name`` is given) is what TRL logs the
    reward under. The instance holds no state of its own (counters live on the judge), so a
    module-level instance over a stateless judge is safe to share.

    When TRL passes ``log_metric``, each batch logs ``<name>/asked`` (the fraction of
    completions that ask a question) and ``<name>/unscored`` (how many questions got no
    score), plus ``<name>/unscored/<reason>`` for each reason that occurred in the batch
    (TRL averages a metric over the batches that logged it). With ``log_extra``, the
    verdict reasons become the completions-table column ``<name>_reason``."""

    def __init__(self, judge: Judge, name: str | None = None):
        self.judge = judge
        self.__name__ = name or f"clarify_{judge.name}"

    def __repr__(self) -> str:
        return f"ClarifyReward({self.judge!r}, name={self.__name__!r})"

    def verdicts(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[Verdict]:
        """One verdict per completion: what ``__call__`` returns, with the reasons."""
        if len(prompts) != len(completions):
            raise ValueError(f"{len(prompts)} prompts but {len(completions)} completions")
        texts = [completion_text(c) for c in completions]
        questions = [clarification_question(t) for t in texts]
        needed = kwargs.get(ASK_NEEDED) or [True] * len(completions)
        verdicts = [Verdict(0.0, NO_QUESTION)] * len(completions)
        for i, text in enumerate(texts):
            if needed[i] is False:
                verdicts[i] = _act_here_verdict(text, questions[i])
        asked = [i for i, question in enumerate(questions) if question is not None and needed[i] is not False]
        columns = [column for column in self.judge.columns if column in kwargs]
        clarifications = [
            Clarification(questions[i], prompts[i], {column: kwargs[column][i] for column in columns}) for i in asked
        ]
        if clarifications:
            judged = self.judge.judge(clarifications)
            if len(judged) != len(clarifications):
                raise RuntimeError(f"judge {self.judge!r} returned {len(judged)} verdicts for {len(clarifications)} questions")
            for i, verdict in zip(asked, judged):
                verdicts[i] = verdict
        return verdicts

    def __call__(self, prompts: Sequence[Any], completions: Sequence[Any], **kwargs: Any) -> list[float | None]:
        verdicts = self.verdicts(prompts, completions, **kwargs)
        self._log(verdicts, kwargs.get("log_metric"), kwargs.get("log_extra"))
        return [verdict.score for verdict in verdicts]

    def _log(
        self,
        verdicts: Sequence[Verdict],
        log_metric: Callable[[str, float], None] | None,
        log_extra: Callable[[str, list], None] | None,
    ) -> None:
        unscored = Counter(v.reason for v in verdicts if v.score is None)
        if unscored:
            logger.warning("%s: %d question(s) got no score: %s", self.__name__, sum(unscored.values()), dict(unscored))
        if log_metric is not None and verdicts:
            log_metric(f"{self.__name__}/asked", sum(v.reason not in (NO_QUESTION, ACTED, MALFORMED) for v in verdicts) / len(verdicts))
            act_here = [v for v in verdicts if v.reason in (NEEDLESS_QUESTION, ACTED, MALFORMED)]
            if act_here:  # the share of act-here samples that asked anyway
                log_metric(f"{self.__name__}/over_asking", sum(v.reason == NEEDLESS_QUESTION for v in act_here) / len(act_here))
            log_metric(f"{self.__name__}/unscored", float(sum(unscored.values())))
            for reason, count in unscored.items():
                log_metric(f"{self.__name__}/unscored/{reason}", float(count))
        if log_extra is not None:
            log_extra(f"{self.__name__}_reason", [v.reason for v in verdicts])


def _act_here_verdict(text: str, question: str | None) -> Verdict:
    """The verdict where asking is not needed (module docstring)."""
    if question is not None:
        return Verdict(0.0, NEEDLESS_QUESTION)
    if decision(text) not in (TOOL_CALL, RESPOND, END):
        return Verdict(0.0, MALFORMED)
    return Verdict(1.0, ACTED)
