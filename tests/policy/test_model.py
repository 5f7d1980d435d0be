"""The policy model: save and load, generation, training reduces loss, determinism."""

from __future__ import annotations

import asyncio
import math

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from pipelines.episodes.agents import AgentContext, HFAgent
from pipelines.episodes.formats import SpeakRLFormat
from pipelines.llm.config import SamplingParams
from pipelines.llm.hf import HFBackend
from catalog.models import save_model
from pipelines.policy.model import (
    Architecture,
    PretrainConfig,
    build_model,
    count_parameters,
    greedy_generate,
    mean_loss,
    target_losses,
    train_causal_lm,
)
from pipelines.policy.pretrain_data import IGNORE_INDEX, chats_to_windows, collate
from pipelines.policy.prompts import compact_messages
from pipelines.policy.tokenizer import training_chat_template
from tests.policy.conftest import TINY

PROMPT = compact_messages([{"role": "user", "content": "I need a train to cambridge on monday."}], 4)


@pytest.fixture(scope="module")
def windows(tokenizer, chats):
    return chats_to_windows(tokenizer, chats["train"][:30], 384, chat_template=training_chat_template(tokenizer))


def test_architecture_is_validated():
    with pytest.raises(ValueError, match="divisible"):
        Architecture(hidden_size=30, num_attention_heads=4)
    with pytest.raises(ValueError, match="num_hidden_layers"):
        Architecture(num_hidden_layers=0)


def test_build_is_seeded_and_uses_the_tokenizers_special_tokens(tokenizer):
    model = build_model(TINY, tokenizer, seed=1)
    assert model.config.vocab_size == len(tokenizer)
    assert (model.config.eos_token_id, model.config.pad_token_id) == (tokenizer.eos_token_id, tokenizer.pad_token_id)
    assert model.generation_config.eos_token_id == tokenizer.eos_token_id
    same, other = build_model(TINY, tokenizer, seed=1), build_model(TINY, tokenizer, seed=2)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), same.parameters()))
    assert not all(torch.equal(a, b) for a, b in zip(model.parameters(), other.parameters()))
    assert count_parameters(model) == sum(p.numel() for p in model.parameters())


def test_save_load_and_generate(tokenizer, tmp_path):
    model = build_model(TINY, tokenizer, seed=0)
    save_model(model, tokenizer, tmp_path / "policy")
    loaded = AutoModelForCausalLM.from_pretrained(tmp_path / "policy")
    loaded_tokenizer = AutoTokenizer.from_pretrained(tmp_path / "policy")
    assert loaded_tokenizer.chat_template == tokenizer.chat_template
    assert loaded_tokenizer.get_vocab() == tokenizer.get_vocab()
    assert type(loaded).__name__ == "Qwen2ForCausalLM"
    before = greedy_generate(model, tokenizer, [PROMPT], max_new_tokens=12)
    after = greedy_generate(loaded, loaded_tokenizer, [PROMPT], max_new_tokens=12)
    assert before == after and before[0].n_tokens > 0
    # The runner's HF agent drives the saved model too (greedy, with the compact prompt).
    agent = HFAgent(HFBackend(loaded, loaded_tokenizer), SpeakRLFormat(), SamplingParams(temperature=0.0, max_tokens=12))
    context = AgentContext(episode_id="e", seed=0, exchange=0, turn=1, step=0, attempt=0, messages=tuple(PROMPT))
    assert asyncio.run(agent.act([context]))[0].text == after[0].text


def test_batched_generation_equals_one_at_a_time(tokenizer):
    model = build_model(TINY, tokenizer, seed=0)
    prompts = [PROMPT, compact_messages([{"role": "user", "content": "Hi."}], 2), PROMPT[:1]]
    batched = greedy_generate(model, tokenizer, prompts, max_new_tokens=10, batch_size=3)
    assert batched == [greedy_generate(model, tokenizer, [p], max_new_tokens=10)[0] for p in prompts]


def test_pretraining_reduces_the_loss(tokenizer, windows):
    model = build_model(TINY, tokenizer, seed=0)
    before = mean_loss(model, windows[:16], tokenizer.pad_token_id)
    result = train_causal_lm(model, windows, PretrainConfig(steps=30, batch_size=4, learning_rate=1e-2, warmup_steps=3), tokenizer.pad_token_id)
    after = mean_loss(model, windows[:16], tokenizer.pad_token_id)
    assert result.steps == 30 and not result.stopped_early
    assert after < 0.75 * before, (before, after)
    assert result.final_loss(5) < result.losses[0]
    assert result.target_tokens < result.tokens


def test_training_is_deterministic_for_a_seed(tokenizer, windows):
    config = PretrainConfig(steps=4, batch_size=4, warmup_steps=1, seed=5)
    runs = []
    for _ in range(2):
        model = build_model(TINY, tokenizer, seed=0)
        runs.append(train_causal_lm(model, windows, config, tokenizer.pad_token_id).losses)
    assert runs[0] == runs[1]


def test_a_time_budget_stops_training_early(tokenizer, windows):
    model = build_model(TINY, tokenizer, seed=0)
    result = train_causal_lm(model, windows, PretrainConfig(steps=1000, warmup_steps=0, max_seconds=1e-6), tokenizer.pad_token_id)
    assert result.stopped_early and result.steps == 1


def test_the_schedule_warms_up_then_decays_to_the_floor():
    config = PretrainConfig(steps=10, warmup_steps=2, min_lr_ratio=0.1)
    factors = [config.lr_factor(step) for step in range(10)]
    assert factors[:3] == [0.5, 1.0, 1.0]
    assert all(a >= b for a, b in zip(factors[2:], factors[3:]))
    assert math.isclose(config.lr_factor(10), 0.1)
    with pytest.raises(ValueError, match="warmup_steps"):
        PretrainConfig(steps=5, warmup_steps=6)


def test_target_losses_are_the_models_own_loss_at_the_labelled_tokens(tokenizer, windows):
    model = build_model(TINY, tokenizer, seed=0)
    batch = collate(windows[:3], tokenizer.pad_token_id)
    with torch.no_grad():
        losses = target_losses(model, batch)
        reference = model(**batch).loss
    assert losses.numel() == int((batch["labels"][:, 1:] != IGNORE_INDEX).sum()) > 0
    assert torch.allclose(losses.mean(), reference, atol=1e-6)
