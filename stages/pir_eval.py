"""DVC stage ``pir_eval``: PIR's metrics (section 4.1) for the starting policy and its PIR
fine-tunes on held-out goals.

    python -m stages.pir_eval [--params params.yaml]

Every model of params.yaml ``pir_eval.models`` plays the first ``max_goals`` goals of the
``split`` (test; those that need the tools) once, greedily, with US-GRPO's conversation player
(:class:`pipelines.episodes.rollout.ConversationRollout`: the agenda user simulator answers
its visible turns and the questions it asks inside its reasoning; the goal checker grades the
conversation). Written: ``reports/pir_eval.json`` (metrics per model: success, TTR, tokens,
questions, helpfulness from the rules judge, composite reward, and what ended the
conversations) and ``reports/pir_eval.md`` (the table); wall times in
``reports/timings/pir_eval.json``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping

from catalog.io import from_params, read_params, write_json_atomic, write_text_atomic, write_timings
from pipelines.episodes.rollout import RolloutConfig
from pipelines.errors import ConfigError
from pipelines.simulators.agenda import AgendaConfig
from stages.entry import main_wrapper

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

_KEYS = {"source", "db_dir", "split", "max_goals", "seed", "simulator", "rollout", "threads", "models", "output"}


def check(params: Mapping[str, Any]) -> tuple[RolloutConfig, AgendaConfig, dict[str, str]]:
    where = "params.yaml pir_eval"
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    for key in ("source", "models", "output"):
        if key not in params:
            raise ConfigError(f"{where}.{key}: required")
    if not Path(params["source"]).exists():
        raise ConfigError(f"{where}.source: {params['source']} does not exist")
    models = params["models"]
    if not isinstance(models, Mapping) or not models:
        raise ConfigError(f"{where}.models: expected a mapping of name -> model directory")
    for name, path in models.items():
        if not (Path(str(path)) / "config.json").is_file():
            raise ConfigError(f"{where}.models.{name}: {path} is not a model directory (run its training stage first)")
    output = params["output"]
    if not isinstance(output, Mapping) or not {"metrics", "markdown"} <= set(output):
        raise ConfigError(f"{where}.output: expected {{metrics, markdown}}")
    max_goals = params.get("max_goals", 20)
    if isinstance(max_goals, bool) or not isinstance(max_goals, int) or max_goals < 1:
        raise ConfigError(f"{where}.max_goals: expected a positive integer, got {max_goals!r}")
    rollout = from_params(RolloutConfig, params.get("rollout"), f"{where}.rollout")
    simulator = from_params(AgendaConfig, params.get("simulator"), f"{where}.simulator")
    return rollout, simulator, {str(k): str(v) for k, v in models.items()}


def run(params: Mapping[str, Any]) -> dict[str, Any]:
    rollout_config, simulator_config, models = check(params)
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from catalog.multiwoz_dir import load_multiwoz
    from pipelines.env.tools import Database
    from pipelines.episodes.rollout import ConversationRollout
    from pipelines.evaluation.play import held_out_goals
    from pipelines.pir.metrics import markdown_table, play_and_score
    from pipelines.rewards.pir import PIRReward, RulesHelpfulness
    from pipelines.simulators.agenda import AgendaSimulator

    if params.get("threads") is not None:  # else the top-level params.yaml threads (stages/__init__.py)
        torch.set_num_threads(int(params["threads"]))
    started = time.perf_counter()
    corpus = load_multiwoz(params["source"], params.get("db_dir"))
    database = Database(corpus.entities, corpus.taxi_options)
    split = str(params.get("split", "test"))
    dialogues = held_out_goals(corpus.dialogues, split, int(params.get("max_goals", 20)))
    if not dialogues:
        raise ConfigError(f"params.yaml pir_eval: no {split} goal in {params['source']}")
    seed = int(params.get("seed", 0))
    results: dict[str, Any] = {}
    timings: dict[str, float] = {}
    for name, path in models.items():
        t0 = time.perf_counter()
        tokenizer = AutoTokenizer.from_pretrained(path)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        rollout = ConversationRollout(database, AgendaSimulator(database, simulator_config), tokenizer, rollout_config, name=name)
        # A fresh reward per model: its branch counts are that model's.
        reward = PIRReward(RulesHelpfulness())
        metrics, _ = play_and_score(rollout, model, dialogues, seed, reward)
        metrics["reward_branches"] = dict(sorted(reward.stats.items()))
        results[name] = metrics
        timings[f"{name}_s"] = round(time.perf_counter() - t0, 2)
        print(f"pir_eval: {name}: success {metrics['success']}, TTR {metrics['ttr']}, tokens {metrics['tokens']}, "
              f"questions {metrics['questions']}, helpfulness {metrics['helpfulness']} [{timings[f'{name}_s']:.1f}s]")
    report = {"split": split, "goals": len(dialogues), "seed": seed, "models": models, "results": results}
    output = params["output"]
    write_json_atomic(output["metrics"], report)
    table = markdown_table(results)
    write_text_atomic(output["markdown"], (
        f"# PIR metrics on {len(dialogues)} held-out {split} goals (one greedy conversation each)\n\n{table}\n\n"
        "success: the goal checker's verdict; TTR: the simulator's replies after its opening (answers to questions "
        "asked inside the reasoning included); tokens: what the policy wrote; questions: in its reasoning and as "
        "visible clarifications; help.: the rules judge's H over the conversations that asked; reward: PIR's "
        "composite reward (0 unless the goal is met).\n"))
    write_timings("pir_eval", {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    return report


@main_wrapper
def main() -> None:
    run(read_params("pir_eval"))


if __name__ == "__main__":
    sys.exit(main())
