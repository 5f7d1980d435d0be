"""The policy tokenizer: exact round trips, single-id tags, TRL's template and its masks."""

from __future__ import annotations

from pathlib import Path

import pytest
import trl
from transformers import AutoTokenizer
from trl.chat_template_utils import get_training_chat_template, is_chat_template_stop_token_trained

from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT
from pipelines.policy.tokenizer import CONTROL_TOKENS, EOS_TOKEN, FORMAT_TOKENS, PAD_TOKEN, train_tokenizer, training_chat_template

CHAT = [
    {"role": "system", "content": COMPACT_SYSTEM_PROMPT},
    {"role": "user", "content": "I need a cheap hotel in the north."},
    {"role": "assistant", "content": '<tool_call>\n{"name": "query_hotel", "arguments": {"area": "north"}}\n</tool_call>'},
    {"role": "user", "content": '<tool_response>\n{"count": 0, "results": []}\n</tool_response>'},
    {"role": "assistant", "content": "There is none, sorry. Goodbye! <end>"},
]


def test_texts_round_trip_and_tags_are_single_tokens(tokenizer):
    text = (
        "<|im_start|>assistant\n<think>ünïcode, 🚆 and  two spaces</think><clarify>Which day?</clarify>"
        '<tool_call>\n{"name": "book_taxi", "arguments": {}}\n</tool_call><tool_response>{}</tool_response> '
        "Bye <end><|im_end|>\n<|endoftext|>"
    )
    ids = tokenizer.encode(text, add_special_tokens=False)
    assert tokenizer.decode(ids) == text
    for token in CONTROL_TOKENS + FORMAT_TOKENS:
        assert tokenizer.encode(token, add_special_tokens=False) == [tokenizer.convert_tokens_to_ids(token)], token
        assert tokenizer.encode(f"x{token}y", add_special_tokens=False).count(tokenizer.convert_tokens_to_ids(token)) == 1


def test_decoding_skips_control_tokens_but_keeps_the_format_tags(tokenizer):
    text = "<think>hm</think><tool_call>\n{}\n</tool_call> <end><|im_end|><|endoftext|>"
    decoded = tokenizer.decode(tokenizer.encode(text, add_special_tokens=False), skip_special_tokens=True)
    assert decoded == "<think>hm</think><tool_call>\n{}\n</tool_call> <end>"
    assert (tokenizer.eos_token, tokenizer.pad_token) == (EOS_TOKEN, PAD_TOKEN)


def test_vocabulary_size_and_training_is_deterministic(chats):
    texts = [m["content"] for chat in chats["train"][:10] for m in chat]
    first, second = train_tokenizer(texts, 400), train_tokenizer(texts, 400)
    assert first.get_vocab() == second.get_vocab()
    assert len(first) <= 400
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(texts, 100)


def test_the_chat_template_is_trls_qwen2_5_byte_for_byte(tokenizer, tmp_path):
    bundled = (Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja").read_bytes()
    assert tokenizer.chat_template.encode("utf-8") == bundled
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded.chat_template.encode("utf-8") == bundled
    assert reloaded.encode(CHAT[2]["content"]) == tokenizer.encode(CHAT[2]["content"])


def test_the_template_renders_chatml_and_the_generation_prompt_is_a_token_prefix(tokenizer):
    rendered = tokenizer.apply_chat_template(CHAT, tokenize=False)
    assert rendered.startswith(f"<|im_start|>system\n{COMPACT_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n")
    assert rendered.count("<|im_start|>assistant\n") == 2
    prompt = tokenizer.apply_chat_template(CHAT[:-1], tokenize=True, add_generation_prompt=True, return_dict=True)["input_ids"]
    full = tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
    assert full[: len(prompt)] == prompt  # what the model was trained on continues the prompt


def test_trl_recognises_the_template_and_the_assistant_mask_covers_exactly_the_outputs(tokenizer):
    template = training_chat_template(tokenizer)
    assert template == get_training_chat_template(tokenizer) and "{% generation %}" in template.replace("{%-", "{%")
    assert is_chat_template_stop_token_trained(tokenizer, chat_template=template)
    encoded = tokenizer.apply_chat_template(
        CHAT, chat_template=template, tokenize=True, return_dict=True, return_assistant_tokens_mask=True
    )
    ids, mask = encoded["input_ids"], encoded["assistant_masks"]
    masked = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert masked == "".join(f"\n{m['content']}<|im_end|>\n" for m in CHAT if m["role"] == "assistant")
    # The training variant renders the same tokens as the original template.
    assert ids == tokenizer.apply_chat_template(CHAT, tokenize=True, return_dict=True)["input_ids"]
