"""DVC stage ``hindsight``: offline logs -> Learn-to-Ask samples (I*_t, s*_t) per assistant turn.

params.yaml ``hindsight``:

* ``source``: a MultiWOZ-layout directory (``format: multiwoz``, optionally ``db_dir``) or a
  chat-log file (``format: chat_log``): JSON Lines, one session per line, or a JSON array
  of sessions (layout: :mod:`pipelines.learn_to_ask.logs`);
* ``stop_when``: ``no_info`` (the paper's eq. 2, default) or ``no_user_reply`` (the
  reference code's rule; CONTINUE samples with nothing to collect are then dropped);
* ``max_sessions``: the first N sessions by id (null: all), for a quick run;
* ``prompts``: the calibrated prompts file of stage ``calibrate`` (its ``extract`` prompt is
  what an LLM extractor reads); null: the paper's seed prompt;
* ``max_llm_failure_rate`` (default 0.05): more failed extractor calls than this (the
  model's own invalid output aside) is an outage: exit non-zero, publish nothing;
* ``output`` (the ``l2a_samples`` Parquet file; ``l2a_train.parquet`` beside it: the usable
  train/val samples as TRL prompt-completion rows with the ``l2a`` reward's columns),
  ``metrics`` (JSON).

The extractor is the ``extractor`` role of params.yaml ``llm.roles``: ``rules`` (offline
default; grounded in the source's annotations), ``hf`` (a local instruct model, e.g.
``{backend: hf, model_path: models/smollm2}``) or ``openai``; an LLM extractor decodes
greedily (temperature 0), and ``llm.cache_dir`` caches the openai backend's replies.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.errors import ConfigError
from pipelines.learn_to_ask.autoprompt import Prompt
from pipelines.learn_to_ask.completion import completer
from pipelines.learn_to_ask.hindsight import (
    SEED_EXTRACTOR_PROMPT,
    STOP_RULES,
    Extractor,
    LLMExtractor,
    RulesExtractor,
    hindsight_samples,
)
from pipelines.learn_to_ask.config import HindsightParams
from pipelines.learn_to_ask.tables import hindsight_metrics, samples_table, train_table
from pipelines.llm import Accounting, BackendConfig
from pipelines.llm.accounting import check_failure_rate
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_timings
from pipelines.config import from_params
from catalog import datasets
from catalog.learn_to_ask import extractor_prompt, load_sessions, policy_prompt

ROLE = "extractor"


def extractor_backend(llm: Mapping[str, Any] | None) -> BackendConfig:
    roles = (llm or {}).get("roles") or {}
    backend = BackendConfig.from_dict(ROLE, roles.get(ROLE, {"backend": "rules"}), f"params.yaml llm.roles.{ROLE}")
    if backend.kind != "rules" and not backend.sampling.greedy:
        # The reference extracted at temperature 0.7: targets that change from run to run.
        raise ConfigError(f"params.yaml llm.roles.{ROLE}.sampling.temperature: the extractor decodes greedily; set 0.0")
    return backend


def make_extractor(backend: BackendConfig, llm: Mapping[str, Any] | None, accounting: Accounting,
                   prompt: Prompt = SEED_EXTRACTOR_PROMPT) -> Extractor:
    if backend.kind == "rules":
        return RulesExtractor()
    return LLMExtractor(completer(backend, llm, accounting), backend.kind, prompt)


def run(params: dict, llm: Mapping[str, Any] | None = None) -> dict:
    config = from_params(HindsightParams, params, "params.yaml hindsight")
    stop_when = config.stop_when
    if stop_when not in STOP_RULES:
        raise ConfigError(f"params.yaml hindsight.stop_when: expected one of {list(STOP_RULES)}, got {stop_when!r}")
    max_failure_rate = config.max_llm_failure_rate
    check_failure_rate(Accounting(), max_failure_rate, "params.yaml hindsight")  # a bad value fails before any call
    backend = extractor_backend(llm)
    output, metrics_path = Path(config.output), Path(config.metrics)

    started = time.perf_counter()
    sessions = load_sessions({"source": config.source, "format": config.format, "db_dir": config.db_dir,
                              "max_sessions": config.max_sessions})
    accounting = Accounting()
    extractor = make_extractor(backend, llm, accounting, extractor_prompt(config.prompts))
    loaded = time.perf_counter()
    samples = hindsight_samples(sessions, extractor, stop_when)
    check_failure_rate(accounting, max_failure_rate, "hindsight")
    extracted = time.perf_counter()
    train = train_table(samples, policy_prompt(config.prompts).render())
    datasets.save({"l2a_samples": samples_table(samples), "l2a_train": train}, config)

    metrics = {"extractor": backend.kind, "stop_when": stop_when, **hindsight_metrics(samples, len(sessions))}
    if backend.kind == "openai":
        metrics["llm"] = accounting.as_dict()
    write_json_atomic(metrics_path, metrics)
    done = time.perf_counter()
    write_timings("hindsight", {"load_s": round(loaded - started, 2), "extract_s": round(extracted - loaded, 2),
                                "publish_s": round(done - extracted, 2), "wall_s": round(done - started, 2)})
    print(
        f"hindsight: {len(sessions)} sessions -> {metrics['samples']} samples, {metrics['kept']} kept "
        f"({metrics['decisions']['continue']} continue, {metrics['decisions']['stop']} stop), dropped {metrics['dropped']} "
        f"-> {output} [load {loaded - started:.1f}s, extract {extracted - loaded:.1f}s, publish {done - extracted:.1f}s]"
    )
    return metrics


@main_wrapper
def main() -> None:
    run(read_params("hindsight"), llm=read_params("llm", required=False))


if __name__ == "__main__":
    main()
