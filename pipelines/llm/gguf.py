"""SmolLM2 (or any llama.cpp-format model) from a GGUF file to a plain transformers model.

transformers reads a GGUF through the ``gguf`` package, dequantised to float; a model loaded
that way stays marked as quantized and refuses ``save_pretrained``, so :func:`convert` builds
a plain model from the GGUF's config and loads the dequantised state dict into it. Used by
the ``smollm2`` stage and by the GPU job (:mod:`flows.gpu`), which converts on the node.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib.util
from pathlib import Path
from typing import Any, Iterator

from pipelines.errors import ConfigError, DataError


def gguf_path(package: str, filename: str) -> Path:
    """The GGUF file inside an installed distribution, located without importing it (the
    package's own module imports ``llm``, which is deliberately not installed)."""
    module = package.replace("-", "_")
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise DataError(package, "package not installed (make setup installs it with --no-deps)")
    path = Path(list(spec.submodule_search_locations)[0]) / filename
    if not path.is_file():
        raise DataError(str(path), "GGUF file missing from the installed package")
    return path


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


@contextlib.contextmanager
def _read_once(gguf: Path) -> Iterator[None]:
    """transformers parses the whole GGUF (49,152 vocabulary strings and merges, read one
    field part at a time) for the config, the weights, the config again and the tokenizer,
    and builds gguf's tensor-name table once per module of the model (397 times): 13 of the
    conversion's 24 s on one core (2026-11-29), time a GPU lease pays before it trains.
    Both come from names it imports from ``gguf`` when
    called, so while this is open they hand back one reader of this file and one table per
    architecture. Speed only: a transformers that imports them otherwise just reads again."""
    import gguf as gguf_package

    reader, name_map = gguf_package.GGUFReader, gguf_package.get_tensor_name_map
    target = Path(gguf).resolve()

    @functools.cache
    def opened() -> Any:
        return reader(target)

    def read(path: Any, *args: Any, **kwargs: Any) -> Any:
        return reader(path, *args, **kwargs) if args or kwargs or Path(path).resolve() != target else opened()

    gguf_package.GGUFReader = read
    gguf_package.get_tensor_name_map = functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf_package.GGUFReader, gguf_package.get_tensor_name_map = reader, name_map


def convert(gguf: Path, dtype: str = "float32") -> tuple[Any, Any]:
    """(model, tokenizer) from a GGUF file: the dequantised weights in a model built from
    the GGUF's config, so that it saves as a normal checkpoint."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    torch_dtype = getattr(torch, dtype, None)
    if not isinstance(torch_dtype, torch.dtype):
        raise ConfigError(f"params.yaml smollm2.dtype: not a torch dtype: {dtype!r}")
    folder, name = str(gguf.parent), gguf.name
    with _read_once(gguf):
        loaded = AutoModelForCausalLM.from_pretrained(folder, gguf_file=name, dtype=torch.float32)
        state = {key: value.detach().clone() for key, value in loaded.state_dict().items()}
        del loaded
        config = AutoConfig.from_pretrained(folder, gguf_file=name)
        tokenizer = AutoTokenizer.from_pretrained(folder, gguf_file=name)
    config.dtype = torch_dtype
    for attribute in ("quantization_config", "_pre_quantization_dtype"):
        if hasattr(config, attribute):
            delattr(config, attribute)
    torch.manual_seed(0)  # the model is fully overwritten below; a fixed seed all the same
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(state, strict=False)
    # Tied embeddings: lm_head.weight is the embedding matrix and may be absent from the GGUF.
    missing = [key for key in missing if not (key == "lm_head.weight" and config.tie_word_embeddings)]
    if missing or unexpected:
        raise DataError(str(gguf), f"state dict does not match the config: missing {missing}, unexpected {unexpected}")
    model = model.to(torch_dtype).eval()
    if not tokenizer.chat_template:
        raise DataError(str(gguf), "no chat template in the GGUF metadata")
    return model, tokenizer


__all__ = ["convert", "gguf_path", "sha256"]
