"""A stage's entry point: an askflow error exits non-zero with its message, not a traceback."""

from __future__ import annotations

import functools
import sys
from typing import Any, Callable, TypeVar

from pipelines.errors import AskflowError

T = TypeVar("T")


def main_wrapper(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a stage's entry point: an askflow error (DataError, ValidationFailed,
    ConfigError) is printed as ``error: <message>`` on stderr and exits with status 1,
    without a traceback since the message already says what and where. Any other
    exception is a bug and keeps its traceback. Before the stage runs, what a killed run
    left (a Prefect server, a staging directory in /tmp) is cleaned up."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        from flows.local_api import clean_up_killed_runs

        clean_up_killed_runs()
        try:
            return fn(*args, **kwargs)
        except AskflowError as error:
            print(f"error: {error}", file=sys.stderr)
            raise SystemExit(1) from None

    return run
