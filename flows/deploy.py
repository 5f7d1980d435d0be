"""The retrain deployment and the local Prefect server it runs on (``askflow deploy``, ``askflow ui``).

``deploy_retrain`` creates or updates (same name: same deployment) the deployment of
``flows/retrain.py:retrain`` from a project directory, with the cron schedule of
params.yaml ``retrain``, on a ``process`` work pool: a worker runs each scheduled run as a
subprocess in the project directory, with the worker's interpreter.

``serve`` runs ``prefect server start`` (API and UI) and, optionally, ``prefect worker
start`` for that pool, in the foreground until Ctrl-C or SIGTERM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable
from urllib.parse import urlsplit
from uuid import UUID

import httpx

from pipelines.errors import ConfigError
from pipelines.retrain import RetrainConfig

ENTRYPOINT = "flows/retrain.py:retrain"
WORK_POOL_TYPE = "process"
SERVER_START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 20.0


# --- Server address --------------------------------------------------------------------------


def resolve_api_url(explicit: str | None, configured: str | None) -> str:
    """The Prefect API URL: ``--api-url``, else the PREFECT_API_URL setting (``configured``:
    the environment, or the Prefect profile); ConfigError when neither."""
    url = explicit or configured
    if not url:
        raise ConfigError(
            "no Prefect server: set PREFECT_API_URL or pass --api-url "
            "(start a local server first with `askflow ui`, which prints the URL)"
        )
    url = url.rstrip("/")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"Prefect API URL {url!r}: expected http(s)://host:port/api")
    # `askflow ui` prints the UI address too; accept it for the API's.
    return url if parts.path.rstrip("/").endswith("/api") or "/api/" in parts.path else f"{url}/api"


def ui_url(api_url: str) -> str:
    return api_url[: -len("/api")] if api_url.endswith("/api") else api_url


def check_server(api_url: str, timeout_s: float = 5.0) -> None:
    """ConfigError unless a Prefect API answers its health check at ``api_url``."""
    try:
        response = httpx.get(f"{api_url}/health", timeout=timeout_s)
    except httpx.HTTPError as error:
        raise ConfigError(f"no Prefect server at {api_url} ({error}); start one with `askflow ui`") from None
    if response.status_code != 200:
        raise ConfigError(f"{api_url}/health answered HTTP {response.status_code}: is this a Prefect API URL?")


# --- Deployment ------------------------------------------------------------------------------


def ensure_work_pool(name: str) -> None:
    """Create the ``process`` work pool ``name`` unless it exists (API from the settings)."""
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists, ObjectNotFound
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        try:
            pool = client.read_work_pool(name)
        except ObjectNotFound:
            template = ProcessWorker.get_default_base_job_template()
            try:
                client.create_work_pool(WorkPoolCreate(name=name, type=WORK_POOL_TYPE, base_job_template=template))
            except ObjectAlreadyExists:  # created meanwhile by a worker or another deploy
                pass
            return
    if pool.type != WORK_POOL_TYPE:
        raise ConfigError(
            f"params.yaml: retrain.work_pool: work pool {name!r} exists with type {pool.type!r}; retraining runs "
            f"need a {WORK_POOL_TYPE!r} pool: choose another name"
        )


def deploy_retrain(root: Path, config: RetrainConfig) -> UUID:
    """Create or update the retrain deployment of the project at ``root``; its id.
    The Prefect API is the one of the current settings (``temporary_settings``)."""
    from prefect.flows import Flow
    from prefect.schedules import Cron

    from flows.retrain import deployment_parameters

    root = root.resolve()
    if not (root / ENTRYPOINT.split(":")[0]).is_file():
        raise ConfigError(f"{root}: no {ENTRYPOINT.split(':')[0]}; --root must be an askflow project directory")
    ensure_work_pool(config.work_pool)
    # from_source with a local directory: the deployment runs the flow file in place (no
    # image, no copy), with the project directory as the working directory of each run.
    source = Flow.from_source(source=str(root), entrypoint=ENTRYPOINT)
    return source.deploy(
        name=config.deployment,
        work_pool_name=config.work_pool,
        schedules=[Cron(config.cron, timezone=config.timezone)],
        parameters=deployment_parameters(root, config),
        description=f"dvc repro in {root}, recording which data and params versions produced which models and scores",
        tags=["askflow"],
        build=False,
        push=False,
        print_next_steps=False,
        ignore_warnings=True,  # the "process work pool" notice: intended, runs stay on this machine
    )


# --- Local server and worker -----------------------------------------------------------------


def server_environment(root: Path, host: str, port: int, environ: dict[str, str] | os._Environ = os.environ) -> dict[str, str]:
    """The environment of the server and worker processes: state under the project's
    ``.prefect`` unless PREFECT_HOME is set, no analytics, the UI on, this server's API."""
    return {
        **environ,
        "PREFECT_HOME": environ.get("PREFECT_HOME") or str(root / ".prefect"),
        "PREFECT_API_URL": f"http://{host}:{port}/api",
        "PREFECT_SERVER_ANALYTICS_ENABLED": "false",
        "PREFECT_SERVER_UI_ENABLED": "true",
        "DO_NOT_TRACK": "1",
    }


