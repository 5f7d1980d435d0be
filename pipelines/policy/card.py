"""The embedded base policy's model card (``README.md`` in its model directory, stage
``bootstrap``): what the model is, how to prompt and serve it, its data version, training,
params and metrics, sample replies and limits."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any, Mapping

import yaml

from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
from pipelines.records import VAL

if TYPE_CHECKING:
    from pipelines.policy.bootstrap import BootstrapResult

#: The split whose seed chats are held out of the base policy's training (its loss, replies).
HELD_OUT_SPLIT = VAL


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
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast
from pipelines.policy.prompts import compact_messages

# Its own tokenizer.json as is: transformers 5's AutoTokenizer builds Qwen2Tokenizer for any
# qwen2-architecture model, which splits text into other tokens than this model was trained on.
tokenizer = PreTrainedTokenizerFast.from_pretrained("{params['output']}")
model = AutoModelForCausalLM.from_pretrained("{params['output']}")
messages = compact_messages([{{"role": "user", "content": "I need a cheap hotel in the north."}}], 6)
inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
reply = model.generate(**inputs, max_new_tokens=96, do_sample=False)
```

The generation config samples by default; pass temperature 0 (`do_sample=False`) for greedy
replies. `transformers serve` loads the tokenizer with `AutoTokenizer` (above): it would prompt
this model with tokens it was not trained on; askflow's `hf` backend loads `tokenizer.json` as is.

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
