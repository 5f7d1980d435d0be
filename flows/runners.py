"""The Prefect task runner a fan-out runs on (:class:`pipelines.config.FanOutSpec`): shared
by the JOSH harvest (:mod:`flows.josh`) and the SpeakER synthesis (:mod:`flows.speaker`)."""

from __future__ import annotations

from typing import Any

from pipelines.config import FanOutSpec
from pipelines.errors import ConfigError


def task_runner(fan_out: FanOutSpec, where: str) -> Any:
    """``thread`` / ``process``: Prefect's pool task runners with ``workers`` workers;
    ``dask``: prefect-dask's ``DaskTaskRunner``, on the scheduler at ``address`` or on a
    ``LocalCluster`` of ``workers`` worker processes (its default: processes, not threads)."""
    if fan_out.task_runner == "thread":
        from prefect.task_runners import ThreadPoolTaskRunner

        return ThreadPoolTaskRunner(max_workers=fan_out.workers)
    if fan_out.task_runner == "process":
        from prefect.task_runners import ProcessPoolTaskRunner

        return ProcessPoolTaskRunner(max_workers=fan_out.workers)
    try:
        from prefect_dask import DaskTaskRunner
    except ImportError:
        raise ConfigError(f"params.yaml {where}.task_runner: 'dask' needs the prefect-dask package (pip install prefect-dask)") from None
    if fan_out.address:
        return DaskTaskRunner(address=fan_out.address)
    return DaskTaskRunner(cluster_kwargs={"n_workers": fan_out.workers})
