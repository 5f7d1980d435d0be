"""Every GRPO reward of askflow, registered by name: the name a GRPO run gives in params
(``rewards: {name: weight}``).

* :mod:`~pipelines.rewards.format`: ``format``, :func:`format_reward`, SpeakRL's
  structured-token reward of eq. 8 with partial credit, on the agent grammar of
  :mod:`pipelines.episodes.formats`;
* :mod:`~pipelines.rewards.clarify`: :class:`ClarifyReward`, SpeakRL's clarification reward
  around an exchangeable judge: ``clarify_verifiable`` (:class:`VerifiableJudge`, a rule over
  the SpeakER decision point's annotations; its module documents the dataset columns) or
  ``clarify_llm`` (:class:`LLMJudge`, the Figure 6 rubric through the ``judge`` role);
* :mod:`~pipelines.rewards.learn_to_ask`: :class:`L2AReward`, Learn-to-Ask's reward (eq. 5:
  the stop decision gates the question's content score from a grader): ``l2a`` and
  ``l2a_questions`` (R_a on the output's questions only);
* :mod:`~pipelines.rewards.clarifier`: the Clarifier paper's goal-aware reward over G*:
  ``clarifier_goal`` (rules judge) and ``clarifier_goal_llm`` (the paper's judge prompt);
* :mod:`~pipelines.rewards.pir`: PIR's US-GRPO composite reward, ``pir_composite_rules``;
* :mod:`~pipelines.rewards.dialogue`: whole conversations' rewards for multi-turn GRPO
  (the rollout's columns): ``dialogue_success``, ``goal_progress``, ``useless_questions``,
  ``malformed_turns``;
* :mod:`~pipelines.rewards.prompts`: the Table 1 training instruction and the conversation
  rendering, shared with the GRPO dataset.

The methods' parsers and judges stay with their methods (:mod:`pipelines.clarifier.judge`,
:mod:`pipelines.clarifier.prompts`, :mod:`pipelines.pir.insertion`); the reward modules
import them.

All are TRL reward functions, ``f(prompts=, completions=, **columns) -> list[float | None]``,
each with a one-line docstring and an example; TRL logs each under its ``__name__``
(``rewards/<__name__>/mean``), which is not always the registered name (``format`` is
``format_reward``, ``pir_composite_rules`` is ``pir_composite``). TRL's ``reward_weights``
combines them; eq. 7 is weights (1, 1)::

    GRPOTrainer(..., reward_funcs=[REWARD_FUNCTIONS["format"], REWARD_FUNCTIONS["clarify_verifiable"]])

A reward outside askflow needs no registration: name it by import path,
``rewards: {"mypackage.rewards:my_reward": 1.0}`` (:func:`resolve_reward`); askflow's own
rewards are always named.
"""

from __future__ import annotations

import importlib
from types import MappingProxyType
from typing import Any, Callable, Mapping

from pipelines.errors import ConfigError
from pipelines.llm import LLMClient
from pipelines.rewards.clarifier import clarifier_goal, clarifier_goal_llm
from pipelines.rewards.dialogue import dialogue_success, goal_progress, malformed_turns, useless_questions
from pipelines.rewards.clarify import NO_QUESTION, Clarification, ClarifyReward, Judge, JudgeError, Verdict
from pipelines.rewards.format import (
    FULL_CREDIT,
    PARTIAL_CREDIT,
    clarification_question,
    completion_text,
    format_reward,
    format_score,
)
from pipelines.rewards.learn_to_ask import L2AReward, RulesGrader, l2a, l2a_questions
from pipelines.rewards.llm_judge import CONVERSATION, JudgeStats, LLMJudge, clarify_llm, parse_score
from pipelines.rewards.pir import pir_composite_rules
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
    clarify_verifiable,
)

CLARIFY_JUDGES: tuple[str, ...] = ("verifiable", "llm")

# --- The registry --------------------------------------------------------------------------------

#: The rewards that need nothing but the dataset, by name.
REWARD_FUNCTIONS: Mapping[str, Callable[..., list]] = MappingProxyType(
    {
        "format": format_reward,
        "clarify_verifiable": clarify_verifiable,
        # Learn-to-Ask (eq. 5, beta 2) with the grader role's rules backend; reads l2a_samples' targets.
        "l2a": l2a,
        "l2a_questions": l2a_questions,
        # The τ-bench Clarifier's goal-aware reward (clarifier_grpo data), judged offline from G*.
        "clarifier_goal": clarifier_goal,
        # PIR's composite reward with the rules helpfulness judge (US-GRPO's rollout gives ``correct``).
        "pir_composite_rules": pir_composite_rules,
        # Whole conversations (multi-turn GRPO's rollout columns: the world's grade of each).
        "dialogue_success": dialogue_success,
        "goal_progress": goal_progress,
        "useless_questions": useless_questions,
        "malformed_turns": malformed_turns,
    }
)

#: The rewards that need an LLM client in the ``judge`` role, by name: name -> factory(client).
JUDGE_REWARDS: Mapping[str, Callable[[LLMClient], Callable[..., list]]] = MappingProxyType(
    {
        "clarify_llm": clarify_llm,
        "clarifier_goal_llm": clarifier_goal_llm,
    }
)

assert not set(REWARD_FUNCTIONS) & set(JUDGE_REWARDS), "a reward name is registered twice"


def _import(path: str) -> Callable[..., list]:
    """A reward outside askflow by import path (the user extension point of :func:`resolve_reward`)."""
    module_name, _, attribute = path.rpartition(":") if ":" in path else path.rpartition(".")
    known = ", ".join([*REWARD_FUNCTIONS, *JUDGE_REWARDS])
    if not module_name:
        raise ConfigError(f"grpo reward {path!r} is unknown; rewards: {known}, or an import path package.module:callable")
    try:
        function = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"grpo reward {path!r}: cannot import it ({exc}); rewards: {known}") from None
    if not callable(function):
        raise ConfigError(f"grpo reward {path!r} is not callable: {function!r}")
    return function


def resolve_reward(name: str, judge: LLMClient | None = None) -> Callable[..., list]:
    """The reward callable a GRPO run names in params: a registered name
    (:data:`REWARD_FUNCTIONS`; :data:`JUDGE_REWARDS` over ``judge``, the client of the
    ``judge`` role), or, for a reward outside askflow, its import path
    ``package.module:name`` (or ``package.module.name``). ConfigError otherwise.

    >>> resolve_reward("format") is format_reward
    True
    >>> resolve_reward("pir_composite_rules").__name__
    'pir_composite'
    >>> resolve_reward("clarify_llm")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: grpo reward 'clarify_llm' needs the judge role: set llm.roles.judge to an openai backend
    >>> resolve_reward("no_such_reward")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: grpo reward 'no_such_reward' is unknown; rewards: format, ..., or an import path package.module:callable
    """
    if name in REWARD_FUNCTIONS:
        return REWARD_FUNCTIONS[name]
    if name in JUDGE_REWARDS:
        if judge is None:
            raise ConfigError(f"grpo reward {name!r} needs the judge role: set llm.roles.judge to an openai backend")
        return JUDGE_REWARDS[name](judge)
    return _import(name)


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
    "dialogue_success",
    "goal_progress",
    "malformed_turns",
    "useless_questions",
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
    "clarifier_goal",
    "clarifier_goal_llm",
    "clarify_llm",
    "clarify_verifiable",
    "completion_text",
    "format_reward",
    "format_score",
    "l2a",
    "l2a_questions",
    "parse_score",
    "pir_composite_rules",
    "render_conversation",
    "render_judge_prompt",
    "render_speakrl_prompt",
    "resolve_reward",
]
