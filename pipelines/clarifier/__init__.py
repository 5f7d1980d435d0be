"""The plug-in Clarifier of the Clarifier paper (τ-bench, sections 3-4): the Clarifier itself
(:mod:`.clarifier`, backends rules / openai / hf), its prompts and parsers (:mod:`.prompts`),
the task grounding behind the offline backend and the goal-aware judges (:mod:`.grounding`,
:mod:`.judge`), the SFT / DPO / GRPO datasets (:mod:`.data`, :mod:`.tables`) and the
Table 1 evaluation (:mod:`.evaluation`)."""

from pipelines.clarifier.clarifier import ROLE, Clarifier, HFClarifier, LLMClarifier, RulesClarifier
from pipelines.clarifier.prompts import NO_NEED, ClarifierDecision, parse_clarifier, render_decision
from pipelines.episodes.clarify import ClarifyContext

__all__ = [
    "NO_NEED",
    "ROLE",
    "Clarifier",
    "ClarifierDecision",
    "ClarifyContext",
    "HFClarifier",
    "LLMClarifier",
    "RulesClarifier",
    "parse_clarifier",
    "render_decision",
]
