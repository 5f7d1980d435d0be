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
from typing import Any, Callable, Mapping

from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.autoprompt import Prompt
from pipelines.learn_to_ask.calibration import SEED_POLICY_PROMPT, prompt_from_document
from pipelines.learn_to_ask.hindsight import (
    EXTRACTION_SCHEMA,
    SEED_EXTRACTOR_PROMPT,
    STOP_RULES,
    Extractor,
    LLMExtractor,
    RulesExtractor,
    hindsight_samples,
)
from pipelines.learn_to_ask.logs import Session, parse_chat_logs, session_from_dialogue
from pipelines.learn_to_ask.tables import L2A_SAMPLES, L2A_TRAIN, hindsight_metrics, samples_table, train_table
from pipelines.llm import Accounting, BackendConfig, CompletionRequest, LLMClient, ResponseCache
from pipelines.llm.accounting import check_failure_rate
from stages.entry import main_wrapper
from catalog.io import publish, read_json, read_params, read_text, write_json_atomic, write_timings

_KEYS = {"source", "format", "db_dir", "stop_when", "max_sessions", "prompts", "max_llm_failure_rate", "output", "metrics"}
FORMATS = ("multiwoz", "chat_log")
DEFAULT_MAX_LLM_FAILURE_RATE = 0.05
ROLE = "extractor"


def read_chat_log(path: Path) -> list[Session]:
    """Sessions of a chat-log file: ``.jsonl`` (one JSON object per line, blank lines
    skipped) or a JSON array; a line that is not JSON is an error naming it."""
    if not path.is_file():
        raise DataError(str(path), "file not found")
    if path.suffix == ".jsonl":
        import json

        records = []
        for number, line in enumerate(read_text(path).splitlines(), start=1):
            if not line.strip():
                continue
            try:
                records.append((f"line {number}", json.loads(line)))
            except json.JSONDecodeError as exc:
                raise DataError(str(path), f"invalid JSON: {exc.msg} at column {exc.colno}", f"line {number}") from None
    else:
        raw = read_json(path)
        if not isinstance(raw, list):
            raise DataError(str(path), f"expected a JSON array of sessions (or a .jsonl file), got {type(raw).__name__}")
        records = [(f"record {i}", item) for i, item in enumerate(raw)]
    return parse_chat_logs(records, str(path))


def load_sessions(params: Mapping[str, Any]) -> list[Session]:
    source, fmt = Path(params["source"]), params.get("format", "multiwoz")
    if fmt not in FORMATS:
        raise ConfigError(f"params.yaml hindsight.format: expected one of {list(FORMATS)}, got {fmt!r}")
    if fmt == "chat_log":
        sessions = read_chat_log(source)
    else:
        from catalog.multiwoz_dir import load_multiwoz

        sessions = [session_from_dialogue(d) for d in load_multiwoz(source, params.get("db_dir")).dialogues]
    sessions.sort(key=lambda s: s.session_id)
    limit = params.get("max_sessions")
    if limit is not None:
        if isinstance(limit, bool) or not isinstance(limit, int) or limit < 1:
            raise ConfigError(f"params.yaml hindsight.max_sessions: expected a positive integer or null, got {limit!r}")
        sessions = sessions[:limit]
    return sessions


def extractor_backend(llm: Mapping[str, Any] | None) -> BackendConfig:
    roles = (llm or {}).get("roles") or {}
    backend = BackendConfig.from_dict(ROLE, roles.get(ROLE, {"backend": "rules"}), f"params.yaml llm.roles.{ROLE}")
    if backend.kind != "rules" and not backend.sampling.greedy:
        # The reference extracted at temperature 0.7: targets that change from run to run.
        raise ConfigError(f"params.yaml llm.roles.{ROLE}.sampling.temperature: the extractor decodes greedily; set 0.0")
    return backend


