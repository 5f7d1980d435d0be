"""DVC stage ``josh``: JOSH tree harvesting on ToolWOZ (Algorithm 1), SFT and KTO data.

    python -m stages.josh [--params params.yaml]

params.yaml ``josh``: ``source`` / ``db_dir`` / ``strict`` (any MultiWOZ-layout corpus),
``max_goals`` (the first train goals in id order; null: all), ``seed``, ``agent``
(``backend``: rules | hf | openai, ``format``, the rules policy, the hf model, sampling),
``simulator`` (``kind``: agenda | goal_llm | guide_llm, agenda settings), ``beam``
(``max_beam``, ``branching_factor``, ``max_turns``), ``concurrency`` (trees in play at
once), ``min_reward`` (a golden path is training data from this tree reward on; paper: 1),
``work_dir`` (per-goal checkpoints), ``test`` (the agent without branching on the official
ToolWOZ test goals: average reward and 100 % success in the metrics; null: skipped),
``output``, ``metrics``.

Resumable: every finished tree is written at once to ``<work_dir>/<fingerprint>/<goal>.json``
(the fingerprint covers the corpus files and every harvest setting), and a run reads the
trees already there instead of harvesting them again, so a run killed mid-way loses at
most the trees in play. With the rules agent and the agenda simulator a tree depends only
on its goal and the params, so a resumed run writes the same tables as an uninterrupted
one; an openai agent's replays are free through the LLM cache (``llm.cache_dir``).

Outputs: ``<output>/josh_trees.parquet``, ``josh_sft.parquet``, ``josh_kto.parquet``
(``askflow sql`` names them by their stem) and the metrics ``reports/josh.json``; wall
time and speed go to ``reports/timings/josh.json``.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import sys
import time
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.env.tools import Database
from pipelines.env.toolwoz import ToolWozDatabase, toolwoz_tools
from pipelines.episodes.formats import FORMATS, get_format
from pipelines.errors import ConfigError, DataError
from pipelines.llm.accounting import check_failure_rate
from pipelines.josh.agent import RulesPolicy, RulesToolWozAgent
from pipelines.josh.beam import BeamConfig, JoshTree, harvest
from pipelines.josh.evaluate import play_toolwoz, toolwoz_scores
from pipelines.josh.goals import JoshGoal, evaluation_goals, harvest_goals, toolwoz_goals
from pipelines.josh.tables import SPECS, harvest_metrics, josh_tables
from pipelines.simulators.agenda import AgendaConfig
from stages.io import from_params, main_wrapper, publish, read_json, read_params, write_json_atomic, write_text_atomic, write_timings
from stages.multiwoz_dir import load_multiwoz

# JOSH's ReACT prompt (Table 8), for the four ToolWOZ domains.
TOOLWOZ_TASK_PROMPT = (
    "You are a customer service agent helping a user find and book restaurants, hotels, attractions and trains "
    "in Cambridge, UK. You MUST use the apis available to you to gather information; never use your own knowledge. "
    "Ask the user for what you need to know before you search or book."
)
BACKENDS: tuple[str, ...] = ("rules", "hf", "openai")


@dataclass(frozen=True)
class SamplingSpec:
    """Paper: temperature 1.0 (gpt); 1.5 with top_k 50 and top_p 0.75 (llama)."""

    temperature: float = 1.0
    top_p: float | None = None
    top_k: int | None = None
    max_tokens: int = 256


@dataclass(frozen=True)
class AgentSpec:
    backend: str = "rules"
    format: str = "react"
    rules: RulesPolicy = field(default_factory=RulesPolicy)
    model_path: str | None = None  # hf: a local model directory, e.g. models/sft
    device: str = "cpu"
    batch_size: int = 8
    sampling: SamplingSpec = field(default_factory=SamplingSpec)


@dataclass(frozen=True)
class SimulatorSpec(AgendaConfig):
    kind: str = "agenda"


@dataclass(frozen=True)
class TestSpec:
    """The harvesting agent on the official ToolWOZ test goals (first ``max_goals`` sorted
    ids of the test list), once per seed, no branching: average reward and 100 % success."""

    max_goals: int = 450
    seeds: tuple[int, ...] = (0,)


@dataclass(frozen=True)
class JoshParams:
    source: str
    output: str
    metrics: str
    db_dir: str | None = None
    strict: bool = False
    max_goals: int | None = None
    seed: int = 0
    agent: AgentSpec = field(default_factory=AgentSpec)
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)
    beam: BeamConfig = field(default_factory=BeamConfig)
    concurrency: int = 8
    min_reward: float = 1.0
    task_prompt: str = TOOLWOZ_TASK_PROMPT
    work_dir: str = "data/cache/josh"
    max_llm_failure_rate: float = 0.05
    test: TestSpec | None = field(default_factory=TestSpec)


def josh_params(params: Mapping[str, Any]) -> JoshParams:
    where = "params.yaml josh"
    config = from_params(JoshParams, params, where)
    if config.agent.backend not in BACKENDS:
        raise ConfigError(f"{where}.agent.backend: expected one of {list(BACKENDS)}, got {config.agent.backend!r}")
    if config.agent.format not in FORMATS:
        raise ConfigError(f"{where}.agent.format: expected one of {list(FORMATS)}, got {config.agent.format!r}")
    if config.agent.backend == "hf" and not config.agent.model_path:
        raise ConfigError(f"{where}.agent.model_path: required for backend 'hf' (e.g. models/sft)")
    if config.max_goals is not None and config.max_goals < 1:
        raise ConfigError(f"{where}.max_goals: expected null or an integer >= 1, got {config.max_goals}")
    if config.concurrency < 1:
        raise ConfigError(f"{where}.concurrency: expected an integer >= 1, got {config.concurrency}")
    if not 0.0 < config.min_reward <= 1.0:
        raise ConfigError(f"{where}.min_reward: expected a number in (0, 1], got {config.min_reward}")
    return config


def fingerprint(config: JoshParams, llm_params: Mapping[str, Any] | None) -> str:
    """What a tree depends on: the corpus files and every harvest setting (not where the
    outputs go, nor how many trees are in play)."""
    digest = hashlib.sha256()
    ignored = ("output", "metrics", "work_dir", "concurrency", "max_goals", "min_reward", "max_llm_failure_rate", "test")
    settings = {k: v for k, v in asdict(config).items() if k not in ignored}
    if config.agent.backend == "openai" or config.simulator.kind != "agenda":
        settings["llm_roles"] = (llm_params or {}).get("roles")
    digest.update(json.dumps(settings, sort_keys=True, default=str).encode())
    source = Path(config.source)
    db = Path(config.db_dir) if config.db_dir else source / "db"
    files = [source / "data.json", *sorted(source.glob("*ListFile.json")), *sorted(db.glob("*.json"))]
    if config.agent.backend == "hf":
        files += sorted(Path(config.agent.model_path or "").glob("*.safetensors"))
    for path in files:
        digest.update(path.name.encode())
        digest.update(hashlib.sha256(path.read_bytes()).digest())
    return digest.hexdigest()[:16]


def _sampling(spec: SamplingSpec) -> Any:
    from pipelines.llm.config import SamplingParams

    extra = {"top_k": spec.top_k} if spec.top_k is not None else {}
    return SamplingParams(temperature=spec.temperature, top_p=spec.top_p, max_tokens=spec.max_tokens, extra_body=extra)


def build_agent(config: JoshParams, database: ToolWozDatabase, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """(the agent, the LLM client whose accounting the report shows, or None)."""
    fmt = get_format(config.agent.format, toolwoz_tools())
    if config.agent.backend == "rules":
        return RulesToolWozAgent(database, fmt, config.agent.rules), None
    if config.agent.backend == "hf":
        from pipelines.episodes.agents import HFAgent
        from pipelines.llm.config import HFConfig
        from pipelines.llm.hf import HFBackend

        backend = HFBackend.from_config(HFConfig(config.agent.model_path or "", config.agent.device, batch_size=config.agent.batch_size))
        return HFAgent(backend, fmt, _sampling(config.agent.sampling), name=f"hf:{config.agent.model_path}", seed=config.seed), None
    client = _client("agent", llm_params)
    from pipelines.episodes.agents import OpenAIAgent

    return OpenAIAgent(client, fmt, _sampling(config.agent.sampling)), client


def _client(role: str, llm_params: Mapping[str, Any] | None) -> Any:
    from pipelines.llm import LLMClient, ResponseCache, backends_from_dict

    backends = backends_from_dict((llm_params or {}).get("roles") or {}, "params.yaml llm.roles")
    backend = backends.get(role)
    if backend is None or backend.kind != "openai":
        raise ConfigError(f"params.yaml llm.roles.{role}: josh needs an 'openai' backend for this role")
    return LLMClient(backend.client, cache=ResponseCache((llm_params or {}).get("cache_dir") or "data/cache/llm"))


def build_simulator(config: JoshParams, corpus_db: Database, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    from pipelines.simulators.factory import simulator_from_config

    agenda = AgendaConfig(**{f.name: getattr(config.simulator, f.name) for f in fields(AgendaConfig)})
    client = None if config.simulator.kind == "agenda" else _client("user_simulator", llm_params)
    return simulator_from_config(config.simulator.kind, database=corpus_db, client=client, agenda=agenda), client


def load_checkpoints(directory: Path, goals: Sequence[JoshGoal]) -> dict[str, JoshTree]:
    done = {}
    for goal in goals:
        path = directory / f"{goal.goal_id}.json"
        if path.is_file():
            done[goal.goal_id] = JoshTree.from_record(read_json(path))
    return done


def run(params: Mapping[str, Any], llm_params: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config = josh_params(params)
    corpus = load_multiwoz(config.source, config.db_dir, strict=config.strict)
    database = ToolWozDatabase(corpus.entities)
    all_goals = toolwoz_goals(corpus.dialogues, corpus.splits, database)
    goals = harvest_goals(all_goals, config.max_goals)
    if not goals:
        raise ConfigError(f"params.yaml josh.source: {config.source} has no train dialogue with ToolWOZ goal APIs")
    agent, agent_client = build_agent(config, database, llm_params)
    simulator, simulator_client = build_simulator(config, Database(corpus.entities, corpus.taxi_options), llm_params)

    checkpoints = Path(config.work_dir) / fingerprint(config, llm_params)
    done = load_checkpoints(checkpoints, goals)
    todo = [g for g in goals if g.goal_id not in done]
    print(f"josh: {len(goals)} train goals, {len(done)} already harvested in {checkpoints}, {len(todo)} to go")

    def save(tree: JoshTree) -> None:
        if tree.backend_failures:
            return  # harvested again next time (the LLM cache replays the calls that worked)
        write_text_atomic(checkpoints / f"{tree.goal_id}.json", json.dumps(tree.to_record(), ensure_ascii=False, sort_keys=True))

    started = time.perf_counter()
    fresh = asyncio.run(harvest(
        todo, agent, simulator, database, config.beam, seed=config.seed, task_prompt=config.task_prompt,
        concurrency=config.concurrency, done=save,
    )) if todo else []
    wall_s = time.perf_counter() - started
    done.update((t.goal_id, t) for t in fresh)
    trees = [done[g.goal_id] for g in goals]

    test_scores = None
    if config.test is not None:
        test_list = [d for d, split in corpus.splits.items() if split == "test"]
        test = evaluation_goals(all_goals, test_list, config.test.max_goals)
        episodes = asyncio.run(play_toolwoz(test, agent, simulator, database, seeds=config.test.seeds,
                                            max_turns=config.beam.max_turns, task_prompt=config.task_prompt))
        test_scores = toolwoz_scores(episodes)
        print(f"josh: test goals ({test_scores['goals']}, seeds {list(config.test.seeds)}): the {config.agent.backend} agent "
              f"without branching: avg reward {test_scores['avg_reward']:.3f}, 100% success {test_scores['success_rate']:.3f}")
    for name, client in (("agent", agent_client), ("user_simulator", simulator_client)):
        if client is not None:  # an outage is an error, never a harvest of fallback turns
            check_failure_rate(client.accounting, config.max_llm_failure_rate, f"josh ({name})")
    tables = josh_tables(trees, config.min_reward)
    if tables["josh_sft"].num_rows == 0:
        rewards = [t.reward for t in trees]
        raise DataError(str(checkpoints), f"no tree of the {len(trees)} goals has a clean golden path with reward >= "
                        f"{config.min_reward} (average reward {sum(rewards) / len(rewards):.3f}): there is nothing to train on; "
                        "the trees are kept there, so a lower josh.min_reward re-uses them")
    output = Path(config.output)
    publish({output / f"{name}.parquet": (tables[name], SPECS[name]) for name in SPECS})
    metrics = harvest_metrics(trees, tables)
    metrics["agent"] = {"backend": config.agent.backend, "format": config.agent.format}
    if test_scores is not None:
        metrics["test"] = test_scores
    # The rules agent and the agenda simulator call no LLM: nothing to account for.
    metrics["llm"] = {name: c.accounting.as_dict() for name, c in (("agent", agent_client), ("user_simulator", simulator_client)) if c is not None}
    write_json_atomic(Path(config.metrics), metrics)
    nodes_fresh = sum(len(t.nodes) for t in fresh)
    write_timings("josh", {
        "goals_harvested": len(fresh), "goals_resumed": len(goals) - len(fresh), "nodes_harvested": nodes_fresh,
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
    run(read_params("josh", args.params), read_params("llm", args.params, required=False))


if __name__ == "__main__":
    sys.exit(main())
