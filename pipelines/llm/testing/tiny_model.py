"""A tiny Qwen2-architecture chat model, built locally in a second (no hub access).

The tokenizer is a byte-level BPE trained with the ``tokenizers`` library on a few sentences,
so any text round-trips; the chat template is TRL's bundled Qwen2.5 template when TRL is
installed, else a minimal ChatML one. Weights are random but seeded, with a large
initializer range so that greedy replies depend on the prompt instead of repeating one token.
"""

from __future__ import annotations

import os
from pathlib import Path

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
_CORPUS = (
    "I am looking for a cheap restaurant in the centre of town.",
    "Which area would you like? Do you have a price range in mind?",
    "Book a table for two people on Friday at 18:30, please.",
    "The hotel has free parking and wifi. Shall I book it?",
    "system user assistant: a train to Cambridge leaving after 09:15",
)


def chat_template() -> str:
    try:
        import trl
    except ImportError:
        return CHATML_TEMPLATE
    path = Path(trl.__file__).parent / "chat_templates" / "qwen2_5.jinja"
    return path.read_text(encoding="utf-8") if path.is_file() else CHATML_TEMPLATE


def build_tiny_chat_model(directory: str | os.PathLike[str], *, seed: int = 0, vocab_size: int = 400) -> Path:
    """Write a tiny model and tokenizer with ``save_pretrained`` into ``directory``; return it."""
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM

    directory = Path(directory)
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(_CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token="<|im_end|>", pad_token="<|endoftext|>")
    tokenizer.chat_template = chat_template()
    tokenizer.save_pretrained(directory)

    config = Qwen2Config(
        hidden_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=64,
        vocab_size=len(tokenizer),
        max_position_embeddings=1024,
        initializer_range=0.5,
        tie_word_embeddings=True,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    # As in released chat checkpoints. transformers serve maps temperature 0 to greedy but never
    # switches sampling on itself: without this, temperature > 0 would silently decode greedily.
    model.generation_config.do_sample = True
    model.save_pretrained(directory)
    return directory
