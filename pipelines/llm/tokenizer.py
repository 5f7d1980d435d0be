"""A model's tokenizer exactly as its ``tokenizer.json`` defines it: the one loader behind
training (:func:`pipelines.training.modeling.load_tokenizer`), evaluation and the ``hf``
backend (:meth:`pipelines.llm.hf.HFBackend.from_config`), so that a model is never prompted
with tokens other than those it was trained on.

transformers 5's ``AutoTokenizer`` maps every ``qwen2`` model to ``Qwen2Tokenizer``, which
rebuilds the normalizer and pre-tokenizer of Qwen's own vocabulary: a tokenizer trained with
other rules (the embedded base model's) then splits text into tokens the model never saw. A
local directory whose ``tokenizer.json`` disagrees with what ``AutoTokenizer`` built is loaded
from that file as is, with a warning.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)


def _tokenization(tokenizer_json: dict) -> dict:
    return {part: tokenizer_json.get(part) for part in ("normalizer", "pre_tokenizer")}


def faithful_tokenizer(name_or_path: str, **kwargs: Any) -> Any:
    """``AutoTokenizer.from_pretrained(name_or_path, **kwargs)``, unless ``name_or_path`` is a
    local directory whose ``tokenizer.json`` splits text otherwise: then that file as is
    (``PreTrainedTokenizerFast``). A hub id is taken as ``AutoTokenizer`` builds it."""
    from transformers import AutoTokenizer, PreTrainedTokenizerFast

    tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
    saved = Path(name_or_path) / "tokenizer.json"
    if saved.is_file():
        expected = _tokenization(json.loads(saved.read_text(encoding="utf-8")))
        if _tokenization(json.loads(tokenizer.backend_tokenizer.to_str())) != expected:
            logger.warning("%s: AutoTokenizer built a %s that tokenizes differently from tokenizer.json; using tokenizer.json as is",
                           name_or_path, type(tokenizer).__name__)
            tokenizer = PreTrainedTokenizerFast.from_pretrained(name_or_path, **kwargs)
    return tokenizer


__all__ = ["faithful_tokenizer"]
