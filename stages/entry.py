"""A stage's entry point: an askflow error exits non-zero with its message, not a traceback."""

from __future__ import annotations

import contextlib
import functools
import sys
from typing import Any, Callable, Iterator, TypeVar

from pipelines.errors import AskflowError

T = TypeVar("T")


def main_wrapper(fn: Callable[..., T]) -> Callable[..., T]:
    """Decorate a stage's entry point: an askflow error (DataError, ValidationFailed,
    ConfigError) is printed as ``error: <message>`` on stderr and exits with status 1,
    without a traceback since the message already says what and where. Any other
    exception is a bug and keeps its traceback. Before the stage runs, what a killed run
    left (a Prefect server, a staging directory in /tmp) is cleaned up. A stage prints
    ``[stage <name>] start`` and ``[stage <name>] done in <wall time>`` (:func:`stage_timer`)."""

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> T:
        from flows.local_api import clean_up_killed_runs

        clean_up_killed_runs()
        with stage_timer(fn):
            try:
                return fn(*args, **kwargs)
            except AskflowError as error:
                print(f"error: {error}", file=sys.stderr)
                raise SystemExit(1) from None

    return run


# --- Start and end lines with the wall time (issue 30) ---------------------------------------

#: ``python -m stages.run`` (``make run``) sets this to a file; every stage appends one JSON
#: line (stage, status, wall_s) to it for the run's summary. Nothing else records the times.
RUN_LOG_ENV = "ASKFLOW_RUN_LOG"
#: Entry points that are commands, not pipeline stages: no start/end lines.
NOT_STAGES = frozenset({"stages.cli"})
_depth = 0  # a stage's main called by another one in the same process reports once


def stage_name(fn: Callable[..., Any]) -> str | None:
    """The name a stage reports under: DVC's (``$DVC_STAGE``, e.g. ``train_sft``) inside
    ``dvc repro``, else its module's (``stages.bootstrap`` -> ``bootstrap``); None for an entry
    point that is no stage (the ``askflow`` command)."""
    import os

    module = fn.__module__
    if module == "__main__":  # python -m stages.<name>
        spec = getattr(sys.modules.get("__main__"), "__spec__", None)
        module = spec.name if spec is not None else module
    if module in NOT_STAGES:
        return None
    if os.environ.get("DVC_STAGE"):
        return os.environ["DVC_STAGE"]
    return module.rsplit(".", 1)[-1] if module.startswith("stages.") else None


@contextlib.contextmanager
def stage_timer(fn: Callable[..., Any]) -> Iterator[None]:
    """``[stage <name>] start`` before the stage and ``[stage <name>] done in <wall time>``
    (or ``failed after``) after it, on stdout beside DVC's ``Running stage`` lines, with
    ``[stage <name>] still running, ...`` every 30 s in which no progress line came
    (:class:`pipelines.progress.Heartbeat`); and the line for ``make run``'s summary
    (:data:`RUN_LOG_ENV`)."""
    global _depth
    name = stage_name(fn) if _depth == 0 else None
    if name is None:
        yield
        return
    import time

    from pipelines.progress import Heartbeat, format_duration

    print(f"[stage {name}] start", flush=True)
    started = time.monotonic()
    status = "failed"
    _depth += 1
    try:
        with Heartbeat(f"[stage {name}]", emit=lambda line: print(line, flush=True)):
            yield
        status = "done"
    except SystemExit as exit_:
        status = "done" if exit_.code in (None, 0) else "failed"
        raise
    finally:
        _depth -= 1
        wall_s = time.monotonic() - started
        print(f"[stage {name}] {'done in' if status == 'done' else 'failed after'} {format_duration(wall_s)}", flush=True)
        _log_run(name, status, wall_s)


def _log_run(name: str, status: str, wall_s: float) -> None:
    import json
    import os

    path = os.environ.get(RUN_LOG_ENV)
    if not path:
        return
    try:
        with open(path, "a", encoding="utf-8") as log:
            log.write(json.dumps({"stage": name, "status": status, "wall_s": round(wall_s, 1)}) + "\n")
    except OSError as error:  # the summary loses a line; the stage's result stands
        print(f"warning: {path}: {error}", file=sys.stderr)
