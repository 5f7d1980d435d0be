"""DVC stage ``clarifier_eval@taubench``: pass@1 on τ-bench retail test and airline test (out
of domain) for every Clarifier in params, with the do-nothing floor beside each, the agent's
own steps and the Clarifier's questions per episode (the paper's Table 1 layout).

params.yaml ``clarifier.eval``:

* ``taubench`` (default ``vendor/taubench``, in the repository; absent: an error naming it), ``domains``
  (domain -> split), ``seeds`` (every task is played once per seed; ``seed``: one seed),
  ``budget`` (Clarifier questions per episode), ``max_tasks`` (the first N tasks of each
  split; null: all);
* ``agent``: the backbone. Measured settings never see a task's solution: ``{kind: policy}``
  (offline: :class:`~pipelines.clarifier.policy_agent.TauPolicyAgent`, built from the domain's
  name alone; follows the policy, looks up and asks), ``{kind: openai, base_url, model, ...}``
  (any endpoint with function calling; role ``agent``) or ``{kind: hf, model_path, ...}`` (a
  local model, function calling); ``max_tokens`` for the model backbones. ``{kind:
  oracle_informed, patience}`` is the old informed agent, which replays the ground truth: an
  ORACLE, so the report's title says so;
* ``user``: ``{backend: rules}`` (the offline fuzzy user that knows only its instruction,
  :class:`~pipelines.simulators.taubench.TauInstructionUser`) or an ``openai`` backend (the
  paper's User-Driven Fuzzy Intent prompt; role ``user_simulator``);
* ``clarifiers``: name -> ``null`` (no Clarifier) or a ``clarifier`` role backend: ``hf``
  (``model_path``: the untrained starting model or a trained Clarifier; a missing directory is
  an error naming it), ``openai``, ``rules`` (the offline teacher, which reads the task's
  ground truth: its name must start with ``oracle``, so that every table labels it);
* ``cache_dir``, ``output`` (``episodes.parquet`` + ``episode_events.parquet``; episode ids
  ``<clarifier>:<task id>#<seed>``), ``metrics`` (JSON) and ``markdown`` (the table);
  ``max_llm_failure_rate`` (default 0.05): an LLM outage stops the stage, nothing published.
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.policy_agent import TauPolicyAgent
from pipelines.clarifier.clarifier import HFClarifier, LLMClarifier, RulesClarifier
from pipelines.clarifier.evaluation import DoNothingAgent, results_json, summarize_seeds, table1_markdown
from pipelines.clarifier.prompts import prompt_cut
from pipelines.env.world import TauBenchWorld
from pipelines.episodes import FunctionCallingFormat, episode_tables
from pipelines.episodes.runner import EpisodeSpec, run_episodes
from pipelines.episodes.taubench import tau_runner_config, tau_specs
from pipelines.errors import ConfigError, DataError
from pipelines.llm import Accounting, BackendConfig, HFConfig, LLMClient, ResponseCache, SamplingParams
from pipelines.llm.accounting import check_failure_rate
from pipelines.simulators.taubench import TauInstructionUser
from stages.common import evaluation_parser, for_seeds_table
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_text_atomic, write_timings
from pipelines.clarifier.config import ClarifierEvalParams
from pipelines.config import from_params
from catalog import datasets
from catalog.taubench_dir import load_taubench_domain, taubench_root

#: Agent kinds that never receive a task (its ground-truth actions and outputs); the rest are oracles.
HONEST_AGENTS = ("policy", "openai", "hf")
ORACLE_AGENTS = ("oracle_informed",)
NOTES = {
    "policy": [
        "Agent `policy` (offline rules, `pipelines/clarifier/policy_agent.py`): it is built from the domain's name alone and "
        "never sees a task's solution; it authenticates the user with what the user says, reads the profile and orders, "
        "reads the request from the user's words (items, reason, variant, payment), asks for what it lacks, confirms and "
        "writes. It has no give-up timer. Airline: it only cancels a reservation whose id the user gives. Its pass@1 is "
        "what a script that does not know the answer reaches here, not a model's τ-bench ability.",
        "User `rules`: it knows only its instruction (values the instruction states) and says it does not know anything else.",
        "`oracle_rules` is an ORACLE upper bound, not a Clarifier a model can be: it reads the task's ground-truth actions "
        "to pick its question. Every other row reads only the dialogue.",
    ],
    "oracle_informed": [
        "ORACLE agent `oracle_informed`: it replays each task's ground-truth actions once the user has said their values and "
        "gives up after `patience` idle turns; its pass@1 is not an agent's result.",
    ],
    "model": [
        "A model backbone: pass@1 is a real τ-bench result for this agent, user and Clarifier "
        "(meaningful when the backbone is a real instruct model; the embedded tiny models stay at the floor).",
    ],
}


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


def run(params: dict, prompt: Mapping[str, Any] | None = None) -> dict:
    cut = prompt_cut(prompt)
    settings = from_params(ClarifierEvalParams, params, "params.yaml clarifier.eval")
    metrics_path, markdown_path = Path(settings.metrics), Path(settings.markdown)
    domains = settings.domains or {"retail": "test", "airline": "test"}
    clarifiers = settings.clarifiers or {"none": None, "oracle_rules": {"backend": "rules"}}
    if not isinstance(clarifiers, Mapping) or not clarifiers:
        raise ConfigError("params.yaml clarifier.eval.clarifiers: expected a mapping name -> null | clarifier backend")
    bad = [name for name in clarifiers if not str(name).replace("_", "").isalnum()]
    if bad:
        raise ConfigError(f"params.yaml clarifier.eval.clarifiers: names must be letters, digits and _, got {bad}")
    seeds = list(settings.seeds or (settings.seed,))
    budget, max_tasks = settings.budget, settings.max_tasks
    root = taubench_root({"taubench": settings.taubench}, "clarifier.eval")
    accounting, cache = Accounting(), ResponseCache(settings.cache_dir or "data/cache/llm")
    agent_kind = (settings.agent or {}).get("kind", "policy")
    started = time.perf_counter()
    timings: dict[str, float] = {}
    results, episodes = [], []
    user = make_user(settings.user, accounting, cache)
    # name -> (label, Clarifier) per training seed: a list is one Clarifier trained under several
    # seeds (the seeds profile), pooled into one row; the first keeps the row's name, then name@k
    built: dict[str, list[tuple[str, Any]]] = {}
    for name, section in clarifiers.items():
        sections = section if isinstance(section, list) else [section]
        if not sections or (len(sections) > 1 and any(s is None for s in sections)):
            raise ConfigError(f"params.yaml clarifier.eval.clarifiers.{name}: a list names one trained Clarifier per training seed, got {section!r}")
        built[name] = [(f"{name}@{k}" if k else name, make_clarifier(name, s, accounting, cache, cut)) for k, s in enumerate(sections)]
    for domain_name, split in domains.items():
        domain = load_taubench_domain(root, domain_name, (split,))
        world, tasks = TauBenchWorld(domain), domain.tasks[split]
        if max_tasks is not None:
            tasks = tasks[:max_tasks]
        fmt = FunctionCallingFormat(domain.tool_schemas)
        floor_episodes = asyncio.run(run_episodes(tau_specs(tasks, seeds[0]), DoNothingAgent(fmt), TauInstructionUser(), world, tau_runner_config(domain)))
        floor_passed = sum(e.success for e in floor_episodes)
        for name, seeded in built.items():
            t0 = time.perf_counter()
            per_seed = []
            for label, clarifier in seeded:  # one per training seed of the row
                played = []
                for seed in seeds:
                    specs = [EpisodeSpec(f"{label}:{task.task_id}#{seed}", task, seed) for task in tasks]
                    agent = make_agent(settings.agent, domain, {s.episode_id: s.goal for s in specs}, accounting, cache)
                    config = tau_runner_config(domain, max_exchanges=30 + budget)
                    played += asyncio.run(run_episodes(specs, agent, user, world, config, clarifier, budget))
                per_seed.append(played)
            results.append(summarize_seeds(name, domain_name, per_seed, floor_passed))
            episodes.extend(ep for played in per_seed for ep in played)
            timings[f"{name}/{domain_name}_s"] = round(time.perf_counter() - t0, 2)
    check_failure_rate(accounting, settings.max_llm_failure_rate, "clarifier_eval")
    tables = episode_tables(episodes)
    datasets.save({f"clarifier_eval.{name}": table for name, table in tables.items()}, settings)
    setting = {"agent": agent_kind, "oracle_agent": agent_kind in ORACLE_AGENTS,
               "user": (settings.user or {}).get("backend", "rules"), "budget": budget, "seeds": seeds,
               "max_tasks": max_tasks, "domains": dict(domains),
               "oracle_rows": [name for name in clarifiers if str(name).startswith("oracle")]}
    metrics = results_json(results, setting)
    metrics["llm"] = accounting.as_dict()
    # A model Clarifier's consultations whose history was compacted to fit its positions, and
    # those that did not fit even so (asked nothing, counted as unreadable), both domains.
    metrics["prompts"] = {label: {"compacted": c.compacted, "too_long": c.too_long}
                          for seeded in built.values() for label, c in seeded if isinstance(c, HFClarifier)}
    write_json_atomic(metrics_path, metrics)
    notes = NOTES.get(agent_kind, NOTES["model"]) + [
        f"Floor: a do-nothing agent against the same user (tasks that change nothing and require no output). "
        f"Budget {budget} Clarifier questions per episode; user `{setting['user']}`; seeds {seeds}: every task played once "
        f"per seed (pass@1 is the mean over tasks and seeds; the interval is a 95 % bootstrap over tasks, 2,000 resamples)."
        + (f" The first {max_tasks} tasks of each split." if max_tasks is not None else "")
    ]
    pooled = [name for name, seeded in built.items() if len(seeded) > 1]
    if pooled:
        notes.append(f"Training seeds: {', '.join(pooled)} each pool {max(len(v) for v in built.values())} Clarifiers trained "
                     "under different seeds (every one plays every task and seed); pass@1 is the mean over all their "
                     "episodes and the interval resamples the training seeds, then the tasks, so it carries what a "
                     "re-training moves. Each seed's model, passed / questions per episode (Avg Clarify): "
                     + "; ".join(f"{r.clarifier} {r.domain} " + ", ".join(f"{p}/{r.n_tasks * r.seeds} {c:.2f}" for p, c in zip(
                         r.passed_by_training_seed, r.clarify_by_training_seed)) for r in results if r.training_seeds > 1) + ".")
    title = ("# τ-bench Clarifier evaluation: ORACLE agent (it replays the solution)" if agent_kind in ORACLE_AGENTS
             else "# τ-bench Clarifier evaluation (Table 1 layout)")
    write_text_atomic(markdown_path, title + "\n\n" + table1_markdown(results, list(domains), notes))
    timings["wall_s"] = round(time.perf_counter() - started, 2)
    # named after the report (clarifier_eval, or a seeds table's name): a table never overwrites another's
    write_timings(metrics_path.stem, timings)
    for result in results:
        print(f"clarifier_eval: {result.clarifier:>8} {result.domain:>8}: pass@1 {result.passed}/{result.n_tasks} "
              f"(floor {result.floor_passed}), agent steps {result.agent_steps:.2f}, clarify {result.clarifications:.2f}")
    return metrics


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    args = evaluation_parser("python -m stages.clarifier_eval", __doc__.split("\n\n")[0], "clarifier_eval_seeds").parse_args(argv)
    section = read_params("clarifier", args.params)
    params = for_seeds_table(section.get("eval") or {}, args, "clarifier_eval_seeds",
                             {"output": "data/episodes/{table}", "metrics": "reports/training_seeds/{table}.json", "markdown": "reports/training_seeds/{table}.md"},
                             models_key="clarifiers")
    run(params, section.get("prompt"))


if __name__ == "__main__":
    main()
