"""DVC stage ``gold_replay``: play every gold dialogue through the dialogue runner.

The replay agent speaks the dataset's system side (its tool calls, then its words) and the
user simulator named in params answers from the hidden goal; the goal checker grades each
episode. On a sound corpus (and a sound simulator, environment and checker) nearly every
episode succeeds, so this stage is the pipeline's end-to-end self-check, and its episodes
are stored like any agent's (``episodes`` / ``episode_events``).

params.yaml ``gold_replay``: source (MultiWOZ directory), db_dir (optional), agent_format,
simulator (agenda settings), max_exchanges, seed, output, metrics.
"""

from __future__ import annotations

import time
from collections import Counter
from pathlib import Path

from pipelines.env.tools import Database
from pipelines.episodes import EPISODE_EVENTS, EPISODES, EpisodeSpec, ReplayAgent, RunnerConfig, episode_tables, get_format, run_episodes_sync
from pipelines.errors import ConfigError
from pipelines.simulators.agenda import AgendaConfig, AgendaSimulator
from stages.io import main_wrapper, publish, read_params, write_json_atomic, write_timings
from stages.multiwoz_dir import load_multiwoz


def summary(episodes) -> dict:
    """The replay's metrics: a function of the corpus and the params only (no clock)."""
    n = len(episodes)
    ended = Counter(e.ended_by for e in episodes)
    return {
        "episodes": n,
        "success_rate": sum(e.success for e in episodes) / n if n else 0.0,
        "inform_rate": sum(e.inform for e in episodes) / n if n else 0.0,
        "avg_turns": sum(e.n_turns for e in episodes) / n if n else 0.0,
        "ended_by": dict(sorted(ended.items())),
        "tool_calls": sum(e.n_tool_calls for e in episodes),
        "tool_errors": sum(e.n_tool_errors for e in episodes),
        "simulator_fallbacks": sum(e.simulator_fallbacks for e in episodes),
    }


def run(params: dict) -> dict:
    try:
        source, output = Path(params["source"]), Path(params["output"])
    except KeyError as exc:
        raise ConfigError(f"params.yaml gold_replay: {exc.args[0]!r} is required") from exc
    simulator_params = dict(params.get("simulator") or {})
    kind = simulator_params.pop("kind", "agenda")
    if kind != "agenda":
        raise ConfigError(f"params.yaml gold_replay.simulator.kind: only 'agenda' replays gold dialogues offline, got {kind!r}")
    corpus = load_multiwoz(source, params.get("db_dir"))
    database = Database(corpus.entities, corpus.taxi_options)
    seed = int(params.get("seed", 0))
    specs = [EpisodeSpec.from_dialogue(d, seed=seed) for d in corpus.dialogues]
    try:
        simulator = AgendaSimulator(database, AgendaConfig(**simulator_params))
    except TypeError as exc:
        raise ConfigError(f"params.yaml gold_replay.simulator: {exc}") from exc
    agent = ReplayAgent(get_format(params.get("agent_format", "speakrl")))
    start = time.perf_counter()
    episodes = run_episodes_sync(specs, agent, simulator, database, RunnerConfig(max_exchanges=int(params.get("max_exchanges", 20))))
    wall_s = time.perf_counter() - start
    metrics = summary(episodes)
    tables = episode_tables(episodes)
    publish({output / "episodes.parquet": (tables["episodes"], EPISODES), output / "episode_events.parquet": (tables["episode_events"], EPISODE_EVENTS)},
            Path(params["report"]) if params.get("report") else None)
    if params.get("metrics"):
        write_json_atomic(Path(params["metrics"]), metrics)
    speed = len(episodes) / wall_s if wall_s else 0.0
    write_timings("gold_replay", {"episodes": len(episodes), "wall_s": round(wall_s, 2), "episodes_per_second": round(speed, 2)})
    print(f"gold_replay: {metrics['episodes']} episodes, success {metrics['success_rate']:.4f}, {speed:.1f} episodes/s")
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("gold_replay"))


if __name__ == "__main__":
    main()
