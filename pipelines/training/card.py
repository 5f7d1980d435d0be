"""The model card (``README.md`` in the model directory) and the data version it names.

A dataset's version is the MD5 of its file: the hash DVC records for it in ``dvc.lock``,
so ``grep <md5> dvc.lock`` finds the pipeline run that produced the data.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Mapping

import yaml

from pipelines.training.config import TrainConfig, config_dict
from pipelines.training.report import flatten


def file_md5(path: str | Path) -> str:
    digest = hashlib.md5()
    with open(path, "rb") as file:
        for block in iter(lambda: file.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _number(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}"
    return "" if value is None else str(value)


def model_card(
    config: TrainConfig,
    report: Mapping[str, Any],
    examples: Mapping[str, list[tuple[str, str]]] | None = None,
) -> str:
    """Markdown: what was trained from what, on which data version, with which settings,
    and the held-out metrics before and after; no wall times (the card is hashed with the
    model by DVC; they go to ``reports/timings/``). ``examples``: (prompt tail, generation)
    pairs per source."""
    before = flatten(report.get("eval", {}).get("before", {}))
    after = flatten(report.get("eval", {}).get("after", {}))
    rows = "\n".join(
        f"| {name} | {_number(before.get(name))} | {_number(after.get(name))} |" for name in sorted(set(before) | set(after))
    )
    data = "\n".join(
        f"| {name} | `{info['path']}` | `{info['md5']}` | {info['train']} | {info['heldout']} |"
        + (f"\n| (prompts) | `{info['prompts_from']}` | `{info['prompts_md5']}` | | |" if "prompts_from" in info else "")
        for name, info in report.get("data", {}).get("sources", {}).items()
    )
    train = report.get("train", {})
    lines = [
        "---",
        "library_name: transformers",
        "pipeline_tag: text-generation",
        f"tags: [askflow, trl, {config.method}]",
        "---",
        "",
        f"# askflow {config.method.upper()} policy",
        "",
        f"Trained with TRL's {config.method.upper()} trainer by askflow's `train_{config.method}` flow, "
        f"starting from `{config.model.name_or_path}`"
        + (" through a LoRA adapter" + (" (merged)" if config.model.lora.merge else "") if config.model.lora else "")
        + ".",
        "",
        "## Data",
        "",
        "| source | path | md5 (DVC data version) | train rows | held-out rows |",
        "|---|---|---|---|---|",
        data,
        "",
        f"Held out: the corpus `{config.data.holdout.split}` split (column `{config.data.holdout.split_column}`; "
        f"a source without it: dialogues whose `{config.data.holdout.key}` hashes below {config.data.holdout.fraction}); "
        "the same dialogues in every stage. Test-split dialogues are never trained on.",
        "",
        "## Training",
        "",
        f"{train.get('steps')} steps ({train.get('stopped_by')}), final loss {_number(train.get('final_loss'))}"
        + f" on {report.get('device', {}).get('accelerator', '?')}.",
        "",
        "## Held-out metrics",
        "",
        "| metric | before | after |",
        "|---|---|---|",
        rows,
        "",
        "## Parameters",
        "",
        "```yaml",
        yaml.safe_dump(config_dict(config), sort_keys=False).rstrip(),
        "```",
    ]
    for source, pairs in (examples or {}).items():
        lines += ["", f"## Sample generations ({source}, held out)", ""]
        for prompt_tail, text in pairs:
            lines += ["```text", f"... {prompt_tail}", "--- generated ---", text, "```", ""]
    return "\n".join(lines).rstrip() + "\n"


__all__ = ["file_md5", "model_card"]
