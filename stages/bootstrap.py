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

import hashlib
import json
import os
import time
from pathlib import Path
from typing import Any, Mapping

import yaml

from pipelines.config import from_params
from pipelines.env.tools import Database
from pipelines.errors import ConfigError
from pipelines.records import VAL
from pipelines.policy.bootstrap import BootstrapConfig, BootstrapResult, bootstrap_policy
from pipelines.policy.pretrain_data import seed_chat
from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from catalog.models import save_model
from catalog.multiwoz_dir import load_multiwoz

HELD_OUT_SPLIT = VAL


def bootstrap_config(params: Mapping[str, Any]) -> BootstrapConfig:
    """params.yaml ``bootstrap``, checked (ConfigError naming the setting)."""
    where = "params.yaml bootstrap"
    if isinstance(params.get("train"), Mapping) and "seed" in params["train"]:
        raise ConfigError(f"{where}.train.seed: use bootstrap.seed")
    return from_params(BootstrapConfig, params, where)


def directory_sha256(root: Path) -> str:
    """A content hash of a directory: every file's relative path and bytes, in path order."""
    digest = hashlib.sha256()
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        digest.update(path.relative_to(root).as_posix().encode() + b"\0")
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


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


def model_card(result: BootstrapResult, metrics: Mapping[str, Any], params: Mapping[str, Any]) -> str:
    """The model directory's README.md: what the model is, its data version, params and metrics."""
    generation, opening, training = metrics["generation"], metrics["opening"], metrics["training"]
    data = metrics["data_version"]
    samples = "\n\n".join(
        f"- last message: `{json.dumps(s['last_message'], ensure_ascii=False)[:200]}`\n"
        f"  - gold: `{json.dumps(s['gold'], ensure_ascii=False)}`\n"
        f"  - reply: `{json.dumps(s['reply'], ensure_ascii=False)}`{'' if s['finished'] else ' (unfinished)'}"
        for s in result.samples
    )
    return f"""---
library_name: transformers
pipeline_tag: text-generation
tags: [askflow, speakrl, qwen2, multiwoz]
---

# askflow base policy (embedded)

A {metrics['parameters']:,}-parameter Qwen2-architecture causal LM with a {metrics['vocab_size']}-token
byte-level BPE tokenizer and TRL's Qwen2.5 chat template, pretrained from scratch by the DVC
stage `bootstrap` on gold MultiWOZ-layout seed dialogues rendered in the SpeakRL agent format:
tool calls in `<tool_call>`, results as `<tool_response>` user messages, plain responses, `<end>`
at the end of the task. There are no clarification turns in its data: this is the *base model*
of the SpeakRL tables. It acts, but it does not ask.

## Use

Prompts must be built with `pipelines.policy.prompts.compact_messages` (the compact system
prompt and the last N messages; the model was trained on windows of {metrics['data']['max_length']} tokens):

```python
from transformers import AutoModelForCausalLM, AutoTokenizer
from pipelines.policy.prompts import compact_messages

tokenizer = AutoTokenizer.from_pretrained("{params['output']}")
model = AutoModelForCausalLM.from_pretrained("{params['output']}")
messages = compact_messages([{{"role": "user", "content": "I need a cheap hotel in the north."}}], 6)
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
reply = model.generate(**inputs, max_new_tokens=96, do_sample=False)
```

Serve it with `transformers serve {params['output']}` (OpenAI-compatible). The generation config
samples by default; request temperature 0 for greedy replies.

## Data

- corpus: `{data['source']}`, sha256 of its files `{data['sha256']}`
- seed chats: {data['dialogues']['train']} (train split) for training, {data['dialogues'][HELD_OUT_SPLIT]} ({HELD_OUT_SPLIT} split) held out
- training windows: {metrics['data']['train_windows']} ({metrics['data']['train_tokens']:,} tokens), loss on {'assistant tokens only' if metrics['data']['assistant_only_loss'] else 'every token'}

## Training

{training['steps']} steps of {training['batch_size']} windows ({training['tokens_seen']:,} tokens, {training['epochs']} epochs){', stopped early by the time budget' if training['stopped_early'] else ''}.

Compact system prompt:

```
{COMPACT_SYSTEM_PROMPT}
```

Parameters (params.yaml `bootstrap`):

```yaml
{yaml.safe_dump(dict(params), sort_keys=False).strip()}
```

## Metrics

| metric | value |
|---|---|
| parameters | {metrics['parameters']:,} |
| vocabulary | {metrics['vocab_size']} |
| train loss (first step / mean of last 10 steps) | {training['first_train_loss']} / {training['final_train_loss']} |
| held-out loss, nats per assistant token ({metrics['data']['held_out_windows']} {HELD_OUT_SPLIT} windows) | {metrics['held_out_loss']} |
| greedy replies that parse as SpeakRL ({generation['prompts']} {HELD_OUT_SPLIT} prompts) | {generation['format_valid_share']} |
| ... that ended within {generation['max_new_tokens']} new tokens | {generation['finished_share']} |
| ... of the gold output's kind (tool call / response) | {generation['same_kind_share']} |
| ... calling the gold tool / with the gold arguments ({generation['gold_tool_calls']} gold calls) | {generation['same_tool_share']} / {generation['same_call_share']} |
| ... that ask a clarification question | {generation['clarify_share']} |
| first replies to {opening['prompts']} {HELD_OUT_SPLIT} opening requests: of the gold kind / calling the gold tool ({opening['gold_tool_calls']} gold calls) | {opening['same_kind_share']} / {opening['same_tool_share']} |

Sample greedy replies:

{samples}

## Limitations

A model of this size trained for a minute or two on CPU learns the output format and the kind
of action first, and exact tool arguments, venue names and reference numbers much later: read
`same_call_share` before relying on its calls. `format_valid_share` counts any untagged text as
a valid plain response; `finished_share` and `same_kind_share` say more about whether it has
learnt to act. It has never seen a `<think>` or `<clarify>` output.
"""


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
