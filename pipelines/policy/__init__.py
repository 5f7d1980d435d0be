"""The embedded policy: a small Qwen2-architecture agent model built and pretrained on CPU.

* :mod:`~pipelines.policy.prompts`: the compact system prompt and
  :func:`compact_messages`, how every prompt for this model is built (the SpeakRL system
  prompt with full tool schemas does not fit its context);
* :mod:`~pipelines.policy.tokenizer`: byte-level BPE trained on the corpus, SpeakRL's tags
  as single tokens, TRL's Qwen2.5 chat template;
* :mod:`~pipelines.policy.pretrain_data`: gold seed dialogues as agent chats (what the
  replay agent says), cut into assistant-masked token windows;
* :mod:`~pipelines.policy.model`: architecture, training loop, held-out loss, greedy
  generation, Hugging Face save;
* :mod:`~pipelines.policy.bootstrap`: all of it together, with the evaluation the
  ``bootstrap`` stage reports.

Torch and transformers are imported inside the functions that need them, so importing
this package (e.g. for the prompts) stays cheap.
"""

from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT, compact_history, compact_messages, compact_messages_within, compact_system_prompt

__all__ = ["COMPACT_SYSTEM_PROMPT", "compact_history", "compact_messages", "compact_messages_within", "compact_system_prompt"]
