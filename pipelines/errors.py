"""Errors that name what is wrong and where: file, record and field."""

from __future__ import annotations


class AskflowError(Exception):
    """Base class: every askflow error is meant to be read by a person."""


class DataError(AskflowError):
    """Bad input data. ``source`` is the file (or logical source), ``record`` the record id
    (dialogue id, entity id, row), ``field`` the field path inside the record."""

    def __init__(self, source: str, message: str, record: str | None = None, field: str | None = None):
        self.source = source
        self.record = record
        self.field = field
        self.message = message
        where = source
        if record is not None:
            where += f", record {record!r}"
        if field is not None:
            where += f", field {field!r}"
        super().__init__(f"{where}: {message}")


class ValidationFailed(AskflowError):
    """An expectation suite failed; ``report`` is the readable report. ``record`` and
    ``field``, where known, say where the first failure is (``detail``: what was found)."""

    def __init__(self, artifact: str, report: str, record: str | None = None, field: str | None = None,
                 detail: str | None = None):
        self.artifact = artifact
        self.report = report
        self.record = record
        self.field = field
        where = ""
        if record is not None:
            where += f" record {record}"
        if field is not None:
            where += f"{',' if where else ''} field {field!r}"
        first = f"{where}: {detail}" if where and detail else where
        super().__init__(f"artifact {artifact!r} failed validation:{first}\n{report}")


class ConfigError(AskflowError):
    """Bad params.yaml section or command-line configuration."""


class ConfigValueError(ConfigError, ValueError):
    """A setting out of its range, as :mod:`pipelines.config`'s validators say it: a ConfigError,
    and a ValueError for the callers that caught the ValueError of the checks they replaced."""


class LLMOutage(AskflowError):
    """Too many LLM calls of a stage failed: its results would be what the outage left, not data."""


class LowYield(AskflowError):
    """A stage kept less of its input than the share its params declare: what it would publish
    is what a fault (a broken model, a garbage-answering server) left, not data."""


class NoLearningSignal(AskflowError):
    """A GRPO run whose every group of completions had the same reward: its gradient was zero,
    so the "trained" model is a copy of its start and would be published as if it had learned."""
