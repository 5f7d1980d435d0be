"""The JOSH harvest's workspace (corpus, goals, agent, simulator, checkpoints) and its fan-out
over workers as a Prefect flow.

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

import asyncio
import functools
import hashlib
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from prefect import flow, get_run_logger, task
from prefect.cache_policies import NO_CACHE

from pipelines.env.tools import Database
from pipelines.env.toolwoz import ToolWozDatabase, toolwoz_tools
from pipelines.episodes.formats import get_format
from pipelines.errors import ConfigError
from pipelines.josh.agent import RulesToolWozAgent
from pipelines.josh.beam import JoshTree, harvest
from pipelines.josh.config import JoshConfig, SamplingSpec
from pipelines.josh.goals import JoshGoal, harvest_goals, toolwoz_goals
from pipelines.llm.accounting import check_failure_rate
from pipelines.records import Corpus
from pipelines.simulators.agenda import SimulatorSpec
from catalog.io import read_json, write_text_atomic
from catalog.multiwoz_dir import load_multiwoz
from flows.runners import task_runner

_TASK = {"cache_policy": NO_CACHE, "persist_result": False}


@dataclass
class Workspace:
    config: JoshConfig
    corpus: Corpus
    database: ToolWozDatabase
    all_goals: list[JoshGoal]  # every ToolWOZ goal of the corpus, any split
    goals: list[JoshGoal]  # the train goals to harvest
    agent: Any
    agent_client: Any
    simulator: Any
    simulator_client: Any
    checkpoints: Path

    def done(self) -> dict[str, JoshTree]:
        """The trees already checkpointed, by goal id."""
        trees = {}
        for goal in self.goals:
            path = self.checkpoints / f"{goal.goal_id}.json"
            if path.is_file():
                trees[goal.goal_id] = JoshTree.from_record(read_json(path))
        return trees

    def save(self, tree: JoshTree) -> None:
        if tree.backend_failures:
            return  # harvested again next time (the LLM cache replays the calls that worked)
        write_text_atomic(self.checkpoints / f"{tree.goal_id}.json", json.dumps(tree.to_record(), ensure_ascii=False, sort_keys=True))

    def harvest(self, goals: Sequence[JoshGoal], on_tree: Callable[[JoshTree], Any] | None = None) -> list[JoshTree]:
        """Harvest ``goals`` in this process, checkpointing each tree as it finishes (then
        ``on_tree(tree)``, e.g. to report progress)."""
        config = self.config

        def done(tree: JoshTree) -> None:
            self.save(tree)
            if on_tree is not None:
                on_tree(tree)

        return asyncio.run(harvest(
            goals, self.agent, self.simulator, self.database, config.beam, seed=config.seed,
            task_prompt=config.task_prompt, concurrency=config.concurrency, done=done,
        )) if goals else []

    def check_llm_failures(self) -> None:
        for name, client in (("agent", self.agent_client), ("user_simulator", self.simulator_client)):
            if client is not None:  # an outage is an error, never a harvest of fallback turns
                check_failure_rate(client.accounting, self.config.max_llm_failure_rate, f"josh ({name})")

    def llm_accounting(self) -> dict[str, Any]:
        # The rules agent and the agenda simulator call no LLM: nothing to account for.
        return {name: c.accounting.as_dict() for name, c in (("agent", self.agent_client), ("user_simulator", self.simulator_client))
                if c is not None}


def open_workspace(config: JoshConfig, llm_params: Mapping[str, Any] | None) -> Workspace:
    corpus = load_multiwoz(config.source, config.db_dir, strict=config.strict)
    database = ToolWozDatabase(corpus.entities)
    all_goals = toolwoz_goals(corpus.dialogues, corpus.splits, database)
    goals = harvest_goals(all_goals, config.max_goals)
    if not goals:
        raise ConfigError(f"params.yaml josh.source: {config.source} has no train dialogue with ToolWOZ goal APIs")
    agent, agent_client = build_agent(config, database, llm_params)
    simulator, simulator_client = build_simulator(config.simulator, Database(corpus.entities, corpus.taxi_options), llm_params)
    checkpoints = Path(config.work_dir) / fingerprint(config, llm_params)
    return Workspace(config, corpus, database, all_goals, goals, agent, agent_client, simulator, simulator_client, checkpoints)


def fingerprint(config: JoshConfig, llm_params: Mapping[str, Any] | None) -> str:
    """What a tree depends on: the corpus files, the model weights (and torch's CPU thread
    count) and every harvest setting (not where the outputs go, how many goals, how they are
    spread over workers)."""
    digest = hashlib.sha256()
    ignored = ("output", "metrics", "work_dir", "concurrency", "max_goals", "min_reward", "max_llm_failure_rate", "test", "fan_out",
               "require_training_data")
    settings = {k: v for k, v in asdict(config).items() if k not in ignored}
    if config.agent.backend == "openai" or config.simulator.kind != "agenda":
        settings["llm_roles"] = (llm_params or {}).get("roles")
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    source = Path(config.source)
    db = Path(config.db_dir) if config.db_dir else source / "db"
    files = [source / "data.json", *sorted(source.glob("*ListFile.json")), *sorted(db.glob("*.json"))]
    if config.agent.backend == "hf":
        files += sorted(Path(config.agent.model_path or "").glob("*.safetensors"))
        import torch

        # a local model samples other tokens on another CPU thread count (params.yaml threads)
        digest.update(f"threads={torch.get_num_threads()}".encode())
    for path in files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _sampling(spec: SamplingSpec) -> Any:
    from pipelines.llm.config import SamplingParams

    extra = {"top_k": spec.top_k} if spec.top_k is not None else {}
    return SamplingParams(temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens, extra_body=extra)


def build_agent(config: JoshConfig, database: ToolWozDatabase, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """(the agent, the LLM client whose accounting the report shows, or None)."""
    fmt = get_format(config.agent.format, toolwoz_tools())
    if config.agent.backend == "rules":
        return RulesToolWozAgent(database, fmt, config.agent.rules), None
    if config.agent.backend == "hf":
        from pipelines.episodes.agents import HFAgent
        from pipelines.llm.config import HFConfig
        from pipelines.llm.hf import HFBackend

        backend = HFBackend.from_config(HFConfig(config.agent.model_path or "", config.agent.device, batch_size=config.agent.batch_size))
        agent = HFAgent(backend, fmt, _sampling(config.agent.sampling), name=f"hf:{config.agent.model_path}", seed=config.seed)
        if config.agent.prompt is None:
            return agent, None
        from pipelines.evaluation.agent import PolicyPromptAgent

        # M harvests prompted as it is trained and evaluated (josh.agent.prompt)
        return PolicyPromptAgent(agent, backend.tokenizer, config.agent.prompt), None
    from pipelines.episodes.agents import OpenAIAgent

    client = _client("agent", llm_params)
    return OpenAIAgent(client, fmt, _sampling(config.agent.sampling)), client


def _client(role: str, llm_params: Mapping[str, Any] | None) -> Any:
    from pipelines.llm import LLMClient, ResponseCache, backends_from_dict

    backends = backends_from_dict((llm_params or {}).get("roles") or {}, "params.yaml llm.roles")
    backend = backends.get(role)
    if backend is None or backend.kind != "openai":
        raise ConfigError(f"params.yaml llm.roles.{role}: josh needs an 'openai' backend for this role")
    return LLMClient(backend.client, cache=ResponseCache((llm_params or {}).get("cache_dir") or "data/cache/llm"))


def build_simulator(spec: SimulatorSpec, corpus_db: Database, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """(the user simulator of ``spec``, its LLM client or None); also the ToolWOZ evaluation's."""
    from pipelines.simulators.factory import simulator_from_config

    client = None if spec.kind == "agenda" else _client("user_simulator", llm_params)
    return simulator_from_config(spec.kind, database=corpus_db, client=client, spec=spec), client


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
