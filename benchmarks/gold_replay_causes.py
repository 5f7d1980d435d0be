"""Gold replay on a MultiWOZ directory, with every failing episode classified by cause and
every verdict written down with its evidence.

    python benchmarks/gold_replay_causes.py vendor/multiwoz_val --db-dir vendor/multiwoz_db [--list] [--out reports/gold_replay_causes.jsonl]

The directory holds ``data.json`` or ``data.json.xz`` (the real validation split is in the
repository: ``vendor/multiwoz_val``, its database ``vendor/multiwoz_db``). Replays every
dialogue exactly as the ``gold_replay`` stage does (replay agent, agenda simulator with
params.yaml's ``gold_replay.simulator`` settings, goal checker), prints both grades (askflow's
``strict`` checker and the MultiWOZ ``standard`` evaluator's definitions,
:mod:`pipelines.env.standard`), then one row per cause with its count and share of the
episodes, how many failures are not the human dialogues' (every cause but
``human_failure``), then what the human dialogues failed at (the problem each
``human_failure`` rests on, by kind and slot); ``--list`` adds every failing dialogue with
its cause and the checker's reasons behind it. The causes come from
:mod:`pipelines.episodes.causes`.

``--out`` writes one JSON line per dialogue, in corpus order (the committed
``reports/gold_replay_causes.jsonl`` is this on ``vendor/multiwoz_val``)::

    {"dialogue_id", "strict": {"success", "inform"}, "standard": {"success", "inform"},
     "cause": null | one of CAUSES, "ended_by",
     "evidence": [{"domain", "kind", "slot", "cause", "missing", "turn", "text"}, ...]}

``evidence`` lists every problem of the dialogue's offline grade with its cause, the fact
that is missing (``missing``: the checker's reason, naming the value the goal expects) and,
where one turn settles it, that turn's index and text (the booking made with the wrong
value, the venue named, the user's question left unanswered); the dialogue's ``cause`` is
the first decisive one (:func:`pipelines.episodes.causes.dialogue_cause`). A
``simulator_ended_early`` verdict's evidence is the episode's own reasons.
"""

from __future__ import annotations

import argparse
import json
import time
from collections import Counter
from pathlib import Path
from typing import Any, Mapping

from pipelines.episodes.causes import CAUSES, dialogue_cause, evidence, replay_offline, triage
from pipelines.env.tools import Database
from pipelines.episodes import EpisodeSpec, ReplayAgent, RunnerConfig, get_format, run_episodes_sync
from pipelines.simulators.agenda import SimulatorSpec, AgendaSimulator
from catalog.io import read_params
from catalog.multiwoz_dir import load_multiwoz


# What the usual MultiWOZ evaluators check of the requested attributes.
_USUAL_REQUESTABLES = frozenset({"phone", "address", "postcode", "reference", "trainID"})


