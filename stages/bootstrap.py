"""DVC stage ``bootstrap``: the embedded base policy, pretrained on gold seed dialogues.

Renders every gold dialogue of the train split as the chat of an agent that replays it
(tool calls, ``<tool_response>`` observations, the gold system text; no clarifications),
trains a byte-level BPE tokenizer and a small Qwen2 model on them, evaluates on the val
split, and writes the model in Hugging Face format with its model card (``README.md``) and
the metrics. See :mod:`pipelines.policy`.

params.yaml ``bootstrap``:

* ``source`` (a MultiWOZ-layout directory), ``db_dir`` (optional), ``env_seed`` (the tool
  environment's seed in the rendered chats, as an episode's seed);
* ``seed`` (model initialisation, data order, evaluation prompts), ``threads`` (torch
  CPU threads; default: the top-level ``threads``);
* ``vocab_size``, ``max_length`` (tokens per training window), ``assistant_only_loss``;
* ``model``: :class:`pipelines.policy.model.Architecture` fields;
* ``train``: :class:`pipelines.policy.model.PretrainConfig` fields except ``seed``;
* ``eval``: ``windows`` (held-out windows for the loss), ``prompts`` (held-out prompts for
  greedy generation), ``max_new_tokens``;
* ``output`` (model directory), ``metrics`` (JSON).

The section is :class:`pipelines.policy.bootstrap.BootstrapConfig`, the library's config.

The model directory is written next to its target and swapped in whole. Run as a
program, the stage sets ``OMP_WAIT_POLICY=PASSIVE`` unless it is set (see :func:`main`).
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.config import from_params
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.policy.bootstrap import BootstrapConfig, bootstrap_policy
from pipelines.policy.card import HELD_OUT_SPLIT, model_card
from pipelines.policy.pretrain_data import seed_chat
from stages.entry import main_wrapper
from catalog.io import directory_sha256, read_params, write_json_atomic, write_timings
from catalog.models import save_model
from catalog.multiwoz_dir import load_multiwoz


def bootstrap_config(params: Mapping[str, Any]) -> BootstrapConfig:
    """params.yaml ``bootstrap``, checked (ConfigError naming the setting)."""
    where = "params.yaml bootstrap"
    if isinstance(params.get("train"), Mapping) and "seed" in params["train"]:
        raise ConfigError(f"{where}.train.seed: use bootstrap.seed")
    return from_params(BootstrapConfig, params, where)


def run(params: dict) -> dict:
    import torch

    started = time.perf_counter()
    config = bootstrap_config(params)
    source, output, metrics_path = Path(config.source), Path(config.output), Path(config.metrics)
    threads, env_seed = config.threads, config.env_seed
    if threads is not None:  # else the top-level params.yaml threads (stages/__init__.py)
        torch.set_num_threads(threads)

    corpus = load_multiwoz(source, config.db_dir)
    database = Database(corpus.entities, corpus.taxi_options)
    chats = {split: [seed_chat(d, database, env_seed=env_seed) for d in corpus.dialogues if d.split == split] for split in ("train", HELD_OUT_SPLIT)}
    data_version = {"source": str(source), "sha256": directory_sha256(source), "dialogues": {k: len(v) for k, v in chats.items()}}
    loaded = time.perf_counter()
    print(f"bootstrap: {len(chats['train'])} train / {len(chats[HELD_OUT_SPLIT])} {HELD_OUT_SPLIT} seed chats from {source} [{loaded - started:.1f}s]")

    result = bootstrap_policy(chats["train"], chats[HELD_OUT_SPLIT], config, log=print)
    metrics = {**result.metrics, "data_version": data_version}
    timings = {"load_s": round(loaded - started, 2), **result.timings}

    save_model(result.model, result.tokenizer, output, card=model_card(result, metrics, params))
    write_json_atomic(metrics_path, metrics)
    timings["wall_s"] = round(time.perf_counter() - started, 2)
    write_timings("bootstrap", timings)
    generation = metrics["generation"]
    print(
        f"bootstrap: {metrics['parameters']:,} parameters, {metrics['training']['steps']} steps, "
        f"train loss {metrics['training']['final_train_loss']}, held-out loss {metrics['held_out_loss']}, "
        f"format-valid {generation['format_valid_share']:.0%} of {generation['prompts']} greedy replies "
        f"-> {output} [{timings['wall_s']:.1f}s]"
    )
    return metrics


@main_wrapper
def main() -> None:
    # OpenMP threads that wait at a barrier sleep instead of spinning. Read once, when torch
    # loads its OpenMP runtime, so it is set before torch is first imported. On a 2-core
    # machine shared with other jobs, spinning made a 2-thread training step 6-10x slower
    # whenever another process was busy (measured: 6-9 s against 0.9 s per step).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    run(read_params("bootstrap"))


if __name__ == "__main__":
    main()
