"""DVC stage ``clarifier_data@taubench``: the Clarifier's SFT / DPO / GRPO datasets (paper
section 3.2) from Clarifier-augmented episodes on τ-bench retail (train tasks; dev tasks as
the held-out ``val`` split).

params.yaml ``clarifier.data``:

* ``taubench``: the τ-bench directory (default ``vendor/taubench``, in the repository, read in place);
  absent: the stage stops with an error naming it;
* ``splits``: split label -> retail split (``{train: train, val: dev}``);
* ``seed``, ``budget`` (Clarifier questions per episode), ``patience`` (the informed agent's
  turns of waiting before it gives up);
* ``teacher``: the Clarifier that plays the episodes and writes SFT, a ``clarifier`` role
  backend (``{backend: rules}`` offline; ``{backend: openai, ...}`` the paper's teacher);
* ``candidates``: ``{noise, temperature}``: the two DPO candidates per state: the rules
  teacher with this chance of an ungrounded answer; an openai teacher sampled at
  ``temperature`` (paper: 0.6) with two seeds;
* ``judge``: a ``judge`` role backend: ``rules`` (the utilities of
  :mod:`pipelines.clarifier.grounding`, from G*) or ``openai`` (the paper's A/B/TIE/BOTH_BAD prompt);
* ``cache_dir``, ``output`` (directory of the three Parquet files), ``metrics`` (JSON with
  the judge's outcome counts); ``max_llm_failure_rate`` (default 0.05): more failed teacher
  or judge calls than this is an outage: exit 1, nothing published. A teacher answer that is
  neither form is counted (``sft.teacher_malformed``) and never becomes an SFT example.

The stage is in the pipeline only when ``clarifier.enable`` lists ``taubench`` (dvc.yaml
``foreach``); its data is in the repository, so it runs on every machine.
"""

from __future__ import annotations

import time
from dataclasses import replace
from pathlib import Path
from typing import Any, Mapping

from pipelines.clarifier.agent import TauInformedAgent
from pipelines.clarifier.clarifier import LLMClarifier, RulesClarifier
from pipelines.clarifier.data import collect, dpo_rows, grpo_rows, sft_rows
from pipelines.clarifier.judge import LLMGoalJudge, RulesGoalJudge
from pipelines.clarifier.prompts import prompt_cut
from pipelines.clarifier.tables import CLARIFIER_DPO, CLARIFIER_GRPO, CLARIFIER_SFT, table
from pipelines.env.world import TauBenchWorld
from pipelines.episodes.taubench import tau_runner_config
from pipelines.errors import ConfigError
from pipelines.llm import Accounting, BackendConfig, LLMClient, ResponseCache
from pipelines.llm.accounting import check_failure_rate
from pipelines.simulators.taubench import TauRulesUser
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from pipelines.clarifier.config import ClarifierDataParams
from pipelines.config import from_params
from catalog import datasets
from catalog.taubench_dir import load_taubench_domain, taubench_root



def _client(backend: BackendConfig, cache_dir: str | None, accounting: Accounting) -> LLMClient:
    return LLMClient(backend.client, cache=ResponseCache(cache_dir or "data/cache/llm"), accounting=accounting)


def run(params: dict, prompt: Mapping[str, Any] | None = None) -> dict:
    cut = prompt_cut(prompt)
    config = from_params(ClarifierDataParams, params, "params.yaml clarifier.data")
    output, metrics_path = Path(config.output), Path(config.metrics)
    splits = config.splits or {"train": "train", "val": "dev"}
    if not isinstance(splits, Mapping) or not set(splits) <= {"train", "val"} or "train" not in splits:
        raise ConfigError(f"params.yaml clarifier.data.splits: expected {{train: <retail split>, val: <retail split>}}, got {splits!r}")
    if "test" in splits.values():
        raise ConfigError("params.yaml clarifier.data.splits: the retail test split is for evaluation only")
    budget, patience, seed = config.budget, config.patience, config.seed
    candidates = config.candidates or {}
    started = time.perf_counter()
    domain = load_taubench_domain(taubench_root({"taubench": config.taubench}, "clarifier.data"), "retail", tuple(dict.fromkeys(splits.values())))
    accounting = Accounting()

    teacher_backend = BackendConfig.from_dict("clarifier", config.teacher or {"backend": "rules"}, "clarifier.data.teacher")
    if teacher_backend.kind == "rules":
        teacher: Any = RulesClarifier()
        pair: tuple[Any, Any] = tuple(RulesClarifier(float(candidates.get("noise", 0.5)), sample) for sample in (0, 1))
    elif teacher_backend.kind == "openai":
        client = _client(teacher_backend, config.cache_dir, accounting)
        teacher = LLMClarifier(client, teacher_backend.sampling)
        sampled = replace(teacher_backend.sampling, temperature=float(candidates.get("temperature", 0.6)))
        pair = (LLMClarifier(client, sampled, sample=1), LLMClarifier(client, sampled, sample=2))
    else:
        raise ConfigError("params.yaml clarifier.data.teacher.backend: use rules or openai (hf is for evaluating trained Clarifiers)")
    judge_backend = BackendConfig.from_dict("judge", config.judge or {"backend": "rules"}, "clarifier.data.judge")
    judge: Any = RulesGoalJudge() if judge_backend.kind == "rules" else LLMGoalJudge(_client(judge_backend, config.cache_dir, accounting), judge_backend.sampling)
    loaded = time.perf_counter()

    tasks = {label: domain.tasks[split] for label, split in splits.items()}
    data = collect(
        tasks, TauBenchWorld(domain), lambda by_episode: TauInformedAgent(by_episode, patience=patience), TauRulesUser(),
        tau_runner_config(domain, max_exchanges=30 + budget), teacher, pair, judge, budget=budget, seed=seed,
    )
    check_failure_rate(accounting, config.max_llm_failure_rate, "clarifier_data")
    collected = time.perf_counter()
    tables = {
        "clarifier_sft": table(sft_rows(data, cut), CLARIFIER_SFT),
        "clarifier_dpo": table(dpo_rows(data, cut), CLARIFIER_DPO),
        "clarifier_grpo": table(grpo_rows(data, cut), CLARIFIER_GRPO),
    }
    datasets.save(tables, config)
    metrics = data.metrics()
    metrics["rows"] = {name: t.num_rows for name, t in tables.items()}
    metrics["backends"] = {"teacher": teacher_backend.kind, "judge": judge_backend.kind}
    metrics["llm"] = accounting.as_dict()
    write_json_atomic(metrics_path, metrics)
    done = time.perf_counter()
    write_timings("clarifier_data", {"load_s": round(loaded - started, 2), "episodes_and_judge_s": round(collected - loaded, 2),
                                     "publish_s": round(done - collected, 2), "wall_s": round(done - started, 2)})
    print(
        f"clarifier_data: {metrics['episodes']} episodes, {metrics['states']} states -> SFT {metrics['rows']['clarifier_sft']}, "
        f"DPO {metrics['rows']['clarifier_dpo']}, GRPO {metrics['rows']['clarifier_grpo']}; judge {metrics['judge_outcomes']} "
        f"[{done - started:.1f}s] -> {output}"
    )
    return metrics


@main_wrapper
def main() -> None:
    section = read_params("clarifier")
    run(dict(section.get("data") or {}), section.get("prompt"))


if __name__ == "__main__":
    main()
