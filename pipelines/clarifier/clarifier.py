"""The Clarifier (paper section 3.1): after each tool call of the agent, it reads the dialogue
so far and the tool result and says ``NO NEED TO ASK`` or asks one concise question, which
the runner then shows the user as the agent's turn (:func:`pipelines.episodes.runner.play`).

Backends, one interface (:class:`Clarifier`: ``decide(contexts) -> decisions``, batched):

* :class:`RulesClarifier`: offline, grounded in the task (:mod:`.grounding`): it asks for the
  most urgent detail the ground truth needs that the user has not said yet, and says
  ``NO NEED TO ASK`` otherwise; ``noise`` > 0 makes it a sampler of teacher candidates
  (another missing detail, a detail already said, a retrievable fact, or not asking), seeded
  per state and sample. It reads the goal; the model backends never see it.
* :class:`LLMClarifier`: the paper's prompt through :class:`~pipelines.llm.LLMClient` (role
  ``clarifier``, any OpenAI-compatible endpoint).
* :class:`HFClarifier`: a local transformers model (:class:`~pipelines.llm.HFBackend`), e.g. a
  trained Clarifier.

A failed call or an unreadable answer asks nothing (and is counted as ``malformed``): the
Clarifier is optional and must never stop an episode.
"""

from __future__ import annotations

import json

import random
from typing import Any, Protocol, Sequence

from pipelines.clarifier.grounding import QUESTIONS, missing_details, question_for
from pipelines.clarifier.prompts import ClarifierDecision, clarifier_messages, cut_tool_outputs, fit_history, parse_clarifier
from pipelines.config import rate
from pipelines.env.taubench.data import TauTask
from pipelines.episodes.clarify import ClarifyContext
from pipelines.llm import Failure, LLMClient, SamplingParams
from pipelines.simulators.taubench import task_details

ROLE = "clarifier"


class Clarifier(Protocol):
    name: str

    async def decide(self, contexts: Sequence[ClarifyContext]) -> list[ClarifierDecision]: ...


def _reasoning(context: ClarifyContext, detail_name: str | None, why: str) -> str:
    return f"The agent just called {context.tool_name}. {why}" + (
        f" The user knows the {detail_name.replace('_', ' ')} and no tool can give it, so ask." if detail_name else ""
    )


class RulesClarifier:
    """The offline, task-grounded Clarifier (module docstring). ``noise``: the probability of
    answering with another candidate than the grounded one; ``sample``: which candidate
    draw this is (two teacher candidates per state are samples 0 and 1)."""

    def __init__(self, noise: float = 0.0, sample: int = 0, name: str = "rules"):
        rate(noise, "noise")
        self.noise = noise
        self.sample = sample
        self.name = name

    async def decide(self, contexts: Sequence[ClarifyContext]) -> list[ClarifierDecision]:
        return [self.decide_one(context) for context in contexts]

    def decide_one(self, context: ClarifyContext) -> ClarifierDecision:
        task = context.goal
        if not isinstance(task, TauTask):
            raise TypeError(f"the rules Clarifier is grounded in τ-bench tasks, got {type(task).__name__}")
        details = task_details(task)
        missing = [d for d in missing_details(task, context.history, details) if question_for(d) not in context.asked]
        rng = random.Random(f"{context.call_seed}\x00{self.sample}")
        if self.noise and rng.random() < self.noise:
            return self._alternative(context, details, missing, rng)
        if not missing:
            return self._decision(None, _reasoning(context, None, "Everything the next steps need from the user is known."))
        detail = missing[0]
        return self._decision(question_for(detail), _reasoning(context, detail.name, f"The next step needs the {detail.name.replace('_', ' ')}, which the user has not given."))

    def _alternative(self, context: ClarifyContext, details: list, missing: list, rng: random.Random) -> ClarifierDecision:
        """A plausible but not grounded candidate, as a sampling teacher writes one."""
        said = [d for d in details if d not in missing]
        options = [("later", d) for d in missing[1:]] + [("said", d) for d in said] + [("retrievable", None), ("no", None)]
        kind, detail = options[rng.randrange(len(options))]
        if kind == "no":
            return self._decision(None, _reasoning(context, None, "The agent can probably go on with what it has."))
        if kind == "retrievable":
            return self._decision("Could you confirm the current status and price of everything involved?",
                                  _reasoning(context, None, "The agent may want the current state confirmed."))
        why = "This still needs the user." if kind == "later" else "It helps to be sure of this."
        return self._decision(question_for(detail), _reasoning(context, detail.name, why))

    @staticmethod
    def _decision(question: str | None, reasoning: str) -> ClarifierDecision:
        from pipelines.clarifier.prompts import render_decision

        return ClarifierDecision(question, reasoning, render_decision(question, reasoning))


