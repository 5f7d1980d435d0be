"""Config vocabulary shared by the methods (issue 31: one shape per kind of setting, at the
bottom floor). :class:`FanOutSpec`: how a stage fans its work out over Prefect workers; JOSH's
harvest (``josh.fan_out``) and SpeakER's synthesis (``speaker.fan_out``) read the same one.
:func:`positive_int` and :func:`rate`: the checks of a count and of a share, one wording each
(``where`` is the setting's key path, as the user wrote it); they return the value unchanged."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pipelines.errors import ConfigError, ConfigValueError

TASK_RUNNERS: tuple[str, ...] = ("thread", "process", "dask")


def positive_int(value: Any, where: str, *, optional: bool = False, minimum: int = 1) -> int | None:
    """``value`` if an int (not a bool) >= ``minimum``, or None when ``optional``; else a ConfigError.

    >>> positive_int(3, "josh.concurrency"), positive_int(None, "evaluate.max_goals", optional=True)
    (3, None)
    >>> positive_int(0, "workers", minimum=0)
    0
    >>> positive_int(True, "params.yaml clarifier.prompt.max_tool_chars", optional=True)
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigValueError: params.yaml clarifier.prompt.max_tool_chars: expected an integer >= 1 or null, got True
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigValueError(f"{where}: expected an integer >= {minimum}{' or null' if optional else ''}, got {value!r}")
    return value


def rate(value: Any, where: str, *, optional: bool = False) -> float | None:
    """``value`` if a number (not a bool) in [0, 1], or None when ``optional``; else a ConfigError.

    >>> rate(0.05, "evaluate.max_llm_failure_rate"), rate(1, "noise"), rate(None, "top_p", optional=True)
    (0.05, 1, None)
    >>> rate(1.5, "rules agent.p_ask")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigValueError: rules agent.p_ask: expected a number in [0, 1], got 1.5
    """
    if value is None and optional:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 <= value <= 1:
        raise ConfigValueError(f"{where}: expected a number in [0, 1]{' or null' if optional else ''}, got {value!r}")
    return value


@dataclass(frozen=True)
class FanOutSpec:
    """``workers`` 0: in the stage's process. ``workers`` n >= 1: a Prefect flow whose tasks
    each take ``chunk_size`` items (goals, seed dialogues), on Prefect's ``thread`` or
    ``process`` pool task runner with n workers, or on a Dask cluster (``dask``, prefect-dask:
    a ``LocalCluster`` of n worker processes, or the scheduler at ``address``) when one
    machine is not enough. The items' results do not depend on the runner.

    >>> FanOutSpec(workers=2, task_runner="dask").chunk_size
    16
    >>> FanOutSpec(workers=2, task_runner="mpi")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: task_runner: expected one of ['thread', 'process', 'dask'], got 'mpi'
    """

    workers: int = 0
    task_runner: str = "thread"
    chunk_size: int = 16
    address: str | None = None

    def __post_init__(self) -> None:
        if self.task_runner not in TASK_RUNNERS:
            raise ConfigError(f"task_runner: expected one of {list(TASK_RUNNERS)}, got {self.task_runner!r}")
        positive_int(self.workers, "workers", minimum=0)
        positive_int(self.chunk_size, "chunk_size")
