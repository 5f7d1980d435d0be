"""Where an evaluated policy's dialogues fail, from an evaluation's committed episodes (no model, no GPU).

    python benchmarks/failures.py [EVALUATE_DIR] [--agent sft]

EVALUATE_DIR holds ``episodes.parquet`` and ``episode_events.parquet`` as an evaluation writes
them, or the ``evaluate_sft_`` ones of a GPU job stopped before its last evaluation (default:
the partial H100 run of 2026-11-26 under reports/gpu/). Per model: its failed dialogues;
those whose replies state a wrong phone number, postcode or address
(``pipelines.evaluation.grounding``, ``benchmarks/grounding.py``); and the others by the
first goal check they failed, domain by domain in the goal's order (inform: the venue offered
is not the goal's; book: no booking that meets it; request: an attribute asked for and never
given), with the checker's words for one of them. Then its searches again of a domain it had
searched before in the dialogue, and those that leave out a slot the previous search of that
domain had (the agenda user never takes a constraint back; one it says it does not mind is
counted too), with the failed and successful dialogues that have one. And its searches for a
venue by name, those that found nothing (a kind of place the venue is not, or a type the user
did not mean) and whether the next search for the name is among another kind. The checker grades;
nothing here plays or scores a policy.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.grounding import DEFAULT, read_episodes  # noqa: E402 (after the path)

#: What counts as a wrong stated value (as the README's grounding paragraph counts them).
SLOTS = ("phone", "postcode", "address")
CHECKS = ("inform", "book", "request")


def first_failed_check(domain_results: list[dict]) -> tuple[str, str, str] | None:
    """(domain, check, the checker's first reason) of the first domain of the goal that failed,
    None when every domain succeeded.

    >>> first_failed_check([{"domain": "hotel", "inform": True, "book": None, "request": True, "reasons": []},
    ...                     {"domain": "taxi", "inform": None, "book": False, "request": None, "reasons": ["no taxi was booked"]}])
    ('taxi', 'book', 'no taxi was booked')
    """
    for result in domain_results:
        check = next((c for c in CHECKS if result.get(c) is False), None)
        if check is not None:
            return result["domain"], check, (list(result.get("reasons") or []) or [""])[0]
    return None


def requery_drops(events: list[dict]) -> tuple[int, int]:
    """(searches of a domain searched before in the dialogue, those whose arguments lack a slot
    the previous search of that domain had), from one episode's events in order.

    >>> call = lambda args: {"kind": "tool_call", "tool_name": "query_restaurant", "arguments_json": json.dumps(args)}
    >>> requery_drops([call({"area": "south"}), call({"area": "south", "pricerange": "moderate"}), call({"food": "european"})])
    (2, 1)
    """
    by_tool = requery_drops_by_tool(events).values()
    return sum(s for s, _ in by_tool), sum(d for _, d in by_tool)


def requery_drops_by_tool(events: list[dict]) -> dict[str, tuple[int, int]]:
    """:func:`requery_drops` per search tool (tools searched once are left out).

    >>> call = lambda tool, args: {"kind": "tool_call", "tool_name": tool, "arguments_json": json.dumps(args)}
    >>> requery_drops_by_tool([call("query_train", {"day": "monday"}), call("query_hotel", {"area": "east"}), call("query_train", {})])
    {'query_train': (1, 1)}
    """
    last: dict[str, set[str]] = {}
    counts: dict[str, tuple[int, int]] = {}
    for event in events:
        tool = event.get("tool_name") or ""
        if event["kind"] != "tool_call" or not tool.startswith("query_"):
            continue
        slots = set(json.loads(event.get("arguments_json") or "{}"))
        if tool in last:
            searches, drops = counts.get(tool, (0, 0))
            counts[tool] = (searches + 1, drops + bool(last[tool] - slots))
        last[tool] = slots
    return counts


def name_misses(events: list[dict]) -> tuple[int, int, int]:
    """(searches for a venue by name, those that found nothing, those whose next search for the
    name is among another kind of place), from one episode's events in order.

    >>> call = lambda tool, args: {"kind": "tool_call", "tool_name": tool, "arguments_json": json.dumps(args)}
    >>> seen = lambda n: {"kind": "observation", "tool_name": "", "observation_json": json.dumps({"count": n, "results": []})}
    >>> name_misses([call("query_restaurant", {"name": "gate hall"}), seen(0), call("query_restaurant", {"name": "gate hall"}), seen(0),
    ...              call("query_attraction", {"name": "gate hall"}), seen(1)])
    (3, 2, 1)
    """
    searches: list[list] = []  # [tool, name, the count its observation gave]
    for event in events:
        if event["kind"] == "tool_call" and (event.get("tool_name") or "").startswith("query_"):
            searches.append([event["tool_name"], json.loads(event.get("arguments_json") or "{}").get("name"), None])
        elif event["kind"] == "observation" and searches and searches[-1][2] is None:
            searches[-1][2] = json.loads(event.get("observation_json") or "{}").get("count", 0)
    named = [(i, tool, name) for i, (tool, name, _) in enumerate(searches) if name]
    missed = [(i, tool, name) for i, tool, name in named if searches[i][2] == 0]
    # The next search for the same name: another kind of place, or the same search again.
    other = sum(next((t for t, n, _ in searches[i + 1:] if n == name), tool) != tool for i, tool, name in missed)
    return len(named), len(missed), other


def failure_rows(directory: Path, agents: list[str] | None = None) -> dict[str, dict]:
    """Per model: ``dialogues``, ``failed``, ``with_wrong_value`` (failed ones), ``by_check``
    ({(domain, check): count} of the other failed ones), ``example`` (a reason per key) and
    ``user_ended`` (failed dialogues the user closed); ``requeries`` and ``dropping`` (over every
    dialogue, :func:`requery_drops`), ``dropping_by_tool`` ({tool: (dropping, requeries)}) and
    ``failed_dropping`` / ``succeeded_dropping`` (dialogues with a search that drops a slot);
    ``name_searches``, ``name_misses``, ``name_misses_other_kind`` (:func:`name_misses`) and
    ``failed_name_miss`` / ``succeeded_name_miss`` (dialogues with a name search that found nothing)."""
    from pipelines.episodes.formats import get_format
    from pipelines.evaluation.grounding import claims

    episodes, events = read_episodes(directory, ["episode_id", "agent", "agent_format", "success", "ended_by", "domain_results"])
    rows = {}
    for agent in dict.fromkeys(e["agent"] for e in episodes):
        if agents and agent not in agents:
            continue
        mine = [e for e in episodes if e["agent"] == agent]
        fmt = get_format(mine[0]["agent_format"])
        failed = [e for e in mine if not e["success"]]
        # Right or wrong does not depend on the prompt: the claims are read off the whole history.
        wrong = {e["episode_id"] for e in failed
                 for c in claims(e["episode_id"], events[e["episode_id"]], fmt, lambda m: m)
                 if c.slot in SLOTS and c.outcome.startswith("wrong")}
        by_check, example = Counter(), {}
        for e in failed:
            if e["episode_id"] in wrong:
                continue
            found = first_failed_check(e["domain_results"])
            key = found[:2] if found else ("none", "")
            by_check[key] += 1
            example.setdefault(key, found[2] if found else "")
        # Each episode's events read once: per tool, then summed for the episode.
        per_tool = {e["episode_id"]: requery_drops_by_tool(events[e["episode_id"]]) for e in mine}
        drops = {i: (sum(s for s, _ in t.values()), sum(d for _, d in t.values())) for i, t in per_tool.items()}
        by_tool: Counter = Counter()
        for counts in per_tool.values():
            for tool, (searches, dropping) in counts.items():
                by_tool[tool, "requeries"] += searches
                by_tool[tool, "dropping"] += dropping
        names = {e["episode_id"]: name_misses(events[e["episode_id"]]) for e in mine}
        rows[agent] = {"name_searches": sum(n[0] for n in names.values()), "name_misses": sum(n[1] for n in names.values()),
                       "name_misses_other_kind": sum(n[2] for n in names.values()),
                       "failed_name_miss": sum(bool(names[e["episode_id"]][1]) for e in failed),
                       "succeeded_name_miss": sum(bool(names[e["episode_id"]][1]) for e in mine if e["success"]),
                       "dialogues": len(mine), "failed": len(failed), "with_wrong_value": len(wrong), "by_check": dict(by_check),
                       "example": example, "user_ended": sum(e["ended_by"] == "user_end" for e in failed),
                       "requeries": sum(d[0] for d in drops.values()), "dropping": sum(d[1] for d in drops.values()),
                       "failed_dropping": sum(bool(drops[e["episode_id"]][1]) for e in failed),
                       "succeeded_dropping": sum(bool(drops[e["episode_id"]][1]) for e in mine if e["success"]),
                       "dropping_by_tool": {tool: (by_tool[tool, "dropping"], by_tool[tool, "requeries"])
                                            for tool in sorted({t for t, _ in by_tool})}}
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--agent", nargs="*", default=None)
    args = parser.parse_args(argv)
    for agent, row in failure_rows(args.directory, args.agent).items():
        print(f"{agent}: {row['failed']} of {row['dialogues']} dialogues failed ({row['user_ended']} closed by the user); "
              f"{row['with_wrong_value']} state a wrong {', '.join(SLOTS)}; the others by the first check they failed:")
        for (domain, check), count in sorted(row["by_check"].items(), key=lambda item: (-item[1], item[0])):
            print(f"  {count:3d}  {domain} {check}  (e.g. \"{row['example'][(domain, check)]}\")")
        print(f"  searches again: {row['requeries']}, {row['dropping']} of them without a slot the domain's previous search had; "
              f"dialogues with one: {row['failed_dropping']} failed, {row['succeeded_dropping']} successful")
        if row["dropping_by_tool"]:
            print("    by tool: " + ", ".join(f"{tool} {d} of {n}" for tool, (d, n) in row["dropping_by_tool"].items()))
        print(f"  searches for a venue by name: {row['name_searches']}, {row['name_misses']} of them found nothing, "
              f"{row['name_misses_other_kind']} of those next looked up among another kind of place; "
              f"dialogues with a miss: {row['failed_name_miss']} failed, {row['succeeded_name_miss']} successful")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