class LLMClarifier:
    """The paper's Clarifier prompt over an OpenAI-compatible endpoint (role ``clarifier``)."""

    name = "openai"

    def __init__(self, client: LLMClient, sampling: SamplingParams | None = None, *, role: str = ROLE, sample: int = 0,
                 prompt_cut: tuple[int | None, int | None] = (None, None)):
        self.client = client
        self.prompt_cut = prompt_cut  # (max_tool_chars, max_tool_outputs): :func:`cut_tool_outputs`
        self.sample = sample  # candidate draws of one state differ by their seed
        self.sampling = sampling if sampling is not None else SamplingParams(temperature=0.0, max_tokens=1000)
        self.role = role
        self.failures = 0

    async def decide(self, contexts: Sequence[ClarifyContext]) -> list[ClarifierDecision]:
        from pipelines.llm import CompletionRequest

        requests = [CompletionRequest(clarifier_messages(c.history, *self.prompt_cut), self.role, self.sampling, c.call_seed + self.sample) for c in contexts]
        results = await self.client.complete_many(requests)
        decisions = []
        for result in results:
            if isinstance(result, Failure):
                self.failures += 1
                decisions.append(ClarifierDecision(None, "", "", malformed=True))
            else:
                decisions.append(parse_clarifier(result.text))
        return decisions


class HFClarifier:
    """A local transformers Clarifier (e.g. one trained on ``clarifier_sft``)."""

    name = "hf"

    def __init__(self, backend: Any, sampling: SamplingParams | None = None, *, prompt_cut: tuple[int | None, int | None] = (None, None)):
        self.backend = backend
        self.prompt_cut = prompt_cut  # (max_tool_chars, max_tool_outputs), as in the training rows
        self.sampling = sampling if sampling is not None else SamplingParams(temperature=0.0, max_tokens=256)
        self.too_long = 0  # prompts that did not fit even compacted
        self.compacted = 0  # histories compacted to fit
        self._memo: dict[str, str] = {}  # prompt -> greedy answer

    async def decide(self, contexts: Sequence[ClarifyContext]) -> list[ClarifierDecision]:
        if not contexts:
            return []
        # A history too long for the model's positions with its answer loses its oldest agent
        # and tool lines, then user lines (fit_history); one that still does not fit is not
        # sent: it asks nothing and is counted as malformed, like an unreadable answer.
        limit = getattr(getattr(self.backend.model, "config", None), "max_position_embeddings", None)

        def fits(messages: list[dict[str, str]]) -> bool:
            return limit is None or len(self.backend.tokenizer(self.backend.render(messages))["input_ids"]) + (self.sampling.max_tokens or 0) <= limit

        conversations, ok = [], []
        for c in contexts:
            messages = clarifier_messages(c.history, *self.prompt_cut)
            fit = fits(messages)  # one tokenization per prompt that fits as it is
            if not fit:
                self.compacted += 1
                messages = clarifier_messages(fit_history(cut_tool_outputs(c.history, *self.prompt_cut), lambda h: fits(clarifier_messages(h))))
                fit = fits(messages)
            conversations.append(messages)
            ok.append(fit)
        # Greedy decoding (temperature 0) answers a prompt the same way whatever the seed: an
        # answer already generated in this run is reused (an evaluation's later seeds cost nothing).
        greedy = not self.sampling.temperature
        keys = [json.dumps(m, sort_keys=True) for m in conversations]
        sent = list({k: m for k, m, fit in zip(keys, conversations, ok) if fit and not (greedy and k in self._memo)}.items())
        replies = self.backend.generate([m for _, m in sent], self.sampling, seed=contexts[0].call_seed) if sent else []
        fresh = {k: reply for (k, _), reply in zip(sent, replies)}
        if greedy:
            self._memo.update(fresh)
        self.too_long += ok.count(False)
        return [parse_clarifier(fresh[k] if k in fresh else self._memo[k]) if fit else ClarifierDecision(None, "", "", malformed=True)
                for k, fit in zip(keys, ok)]


__all__ = ["ROLE", "QUESTIONS", "Clarifier", "ClarifyContext", "HFClarifier", "LLMClarifier", "RulesClarifier"]
