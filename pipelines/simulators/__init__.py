"""User simulators: the agenda simulator (rules) and the JOSH goal / guide LLM simulators,
with PIR-style failure protection. ``base`` holds the contract with the dialogue runner."""

from pipelines.simulators.agenda import SimulatorSpec, AgendaSession, AgendaSimulator
from pipelines.simulators.base import END_CONVERSATION, SimulatorSession, UserSimulator, UserTurn
from pipelines.simulators.factory import SIMULATOR_KINDS, simulator_from_config
from pipelines.simulators.goals import goal_instructions, pursuit_order, render_goal, strip_markup
from pipelines.simulators.llm import (
    GoalLLMSession,
    GoalLLMSimulator,
    GuideLLMSession,
    GuideLLMSimulator,
    DEFAULT_SAMPLING,
    goal_messages,
    guide_messages,
    parse_reply,
)
from pipelines.simulators.protection import (
    FALLBACK_REPLIES,
    ProtectedSession,
    ProtectedSimulator,
    SimulatorFault,
    turn_fault,
)

__all__ = [
    "SimulatorSpec",
    "AgendaSession",
    "AgendaSimulator",
    "END_CONVERSATION",
    "FALLBACK_REPLIES",
    "GoalLLMSession",
    "GoalLLMSimulator",
    "GuideLLMSession",
    "GuideLLMSimulator",
    "DEFAULT_SAMPLING",
    "ProtectedSession",
    "ProtectedSimulator",
    "SIMULATOR_KINDS",
    "SimulatorFault",
    "SimulatorSession",
    "UserSimulator",
    "UserTurn",
    "goal_instructions",
    "goal_messages",
    "guide_messages",
    "parse_reply",
    "pursuit_order",
    "render_goal",
    "simulator_from_config",
    "strip_markup",
    "turn_fault",
]
