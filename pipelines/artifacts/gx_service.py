"""One Great Expectations process for every stage of a ``make run`` (issue 30).

Importing GX costs a stage process about 4 s of CPU on 2 cores (a quarter of a short stage's
run: altair, scipy and pydantic models come with it), and nearly every stage validates what it
reads or publishes. ``make run`` (``stages/run.py``) therefore starts this service once, on a
Unix socket in its temporary directory with a random key, and sets :data:`SERVICE_ENV` for its
stages; :func:`pipelines.artifacts.validate.validate` sends the table's scalar columns (Arrow
IPC, the same bytes) and the expectations here, and this process runs the same
``_run_gx`` on them: the results are those a stage computes alone. Without the variable, or
when the service cannot be reached or does not answer in time, a stage validates in its own
process as before; an error of the suite itself (an unknown expectation) is raised in the stage
as it would be there.

    python -m pipelines.artifacts.gx_service SOCKET   # key in $ASKFLOW_GX_SERVICE_KEY (hex)
"""

from __future__ import annotations

import contextlib
import os
import pickle
import secrets
import subprocess
import sys
import threading
import time
from multiprocessing.connection import AuthenticationError, Client, Listener
from pathlib import Path
from typing import Any, Iterator, Sequence

import pyarrow as pa

from pipelines.files import stop_process

#: ``SOCKET:KEYHEX`` of the running service, set by ``make run`` for its stages.
SERVICE_ENV = "ASKFLOW_GX_SERVICE"
_KEY_ENV = "ASKFLOW_GX_SERVICE_KEY"
_PARENT_ENV = "ASKFLOW_GX_SERVICE_PARENT"  # the pid of the process that started it
#: How long a stage waits for an answer before it validates by itself.
ANSWER_TIMEOUT_S = 600.0


def _encode(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def _decode(data: bytes) -> pa.Table:
    return pa.ipc.open_stream(pa.py_buffer(data)).read_all()


def validate_remotely(table: pa.Table, expectations: Sequence[Any], artifact: str) -> dict[Any, Any] | None:
    """The service's results for ``expectations`` on ``table`` (expectation -> result, as
    ``_run_gx`` gives them), or None when there is no service to ask (then validate here)."""
    where = os.environ.get(SERVICE_ENV)
    if not where or not expectations:
        return None
    address, _, key = where.rpartition(":")
    try:
        connection = Client(address, family="AF_UNIX", authkey=bytes.fromhex(key))
    except (OSError, EOFError, ValueError, AuthenticationError):
        return None
    with connection:
        try:
            connection.send((_encode(table), [(e.type, dict(e.kwargs)) for e in expectations], artifact))
            if not connection.poll(ANSWER_TIMEOUT_S):
                return None
            status, payload = connection.recv()
        except (OSError, EOFError):
            return None
    if status == "error":
        raise payload
    return dict(zip(expectations, payload))


def _answer(connection, lock: threading.Lock) -> None:
    from pipelines.artifacts.spec import Expectation
    from pipelines.artifacts.validate import _run_gx

    with connection:
        try:
            data, expectations, artifact = connection.recv()
            rebuilt = [Expectation(kind, kwargs) for kind, kwargs in expectations]
            with lock:  # one GX validation at a time: its ephemeral contexts are not meant to be shared
                outcome = _run_gx(_decode(data), rebuilt, artifact)
            reply: tuple[str, Any] = ("ok", [outcome[e] for e in rebuilt])
        except Exception as error:  # the stage raises it, as it would have raised it itself
            reply = ("error", error)
        try:  # pickled once here, so that an unpicklable error still gets an answer across
            message = pickle.dumps(reply)
        except Exception:
            message = pickle.dumps(("error", RuntimeError(f"validation service: {reply[1]!r}")))
        with contextlib.suppress(OSError, EOFError):
            connection.send_bytes(message)  # what Connection.send does after pickling; the stage's recv() unpickles


def serve(address: str, key: bytes, parent: int | None = None) -> None:
    """Answer validation requests on ``address`` until terminated, or until ``parent``, the
    process that started it, is gone (a ``make run`` killed with SIGKILL leaves no service)."""
    from pipelines.artifacts.validate import _quiet_gx

    if parent is not None:
        threading.Thread(target=_exit_with_parent, args=(parent,), daemon=True).start()
    with _quiet_gx():  # the import every stage would pay, paid once
        pass
    lock = threading.Lock()
    with Listener(address, family="AF_UNIX", authkey=key) as listener:
        while True:
            try:
                connection = listener.accept()
            except (OSError, EOFError, AuthenticationError):
                continue
            threading.Thread(target=_answer, args=(connection, lock), daemon=True).start()


def _exit_with_parent(parent: int, every_s: float = 1.0) -> None:
    # An orphan is given another parent (init or a subreaper), maybe before this ran at all.
    while os.getppid() == parent:
        time.sleep(every_s)
    os._exit(0)


@contextlib.contextmanager
def running_service(directory: Path | str) -> Iterator[dict[str, str]]:
    """Start the service on a socket in ``directory`` and yield the environment the stages
    need to use it; stop it on exit. Stages that start before it listens validate by themselves."""
    address = str(Path(directory) / "gx.sock")
    key = secrets.token_hex(32)
    process = subprocess.Popen([sys.executable, "-m", "pipelines.artifacts.gx_service", address],
                               env={**os.environ, _KEY_ENV: key, _PARENT_ENV: str(os.getpid())}, stdin=subprocess.DEVNULL)
    try:
        yield {SERVICE_ENV: f"{address}:{key}"}
    finally:
        stop_process(process)


def wait_until_listening(address: str, timeout_s: float = 60.0) -> bool:
    """True once the socket exists (for tests and benchmarks)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if Path(address).exists():
            return True
        time.sleep(0.05)
    return False


if __name__ == "__main__":
    if len(sys.argv) != 2 or not os.environ.get(_KEY_ENV):
        raise SystemExit(f"usage: {_KEY_ENV}=HEX python -m pipelines.artifacts.gx_service SOCKET")
    parent = os.environ.pop(_PARENT_ENV, "")
    serve(sys.argv[1], bytes.fromhex(os.environ.pop(_KEY_ENV)), int(parent) if parent.isdigit() else None)
