"""The cold-start SFT mask: the simulated user's <response> text gets no loss (by default),
proved on the gradient of a real model, and kept by TRL's SFTTrainer."""

from __future__ import annotations

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelines.pir.insertion import Insertion, insert_pairs
from pipelines.pir.sft import IGNORE_INDEX, response_spans, sft_prompt_completion, tokenize_example
from pipelines.pir.tables import augmented_trace

pytestmark = pytest.mark.usefixtures("single_torch_thread")

REASONING = "The user wants a cheap restaurant.\n\nI will look in the centre.\n\nBook it for two people."
TRACE = augmented_trace(
    insert_pairs(REASONING, [Insertion(1, "Which area would you like?", "The north, please."), Insertion(2, "For how many?", "Two people.")]),
    "I booked it.",
)
PROMPT = [{"role": "user", "content": "I am looking for a cheap restaurant."}]


@pytest.fixture(scope="module")
def tokenizer(tiny_model_dir):
    return AutoTokenizer.from_pretrained(tiny_model_dir)


def _completion_tokens(tokenizer, example):
    encoded = tokenizer(TRACE, add_special_tokens=False, return_offsets_mapping=True)
    start = len(example["input_ids"]) - len(encoded["input_ids"]) - 1  # the eos token closes the example
    return start, encoded["offset_mapping"]


def test_response_tokens_have_no_label_and_everything_else_the_policy_writes_has(tokenizer):
    example = tokenize_example(tokenizer, PROMPT, TRACE)
    spans = response_spans(TRACE)
    assert len(spans) == 2 and all(TRACE[a:b].startswith("<response>") for a, b in spans)
    start, offsets = _completion_tokens(tokenizer, example)
    assert example["labels"][:start] == [IGNORE_INDEX] * start  # the prompt
    assert example["labels"][-1] == tokenizer.eos_token_id
    for k, (a, b) in enumerate(offsets):
        overlaps = any(a < e and s < b for s, e in spans)
        label = example["labels"][start + k]
        assert (label == IGNORE_INDEX) == overlaps, TRACE[a:b]
    # Every character of the user's answers sits in a masked token; the questions are trained.
    masked = "".join(TRACE[a:b] for k, (a, b) in enumerate(offsets) if example["labels"][start + k] == IGNORE_INDEX)
    assert "The north, please." in masked and "Two people." in masked and "Which area" not in masked
    trained = tokenizer.decode([t for t in example["labels"] if t != IGNORE_INDEX])
    assert "Which area would you like?" in trained and "north" not in trained and "I booked it." in trained


def test_the_papers_objective_trains_on_the_responses_too(tokenizer):
    example = tokenize_example(tokenizer, PROMPT, TRACE, train_on_responses=True)
    start, offsets = _completion_tokens(tokenizer, example)
    assert IGNORE_INDEX not in example["labels"][start:]
    assert len(tokenize_example(tokenizer, PROMPT, TRACE, max_length=10)["labels"]) == 10


def test_masked_tokens_get_no_gradient(tiny_model_dir, tokenizer):
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    example = tokenize_example(tokenizer, PROMPT, TRACE)
    input_ids = torch.tensor([example["input_ids"]])
    labels = torch.tensor([example["labels"]])
    out = model(input_ids=input_ids)
    out.logits.retain_grad()
    loss = model.loss_function(out.logits, labels, vocab_size=model.config.vocab_size)
    loss.backward()
    # The logits at j-1 predict token j: their gradient is zero exactly for the unlabelled tokens.
    grad = out.logits.grad[0].abs().sum(-1)
    for j in range(1, len(example["labels"])):
        assert (grad[j - 1] == 0).item() == (example["labels"][j] == IGNORE_INDEX), j


def test_trl_sft_trainer_keeps_the_mask(tiny_model_dir, tokenizer, tmp_path):
    from datasets import Dataset
    from trl import SFTConfig, SFTTrainer

    row = {"input": PROMPT[0]["content"], "augmented_trace": TRACE}
    pair = sft_prompt_completion(row)
    example = tokenize_example(tokenizer, pair["prompt"], pair["completion"][0]["content"])
    config = SFTConfig(output_dir=str(tmp_path), bf16=False, use_cpu=False, gradient_checkpointing=False, max_steps=1,
                       per_device_train_batch_size=1, report_to=[], max_length=None)
    trainer = SFTTrainer(model=AutoModelForCausalLM.from_pretrained(tiny_model_dir), args=config,
                         train_dataset=Dataset.from_list([example]), processing_class=tokenizer)
    assert trainer.train_dataset[0]["labels"] == example["labels"]
    batch = trainer.data_collator([trainer.train_dataset[0]])
    assert batch["labels"][0].tolist() == example["labels"]


def test_the_training_flow_reads_pir_traces_and_masks_the_responses(tokenizer):
    """pir_traces rows through the training data path (stage train_pir_sft): the input as the
    user's message under the compact system prompt, the augmented trace as the reply, the
    <response> blocks out of the loss; without loss_mask (the paper's eq. 3) TRL gets the
    prompt-completion pairs whole."""
    from pipelines.errors import ConfigError
    from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
    from pipelines.training.config import DataSpec, SourceSpec
    from pipelines.training.data import TokenCounter, build_train_dataset, prepare_source

    rows = [{"trace_id": "t1", "dialogue_id": "d1", "split": "train", "input": PROMPT[0]["content"], "augmented_trace": TRACE},
            {"trace_id": "t2", "dialogue_id": "d2", "split": "val", "input": "Another request.", "augmented_trace": TRACE}]
    source = SourceSpec("pir_traces.parquet", prompt_column="input", completion_column="augmented_trace")
    spec = DataSpec(sources=(source,), max_history_messages=None)
    prepared = prepare_source(rows, list(rows[0]), source, "sft", spec, TokenCounter(tokenizer), 4096)
    assert [r["dialogue_id"] for r in prepared.train] == ["d1"] and [r["dialogue_id"] for r in prepared.heldout] == ["d2"]
    assert prepared.train[0]["prompt"] == [{"role": "system", "content": COMPACT_SYSTEM_PROMPT}, PROMPT[0]]

    [example] = build_train_dataset("sft", [prepared], tokenizer=tokenizer, loss_mask="pipelines.pir.sft:response_spans").to_list()
    assert example == tokenize_example(tokenizer, prepared.train[0]["prompt"], TRACE)
    trained = tokenizer.decode([t for t in example["labels"] if t != IGNORE_INDEX])
    assert "Which area would you like?" in trained and "north" not in trained and "Two people." not in trained

    [whole] = build_train_dataset("sft", [prepared]).to_list()
    assert whole["completion"] == [{"role": "assistant", "content": TRACE}]
    with pytest.raises(ConfigError, match="loss_mask"):
        build_train_dataset("sft", [prepared], tokenizer=tokenizer, loss_mask="pipelines.pir.sft:no_such_function")
