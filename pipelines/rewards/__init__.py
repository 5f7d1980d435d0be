"""SpeakRL's rewards for GRPO (section 3.3): R_total = R_format + R_clarify.

* :mod:`~pipelines.rewards.format`: :func:`format_reward`, the structured-token reward of
  eq. 8 with partial credit, on the agent grammar of :mod:`pipelines.episodes.formats`;
* :mod:`~pipelines.rewards.clarify`: :class:`ClarifyReward`, the clarification reward
  around an exchangeable judge: :class:`VerifiableJudge` (a rule over the SpeakER
  decision point's annotations; its module documents the dataset columns) or
  :class:`LLMJudge` (the Figure 6 rubric through the LLM client);
* :mod:`~pipelines.rewards.learn_to_ask`: :class:`L2AReward`, Learn-to-Ask's reward (eq. 5:
  the stop decision gates the question's content score from a grader, :class:`RulesGrader`);
* :mod:`~pipelines.rewards.prompts`: the Table 1 training instruction and the conversation
  rendering, shared with the GRPO dataset.

The methods' own rewards live with their methods (``pipelines.clarifier.reward``,
``pipelines.pir.reward``): the registry names them by import path, imported on first use.

All are TRL reward functions, ``f(prompts=, completions=, **columns) -> list[float | None]``.
TRL's ``reward_weights`` combines them; eq. 7 is weights (1, 1)::

    GRPOTrainer(..., reward_funcs=[format_reward, build_clarify_reward("verifiable")])
"""

from __future__ import annotations

import importlib
from typing import Any, Callable, Iterator, Mapping

from pipelines.errors import ConfigError
from pipelines.llm import LLMClient
from pipelines.rewards.clarify import NO_QUESTION, Clarification, ClarifyReward, Judge, JudgeError, Verdict
from pipelines.rewards.format import (
    FULL_CREDIT,
    PARTIAL_CREDIT,
    clarification_question,
    completion_text,
    format_reward,
    format_score,
)
from pipelines.rewards.learn_to_ask import L2AReward, RulesGrader
from pipelines.rewards.llm_judge import CONVERSATION, JudgeStats, LLMJudge, parse_score
from pipelines.rewards.prompts import (
    JUDGE_PROMPT_TEMPLATE,
    SPEAKRL_PROMPT_TEMPLATE,
    render_conversation,
    render_judge_prompt,
    render_speakrl_prompt,
)
from pipelines.rewards.verifiable import (
    CANDIDATE_VALUES,
    DISCRIMINATING_SLOTS,
    KNOWN_SLOTS,
    SLOT_CUES,
    VerifiableJudge,
    asked_slots,
)

CLARIFY_JUDGES: tuple[str, ...] = ("verifiable", "llm")

class _Registry(Mapping[str, Any]):
    """Name -> entry; an entry given as ``package.module:name`` is imported on first use, so the
    registry names the methods' rewards without importing the methods (they sit above it)."""

    def __init__(self, entries: Mapping[str, Any]) -> None:
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Any:
        entry = self._entries[name]
        if isinstance(entry, str):
            entry = self._entries[name] = _import(entry, name)
        return entry

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)


#: The reward functions that need nothing but the dataset, by name. An LLM-judged reward
#: needs a client: :func:`build_clarify_reward`.
REWARD_FUNCTIONS: Mapping[str, Callable[..., list]] = _Registry(
    {
        "format": format_reward,
        "clarify_verifiable": ClarifyReward(VerifiableJudge()),
        # Learn-to-Ask (eq. 5, beta 2) with the grader role's rules backend; reads l2a_samples' targets.
        "l2a": L2AReward(RulesGrader()),
        # The τ-bench Clarifier's goal-aware reward (clarifier_grpo data), judged offline from G*.
        "clarifier_goal": "pipelines.clarifier.reward:clarifier_goal",
    }
)


#: Rewards that need an LLM client in the ``judge`` role, by name: name -> factory(client).
JUDGE_REWARDS: Mapping[str, Callable[[LLMClient], Callable[..., list]]] = _Registry(
    {
        "clarify_llm": lambda client: build_clarify_reward("llm", client),
        "clarifier_goal_llm": "pipelines.clarifier.reward:clarifier_goal_llm",
    }
)


def _import(path: str, name: str) -> Any:
    module_name, _, attribute = path.rpartition(":") if ":" in path else path.rpartition(".")
    known = ", ".join([*REWARD_FUNCTIONS, *JUDGE_REWARDS])
    if not module_name:
        raise ConfigError(f"grpo reward {name!r} is unknown; rewards: {known}, or an import path package.module:callable")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"grpo reward {name!r}: cannot import it ({exc}); rewards: {known}") from None
    if not callable(function):
        raise ConfigError(f"grpo reward {name!r} is not callable: {function!r}")
    return function


def resolve_reward(name: str, judge: LLMClient | None = None) -> Callable[..., list]:
    """The reward callable a GRPO run names in params: a registered name
    (:data:`REWARD_FUNCTIONS`; :data:`JUDGE_REWARDS` over ``judge``, the client of the
    ``judge`` role), or any reward callable by import path, ``package.module:name`` or
    ``package.module.name`` (the rewards other methods add). ConfigError otherwise.

    >>> resolve_reward("format") is format_reward
    True
    >>> resolve_reward("pipelines.rewards.format:format_reward") is format_reward
    True
    >>> resolve_reward("clarify_llm")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: grpo reward 'clarify_llm' needs the judge role: set llm.roles.judge to an openai backend
    """
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if name in JUDGE_REWARDS:
        if judge is None:
            raise ConfigError(f"grpo reward {name!r} needs the judge role: set llm.roles.judge to an openai backend")
        return JUDGE_REWARDS[name](judge)
    return _import(name, name)


def build_clarify_reward(kind: str, client: LLMClient | None = None) -> ClarifyReward:
    """The clarification reward with the ``kind`` of judge, one of :data:`CLARIFY_JUDGES`:
    ``"verifiable"`` (``client`` is not used) or ``"llm"`` (an :class:`LLMJudge` with its
    defaults over ``client``, which is then required; build ``ClarifyReward(LLMJudge(...))``
    directly for other judge settings). Raises ConfigError for an unknown kind or a missing
    client."""
    if kind == "verifiable":
        return ClarifyReward(VerifiableJudge())
    if kind == "llm":
        if client is None:
            raise ConfigError("clarify reward: the llm judge needs an LLM client")
        return ClarifyReward(LLMJudge(client))
    raise ConfigError(f"clarify reward: unknown judge {kind!r}; judges: {', '.join(CLARIFY_JUDGES)}")


__all__ = [
    "CANDIDATE_VALUES",
    "CLARIFY_JUDGES",
    "CONVERSATION",
    "Clarification",
    "ClarifyReward",
    "DISCRIMINATING_SLOTS",
    "FULL_CREDIT",
    "JUDGE_PROMPT_TEMPLATE",
    "JUDGE_REWARDS",
    "Judge",
    "JudgeError",
    "JudgeStats",
    "KNOWN_SLOTS",
    "L2AReward",
    "LLMJudge",
    "NO_QUESTION",
    "PARTIAL_CREDIT",
    "REWARD_FUNCTIONS",
    "RulesGrader",
    "SLOT_CUES",
    "SPEAKRL_PROMPT_TEMPLATE",
    "Verdict",
    "VerifiableJudge",
    "asked_slots",
    "build_clarify_reward",
    "clarification_question",
    "completion_text",
    "format_reward",
    "format_score",
    "parse_score",
    "render_conversation",
    "render_judge_prompt",
    "render_speakrl_prompt",
    "resolve_reward",
]
