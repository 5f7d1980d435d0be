"""Config vocabulary shared by the methods (issue 31: one shape per kind of setting, at the
bottom floor). :class:`FanOutSpec`: how a stage fans its work out over Prefect workers; JOSH's
harvest (``josh.fan_out``) and SpeakER's synthesis (``speaker.fan_out``) read the same one."""

from __future__ import annotations

from dataclasses import dataclass

from pipelines.errors import ConfigError

TASK_RUNNERS: tuple[str, ...] = ("thread", "process", "dask")


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
        if isinstance(self.workers, bool) or not isinstance(self.workers, int) or self.workers < 0:
            raise ConfigError(f"workers: expected an integer >= 0, got {self.workers!r}")
        if isinstance(self.chunk_size, bool) or not isinstance(self.chunk_size, int) or self.chunk_size < 1:
            raise ConfigError(f"chunk_size: expected an integer >= 1, got {self.chunk_size!r}")
