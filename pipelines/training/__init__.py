"""Post-training recipes with TRL: SFT, DPO, KTO and GRPO, as configs and building blocks.

The Prefect flows in :mod:`flows.train` put these together; the DVC stages
(``stages/train.py``) read ``params.yaml`` into the configs. Every check that can fail before
training starts is :mod:`pipelines.preflight`, above the methods (it knows every artifact).

* :mod:`~pipelines.training.config` - a run as frozen dataclasses (:class:`TrainConfig`);
* :mod:`~pipelines.training.device` - GPU/CPU, bf16, gradient checkpointing, vLLM;
* :mod:`~pipelines.training.data` - column contract, dialogue-level hold-out, compact
  prompts fitted to the context, TRL rows;
* :mod:`~pipelines.training.modeling` - model, tokenizer, LoRA, 4-bit, saving;
* :mod:`~pipelines.training.trainers` - the TRL trainer of each method;
* :mod:`~pipelines.training.callbacks` - progress logging, time budget, curves;
* :mod:`~pipelines.training.evaluation` - held-out generations, rewards, preference margins;
* :mod:`~pipelines.training.report` / :mod:`~pipelines.training.card` - metrics, curve,
  model card.

torch, transformers and TRL are imported where they are used, so that configs and
preflight checks stay cheap to import.
"""

from __future__ import annotations

from pipelines.training import config as _config
from pipelines.training.config import *  # noqa: F403 - the configs are the package's vocabulary

__all__ = list(_config.__all__)
