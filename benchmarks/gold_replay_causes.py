"""Gold replay on a MultiWOZ directory, with every failing episode classified by cause.

    python benchmarks/gold_replay_causes.py vendor/multiwoz_val --db-dir vendor/multiwoz_db [--list]

The directory holds ``data.json`` or ``data.json.xz`` (the real validation split is in the
repository: ``vendor/multiwoz_val``, its database ``vendor/multiwoz_db``). Replays every dialogue exactly as the ``gold_replay`` stage does (replay
agent, agenda simulator with params.yaml's ``gold_replay.simulator`` settings, goal checker), prints the success rate, then one row per cause
with its count and share of the episodes, then what the human dialogues failed at (the
problem each ``human_failure`` rests on, by kind and slot) and how many failing dialogues
miss only requested attributes beyond MultiWOZ's usual requestables (phone, address,
postcode, reference, train id: all the usual evaluators check, hence their ~90 % for
ground-truth system turns); ``--list`` adds every failing dialogue with its cause and the
checker's reasons behind it. The causes come from :mod:`pipelines.episodes.causes`.
"""

from __future__ import annotations

import argparse
import time
from collections import Counter
from pathlib import Path

from pipelines.episodes.causes import CAUSES, dialogue_cause, triage
from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, ReplayAgent, RunnerConfig, get_format, run_episodes_sync
from pipelines.simulators.agenda import AgendaConfig, AgendaSimulator
from catalog.io import read_params
from catalog.multiwoz_dir import load_multiwoz


# What the usual MultiWOZ evaluators check of the requested attributes.
_USUAL_REQUESTABLES = frozenset({"phone", "address", "postcode", "reference", "trainID"})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="MultiWOZ directory with data.json")
    parser.add_argument("--db-dir", type=Path, default=None, help="database directory (default: the source's own)")
    stage = read_params("gold_replay")  # the stage's own simulator settings and turn limit
    settings = {k: v for k, v in (stage.get("simulator") or {}).items() if k != "kind"}
    parser.add_argument("--max-exchanges", type=int, default=int(stage.get("max_exchanges", 20)))
    parser.add_argument("--max-stalled-turns", type=int, default=int(settings.get("max_stalled_turns", AgendaConfig().max_stalled_turns)))
    parser.add_argument("--list", action="store_true", help="print every failing dialogue")
    args = parser.parse_args()

    start = time.perf_counter()
    corpus = load_multiwoz(args.source, args.db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    specs = [EpisodeSpec.from_dialogue(d, seed=0) for d in corpus.dialogues]
    simulator = AgendaSimulator(database, AgendaConfig(**{**settings, "max_stalled_turns": args.max_stalled_turns}))
    episodes = run_episodes_sync(specs, ReplayAgent(get_format("speakrl"), database=database), simulator, database, RunnerConfig(max_exchanges=args.max_exchanges))
    seconds = time.perf_counter() - start

    by_id = {d.dialogue_id: d for d in corpus.dialogues}
    failing = []  # (episode, cause, the problem it rests on or None, reasons)
    for episode in episodes:
        if episode.success:
            continue
        triaged = triage(by_id[episode.dialogue_id], database)
        if not triaged:
            failing.append((episode, "simulator_ended_early", None, episode.result.reasons, False))
            continue
        cause, problem = dialogue_cause(triaged)
        beyond_usual = all(p.kind == "request_not_given" and p.slot not in _USUAL_REQUESTABLES for p, _ in triaged)
        failing.append((episode, cause, problem, tuple(f"{p.domain}: {p.text}" for p, _ in triaged), beyond_usual))
    counts = Counter(cause for _, cause, _, _, _ in failing)
    n = len(episodes)
    print(f"gold replay: {n} episodes, success {sum(e.success for e in episodes) / n:.4f} ({n - len(failing)}/{n}), {seconds:.1f} s")
    print(f"{'cause':<24} {'episodes':>8} {'share':>7}")
    for cause in CAUSES:
        if counts[cause]:
            print(f"{cause:<24} {counts[cause]:>8} {counts[cause] / n:>7.2%}")
    print(f"{'total failing':<24} {len(failing):>8} {len(failing) / n:>7.2%}")
    human = Counter(f"{p.domain} {p.kind} {p.slot or ''}".strip() for _, cause, p, _, _ in failing if cause == "human_failure" and p)
    print("human_failure by the problem it rests on:")
    for what, count in human.most_common():
        print(f"  {what:<44} {count:>4}")
    beyond = sum(1 for *_, only in failing if only)
    print(f"failing only on requested attributes beyond the usual requestables: {beyond} "
          f"(success with the usual requestables alone: {(n - len(failing) + beyond) / n:.4f})")
    if args.list:
        for episode, cause, _, reasons, _ in failing:
            print(f"{episode.dialogue_id}\t{cause}\t{' | '.join(reasons)}")

if __name__ == "__main__":
    main()
