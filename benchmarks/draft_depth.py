"""How many sequential decode steps prompt-lookup drafts would save a GPU run's evaluation,
read off its recorded replies (no model, no GPU).

    python benchmarks/draft_depth.py [RUN_DIR] [--model models/smollm2] [--models sft]
        [--tokens 2 4 8] [--ngram 3] [--out reports/draft_depth.json]

RUN_DIR: a GPU run's results (default: the H200 run of c0e0160). Each model's recorded outputs
are played again through the same evaluation (:mod:`benchmarks.eval_host`'s replay: the
profile's goals, user, world and the agent's own prompt path), which gives every agent call's
prompt ids; its reply ids are the recorded reply tokenised, then the stop token. Greedy
decoding is deterministic, so what a verifying step of
:class:`~pipelines.episodes.continuous.SlotDecoder` with ``draft: {tokens: K, ngram: N}``
would accept is known without the model: the leading drafted ids that equal the reply's next
ids, then one more. Per model and K it prints the decode steps after the prefills with and
without drafts (the steps a one-at-a-time decoder takes), the ids a verifying step gives on
average, and per dialogue the sequential steps (prefills plus steps) of its longest dialogue,
the floor under continuous batching, which drafts lower (where the whole evaluation's steps
go: ``benchmarks/decode_depth.py``). A verifying step computes K + 1 positions per row; what
that costs on the card is measured there (``benchmarks/gpu_eval.py``).

The replay's reply ids are the reply's text tokenised again, which can differ from the ids
the model wrote (another split of the same text); the report gives both counts of tokens.
"""

from __future__ import annotations

import argparse
import collections
import json
import sys
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.eval_host import DEFAULT, ReplayedDecoding, missing_inputs, recorded_outputs  # noqa: E402


def drafted_steps(prompt: Sequence[int], reply: Sequence[int], tokens: int, ngram: int) -> int:
    """Decode steps after the prefill (which gives ``reply[0]``) to write ``reply`` greedily
    when each step verifies a prompt-lookup draft of at most ``tokens`` ids: ``len(reply) - 1``
    with no draft ever accepted.

    >>> drafted_steps([1, 2, 3, 4, 9], [1, 2, 3, 4, 0], tokens=4, ngram=2)  # (9, 1): no; (1,) then
    1
    >>> drafted_steps([5, 6], [7, 8, 0], tokens=4, ngram=2)
    2
    """
    from pipelines.episodes.continuous import NgramDrafts, accepted

    drafts = NgramDrafts([*prompt, reply[0]], ngram, tokens)
    done, steps = 1, 0
    while done < len(reply):
        draft = drafts.draft()
        took = min(accepted(draft, reply[done:]) + 1, len(reply) - done)
        drafts.extend(reply[done : done + took])
        done += took
        steps += 1
    return steps


class RecordingDecoding(ReplayedDecoding):
    """The replay, keeping each call's prompt ids and reply ids (stop token last)."""

    def __init__(self, inner: Any, outputs: dict[str, collections.deque], stop: int):
        super().__init__(inner, outputs)
        self.calls: list[tuple[str, list[int], list[int]]] = []
        self.stop = stop

    def __call__(self, contexts: list[Any], prompts: list[str], kept: Any = None) -> list[Any]:
        tokenizer = self.inner.backend.tokenizer
        replies = super().__call__(contexts, prompts, kept)
        rows = tokenizer(prompts, add_special_tokens=not self.inner.has_template)["input_ids"]
        for context, row, output in zip(contexts, rows, replies):
            reply = tokenizer(output.text, add_special_tokens=False)["input_ids"] + [self.stop]
            self.calls.append((context.episode_id, list(row), reply))
        return replies


def model_rows(run: Path, name: str, model: Path, events: list[dict[str, Any]], evaluate: dict[str, Any],
               tokens: list[int], ngram: int) -> list[dict[str, Any]]:
    from benchmarks import eval_host
    from pipelines.evaluation.play import play_policy
    from pipelines.evaluation.speed import agent_calls

    mine = [e for e in events if e["episode_id"].startswith(f"{name}/")]
    setting = eval_host.run_setting(run, model, evaluate, "benchmarks/draft_depth")
    agent, inner = setting.agent, setting.agent.inner
    stop = inner.backend.tokenizer.convert_tokens_to_ids("<|im_end|>")
    recording = RecordingDecoding(inner, recorded_outputs(mine), stop)
    inner._generate = recording
    agent.name = inner.name = name
    played = play_policy(agent, setting.goals, setting.simulator, setting.database, setting.config.plan())
    same = sum(e.transcript() == eval_host.transcripts(mine).get(e.episode_id) for e in played)
    recorded_tokens = sum(map(sum, agent_calls(mine).values()))
    rows = []
    for k in [0, *tokens]:
        per_episode: dict[str, int] = collections.defaultdict(int)
        steps = written = 0
        for episode, prompt, reply in recording.calls:
            s = len(reply) - 1 if k == 0 else drafted_steps(prompt, reply, k, ngram)
            steps += s
            written += len(reply) - 1
            per_episode[episode] += 1 + s  # the prefill, then the steps
        rows.append({"model": name, "draft_tokens": k, "ngram": ngram if k else None, "episodes": len(played),
                     "identical_transcripts": same, "calls": len(recording.calls),
                     "reply_tokens_replayed": sum(len(r) for _, _, r in recording.calls), "reply_tokens_recorded": recorded_tokens,
                     "steps_after_prefill": steps, "ids_per_step": round(written / steps, 3) if steps else None,
                     "longest_dialogue_steps": max(per_episode.values(), default=0)})
    return rows


def markdown(rows: list[dict[str, Any]]) -> str:
    """The README's table of a report's rows: per model, the steps after the prefills and its
    longest dialogue's steps, one id per step and with each draft length (ids per step in
    brackets)."""
    drafts = sorted({row["draft_tokens"] for row in rows if row["draft_tokens"]})
    head = ["model", "calls", "steps, one id per step", *(f"with {k}-id drafts" for k in drafts),
            "longest dialogue, one id per step", *(f"with {k}-id drafts" for k in drafts)]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * 2 + "---:|" * (len(head) - 2)]
    for model in dict.fromkeys(row["model"] for row in rows):
        mine = {row["draft_tokens"]: row for row in rows if row["model"] == model}
        plain = mine[0]
        lines.append("| " + " | ".join([model, f"{plain['calls']:,}", f"{plain['steps_after_prefill']:,}",
                                         *(f"{mine[k]['steps_after_prefill']:,} ({mine[k]['ids_per_step']:.2f})" for k in drafts),
                                         f"{plain['longest_dialogue_steps']:,}", *(f"{mine[k]['longest_dialogue_steps']:,}" for k in drafts)]) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2")
    parser.add_argument("--models", nargs="+")
    parser.add_argument("--tokens", type=int, nargs="+", default=[2, 4, 8])
    parser.add_argument("--ngram", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    problem = missing_inputs(args.run, args.model, ("evaluate.json", "episode_events.parquet"), "draft_depth")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    evaluate = json.loads((args.run / "evaluate.json").read_text())
    events = pq.read_table(args.run / "episode_events.parquet").to_pylist()
    rows = []
    for name in args.models or list(evaluate["speed"]):
        for row in model_rows(args.run, name, args.model, events, evaluate, args.tokens, args.ngram):
            print(json.dumps(row), flush=True)
            rows.append(row)
    print(markdown(rows))
    if args.out is not None:
        args.out.write_text(json.dumps({"run": args.run.name, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
