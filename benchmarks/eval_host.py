"""What a GPU run's evaluation spent off the GPU, replayed on this machine (no model call).

    python benchmarks/eval_host.py [RUN_DIR] [--model models/smollm2] [--models sft] [--goals N]
        [--source data/raw/embedded_multiwoz] [--as-run whole|pieces] [--out reports/eval_host_cpu.json]

RUN_DIR: a GPU run's results (``askflow gpu import`` puts them under reports/gpu/; default: the
H200 run of c0e0160) with ``evaluate.json`` and the episode tables. For each model it evaluated,
the agent's recorded outputs (each step's actions, from ``episode_events.parquet``) are played
again through the same evaluation: the profile's held-out goals, agenda user, world and runner,
and the agent's own prompt path (the policy's prompt rewriting with its fit to
``max_prompt_tokens``, the chat template, the tokenizer of ``--model``), with only the model's
decoding replaced by the recorded output. Per model it prints:

* whether the replay is the run: transcripts and success verdicts equal to the recorded ones
  (a replay that is not measures something else, and says so);
* the host seconds by part: ``prompt_fit`` (the policy's prompt rewriting, which renders each
  candidate prompt and counts its tokens to test its length), ``render`` and ``tokenize`` (the
  agent's prompt), and the rest (runner, user simulator, tools, goal checker); once with this
  checkout's code, once with every candidate prompt tokenised whole
  (:class:`~pipelines.evaluation.agent.PromptTokens` ``whole``: the runs up to 67c31cf), and
  whether the agent's prompts were the same token ids both times;
* the prompt tokens the agent's calls had, the part the episode cache can reuse (the
  episode's previous prompt and reply as a prefix: the decoder prefills only the rest) and
  the rest;
* the run's measured wall time less the host seconds here of the code the run had (``--as-run
  whole``, the default, for runs up to 67c31cf; ``pieces`` after): the device's share, and what
  a decode step cost after it (the run's steps). The node's CPU is not this one: the host
  seconds are this machine's.

No timing goes into a hashed output; ``--out`` writes the printed rows as JSON.
"""

from __future__ import annotations

import argparse
import collections
import hashlib
import json
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any, Sequence

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

DEFAULT = ROOT / "reports" / "gpu" / "2026-11-30_nvidia-h200_speakrl_222527"


def recorded_outputs(events: list[dict[str, Any]]) -> dict[str, collections.deque]:
    """Each episode's agent outputs in order, as :class:`AgentOutput`: a step's output starts
    at the agent event that carries its token counts; its actions are rendered back into the
    agent's format by :func:`outputs_for`. A malformed output replays as its raw text."""
    from pipelines.episodes.formats import AgentAction

    steps: dict[str, collections.deque] = collections.defaultdict(collections.deque)
    current: list[Any] | None = None
    for event in events:
        if event["actor"] != "agent" or event["kind"] == "fallback":  # the runner's apology, not the model's
            continue
        if event["prompt_tokens"] is not None:
            current = []
            steps[event["episode_id"]].append(current)
        if current is None:
            raise ValueError(f"episode {event['episode_id']!r}, event {event['event_index']}: an agent action before any output")
        kind = event["kind"]
        if kind == "malformed":
            current.append(event["text"] or "")
        elif kind == "tool_call":
            current.append(AgentAction.tool_call(event["tool_name"], json.loads(event["arguments_json"] or "{}")))
        elif kind == "end":
            current.append(AgentAction.end())
        else:
            current.append(getattr(AgentAction, kind)(event["text"] or ""))
    return steps


def transcripts(events: list[dict[str, Any]]) -> dict[str, list[tuple[str, str]]]:
    """Each episode's utterances as :meth:`Episode.transcript` gives them."""
    from pipelines.episodes.records import UTTERANCE_KINDS

    seen: dict[str, list[tuple[str, str]]] = collections.defaultdict(list)
    for event in events:
        if event["kind"] in UTTERANCE_KINDS:
            seen[event["episode_id"]].append((event["actor"], event["text"] or ""))
    return seen


