"""The temporary local Prefect API of a stage's flow run, and what a killed stage left of one.

Without ``PREFECT_API_URL``, Prefect would start a temporary API server as a child process
by itself. A stage killed with SIGKILL cannot stop it: the server runs on, holding the
project's Prefect database, and the flow run stays ``RUNNING`` for ever. So the stages start
that server themselves (:func:`local_prefect_api`), and record it with its owner in
``$PREFECT_HOME/askflow-runs/<pid>.json``; their flow runs carry the owner's tag. The next
stage to start finds the records whose owner is gone, stops their servers, marks their
``RUNNING`` / ``PENDING`` flow runs ``Crashed`` and removes the records. Processes are
identified by pid and start time, so a reused pid is never mistaken for the owner.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import signal
import socket
import time
from pathlib import Path
from typing import Any, Iterator

from pipelines.files import process_start, same_process

logger = logging.getLogger(__name__)

RECORDS = "askflow-runs"
OWNER_TAG = "askflow-owner"
SERVER_MODULE = "prefect.server.api.server:create_app"
SHARED_SERVER_ENV = "ASKFLOW_SHARED_PREFECT_API"  # the URL of make run's server (shared_prefect_api)


def owner_tag(pid: int, start: int | None) -> str:
    return f"{OWNER_TAG}:{pid}-{start}"


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _stop(pid: int, start: int | None, timeout_s: float = 10.0) -> bool:
    """SIGTERM (then SIGKILL) a leftover server, only if it is still that process and a
    Prefect API server. Returns whether one was stopped."""
    if not same_process(pid, start) or SERVER_MODULE not in _cmdline(pid):
        return False
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while same_process(pid, start) and time.monotonic() < deadline:
        time.sleep(0.1)
    if same_process(pid, start):
        os.kill(pid, signal.SIGKILL)
    return True


def stale_records(home: Path) -> list[tuple[Path, dict[str, Any]]]:
    """The run records under ``home`` whose owner no longer runs."""
    stale = []
    for path in sorted((home / RECORDS).glob("*.json")):
        try:
            record = json.loads(path.read_text())
            owner = (int(record["pid"]), record.get("start"))
        except (OSError, ValueError, KeyError, TypeError):
            stale.append((path, {}))  # torn by the kill: nothing to stop, only to remove
            continue
        if not same_process(*owner):
            stale.append((path, record))
    return stale


def stop_stale_servers(home: Path) -> list[tuple[Path, dict[str, Any]]]:
    """Stop the servers of dead owners; returns their records (still on disk)."""
    stale = stale_records(home)
    for _, record in stale:
        if record.get("server_pid") and _stop(int(record["server_pid"]), record.get("server_start")):
            logger.warning("stopped a Prefect server (pid %s) left by a killed run (pid %s)", record["server_pid"], record["pid"])
    return stale


async def _crash_runs(tags: list[str]) -> list[str]:
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import FlowRunFilter, FlowRunFilterState, FlowRunFilterStateType, FlowRunFilterTags
    from prefect.client.schemas.objects import StateType
    from prefect.states import Crashed

    crashed = []
    async with get_client() as client:
        for tag in tags:
            runs = await client.read_flow_runs(flow_run_filter=FlowRunFilter(
                tags=FlowRunFilterTags(all_=[tag]),
                state=FlowRunFilterState(type=FlowRunFilterStateType(any_=[StateType.RUNNING, StateType.PENDING])),
            ))
            for run in runs:
                message = "The process running this flow was killed; marked crashed by the next run."
                await client.set_flow_run_state(run.id, Crashed(message=message), force=True)
                crashed.append(str(run.id))
    return crashed


def crash_orphaned_runs(stale: list[tuple[Path, dict[str, Any]]]) -> list[str]:
    """Mark the unfinished flow runs of dead owners Crashed (on the API in use) and remove
    their records; returns the ids of the runs marked."""
    from prefect.utilities.asyncutils import run_coro_as_sync

    tags = [owner_tag(int(r["pid"]), r.get("start")) for _, r in stale if "pid" in r]
    crashed = run_coro_as_sync(_crash_runs(tags)) if tags else []
    for run_id in crashed:
        logger.warning("flow run %s of a killed run marked Crashed", run_id)
    for path, _ in stale:
        path.unlink(missing_ok=True)
    return crashed


def clean_up_killed_runs(home: Path | str | None = None) -> None:
    """What a killed run left, cleaned up by the next run of any stage (``stages.entry``) and
    at ``make run`` start (``stages.run``): the Prefect servers of dead owners are stopped
    (their records stay, so that the next flow-running stage marks their flow runs Crashed on
    its own API), and the trainers' staging directories in the temporary directory are removed.
    ``home``: ``$PREFECT_HOME``, else ``.prefect`` in the working directory. Never raises: a
    cleanup that fails is logged and the stage goes on."""
    from pipelines.files import remove_stale_temp_staging

    home = Path(home or os.environ.get("PREFECT_HOME") or Path.cwd() / ".prefect")
    try:
        if (home / RECORDS).is_dir():
            stop_stale_servers(home)
        for entry in remove_stale_temp_staging():
            logger.warning("removed %s, left by a killed run", entry)
    except Exception as error:  # noqa: BLE001 - cleanup must not stop the stage
        logger.warning("cleaning up after killed runs failed: %s", error)


@contextlib.contextmanager
def local_prefect_api(home: Path | str) -> Iterator[str | None]:
    """Run the body against a temporary Prefect API on ``home``'s database, recorded so that
    a killed run's server and flow runs are cleaned up by the next one; leftovers of dead
    runs are cleaned up first. With ``PREFECT_API_URL`` set, that server is used as is
    (yields None). Flow runs started in the body carry this process's owner tag."""
    from prefect import tags
    from prefect.settings import PREFECT_API_URL, temporary_settings

    home = Path(home)
    me, my_start = os.getpid(), process_start(os.getpid())
    records = home / RECORDS
    record = records / f"{me}.json"
    if PREFECT_API_URL.value():
        if os.environ.get(SHARED_SERVER_ENV) != PREFECT_API_URL.value():
            yield None  # the user's own server: used as is
            return
        # make run's one server for every stage (shared_prefect_api): this stage's runs carry
        # its owner tag and it is recorded without a server, so that a kill of this stage is
        # cleaned up by the next one (its runs marked Crashed) while the server goes on.
        records.mkdir(parents=True, exist_ok=True)
        record.write_text(json.dumps({"pid": me, "start": my_start, "server_pid": None}))
        try:
            crash_orphaned_runs(stale_records(home))
            try:
                with tags(owner_tag(me, my_start)):
                    yield PREFECT_API_URL.value()
            finally:
                _drain_logs()
        finally:
            record.unlink(missing_ok=True)
        return
    from prefect.server.api.server import SubprocessASGIServer

    stale = stop_stale_servers(home)  # before ours starts: they hold the same database
    records.mkdir(parents=True, exist_ok=True)
    # Prefect keeps one SubprocessASGIServer object per port, "none given" included: without a
    # port of its own this would be any other server of the process (prefect_test_harness's),
    # and stopping ours would stop that one too.
    server = SubprocessASGIServer(_free_port())
    server.start(timeout=120)
    try:
        server_pid = server.server_process.pid if server.server_process else None
        record.write_text(json.dumps({
            "pid": me, "start": my_start, "server_pid": server_pid,
            "server_start": process_start(server_pid) if server_pid else None, "port": server.port,
        }))
        with temporary_settings({PREFECT_API_URL: server.api_url}):
            crash_orphaned_runs(stale)
            try:
                with tags(owner_tag(me, my_start)):
                    yield server.api_url
            finally:
                _drain_logs()
    finally:
        server.stop()
        record.unlink(missing_ok=True)


