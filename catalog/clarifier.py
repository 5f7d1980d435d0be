"""The τ-bench Clarifier evaluation's players, built from params.yaml ``clarifier.eval``'s
sections (stage ``clarifier_eval``): the agent backbone, each Clarifier and the user, their
LLM clients on the shared cache and accounting, and the model directories they need checked."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.clarifier import HFClarifier, LLMClarifier, RulesClarifier
from pipelines.clarifier.evaluation import HONEST_AGENTS, ORACLE_AGENTS
from pipelines.clarifier.policy_agent import TauPolicyAgent
from pipelines.episodes import FunctionCallingFormat
from pipelines.errors import ConfigError, DataError
from pipelines.llm import Accounting, BackendConfig, HFConfig, LLMClient, ResponseCache, SamplingParams
from pipelines.simulators.taubench import TauInstructionUser


def _backend(role: str, section: Any, where: str) -> BackendConfig:
    return BackendConfig.from_dict(role, section, where)


def make_agent(section: Mapping[str, Any], domain: Any, tasks: Mapping[str, Any], accounting: Accounting, cache: ResponseCache) -> Any:
    """The agent backbone. Only an ORACLE kind is handed ``tasks`` (episode id -> task, with
    its ground-truth actions and outputs); the measured kinds get the domain's tools and name."""
    section = dict(section or {"kind": "policy"})
    kind = section.pop("kind", "policy")
    fmt = FunctionCallingFormat(domain.tool_schemas)
    if kind == "policy":
        return TauPolicyAgent(domain.name, fmt)
    if kind == "oracle_informed":
        return TauInformedAgent(tasks, fmt, patience=int(section.get("patience", 2)))
    max_tokens = int(section.pop("max_tokens", 512))
    if kind == "openai":
        from pipelines.episodes import OpenAIAgent

        backend = _backend("agent", {"backend": "openai", **section}, "clarifier.eval.agent")
        sampling = backend.sampling if backend.sampling.max_tokens else SamplingParams(temperature=0.0, max_tokens=max_tokens)
        return OpenAIAgent(LLMClient(backend.client, cache=cache, accounting=accounting), fmt, sampling, role="agent")
    if kind == "hf":
        from pipelines.episodes import HFAgent
        from pipelines.llm import HFBackend

        config = HFConfig.from_dict(section, "clarifier.eval.agent")
        if not Path(config.model_path).exists():
            raise DataError(config.model_path, "agent model directory not found (params.yaml clarifier.eval.agent.model_path)")
        return HFAgent(HFBackend.from_config(config), fmt, SamplingParams(temperature=0.0, max_tokens=max_tokens))
    raise ConfigError(f"params.yaml clarifier.eval.agent.kind: expected one of {[*HONEST_AGENTS, *ORACLE_AGENTS]}, got {kind!r}")


def make_clarifier(name: str, section: Any, accounting: Accounting, cache: ResponseCache, cut: tuple[int | None, int | None] = (None, None)) -> Any:
    if section is None:
        return None
    backend = _backend("clarifier", section, f"clarifier.eval.clarifiers.{name}")
    if backend.kind == "rules":
        if not name.startswith("oracle"):
            raise ConfigError(f"params.yaml clarifier.eval.clarifiers.{name}: the rules Clarifier reads the task's ground truth; "
                              f"name it oracle_... so that the table labels it an oracle")
        return RulesClarifier(name=name)
    if backend.kind == "openai":
        return LLMClarifier(LLMClient(backend.client, cache=cache, accounting=accounting), backend.sampling, prompt_cut=cut)
    if not Path(backend.hf.model_path).exists():
        raise DataError(backend.hf.model_path, f"Clarifier model not found (params.yaml clarifier.eval.clarifiers.{name}); train it first")
    from pipelines.llm import HFBackend

    return HFClarifier(HFBackend.from_config(backend.hf), backend.sampling, prompt_cut=cut)


def make_user(section: Any, accounting: Accounting, cache: ResponseCache) -> Any:
    backend = _backend("user_simulator", section or {"backend": "rules"}, "clarifier.eval.user")
    if backend.kind == "rules":
        return TauInstructionUser()
    from pipelines.simulators.protection import ProtectedSimulator
    from pipelines.simulators.taubench import FuzzyLLMUser

    return ProtectedSimulator(FuzzyLLMUser(LLMClient(backend.client, cache=cache, accounting=accounting), backend.sampling))