def verdicts(source: Path, db_dir: Path | None = None, settings: Mapping[str, Any] | None = None, max_exchanges: int = 20) -> list[dict[str, Any]]:
    """One verdict per dialogue of ``source`` (the ``--out`` lines, module docstring), replayed
    with the agenda simulator under ``settings`` (params.yaml ``gold_replay.simulator``)."""
    corpus = load_multiwoz(source, db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    specs = [EpisodeSpec.from_dialogue(d, seed=0) for d in corpus.dialogues]
    simulator = AgendaSimulator(database, SimulatorSpec(**{k: v for k, v in (settings or {}).items() if k != "kind"}))
    episodes = run_episodes_sync(specs, ReplayAgent(get_format("speakrl"), database=database), simulator, database, RunnerConfig(max_exchanges=max_exchanges))
    by_id = {d.dialogue_id: d for d in corpus.dialogues}
    rows = []
    for episode in episodes:
        row: dict[str, Any] = {
            "dialogue_id": episode.dialogue_id,
            "strict": {"success": episode.success, "inform": episode.inform},
            "standard": {"success": bool(episode.standard_success), "inform": bool(episode.standard_inform)},
            "cause": None,
            "ended_by": episode.ended_by,
            "evidence": [],
        }
        if not episode.success:
            dialogue = by_id[episode.dialogue_id]
            replayed = replay_offline(dialogue, database)
            triaged = triage(dialogue, database, replayed)
            if not triaged:
                row["cause"] = "simulator_ended_early"
                row["evidence"] = [{"domain": p.domain, "kind": p.kind, "slot": p.slot, "cause": "simulator_ended_early",
                                    "missing": f"in the replayed episode (not in the human dialogue): {p.text}", "turn": None, "text": None}
                                   for p in episode.result.problems]
            else:
                row["cause"] = dialogue_cause(triaged)[0]
                row["evidence"] = [evidence(problem, cause, dialogue, replayed) for problem, cause in triaged]
                row["beyond_usual_requestables"] = all(p.kind == "request_not_given" and p.slot not in _USUAL_REQUESTABLES for p, _ in triaged)
        rows.append(row)
    return rows


def cause_counts(rows: list[dict[str, Any]]) -> dict[str, int]:
    """Failing dialogues per cause, in :data:`CAUSES` order (causes with none left out)."""
    counts = Counter(r["cause"] for r in rows if r["cause"])
    return {cause: counts[cause] for cause in CAUSES if counts[cause]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("source", type=Path, help="MultiWOZ directory with data.json")
    parser.add_argument("--db-dir", type=Path, default=None, help="database directory (default: the source's own)")
    stage = read_params("gold_replay")  # the stage's own simulator settings and turn limit
    settings = {k: v for k, v in (stage.get("simulator") or {}).items() if k != "kind"}
    parser.add_argument("--max-exchanges", type=int, default=int(stage.get("max_exchanges", 20)))
    parser.add_argument("--max-stalled-turns", type=int, default=int(settings.get("max_stalled_turns", SimulatorSpec().max_stalled_turns)))
    parser.add_argument("--list", action="store_true", help="print every failing dialogue")
    parser.add_argument("--out", type=Path, default=None, help="write every dialogue's verdict with its evidence (JSON lines)")
    args = parser.parse_args()

    start = time.perf_counter()
    rows = verdicts(args.source, args.db_dir, {**settings, "max_stalled_turns": args.max_stalled_turns}, args.max_exchanges)
    seconds = time.perf_counter() - start
    n = len(rows)
    failing = [r for r in rows if r["cause"]]
    for mode in ("strict", "standard"):
        success = sum(r[mode]["success"] for r in rows)
        inform = sum(r[mode]["inform"] for r in rows)
        print(f"gold replay ({mode}): {n} episodes, success {success / n:.4f} ({success}/{n}), inform {inform / n:.4f}")
    print(f"{seconds:.1f} s")
    counts = cause_counts(rows)
    print(f"{'cause':<24} {'episodes':>8} {'share':>7}")
    for cause, count in counts.items():
        print(f"{cause:<24} {count:>8} {count / n:>7.2%}")
    print(f"{'total failing':<24} {len(failing):>8} {len(failing) / n:>7.2%}")
    others = len(failing) - counts.get("human_failure", 0)
    print(f"{'not the human dialogues':<24} {others:>8} {others / n:>7.2%}")
    human = Counter(f"{e['domain']} {e['kind']} {e['slot'] or ''}".strip() for r in failing if r["cause"] == "human_failure"
                    for e in [next(e for e in r["evidence"] if e["cause"] == "human_failure")])
    print("human_failure by the problem it rests on:")
    for what, count in human.most_common():
        print(f"  {what:<44} {count:>4}")
    beyond = sum(1 for r in failing if r.get("beyond_usual_requestables"))
    print(f"failing only on requested attributes beyond the usual requestables: {beyond} "
          f"(success with the usual requestables alone: {(n - len(failing) + beyond) / n:.4f})")
    if args.list:
        for r in failing:
            print(f"{r['dialogue_id']}\t{r['cause']}\t{' | '.join(e['domain'] + ': ' + e['missing'] for e in r['evidence'])}")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in rows), encoding="utf-8")
        print(f"wrote {args.out} ({n} dialogues)")


if __name__ == "__main__":
    main()
