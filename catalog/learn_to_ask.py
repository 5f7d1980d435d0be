"""Learn-to-Ask inputs: the offline logs (a chat-log file or a MultiWOZ-layout directory,
params.yaml ``hindsight`` / ``calibrate`` ``source`` and ``format``) and the calibrated
prompts file of stage ``calibrate`` (``hindsight.prompts``), curated calibration anchors and
the rollout track's sampler model. Stages ``hindsight``, ``calibrate`` and ``l2a_eval`` read
them here."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Mapping

from pipelines.config import positive_int
from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.autoprompt import Prompt
from pipelines.learn_to_ask.calibration import SEED_GRADER_PROMPT, SEED_POLICY_PROMPT, anchor_from_record, prompt_from_document
from pipelines.learn_to_ask.hindsight import SEED_EXTRACTOR_PROMPT
from pipelines.learn_to_ask.logs import Session, parse_chat_logs, session_from_dialogue
from catalog.io import read_json, read_jsonl

FORMATS = ("multiwoz", "chat_log")


def read_chat_log(path: Path) -> list[Session]:
    """Sessions of a chat-log file: ``.jsonl`` (one JSON object per line, blank lines
    skipped) or a JSON array; a line that is not JSON is an error naming it."""
    if not path.is_file():
        raise DataError(str(path), "file not found")
    if path.suffix == ".jsonl":
        records = read_jsonl(path)
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
    limit = positive_int(params.get("max_sessions"), "params.yaml hindsight.max_sessions", optional=True)
    if limit is not None:
        sessions = sessions[:limit]
    return sessions


def extractor_prompt(path: Any) -> Prompt:
    """The calibrated extractor prompt (stage calibrate's prompts file), or the seed prompt."""
    if path is None:
        return SEED_EXTRACTOR_PROMPT
    return prompt_from_document(read_json(Path(path)), "extract", str(path))


def grader_prompt(path: Any) -> tuple[Prompt, str]:
    """The LLM grader's prompt and where it came from: the calibrated GRADER prompt when the
    prompts file has one (``calibrated``), else appendix G's grading prompt (``seed``)."""
    if path is not None:
        document = read_json(Path(path))
        if isinstance(document, Mapping) and "grader" in document:
            return prompt_from_document(document, "grader", str(path)), "calibrated"
    return SEED_GRADER_PROMPT, "seed"


def policy_prompt(path: Any) -> Prompt:
    """The policy's system prompt in ``l2a_train``: the calibrated ROLLOUT prompt when the
    prompts file has one, else appendix G's sampler prompt."""
    if path is not None:
        document = read_json(Path(path))
        if isinstance(document, Mapping) and "rollout" in document:
            return prompt_from_document(document, "rollout", str(path))
    return SEED_POLICY_PROMPT


def read_anchors(path: Path, parse: Any = anchor_from_record) -> list:
    """A curated anchor file (JSON Lines, each line read by ``parse``: an extraction anchor by
    default); at least one anchor."""
    if not path.is_file():
        raise DataError(str(path), "file not found")
    anchors = [parse(raw, str(path), where) for where, raw in read_jsonl(path)]
    if not anchors:
        raise DataError(str(path), "no anchors")
    return anchors


def policy_sampler(section: Any) -> tuple[Any, str]:
    """Stage calibrate's rollout track's sampler (``calibrate.policy``: ``model_path``,
    ``samples``, ``batch_size``, ``sampling``): ``samples`` draws per context, seeded, so a
    re-run samples the same."""
    from pipelines.llm import HFConfig, SamplingParams

    samples = positive_int(section.samples, "params.yaml calibrate.policy.samples")
    sampling = SamplingParams.from_dict(section.sampling, "params.yaml calibrate.policy.sampling")
    config = HFConfig(model_path=section.model_path, batch_size=section.batch_size)
    if not Path(config.model_path).exists():
        raise ConfigError(f"params.yaml calibrate.policy.model_path: {config.model_path} does not exist (python -m stages.smollm2)")
    from pipelines.llm.hf import HFBackend

    model = HFBackend.from_config(config)

    def sample(conversations: list[list[dict[str, str]]]) -> list[list[str]]:
        # Sample s of every conversation is seeded with s: the same prompts get the same draws.
        drawn = [model.generate(conversations, sampling, seed=s) for s in range(samples)]
        return [[draws[i] for draws in drawn] for i in range(len(conversations))]
    return sample, "hf"