def serve(root: Path, host: str, port: int, work_pool: str | None, echo: Callable[[str], Any] = print) -> int:
    """Run the Prefect server (and a worker for ``work_pool``) until Ctrl-C / SIGTERM.

    The children get process groups of their own: a Ctrl-C in the terminal reaches only this
    process, which stops them one at a time (worker first, then server), each with a single
    SIGINT: Prefect treats a second one as "kill now"."""
    env = server_environment(root, host, port)
    api_url = env["PREFECT_API_URL"]
    prefect = [sys.executable, "-m", "prefect"]
    children: list[tuple[str, subprocess.Popen]] = []
    previous = _interrupt_on_signals()
    try:
        server = subprocess.Popen([*prefect, "server", "start", "--host", host, "--port", str(port)], cwd=root, env=env, process_group=0)
        children.append(("prefect server", server))
        _wait_until_healthy(server, api_url, port)
        if work_pool is not None:
            worker = subprocess.Popen(
                [*prefect, "worker", "start", "--pool", work_pool, "--type", WORK_POOL_TYPE],
                cwd=root, env=env, process_group=0,
            )
            children.append(("prefect worker", worker))
        echo(f"\nPrefect UI: {ui_url(api_url)}   (state in {env['PREFECT_HOME']})")
        echo("Point askflow and prefect at this server, e.g. before `askflow deploy`:")
        echo(f"  export PREFECT_API_URL={api_url}")
        if work_pool is not None:
            echo(f"A worker polls work pool {work_pool!r} and runs the scheduled retraining.")
        else:
            echo("No worker: scheduled runs wait until one polls the pool (`askflow ui --worker`).")
        echo("Ctrl-C stops.")
        while True:
            for name, child in children:
                if child.poll() is not None:
                    echo(f"error: {name} exited with status {child.returncode}")
                    return 1
            time.sleep(0.5)
    except KeyboardInterrupt:
        echo("\nstopping ...")
        return 0
    finally:
        # A second Ctrl-C must not cut the shutdown short and leave a child running.
        for sig in previous:
            signal.signal(sig, signal.SIG_IGN)
        for name, child in reversed(children):
            _stop(child)
        _restore_signals(previous)


def _wait_until_healthy(server: subprocess.Popen, api_url: str, port: int) -> None:
    deadline = time.monotonic() + SERVER_START_TIMEOUT_S
    while time.monotonic() < deadline:
        if server.poll() is not None:
            raise ConfigError(
                f"prefect server exited with status {server.returncode} before it was ready "
                f"(its output is above; is port {port} in use? then pass --port)"
            )
        try:
            if httpx.get(f"{api_url}/health", timeout=2).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.5)
    raise ConfigError(f"prefect server did not answer {api_url}/health within {SERVER_START_TIMEOUT_S:.0f} s")


def _stop(child: subprocess.Popen) -> None:
    """One SIGINT, then after a grace period SIGTERM and SIGKILL for the child's whole group:
    a flow run that a worker is executing is in the worker's group."""
    if child.poll() is None:
        child.send_signal(signal.SIGINT)
        try:
            child.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            pass
    for sig in (signal.SIGTERM, signal.SIGKILL):
        if not _group_alive(child.pid):  # process_group=0: the group id is the child's pid
            break
        os.killpg(child.pid, sig)
        deadline = time.monotonic() + 5
        while _group_alive(child.pid) and time.monotonic() < deadline:
            child.poll()  # reaps the child itself once it exits
            time.sleep(0.1)
    child.poll()


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    return True


def _interrupt_on_signals() -> dict[int, Any]:
    """SIGINT and SIGTERM raise KeyboardInterrupt here, whatever this process inherited: a
    shell starts background jobs with SIGINT ignored, and an ignored signal stays ignored in
    the children (Prefect's worker would then ignore the SIGINT that stops it)."""

    def interrupt(signum: int, frame: Any) -> None:
        raise KeyboardInterrupt

    previous = {}
    for sig in (signal.SIGINT, signal.SIGTERM):
        try:
            previous[sig] = signal.signal(sig, interrupt)
        except ValueError:  # not the main thread: leave signals alone
            pass
    return previous


def _restore_signals(previous: dict[int, Any]) -> None:
    for sig, handler in previous.items():
        signal.signal(sig, handler)