class ReplayedDecoding:
    """Stands in for an :class:`HFAgent`'s decoding: tokenises the batch's prompts as the agent
    does, counts what its episode cache could reuse, and answers with the recorded outputs."""

    def __init__(self, inner: Any, outputs: dict[str, collections.deque]):
        self.inner, self.outputs = inner, outputs
        self.seconds: collections.Counter = collections.Counter()
        self.tokens: collections.Counter = collections.Counter()
        self.fed: dict[str, list[int]] = {}  # episode -> its last prompt and reply, as the cache keeps them
        self.prompts = hashlib.sha256()  # every call's token ids, in order: two replays' prompts compared

    def __call__(self, contexts: list[Any], prompts: list[str], kept: Any = None) -> list[Any]:
        from pipelines.episodes.agents import AgentOutput

        tokenizer = self.inner.backend.tokenizer
        started = time.perf_counter()
        rows = tokenizer(prompts, add_special_tokens=not self.inner.has_template)["input_ids"]
        self.seconds["tokenize"] += time.perf_counter() - started
        replies = []
        for context, row in zip(contexts, rows):
            before = self.fed.get(context.episode_id, [])
            reused = next((k for k, (a, b) in enumerate(zip(before, row[:-1])) if a != b), min(len(before), len(row) - 1))
            self.tokens["prompt"] += len(row)
            self.tokens["reusable"] += reused
            self.tokens["calls"] += 1
            self.prompts.update(json.dumps([context.episode_id, row]).encode())
            queue = self.outputs.get(context.episode_id)
            if not queue:
                raise RuntimeError(f"{context.episode_id}: the replay asks for an output the run did not record (it diverged)")
            actions = queue.popleft()
            if actions and isinstance(actions[0], str):
                output = AgentOutput(actions[0])
            else:
                text, calls = self.inner.format.render(actions)
                output = AgentOutput(text, calls)
            replies.append(output)
            self.fed[context.episode_id] = list(row) + tokenizer(output.text, add_special_tokens=False)["input_ids"]
        return replies


def timed(counter: collections.Counter, name: str, function: Any) -> Any:
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            counter[name] += time.perf_counter() - started

    return wrapper


def replay(setting: Any, name: str, mine: list[dict[str, Any]], counting: str) -> tuple[list[Any], float, ReplayedDecoding]:
    """``name``'s recorded outputs played through ``setting`` (a fresh agent's prompt path),
    candidate prompts counted by ``counting`` (``pieces``: this checkout's
    :class:`PromptTokens`; ``whole``: tokenised whole); the episodes, wall seconds, and parts."""
    from pipelines.evaluation.agent import PromptTokens
    from pipelines.evaluation.play import play_policy

    agent, inner = setting.agent, setting.agent.inner
    if agent.prompt_tokens is not None:
        agent.prompt_tokens = PromptTokens(agent.tokenizer, whole=counting == "whole")
    decoding = ReplayedDecoding(inner, recorded_outputs(mine))
    inner._generate = decoding
    inner.render = timed(decoding.seconds, "render", type(inner).render.__get__(inner))
    agent.messages = timed(decoding.seconds, "prompt_fit", type(agent).messages.__get__(agent))
    agent.name = inner.name = name
    started = time.perf_counter()
    played = play_policy(agent, setting.goals, setting.simulator, setting.database, setting.config.plan())
    return played, time.perf_counter() - started, decoding


def run_setting(run: Path, model: Path, evaluate: dict[str, Any], where: str, goals: int | None = None,
                source: Path | None = None) -> Any:
    """The evaluation the GPU run in ``run`` played (its ``evaluate.json`` is ``evaluate``), set
    up here for ``model`` (:func:`flows.gpu.profile_evaluation`): the run's own settings where
    its report says them (goals, exchanges, split, generation limit; the first ``goals`` only
    where given; ``source``: its corpus where it is not the profile's), this checkout's profile
    for the rest."""
    import yaml

    from flows.gpu import profile_evaluation

    gpu = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))["gpu"]
    manifest = json.loads((run / "manifest.json").read_text()) if (run / "manifest.json").is_file() else {}
    setup = evaluate["setup"]
    overrides = {"max_goals": goals or setup["goals"], "max_exchanges": setup["max_exchanges"], "split": setup["split"],
                 "generation": {"max_new_tokens": setup["max_new_tokens"]},  # the run's limit: no SFT rows needed
                 **({"source": str(source)} if source is not None else {})}
    return profile_evaluation(gpu, model, manifest.get("profile"), overrides, where)


