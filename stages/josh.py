"""DVC stage ``josh``: JOSH tree harvesting on ToolWOZ (Algorithm 1), SFT and KTO data.

    python -m stages.josh [--params params.yaml]

params.yaml ``josh``: ``source`` / ``db_dir`` / ``strict`` (any MultiWOZ-layout corpus),
``max_goals`` (the first train goals in id order; null: all), ``seed``, ``agent``
(``backend``: hf, the method: the policy M being trained harvests its own trees, ``model_path``
M, prompted by ``prompt`` as it is trained | openai: M behind an endpoint | rules: the template
harvester, a reference for tests; ``format``, the rules policy, sampling),
``simulator`` (``kind``: agenda | goal_llm | guide_llm, agenda settings), ``beam``
(``max_beam``, ``branching_factor``, ``max_turns``), ``concurrency`` (trees in play at
once), ``min_reward`` (a golden path is training data from this tree reward on; paper: 1),
``work_dir`` (per-goal checkpoints), ``fan_out`` (0 workers: in this process; n: a
Prefect flow over n thread / process workers or a Dask cluster, :mod:`flows.josh`), ``test`` (the agent without branching on the official
ToolWOZ test goals: ``josh_eval``, and average reward and 100 % success in the metrics),
``output``, ``metrics``, ``require_training_data`` (default false: a harvest without
training rows is reported, not an error).

Resumable: every finished tree is written at once to ``<work_dir>/<fingerprint>/<goal>.json``
(the fingerprint covers the corpus files and every harvest setting), and a run reads the
trees already there instead of harvesting them again, so a run killed mid-way loses at
most the trees in play. With the rules agent and the agenda simulator a tree depends only
on its goal and the params, so a resumed run writes the same tables as an uninterrupted
one; an openai agent's replays are free through the LLM cache (``llm.cache_dir``).

When no tree has a golden path (the tiny model's harvest), there is nothing to train M' on:
the stage publishes ``josh_trees``, ``josh_eval`` and EMPTY ``josh_sft`` / ``josh_kto`` tables
(zero rows, their usual schema; never an earlier harvest's rows), writes the report with the
counts (``training_data: false``, ``no_training_data``: why) and exits 0; ``train.josh_*``
(``allow_empty: true``) then report "not trained". ``require_training_data: true`` makes such a
harvest fail instead (the SFT / KTO tables of any earlier harvest are removed).

Outputs: ``<output>/josh_trees.parquet``, ``josh_sft.parquet``, ``josh_kto.parquet``, ``josh_eval.parquet``
(``askflow sql`` names them by their stem) and the metrics ``reports/josh.json``; wall
time and speed go to ``reports/timings/josh.json``.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.errors import DataError
from pipelines.josh.config import JoshConfig
from pipelines.josh.tables import eval_table, josh_tables
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from pipelines.config import from_params
from catalog import datasets


def josh_config(params: Mapping[str, Any]) -> JoshConfig:
    return from_params(JoshConfig, params, "params.yaml josh")


def run(params: Mapping[str, Any], llm_params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config = josh_config(params)
    from catalog.josh import open_workspace
    from flows.josh import run_fan_out
    from pipelines.progress import Progress

    workspace = open_workspace(config, llm_params)
    goals = workspace.goals
    done = workspace.done()
    todo = [g for g in goals if g.goal_id not in done]
    print(f"josh: {len(goals)} train goals, {len(done)} already harvested in {workspace.checkpoints}, {len(todo)} to go")

    started = time.perf_counter()
    if config.fan_out.workers and todo:
        from flows.local_api import local_prefect_api
        from stages.common import configure_prefect

        configure_prefect(Path.cwd())
        with local_prefect_api(os.environ["PREFECT_HOME"]):  # cleans up after a killed run
            run_fan_out(config, llm_params, [g.goal_id for g in todo])
    else:
        # trees harvested at least every 30 s, with the time left
        with Progress(len(todo), "josh harvest", unit="trees") as progress:
            workspace.harvest(todo, on_tree=lambda tree: progress.advance())
    wall_s = time.perf_counter() - started
    harvested = workspace.done()
    missing = [g.goal_id for g in goals if g.goal_id not in harvested]
    workspace.check_llm_failures()
    if missing:  # trees with LLM failures are not checkpointed
        raise DataError(str(workspace.checkpoints), f"{len(missing)} goal(s) have no clean tree (LLM failures), e.g. {missing[:3]}; run again")
    trees = [harvested[g.goal_id] for g in goals]
    fresh = [harvested[g.goal_id] for g in todo]

    test = workspace.test_goals()
    with Progress(len(test) * len(config.test.seeds), "josh test episodes", unit="episodes") as progress:
        episodes = workspace.play_test(test, progress=progress.update)
    workspace.check_llm_failures()
    tables = josh_tables(trees, config.min_reward)
    tables["josh_eval"] = eval_table(episodes)
    metrics = workspace.report(trees, tables, episodes)
    test_scores = metrics["test"]
    harvester = config.agent.model_path if config.agent.backend == "hf" else config.agent.backend
    print(f"josh: test goals ({test_scores['goals']}, seeds {list(config.test.seeds)}): the harvester ({harvester}: "
          f"{metrics['agent']['role']}) without branching: avg reward {test_scores['avg_reward']:.3f} {test_scores['avg_reward_ci95']}, "
          f"100% success {test_scores['success_rate']:.3f} {test_scores['success_rate_ci95']}")
    metrics["llm"] = workspace.llm_accounting()  # this process's calls (fan-out workers keep their own)
    metrics["training_data"] = tables["josh_sft"].num_rows > 0
    if not metrics["training_data"]:
        # Nothing to train M' on: the report says so with the counts and M's test scores. The
        # SFT / KTO tables are published empty (zero rows, their usual schema), so that no
        # training stage trains on an earlier harvester's trees and train.josh_* (allow_empty)
        # report "not trained"; with josh.require_training_data the stage fails instead.
        reason = (f"no tree of the {len(trees)} goals harvested by {harvester} has a clean golden path with reward >= "
                  f"{config.min_reward}: {metrics['successful_nodes']} nodes that met a goal API, {metrics['golden_paths']} golden paths, "
                  f"0 SFT rows, 0 KTO rows (average tree reward {metrics['avg_reward']:.3f}); there is nothing to train M' on")
        metrics["no_training_data"] = reason
        if config.require_training_data:
            datasets.save({name: tables[name] for name in ("josh_trees", "josh_eval")}, config)
            for name in ("josh_sft", "josh_kto"):
                datasets.path(name, config).unlink(missing_ok=True)
            write_json_atomic(Path(config.metrics), metrics)
            raise DataError(str(workspace.checkpoints), f"{reason}; {config.metrics} has the counts and M's test scores, "
                            f"the trees are kept there, so a lower josh.min_reward re-uses them (josh.require_training_data: true)")
        print(f"josh: {reason}; the SFT / KTO tables are published empty (josh.require_training_data: false)")
        datasets.save({name: tables[name] for name in ("josh_trees", "josh_eval")}, config)
        for name in ("josh_sft", "josh_kto"):
            datasets.save_empty(name, tables[name], config)
    else:
        datasets.save({name: tables[name] for name in ("josh_trees", "josh_sft", "josh_kto", "josh_eval")}, config)
    write_json_atomic(Path(config.metrics), metrics)
    nodes_fresh = sum(len(t.nodes) for t in fresh)
    write_timings("josh", {
        "goals_harvested": len(fresh), "goals_resumed": len(goals) - len(fresh), "nodes_harvested": nodes_fresh,
        "workers": config.fan_out.workers, "task_runner": config.fan_out.task_runner if config.fan_out.workers else None,
        "wall_s": round(wall_s, 2), "nodes_per_second": round(nodes_fresh / wall_s, 1) if wall_s else None,
        "agent_calls_per_second": round(sum(t.agent_calls for t in fresh) / wall_s, 1) if wall_s else None,
    })
    print(f"josh: {metrics['goals']} goals, {metrics['nodes']} nodes, {metrics['golden_paths']} golden paths, "
          f"avg reward {metrics['avg_reward']:.3f}, {metrics['sft_rows']} SFT rows, KTO {metrics['kto_rows']}, "
          f"{len(fresh)} trees harvested in {wall_s:.1f} s")
    return metrics


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.josh", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    from stages.common import configure_threads

    configure_threads()
    run(read_params("josh", args.params), read_params("llm", args.params, required=False))


if __name__ == "__main__":
    sys.exit(main())
