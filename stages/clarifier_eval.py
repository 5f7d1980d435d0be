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

import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.clarifier.clarifier import HFClarifier
from pipelines.clarifier.evaluation import ORACLE_AGENTS, evaluation_markdown, play_domain, results_json
from pipelines.clarifier.prompts import prompt_cut
from pipelines.episodes import episode_tables
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, ResponseCache
from pipelines.llm.accounting import check_failure_rate
from stages.common import evaluation_parser, for_seeds_table
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_text_atomic, write_timings
from pipelines.clarifier.config import ClarifierEvalParams
from pipelines.config import from_params
from catalog import datasets
from catalog.clarifier import make_agent, make_clarifier, make_user
from catalog.taubench_dir import load_taubench_domain, taubench_root


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
        tasks = domain.tasks[split] if max_tasks is None else domain.tasks[split][:max_tasks]
        played, episodes_here, seconds = play_domain(
            domain, domain_name, tasks, seeds, built, lambda by_id: make_agent(settings.agent, domain, by_id, accounting, cache), user, budget)
        results += played
        episodes += episodes_here
        timings.update(seconds)
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
    write_text_atomic(markdown_path, evaluation_markdown(results, setting, {name: len(seeded) for name, seeded in built.items()}))
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