def completer(backend: BackendConfig, llm: Mapping[str, Any] | None, accounting: Accounting,
              schema: Mapping[str, Any] | None = EXTRACTION_SCHEMA) -> Callable[[list[list[dict[str, str]]]], list[Any]]:
    """What an LLM extractor (or grader) calls: conversations in, a reply (or a (reason,
    detail) failure) each out; ``schema``: the JSON schema an openai reply must follow."""
    if backend.kind == "hf":
        from pipelines.llm.hf import HFBackend

        assert backend.hf is not None
        if not Path(backend.hf.model_path).exists():
            raise ConfigError(f"{backend.role} model_path: {backend.hf.model_path} does not exist "
                              "(models/smollm2: python -m stages.smollm2)")
        model = HFBackend.from_config(backend.hf)

        def complete(conversations: list[list[dict[str, str]]]) -> list[Any]:
            return model.generate(conversations, backend.sampling)
        return complete
    if backend.kind != "openai" or backend.client is None:
        raise ConfigError(f"{backend.role}: an LLM backend (hf or openai) is needed here, got {backend.kind!r}")
    cache = ResponseCache((llm or {}).get("cache_dir") or "data/cache/llm")
    client = LLMClient(backend.client, cache=cache, accounting=accounting)

    def complete(conversations: list[list[dict[str, str]]]) -> list[Any]:
        requests = [CompletionRequest(c, backend.role, backend.sampling, seed=0, response_schema=schema) for c in conversations]
        return [r.text if r.ok else (r.reason, r.last_error) for r in client.complete_many_sync(requests)]
    return complete


def make_extractor(backend: BackendConfig, llm: Mapping[str, Any] | None, accounting: Accounting,
                   prompt: Prompt = SEED_EXTRACTOR_PROMPT) -> Extractor:
    if backend.kind == "rules":
        return RulesExtractor()
    return LLMExtractor(completer(backend, llm, accounting), backend.kind, prompt)


def extractor_prompt(path: Any) -> Prompt:
    """The calibrated extractor prompt (stage calibrate's prompts file), or the seed prompt."""
    if path is None:
        return SEED_EXTRACTOR_PROMPT
    return prompt_from_document(read_json(Path(path)), "extract", str(path))


def policy_prompt(path: Any) -> Prompt:
    """The policy's system prompt in ``l2a_train``: the calibrated ROLLOUT prompt when the
    prompts file has one, else appendix G's sampler prompt."""
    if path is not None:
        document = read_json(Path(path))
        if isinstance(document, Mapping) and "rollout" in document:
            return prompt_from_document(document, "rollout", str(path))
    return SEED_POLICY_PROMPT


def run(params: dict, llm: Mapping[str, Any] | None = None) -> dict:
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise ConfigError(f"params.yaml hindsight: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    for required in ("source", "output", "metrics"):
        if required not in params:
            raise ConfigError(f"params.yaml hindsight: {required!r} is required")
    stop_when = params.get("stop_when", "no_info")
    if stop_when not in STOP_RULES:
        raise ConfigError(f"params.yaml hindsight.stop_when: expected one of {list(STOP_RULES)}, got {stop_when!r}")
    max_failure_rate = params.get("max_llm_failure_rate", DEFAULT_MAX_LLM_FAILURE_RATE)
    check_failure_rate(Accounting(), max_failure_rate, "params.yaml hindsight")  # a bad value fails before any call
    backend = extractor_backend(llm)
    output, metrics_path = Path(params["output"]), Path(params["metrics"])

    started = time.perf_counter()
    sessions = load_sessions(params)
    accounting = Accounting()
    extractor = make_extractor(backend, llm, accounting, extractor_prompt(params.get("prompts")))
    loaded = time.perf_counter()
    samples = hindsight_samples(sessions, extractor, stop_when)
    check_failure_rate(accounting, max_failure_rate, "hindsight")
    extracted = time.perf_counter()
    train = train_table(samples, policy_prompt(params.get("prompts")).render())
    publish({output: (samples_table(samples), L2A_SAMPLES), output.parent / "l2a_train.parquet": (train, L2A_TRAIN)})

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
