"""The JOSH harvest's fan-out over workers as a Prefect flow (the workspace it harvests in:
:mod:`catalog.josh`).

The harvest is embarrassingly parallel over goals: a tree depends only on its goal and the
settings. ``josh.fan_out.workers: 0`` harvests in the stage's process (one event loop,
``josh.concurrency`` trees in play). With n >= 1 workers the flow ``josh-harvest`` splits the
goals still to harvest into chunks of ``chunk_size`` and submits one task per chunk to a
Prefect task runner:

* ``thread``: Prefect's ``ThreadPoolTaskRunner(n)``: one process, overlapping LLM requests
  (an openai agent or LLM user simulator) and local-model batches that release the GIL;
* ``process``: ``ProcessPoolTaskRunner(n)``: n processes on this machine's cores, for the
  CPU-bound rules agent;
* ``dask``: ``prefect_dask.DaskTaskRunner`` on the cluster at ``address`` (a local one when
  null), for harvests that outgrow one machine (``pip install prefect-dask``; the workers
  need the repository and the corpus at the same paths, and a shared ``work_dir``).

Every task opens its own workspace (once per process) and writes each finished tree to the
checkpoint directory at once; the stage then reads all trees from there. So a worker lost
mid-way loses only its trees in play, and the next run resumes.
"""

from __future__ import annotations

import functools
import json
from typing import Any, Mapping

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines.josh.config import JoshConfig
from catalog.josh import Workspace, open_workspace
from flows.runners import task_runner

_TASK = {"cache_policy": NO_CACHE, "persist_result": False}


# --- Fan-out ------------------------------------------------------------------------------


@functools.lru_cache(maxsize=2)
def _worker_workspace(config: JoshConfig, llm_json: str) -> Workspace:
    """One workspace per worker process and configuration (corpus, agent and simulator are
    loaded once, whatever the number of chunks the process harvests)."""
    return open_workspace(config, json.loads(llm_json))


@task(name="harvest-goals", **_TASK)
def harvest_chunk(config: JoshConfig, llm_json: str, goal_ids: list[str]) -> dict[str, Any]:
    """Harvest the trees of ``goal_ids`` into the checkpoint directory."""
    workspace = _worker_workspace(config, llm_json)
    by_id = {g.goal_id: g for g in workspace.goals}
    trees = workspace.harvest([by_id[i] for i in goal_ids])
    workspace.check_llm_failures()
    return {"trees": len(trees), "nodes": sum(len(t.nodes) for t in trees), "agent_calls": sum(t.agent_calls for t in trees)}


@flow(name="josh-harvest")
def josh_harvest(config: JoshConfig, llm_json: str, goal_ids: list[str]) -> list[dict[str, Any]]:
    """One task per chunk of goals on the flow's task runner; each writes its trees to the
    checkpoint directory. Returns what each chunk harvested."""
    size = config.fan_out.chunk_size
    chunks = [goal_ids[i : i + size] for i in range(0, len(goal_ids), size)]
    from prefect.futures import as_completed

    from pipelines.progress import Progress

    logger = get_run_logger()
    logger.info("%d goals in %d chunks on %d %s workers", len(goal_ids), len(chunks), config.fan_out.workers, config.fan_out.task_runner)
    futures = [harvest_chunk.submit(config, llm_json, chunk) for chunk in chunks]
    # goals of the finished chunks at least every 30 s with the time left (started after the
    # submissions, so that no process of a process pool is forked beside its thread)
    with Progress(len(goal_ids), "josh harvest", unit="goals", emit=lambda line: logger.info("%s", line)) as progress:
        sizes = {id(future): len(chunk) for future, chunk in zip(futures, chunks)}
        for future in as_completed(futures):
            progress.advance(sizes[id(future)])
    return [f.result() for f in futures]


def run_fan_out(config: JoshConfig, llm_params: Mapping[str, Any] | None, goal_ids: list[str]) -> list[dict[str, Any]]:
    llm_json = json.dumps(dict(llm_params or {}), sort_keys=True)
    return josh_harvest.with_options(task_runner=task_runner(config.fan_out, "josh.fan_out"))(config, llm_json, goal_ids)
