"""Build the configured user simulator from already-built parts.

The stage that runs episodes parses its params section into these dataclasses and builds
the database and the LLM client; this function only wires them together and says what is
missing.
"""

from __future__ import annotations

from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.llm import LLMClient
from pipelines.simulators.agenda import SimulatorSpec, AgendaSimulator
from pipelines.simulators.base import UserSimulator
from pipelines.simulators.llm import GoalLLMSimulator, GuideLLMSimulator, LLMSimulatorConfig
from pipelines.simulators.protection import ProtectionConfig, ProtectedSimulator

SIMULATOR_KINDS: tuple[str, ...] = ("agenda", "goal_llm", "guide_llm")


def simulator_from_config(
    kind: str,
    *,
    database: Database | None = None,
    client: LLMClient | None = None,
    agenda: SimulatorSpec = SimulatorSpec(),
    llm: LLMSimulatorConfig = LLMSimulatorConfig(),
    protection: ProtectionConfig | None = ProtectionConfig(),
) -> UserSimulator:
    """The user simulator of ``kind``.

    ``agenda`` needs the ``database``. The LLM kinds need the ``client`` of role
    "user_simulator"; they are wrapped in failure protection unless ``protection`` is None,
    with the agenda simulator as the fallback when a ``database`` is given. The agenda
    simulator is never wrapped: it calls nothing that can fail, so a fault there is a bug
    that should surface, not a turn to paper over.
    """
    if kind not in SIMULATOR_KINDS:
        raise ConfigError(f"user simulator: unknown kind {kind!r}; expected one of {list(SIMULATOR_KINDS)}")
    if kind == "agenda":
        if database is None:
            raise ConfigError("user simulator 'agenda' needs the database")
        return AgendaSimulator(database, agenda)
    if client is None:
        raise ConfigError(
            f"user simulator {kind!r} needs an LLM client: configure an 'openai' backend for role 'user_simulator'"
        )
    inner = GoalLLMSimulator(client, llm) if kind == "goal_llm" else GuideLLMSimulator(client, llm)
    if protection is None:
        return inner
    fallback = AgendaSimulator(database, agenda) if database is not None else None
    return ProtectedSimulator(inner, protection, fallback)
