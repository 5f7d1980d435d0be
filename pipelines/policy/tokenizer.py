"""The embedded policy's tokenizer: byte-level BPE trained on the corpus, with the SpeakRL
format's tags as single tokens and TRL's Qwen2.5 chat template.

* Byte-level, so any text round-trips exactly (``decode(encode(text)) == text``).
* Pre-tokenized at whitespace only (``" ?\\S+|\\s+"``), so that merges may span
  punctuation: ``{"name":`` or `` "query_hotel",`` become single tokens. The corpus is
  JSON-heavy; this about doubles the characters per token compared with GPT-2's split,
  which is what lets a tool result and some history fit in a few hundred tokens. A
  newline before a non-blank character is a token of its own, so a prompt that ends with
  the generation prompt's ``\\n`` tokenizes as a prefix of the whole conversation.
* Control tokens (``special=True``, dropped by ``decode(..., skip_special_tokens=True)``):
  ``<|endoftext|>`` (padding), ``<|im_start|>``, ``<|im_end|>`` (end of a turn: eos).
* Format tokens (``special=False``: one id each, never split by BPE, but kept by
  ``skip_special_tokens`` decoding, which is how agents and servers decode; dropping them
  would make every output unparseable): :data:`FORMAT_TOKENS`.
* The chat template is TRL's bundled ``qwen2_5.jinja``, read from the installed package
  byte for byte, so that TRL recognises it: it swaps in its training variant (with
  ``{% generation %}`` markers) for assistant-only loss and parses Qwen2.5 tool calls.
  :func:`training_chat_template` returns that variant.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Iterable

from pipelines.episodes.formats import END_TOKEN

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerFast

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
EOS_TOKEN = "<|im_end|>"
CONTROL_TOKENS: tuple[str, ...] = (PAD_TOKEN, IM_START, EOS_TOKEN)
FORMAT_TOKENS: tuple[str, ...] = (
    "<think>",
    "</think>",
    "<clarify>",
    "</clarify>",
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    END_TOKEN,
)
TEMPLATE_NAME = "qwen2_5.jinja"
PRE_TOKENIZER_PATTERN = r" ?\S+|\s+"  # a word with its punctuation (and one leading space), or whitespace


def _trl_template(name: str) -> str:
    import trl

    path = Path(trl.__file__).parent / "chat_templates" / name
    if not path.is_file():
        raise FileNotFoundError(f"TRL {trl.__version__} has no bundled chat template {name!r} (looked at {path})")
    # newline="" keeps the file's bytes: no newline translation.
    with open(path, encoding="utf-8", newline="") as handle:
        return handle.read()


def chat_template() -> str:
    """TRL's bundled Qwen2.5 chat template, exactly as installed."""
    return _trl_template(TEMPLATE_NAME)


def training_chat_template(tokenizer: "PreTrainedTokenizerFast") -> str:
    """The template with ``{% generation %}`` markers that TRL's SFT trainer uses for
    assistant-only loss on ``tokenizer`` (its Qwen2.5 training variant). Raises ValueError
    when TRL does not recognise the tokenizer's template."""
    from trl.chat_template_utils import get_training_chat_template, has_generation_markers

    template = get_training_chat_template(tokenizer)
    if template is None and has_generation_markers(tokenizer.chat_template):
        return tokenizer.chat_template
    if template is None:
        raise ValueError("TRL does not recognise the tokenizer's chat template; no training variant is known")
    return template


def train_tokenizer(texts: Iterable[str], vocab_size: int) -> "PreTrainedTokenizerFast":
    """A byte-level BPE tokenizer trained on ``texts`` (module docstring).

    ``vocab_size`` counts every token: the 256 bytes, the merges and the added tokens.
    Training is deterministic for the same texts in the same order."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    minimum = 256 + len(CONTROL_TOKENS) + len(FORMAT_TOKENS)
    if vocab_size <= minimum:
        raise ValueError(f"vocab_size must exceed {minimum} (bytes and added tokens), got {vocab_size}")
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRE_TOKENIZER_PATTERN), behavior="isolated"),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
    ])
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size - len(FORMAT_TOKENS),
        special_tokens=list(CONTROL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    bpe.train_from_iterator(texts, trainer)
    bpe.add_tokens([AddedToken(token, special=False, normalized=False) for token in FORMAT_TOKENS])
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = chat_template()
    return tokenizer
