"""DVC stage ``clarifier_eval@taubench``: pass@1 on τ-bench retail test and airline test (out
of domain) for every Clarifier in params, with the do-nothing floor beside each, the agent's
own steps and the Clarifier's questions per episode (the paper's Table 1 layout).

params.yaml ``clarifier.eval``:

* ``taubench`` (default ``../shared/data/taubench``; absent: an error naming it), ``domains``
  (domain -> split), ``seed``, ``budget`` (Clarifier questions per episode);
* ``agent``: the backbone, ``{kind: informed, patience}`` (offline: knows the solution,
  never asks, gives up after ``patience`` turns without the detail it needs; a mechanism
  check), ``{kind: openai, base_url, model, ...}`` (any endpoint with function calling; role
  ``agent``) or ``{kind: hf, model_path, ...}`` (a local model, function calling);
  ``max_tokens`` for the model backbones;
* ``user``: ``{backend: rules}`` (the task-grounded fuzzy user) or an ``openai`` backend
  (the paper's User-Driven Fuzzy Intent prompt; role ``user_simulator``);
* ``clarifiers``: name -> ``null`` (no Clarifier) or a ``clarifier`` role backend: ``hf``
  (``model_path``: the untrained starting model or a trained Clarifier; a missing directory is
  an error naming it), ``openai``, ``rules`` (the offline teacher, grounded in the task's
  ground truth: a reference row);
* ``cache_dir``, ``output`` (``episodes.parquet`` + ``episode_events.parquet``; episode ids
  ``<clarifier>:<task id>#<seed>``), ``metrics`` (JSON) and ``markdown`` (the table);
  ``max_llm_failure_rate`` (default 0.05): an LLM outage stops the stage, nothing published.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.clarifier import HFClarifier, LLMClarifier, RulesClarifier
from pipelines.clarifier.evaluation import DoNothingAgent, results_json, summarize, table1_markdown
from pipelines.clarifier.prompts import prompt_cut
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import FunctionCallingFormat, episode_tables
from pipelines.episodes.runner import EpisodeSpec, run_episodes
from pipelines.episodes.tables import SPECS as EPISODE_SPECS
from pipelines.episodes.taubench import tau_runner_config, tau_specs
from pipelines.errors import ConfigError, DataError
from pipelines.llm import Accounting, BackendConfig, HFConfig, LLMClient, ResponseCache, SamplingParams
from pipelines.llm.accounting import check_failure_rate
from pipelines.simulators.taubench import TauRulesUser
from stages.entry import main_wrapper
from catalog.io import publish, read_params, write_json_atomic, write_text_atomic, write_timings
from catalog.taubench_dir import load_taubench_domain, taubench_root

_KEYS = {"taubench", "domains", "seed", "budget", "agent", "user", "clarifiers", "cache_dir", "output", "metrics", "markdown",
         "max_llm_failure_rate"}
NOTES = {
    "informed": [
        "Agent `informed` (offline): it knows each task's ground-truth actions and makes one only when the user has said "
        "every value of it that only the user knows; it never asks and gives up after `patience` turns without progress. "
        "Its pass@1 measures whether the Clarifier asks for the right detail at the right time (a mechanism check of the "
        "Clarifier, its data and the runner), NOT an agent's or a model's τ-bench ability; do not compare it with the paper.",
        "The `rules` Clarifier reads the task's ground truth (it is the offline teacher); a model Clarifier never does.",
    ],
    "model": [
        "A model backbone: pass@1 is a real τ-bench result for this agent, user and Clarifier "
        "(meaningful when the backbone is a real instruct model; the embedded tiny models stay at the floor).",
    ],
}


def _backend(role: str, section: Any, where: str) -> BackendConfig:
    return BackendConfig.from_dict(role, section, where)


def make_agent(section: Mapping[str, Any], domain: Any, tasks: Mapping[str, Any], accounting: Accounting, cache: ResponseCache) -> Any:
    section = dict(section or {"kind": "informed"})
    kind = section.pop("kind", "informed")
    fmt = FunctionCallingFormat(domain.tool_schemas)
    if kind == "informed":
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
    raise ConfigError(f"params.yaml clarifier.eval.agent.kind: expected informed, openai or hf, got {kind!r}")


def make_clarifier(name: str, section: Any, accounting: Accounting, cache: ResponseCache, cut: tuple[int | None, int | None] = (None, None)) -> Any:
    if section is None:
        return None
    backend = _backend("clarifier", section, f"clarifier.eval.clarifiers.{name}")
    if backend.kind == "rules":
        return RulesClarifier()
    if backend.kind == "openai":
        return LLMClarifier(LLMClient(backend.client, cache=cache, accounting=accounting), backend.sampling, prompt_cut=cut)
    if not Path(backend.hf.model_path).exists():
        raise DataError(backend.hf.model_path, f"Clarifier model not found (params.yaml clarifier.eval.clarifiers.{name}); train it first")
    from pipelines.llm import HFBackend

    return HFClarifier(HFBackend.from_config(backend.hf), backend.sampling, prompt_cut=cut)


def make_user(section: Any, accounting: Accounting, cache: ResponseCache) -> Any:
    backend = _backend("user_simulator", section or {"backend": "rules"}, "clarifier.eval.user")
    if backend.kind == "rules":
        return TauRulesUser()
    from pipelines.simulators.protection import ProtectedSimulator
    from pipelines.simulators.taubench import FuzzyLLMUser

    return ProtectedSimulator(FuzzyLLMUser(LLMClient(backend.client, cache=cache, accounting=accounting), backend.sampling))


def run(params: dict, prompt: Mapping[str, Any] | None = None) -> dict:
    cut = prompt_cut(prompt)
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise ConfigError(f"params.yaml clarifier.eval: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    try:
        output, metrics_path, markdown_path = Path(params["output"]), Path(params["metrics"]), Path(params["markdown"])
    except KeyError as exc:
        raise ConfigError(f"params.yaml clarifier.eval: {exc.args[0]!r} is required") from None
    domains = params.get("domains") or {"retail": "test", "airline": "test"}
    clarifiers = params.get("clarifiers") or {"none": None, "rules": {"backend": "rules"}}
    if not isinstance(clarifiers, Mapping) or not clarifiers:
        raise ConfigError("params.yaml clarifier.eval.clarifiers: expected a mapping name -> null | clarifier backend")
    bad = [name for name in clarifiers if not str(name).replace("_", "").isalnum()]
    if bad:
        raise ConfigError(f"params.yaml clarifier.eval.clarifiers: names must be letters, digits and _, got {bad}")
    seed, budget = int(params.get("seed", 0)), int(params.get("budget", 3))
    root = taubench_root(params, "clarifier.eval")
    accounting, cache = Accounting(), ResponseCache(params.get("cache_dir") or "data/cache/llm")
    agent_kind = (params.get("agent") or {}).get("kind", "informed")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    results, episodes = [], []
    user = make_user(params.get("user"), accounting, cache)
    built = {name: make_clarifier(name, section, accounting, cache, cut) for name, section in clarifiers.items()}
    for domain_name, split in domains.items():
        domain = load_taubench_domain(root, domain_name, (split,))
        world, tasks = TauBenchWorld(domain), domain.tasks[split]
        fmt = FunctionCallingFormat(domain.tool_schemas)
        floor_episodes = asyncio.run(run_episodes(tau_specs(tasks, seed), DoNothingAgent(fmt), TauRulesUser(), world, tau_runner_config(domain)))
        floor_passed = sum(e.success for e in floor_episodes)
        for name, clarifier in built.items():
            t0 = time.perf_counter()
            specs = [EpisodeSpec(f"{name}:{task.task_id}#{seed}", task, seed) for task in tasks]
            agent = make_agent(params.get("agent"), domain, {s.episode_id: s.goal for s in specs}, accounting, cache)
            config = tau_runner_config(domain, max_exchanges=30 + budget)
            played = asyncio.run(run_episodes(specs, agent, user, world, config, clarifier, budget))
            results.append(summarize(name, domain_name, played, floor_passed))
            episodes.extend(played)
            timings[f"{name}/{domain_name}_s"] = round(time.perf_counter() - t0, 2)
    check_failure_rate(accounting, params.get("max_llm_failure_rate", 0.05), "clarifier_eval")
    tables = episode_tables(episodes)
    publish({output / f"{name}.parquet": (table, EPISODE_SPECS[name]) for name, table in tables.items()})
    setting = {"agent": agent_kind, "user": (params.get("user") or {}).get("backend", "rules"), "budget": budget, "seed": seed,
               "domains": dict(domains)}
    metrics = results_json(results, setting)
    metrics["llm"] = accounting.as_dict()
    # A model Clarifier's consultations whose history was compacted to fit its positions, and
    # those that did not fit even so (asked nothing, counted as unreadable), both domains.
    metrics["prompts"] = {name: {"compacted": c.compacted, "too_long": c.too_long} for name, c in built.items() if isinstance(c, HFClarifier)}
    write_json_atomic(metrics_path, metrics)
    notes = NOTES["informed" if agent_kind == "informed" else "model"] + [
        f"Floor: a do-nothing agent against the same user (tasks that change nothing and require no output). "
        f"Budget {budget} Clarifier questions per episode; user `{setting['user']}`; seed {seed}; one run per task (pass@1)."
    ]
    write_text_atomic(markdown_path, "# τ-bench Clarifier evaluation (Table 1 layout)\n\n" + table1_markdown(results, list(domains), notes))
    timings["wall_s"] = round(time.perf_counter() - started, 2)
    write_timings("clarifier_eval", timings)
    for result in results:
        print(f"clarifier_eval: {result.clarifier:>8} {result.domain:>8}: pass@1 {result.passed}/{result.n_tasks} "
              f"(floor {result.floor_passed}), agent steps {result.agent_steps:.2f}, clarify {result.clarifications:.2f}")
    return metrics


@main_wrapper
def main() -> None:
    section = read_params("clarifier")
    run(dict(section.get("eval") or {}), section.get("prompt"))


if __name__ == "__main__":
    main()