def _free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now."""
    with contextlib.closing(socket.socket(socket.AF_INET, socket.SOCK_STREAM)) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@contextlib.contextmanager
def shared_prefect_api(home: Path | str) -> Iterator[dict[str, str]]:
    """One temporary Prefect API for a whole ``make run``: yields the environment its stages
    run with (``PREFECT_HOME``, ``PREFECT_API_URL`` and the marker that this server is
    askflow's own), so that each flow-running stage connects instead of starting a server of
    its own (about 14 s each on 2 cores). The server is recorded like a stage's, so a killed
    ``make run`` leaves nothing running after the next run's clean-up."""
    home = Path(home)
    with local_prefect_api(home) as url:
        if url is None:  # PREFECT_API_URL set by the user: the stages use that server
            yield {}
            return
        yield {"PREFECT_HOME": str(home), "PREFECT_API_URL": url, SHARED_SERVER_ENV: url}


def _drain_logs() -> None:
    """Send the run's buffered log lines while its server is still up."""
    from prefect.logging.handlers import APILogWorker

    with contextlib.suppress(Exception):
        APILogWorker.drain_all(timeout=10)


__all__ = ["clean_up_killed_runs", "crash_orphaned_runs", "local_prefect_api", "shared_prefect_api", "owner_tag", "process_start", "stale_records", "stop_stale_servers"]
