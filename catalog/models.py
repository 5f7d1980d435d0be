"""Model directories, written in one place: every stage and flow that publishes a model (the
training flows, the GPU job, the bootstrap policy, the SmolLM2 conversion) saves it here, in
Hugging Face layout with its model card, staged beside the target and swapped in whole, with
the artifacts' permissions."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

from pipelines.files import ordinary_permissions, remove_stale_staging, replace_directory, staging_path


def save_model(
    model: Any, tokenizer: Any, directory: str | os.PathLike[str], *, merge_adapter: bool = False, card: str | None = None
) -> Path:
    """Save in Hugging Face layout (weights, config, generation config, tokenizer) into
    ``directory``, replacing it whole: everything is written to a sibling staging directory
    first and swapped in by renames, so a failed or killed save leaves the previous model
    in place (or restorable: the next save puts a model left mid-swap back).

    A PEFT model saves its adapter (``adapter_config.json`` naming the base model), or,
    with ``merge_adapter``, the merged full model. ``card`` becomes ``README.md``, written
    with the weights, so a model is never published without its card."""
    directory = Path(directory)
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_staging(directory)  # what a killed save left: partial copies, a model mid-swap
    temp = staging_path(directory)
    try:
        if merge_adapter and hasattr(model, "merge_and_unload"):
            model = model.merge_and_unload()
        model.save_pretrained(temp)
        tokenizer.save_pretrained(temp)
        if card is not None:
            (temp / "README.md").write_text(card, encoding="utf-8")
        ordinary_permissions(temp)  # safetensors writes 0600
        replace_directory(temp, directory)
    finally:
        if temp.exists():
            shutil.rmtree(temp)
    return directory


__all__ = ["save_model"]
