"""The JOSH harvest's workspace: params.yaml ``josh`` read into the library's objects (the
corpus, its ToolWOZ goals, the agent M, the user simulator) and the per-goal checkpoints.
The stage (:mod:`stages.josh`), the fan-out flow's workers (:mod:`flows.josh`) and the GPU
job's JOSH round (:mod:`flows.gpu`, on a node without Prefect) build them the same way, as
:mod:`catalog.speaker` does for SpeakER; the ToolWOZ evaluation's test goals and user
(:class:`ToolWozTest`) likewise for stage ``josh_evaluate`` and the GPU job."""

from __future__ import annotations

import asyncio
import hashlib
import json
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from pipelines.env.tools import Database
from pipelines.env.toolwoz import ToolWozDatabase, toolwoz_tools
from pipelines.episodes.formats import get_format
from pipelines.errors import ConfigError, DataError
from pipelines.josh.agent import RulesToolWozAgent
from pipelines.josh.beam import JoshTree, harvest
from pipelines.josh.config import HARVESTER_ROLES, JoshConfig, SamplingSpec, ToolWozEvalConfig
from pipelines.josh.evaluate import ToolWozEpisode, play_toolwoz, toolwoz_intervals, toolwoz_scores
from pipelines.josh.goals import JoshGoal, evaluation_goals, harvest_goals, toolwoz_goals
from pipelines.josh.tables import harvest_metrics
from pipelines.llm.accounting import check_failure_rate
from pipelines.records import Corpus
from pipelines.simulators.agenda import SimulatorSpec
from pipelines.training.config import config_dict
from catalog.io import read_json, write_text_atomic
from catalog.multiwoz_dir import load_multiwoz


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

    def test_goals(self) -> list[JoshGoal]:
        """The first ``test.max_goals`` official ToolWOZ test goals, on which M plays without
        branching (its own score beside the harvest)."""
        test_list = [d for d, split in self.corpus.splits.items() if split == "test"]
        test = evaluation_goals(self.all_goals, test_list, self.config.test.max_goals)
        if not test:
            raise DataError(self.config.source, "no test dialogue has ToolWOZ goal APIs: nothing to evaluate on")
        return test

    def play_test(self, goals: Sequence[JoshGoal], progress: Callable[[int, int], Any] | None = None) -> list[ToolWozEpisode]:
        """M plays ``goals`` once per ``test.seeds``, sampled as it harvests, without branching."""
        config = self.config
        return asyncio.run(play_toolwoz(goals, self.agent, self.simulator, self.database, seeds=config.test.seeds,
                                        max_turns=config.beam.max_turns, task_prompt=config.task_prompt, progress=progress))

    def report(self, trees: Sequence[JoshTree], tables: Mapping[str, Any], episodes: Sequence[ToolWozEpisode],
               model_name: str | None = None) -> dict[str, Any]:
        """Stage ``josh``'s report: the harvest's counts, who harvested (``model_name``: how an
        hf M is named, its ``model_path`` by default) and M's scores on the test goals."""
        config = self.config
        report = harvest_metrics(trees, tables)
        report["agent"] = {"backend": config.agent.backend, "format": config.agent.format, "role": HARVESTER_ROLES[config.agent.backend],
                           "model_path": (model_name or config.agent.model_path) if config.agent.backend == "hf" else None}
        report["test"] = {**toolwoz_scores(episodes), **toolwoz_intervals(episodes)}
        return report

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
    # config_dict leaves out a setting added later at its default: old checkpoints stay valid
    settings = {k: v for k, v in config_dict(config).items() if k not in ignored}
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


def _backend(role: str, llm_params: Mapping[str, Any] | None) -> Any:
    from pipelines.llm import backends_from_dict

    backends = backends_from_dict((llm_params or {}).get("roles") or {}, "params.yaml llm.roles")
    backend = backends.get(role)
    if backend is None or backend.kind != "openai":
        raise ConfigError(f"params.yaml llm.roles.{role}: josh needs an 'openai' backend for this role")
    return backend


def _client(role: str, llm_params: Mapping[str, Any] | None, backend: Any = None) -> Any:
    from pipelines.llm import LLMClient, ResponseCache

    backend = backend or _backend(role, llm_params)
    return LLMClient(backend.client, cache=ResponseCache((llm_params or {}).get("cache_dir") or "data/cache/llm"))


def build_simulator(spec: SimulatorSpec, corpus_db: Database, llm_params: Mapping[str, Any] | None) -> tuple[Any, Any]:
    """(the user simulator of ``spec``, its LLM client or None); also the ToolWOZ evaluation's."""
    from pipelines.simulators.factory import simulator_from_config

    if spec.kind == "agenda":
        return simulator_from_config("agenda", database=corpus_db, spec=spec), None
    backend = _backend("user_simulator", llm_params)  # its sampling is the LLM user's
    client = _client("user_simulator", llm_params, backend)
    return simulator_from_config(spec.kind, database=corpus_db, client=client, spec=spec, sampling=backend.sampling), client


@dataclass
class ToolWozTest:
    """The official ToolWOZ test goals of a :class:`ToolWozEvalConfig` and what every model
    plays them against (stage ``josh_evaluate`` and the GPU job's JOSH round)."""

    config: ToolWozEvalConfig
    goals: list[JoshGoal]
    database: ToolWozDatabase
    simulator: Any
    simulator_client: Any
    fmt: Any

    def play(self, agent: Any, name: str, progress: Callable[[int, int], Any] | None = None) -> list[ToolWozEpisode]:
        """``agent`` on every goal once per seed, greedy as configured, without branching;
        the episodes carry ``name``."""
        config = self.config
        played = asyncio.run(play_toolwoz(self.goals, agent, self.simulator, self.database, seeds=config.seeds,
                                          max_turns=config.max_turns, task_prompt=config.task_prompt, progress=progress))
        return [replace(e, agent=name) for e in played]


def open_toolwoz_test(config: ToolWozEvalConfig, llm_params: Mapping[str, Any] | None) -> ToolWozTest:
    corpus = load_multiwoz(config.source, config.db_dir, strict=config.strict)
    database = ToolWozDatabase(corpus.entities)
    test_list = [d for d, split in corpus.splits.items() if split == "test"]
    goals = evaluation_goals(toolwoz_goals(corpus.dialogues, corpus.splits, database), test_list, config.max_goals)
    if not goals:
        raise DataError(config.source, "no test dialogue has ToolWOZ goal APIs: nothing to evaluate on")
    simulator, client = build_simulator(config.simulator, Database(corpus.entities, corpus.taxi_options), llm_params)
    return ToolWozTest(config, goals, database, simulator, client, get_format(config.format, toolwoz_tools()))
