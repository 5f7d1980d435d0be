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
from pipelines.llm import SamplingParams
from pipelines.simulators.llm import DEFAULT_SAMPLING, GoalLLMSimulator, GuideLLMSimulator
from pipelines.simulators.protection import ProtectedSimulator

SIMULATOR_KINDS: tuple[str, ...] = ("agenda", "goal_llm", "guide_llm")


def simulator_from_config(
    kind: str,
    *,
    database: Database | None = None,
    client: LLMClient | None = None,
    spec: SimulatorSpec = SimulatorSpec(),
    sampling: SamplingParams | None = None,
    protected: bool = True,
) -> UserSimulator:
    """The user simulator of ``kind``.

    ``agenda`` needs the ``database``. The LLM kinds need the ``client`` of role
    "user_simulator" and write at that role's ``sampling`` (None: :data:`DEFAULT_SAMPLING`, JOSH's
    temperature 0); they are wrapped in failure protection (``spec.max_retries``,
    ``spec.turn_timeout_s``) unless ``protected`` is false, with the agenda simulator (``spec``'s
    settings) as the fallback when a ``database`` is given. The agenda
    simulator is never wrapped: it calls nothing that can fail, so a fault there is a bug
    that should surface, not a turn to paper over.
    """
    if kind not in SIMULATOR_KINDS:
        raise ConfigError(f"user simulator: unknown kind {kind!r}; expected one of {list(SIMULATOR_KINDS)}")
    if kind == "agenda":
        if database is None:
            raise ConfigError("user simulator 'agenda' needs the database")
        return AgendaSimulator(database, spec)
    if client is None:
        raise ConfigError(
            f"user simulator {kind!r} needs an LLM client: configure an 'openai' backend for role 'user_simulator'"
        )
    sampling = sampling or DEFAULT_SAMPLING
    inner = GoalLLMSimulator(client, sampling) if kind == "goal_llm" else GuideLLMSimulator(client, sampling)
    if not protected:
        return inner
    fallback = AgendaSimulator(database, spec) if database is not None else None
    return ProtectedSimulator(inner, spec, fallback)