def replay_model(run: Path, name: str, model: Path, goals: int | None, events: list[dict[str, Any]],
                 episodes: dict[str, dict[str, Any]], evaluate: dict[str, Any], source: Path | None = None,
                 as_run: str = "whole") -> dict[str, Any]:
    """One model's row (module docstring)."""
    mine = [e for e in events if e["episode_id"].startswith(f"{name}/")]
    setting = run_setting(run, model, evaluate, "benchmarks/eval_host", goals, source)
    recorded = transcripts(mine)
    row: dict[str, Any] = {"model": name}
    for counting in ("pieces", "whole"):
        played, wall, decoding = replay(setting, name, mine, counting)
        same_transcript = sum(e.transcript() == recorded.get(e.episode_id) for e in played)
        same_verdict = sum(bool(e.success) == bool(episodes[e.episode_id]["success"]) for e in played if e.episode_id in episodes)
        seconds = {part: round(value, 2) for part, value in decoding.seconds.items()}
        if counting == "pieces":
            row.update(episodes=len(played), identical_transcripts=same_transcript, same_verdicts=same_verdict,
                       calls=decoding.tokens["calls"], prompt_tokens=decoding.tokens["prompt"],
                       reusable_tokens=decoding.tokens["reusable"], prefill_tokens=decoding.tokens["prompt"] - decoding.tokens["reusable"])
            digest = decoding.prompts.hexdigest()
        else:
            row["same_prompts_counted_whole"] = decoding.prompts.hexdigest() == digest
        row[f"host_s_{counting}"] = round(wall, 2)
        row[f"host_by_part_s_{counting}"] = {**seconds, "rest": round(wall - sum(decoding.seconds.values()), 2)}
    speed = evaluate["speed"].get(name, {})
    if speed.get("wall_s") and row["episodes"] == speed.get("episodes"):
        device = speed["wall_s"] - row[f"host_s_{as_run}"]
        steps = (speed.get("decode") or {}).get("steps")
        row.update(run_wall_s=speed["wall_s"], run_counting=as_run, device_s=round(device, 2),
                   device_ms_per_step=round(1000 * device / steps, 2) if steps else None)
    return row


def missing_inputs(run: Path, model: Path, needed: Sequence[str], program: str) -> str | None:
    """Why a replay of the GPU run's results in ``run`` (files ``needed``) with the tokenizer of
    ``model`` cannot start, or None."""
    for name in needed:
        if not (run / name).is_file():
            return f"{program}: {run / name} is missing (a GPU run's results folder holds it)"
    if not (model / "tokenizer_config.json").is_file():
        return f"{program}: {model} holds no tokenizer (make run converts SmolLM2 to models/smollm2)"
    return None


def main(argv: list[str] | None = None) -> int:
    import pyarrow.parquet as pq

    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", nargs="?", type=Path, default=DEFAULT)
    parser.add_argument("--model", type=Path, default=ROOT / "models" / "smollm2", help="a checkpoint whose tokenizer and chat template the run's models share")
    parser.add_argument("--models", nargs="+", help="default: every model evaluate.json names")
    parser.add_argument("--goals", type=int, help="the first N goals only (default: all the run played)")
    parser.add_argument("--source", type=Path, help="the corpus the run's goals come from, where it is not the profile's path")
    parser.add_argument("--as-run", choices=("whole", "pieces"), default="whole",
                        help="how the run's code counted candidate prompts: whole (up to 67c31cf) or pieces")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args(argv)
    problem = missing_inputs(args.run, args.model, ("evaluate.json", "episodes.parquet", "episode_events.parquet"), "eval_host")
    if problem:
        print(problem, file=sys.stderr)
        return 2
    evaluate = json.loads((args.run / "evaluate.json").read_text())
    events = pq.read_table(args.run / "episode_events.parquet").to_pylist()
    episodes = {e["episode_id"]: e for e in pq.read_table(args.run / "episodes.parquet").to_pylist()}
    rows = []
    for name in args.models or list(evaluate["speed"]):
        row = replay_model(args.run, name, args.model, args.goals, events, episodes, evaluate, args.source, args.as_run)
        print(json.dumps(row), flush=True)
        rows.append(row)
    if args.out is not None:
        machine = {"machine": platform.machine(), "processor": platform.processor() or None, "cpus": os.cpu_count()}
        args.out.write_text(json.dumps({"run": args.run.name, "replayed_on": machine, "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
