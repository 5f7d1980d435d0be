"""DVC stages ``gold_replay`` (the embedded corpus) and ``gold_replay_real`` (the real MultiWOZ
val dialogues and database in ``vendor/``): play every gold dialogue through the dialogue runner.

    python -m stages.gold_replay [--section gold_replay_real] [--params params.yaml]

The replay agent speaks the dataset's system side (its tool calls, then its words) and the
user simulator named in params answers from the hidden goal; the goal checker grades each
episode. On a sound corpus (and a sound simulator, environment and checker) nearly every
episode succeeds, so this stage is the pipeline's end-to-end self-check, and its episodes
are stored like any agent's (``episodes`` / ``episode_events``).

A reference without annotations (no system turn with a belief state: text-only dialogues)
gives the replay agent no tool call to make, so its episode verifies nothing. Such episodes
are still played and stored, but counted as ``unverifiable`` and left out of the success
and inform rates, which are over the verifiable episodes only (null when there are none).

params.yaml ``gold_replay``: source (MultiWOZ directory), db_dir (optional), strict (as in
``seeds``), agent_format, simulator (agenda settings), max_exchanges, seed, output, report,
metrics; ``gold_replay_real`` has the same keys. An unknown key or a value of the wrong type
stops the stage with ``error: params.yaml <section>.<key>: ...``.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.config import from_params, positive_int
from pipelines.env.replay import has_annotations
from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, ReplayAgent, RunnerConfig, episode_tables, get_format, run_episodes_sync
from pipelines.episodes.formats import FORMATS
from pipelines.errors import ConfigError
from pipelines.simulators.agenda import AgendaSimulator, SimulatorSpec
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from catalog import datasets
from catalog.multiwoz_dir import load_multiwoz


def summary(episodes, unverifiable: frozenset[str] = frozenset()) -> dict:
    """The replay's metrics, a function of the corpus and the params only (no clock);
    ``unverifiable``: dialogue ids whose reference has no annotations, left out of the
    success and inform rates."""
    n = len(episodes)
    ended = Counter(e.ended_by for e in episodes)
    verifiable = [e for e in episodes if e.dialogue_id not in unverifiable]
    v = len(verifiable)
    return {
        "episodes": n,
        "verifiable": v,
        "unverifiable": n - v,
        "success_rate": sum(e.success for e in verifiable) / v if v else None,
        "inform_rate": sum(e.inform for e in verifiable) / v if v else None,
        # The same episodes graded by the field's standard evaluator's definitions
        # (pipelines.env.standard); success_rate / inform_rate above are the strict grade.
        "standard_success_rate": sum(bool(e.standard_success) for e in verifiable) / v if v else None,
        "standard_inform_rate": sum(bool(e.standard_inform) for e in verifiable) / v if v else None,
        "avg_turns": sum(e.n_turns for e in episodes) / n if n else 0.0,
        "ended_by": dict(sorted(ended.items())),
        "tool_calls": sum(e.n_tool_calls for e in episodes),
        "tool_errors": sum(e.n_tool_errors for e in episodes),
        "simulator_fallbacks": sum(e.simulator_fallbacks for e in episodes),
    }


@dataclass(frozen=True)
class GoldReplayParams:
    source: str
    output: str
    db_dir: str | None = None
    agent_format: str = "speakrl"
    simulator: SimulatorSpec = field(default_factory=SimulatorSpec)  # only kind agenda replays offline
    max_exchanges: int = 20
    seed: int = 0
    strict: bool = False
    report: str | None = None
    metrics: str | None = None


def gold_replay_params(params: Mapping[str, Any], section: str = "gold_replay") -> GoldReplayParams:
    """The ``gold_replay`` section (or ``section``), checked: declared keys and types only, a
    known agent format and simulator kind, at least one exchange."""
    where = f"params.yaml {section}"
    config = from_params(GoldReplayParams, params, where)
    if config.simulator.kind != "agenda":
        raise ConfigError(f"{where}.simulator.kind: only 'agenda' replays gold dialogues offline, got {config.simulator.kind!r}")
    if config.agent_format not in FORMATS:
        raise ConfigError(f"{where}.agent_format: expected one of {list(FORMATS)}, got {config.agent_format!r}")
    positive_int(config.max_exchanges, f"{where}.max_exchanges")
    return config


def run(params: Mapping[str, Any], section: str = "gold_replay") -> dict:
    config = gold_replay_params(params, section)
    source = Path(config.source)
    corpus = load_multiwoz(source, config.db_dir, strict=config.strict)
    unverifiable = frozenset(d.dialogue_id for d in corpus.dialogues if not has_annotations(d))
    database = Database(corpus.entities, corpus.taxi_options)
    specs = [EpisodeSpec.from_dialogue(d, seed=config.seed) for d in corpus.dialogues]
    simulator = AgendaSimulator(database, config.simulator)
    agent = ReplayAgent(get_format(config.agent_format), database=database)
    start = time.perf_counter()
    episodes = run_episodes_sync(specs, agent, simulator, database, RunnerConfig(max_exchanges=config.max_exchanges))
    wall_s = time.perf_counter() - start
    metrics = summary(episodes, unverifiable)
    tables = episode_tables(episodes)
    notes = {"unverifiable": {"count": len(unverifiable), "reason": "reference has no belief-state annotations",
                              "first": sorted(unverifiable)[:5]}}
    datasets.save({"gold_replay.episodes": tables["episodes"], "gold_replay.episode_events": tables["episode_events"]},
                  config, report=config.report or None, notes=notes)
    if config.metrics:
        write_json_atomic(Path(config.metrics), metrics)
    speed = len(episodes) / wall_s if wall_s else 0.0
    write_timings(section, {"episodes": len(episodes), "wall_s": round(wall_s, 2), "episodes_per_second": round(speed, 2)})
    rate, standard = ("n/a" if metrics[key] is None else f"{metrics[key]:.4f}" for key in ("success_rate", "standard_success_rate"))
    print(f"{section}: {metrics['episodes']} episodes, unverifiable: {metrics['unverifiable']}, "
          f"success {rate} over {metrics['verifiable']} verifiable (strict; standard: {standard}), {speed:.1f} episodes/s")
    if unverifiable:
        print(f"{section}: {len(unverifiable)} reference dialogue(s) have no belief-state annotations, so their "
              "episodes verify nothing; they are left out of the success and inform rates")
    return metrics


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.gold_replay", description=__doc__.split("\n\n")[0])
    parser.add_argument("--section", default="gold_replay", help="params.yaml section (default gold_replay; gold_replay_real)")
    parser.add_argument("--params", default="params.yaml")
    args = parser.parse_args(argv)
    run(read_params(args.section, args.params), args.section)


if __name__ == "__main__":
    main()
