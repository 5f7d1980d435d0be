"""Issue 26's CPU evidence: the teacher-forced next-action proxies of a starting policy before
and after a short SFT on the SpeakER rows, measured on the same held-out val rows (a paired
comparison), by the real ``train_sft`` stage (``python -m stages.train sft``) with a params file
derived from ``params.yaml``. Nothing under ``models/`` or ``reports/`` is touched: the stage
runs in a temporary directory (model, metrics, timings, Prefect state) and reads the project's
``data/`` and ``models/`` through links; the summary is written to ``--out``.

    python benchmarks/sft_proxies.py --policy smollm2 --steps 48 [--rows 2000] [--heldout 64]
        [--seed 0] [--threads 1] [--out reports/speaker_proxies_cpu.json] [--name KEY]

``--policy`` is params.yaml's policy switch (``base``: the tiny bootstrap model, ``smollm2``:
SmolLM2-135M-Instruct with ``policy.lora``); ``models/<policy>`` must exist (``dvc repro
bootstrap`` / ``dvc repro smollm2``). Several runs may write one ``--out`` file: each
replaces its own entry under ``runs`` (``--name``, default the policy).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]
PROXIES = ("action_kind_accuracy", "tool_name_accuracy", "argument_exact_match", "clarify_precision", "clarify_recall")
GENERATION = ("well_formed", "clarify_rate", "over_asking", "clarify_rate_when_needed")


def side_params(params: dict, policy: str, steps: int, rows: int, heldout: int, seed: int, threads: int, out: Path) -> dict:
    """``params`` with ``train.sft`` made into the side run: ``policy`` as the starting model,
    ``steps`` optimiser steps on the first ``rows`` SpeakER SFT rows, both models evaluated on
    ``heldout`` held-out val rows, every output under ``out``."""
    params = json.loads(json.dumps(params))  # a deep copy
    params["threads"] = threads
    params["policy"] = {**params["policy"], "use": policy, "dir": f"models/{policy}"}
    sft = params["train"]["sft"]
    sft["data"]["sources"] = [{**sft["data"]["sources"][0], "max_rows": rows}]
    sft["optim"] = {**sft["optim"], "max_steps": steps, "seed": seed}
    sft["eval"] = {**sft["eval"], "max_examples": heldout, "before": True}
    sft["output"] = {"model_dir": str(out / "model"), "metrics": str(out / "sft.json"), "curve": str(out / "sft_curve.csv")}
    return params


def summary(metrics: dict) -> dict:
    """Before and after, per held-out source: the proxies and the generation figures."""
    pick = {}
    for when in ("before", "after"):
        for source, ev in metrics["eval"][when].items():
            row = {name: ev.get("next_action", {}).get(name) for name in PROXIES}
            row.update({name: ev.get("generation", {}).get(name) for name in GENERATION})
            row.update(n=ev.get("next_action", {}).get("n"), n_tool_calls=ev.get("next_action", {}).get("n_tool_calls"),
                       n_questions=ev.get("next_action", {}).get("n_questions"),
                       n_clarify_needed=ev.get("next_action", {}).get("n_clarify_needed"))
            pick.setdefault(source, {})[when] = row
    return pick


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--policy", default="smollm2")
    parser.add_argument("--steps", type=int, default=48)
    parser.add_argument("--rows", type=int, default=2000)
    parser.add_argument("--heldout", type=int, default=64)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--params", type=Path, default=ROOT / "params.yaml")
    parser.add_argument("--out", type=Path, default=ROOT / "reports" / "speaker_proxies_cpu.json")
    parser.add_argument("--name", help="the run's key under runs (default: --policy)")
    args = parser.parse_args()
    if not (ROOT / "models" / args.policy).is_dir():
        sys.exit(f"error: models/{args.policy} does not exist: run `dvc repro {'bootstrap' if args.policy == 'base' else args.policy}` first")

    # the code the run starts from (the report is written at the end)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    with tempfile.TemporaryDirectory(prefix="sft_proxies_") as tmp:
        work = Path(tmp)
        params = side_params(yaml.safe_load(args.params.read_text()), args.policy, args.steps, args.rows,
                             args.heldout, args.seed, args.threads, work)
        (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
        started = time.perf_counter()
        proc = subprocess.run([sys.executable, "-m", "stages.train", "sft", "--params", str(work / "params.yaml")],
                              cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
        wall = time.perf_counter() - started
        if proc.returncode != 0:
            sys.exit(f"error: the train_sft side run failed (exit {proc.returncode})")
        metrics = json.loads((work / "sft.json").read_text())

    run = {
        "policy": args.policy, "commit": commit, "seed": args.seed, "threads": args.threads,
        "settings": {"steps": args.steps, "train_rows": args.rows, "heldout_rows": args.heldout,
                     "optim": params["train"]["sft"]["optim"], "eval": params["train"]["sft"]["eval"]},
        "data": metrics.get("data"), "train": metrics.get("train"), "wall_s": round(wall, 1),
        "proxies": summary(metrics),
    }
    report = json.loads(args.out.read_text()) if args.out.is_file() else {}
    report["what"] = ("issue 26: teacher-forced next-action proxies before and after a short SFT on the "
                      "SpeakER rows (stage train_sft, a side run by benchmarks/sft_proxies.py), on the same "
                      "held-out val rows; one training seed, 2 CPU cores")
    report.setdefault("runs", {})[args.name or args.policy] = run
    args.out.write_text(json.dumps(report, indent=1) + "\n")
    for source, pair in run["proxies"].items():
        for name in PROXIES + GENERATION:
            b, a = pair["before"].get(name), pair["after"].get(name)
            if b is not None or a is not None:
                print(f"{args.policy} {source} {name}: {b} -> {a}")
    print(f"wall {wall:.0f} s; written {args.out}")


if __name__ == "__main__":
    main()
