"""Warm stage processes for ``make run`` (issue 30): the libraries are imported once.

A training or evaluation stage spends 6-9 s of CPU importing torch, transformers, TRL, PEFT,
datasets and Prefect before its first step, and ``make run`` starts ~30 stage processes on two
cores. ``make run`` (``stages/run.py``) therefore starts this server once, in the stages'
environment; it imports those libraries, and every ``python -m stages.<name>`` that DVC starts
hands its work over to it (``stages/__init__.py`` calls :func:`delegate` before the stage
module loads): the server forks, and the fork runs the stage module as ``__main__`` with the
command's arguments, working directory, environment and standard streams, while the command
waits, forwards the signals it gets and exits with the fork's status. DVC sees the same
command, output and exit status.

A fork is only as good as the process it copies, so the server refuses (and the command runs
the stage itself, as it always did) when its environment differs from the command's in any
variable but :data:`MAY_DIFFER` (the libraries it imported read theirs when they loaded, e.g.
the thread and kernel settings of ``stages/__init__.py``) or when the working directory
differs; the fork keeps what the imports added to the environment, as the stage's own imports
would have added it. Each fork starts with fresh seeds for ``random`` and numpy's global generator, as a new
process would; torch's default generator is untouched by imports. Without the server (any other
``python -m stages.<name>``, a test, a user's shell) nothing changes.

    python -m stages.warm SOCKET PARENT_PID   # started by stages.run; ends when PARENT_PID does
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Iterator

from pipelines.files import stop_process

#: The server's socket, set by ``make run`` for its stages.
SERVER_ENV = "ASKFLOW_WARM_STAGES"
#: Variables a stage command may have that the server lacks or has otherwise: DVC's own
#: (the stage's name and root), the shell's, and the variable that names the server.
MAY_DIFFER = frozenset({"DVC_STAGE", "DVC_ROOT", "PWD", "OLDPWD", "SHLVL", "_", SERVER_ENV})
#: What the stages import before their first step (each import checked: a library that is not
#: installed is left out).
PRELOAD = (
    "numpy", "pandas", "pyarrow.parquet", "torch", "transformers", "transformers.trainer",
    "transformers.models.auto.modeling_auto", "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama", "peft", "datasets", "trl", "trl.trainer.sft_trainer",
    "trl.trainer.dpo_trainer", "trl.trainer.kto_trainer", "trl.trainer.grpo_trainer", "prefect",
    "prefect.flow_engine", "prefect.task_engine", "yaml", "httpx",
)
#: Stage modules that are run in their own process all the same: make run's entry point, this
#: server, and the ``askflow`` command.
NOT_DELEGATED = frozenset({"stages.run", "stages.warm", "stages.cli"})
_FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


# --- The stage command's side -----------------------------------------------------------------


def delegate(module: str, args: list[str]) -> int | None:
    """Have the server run ``python -m module *args``: its exit status, or None when there is
    no server, it cannot be reached or it refuses (then the caller runs the stage itself)."""
    address = os.environ.get(SERVER_ENV)
    if not address or module in NOT_DELEGATED:
        return None
    try:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(address)
    except OSError:
        return None
    with sock:
        request = json.dumps({"module": module, "args": args, "cwd": os.getcwd(), "env": dict(os.environ),
                              "orig_argv": list(getattr(sys, "orig_argv", []))}).encode()
        try:
            sys.stdout.flush()
            sys.stderr.flush()
            socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
            reader = sock.makefile("rb")
            first = reader.readline()
        except OSError:
            return None
        if not first.startswith(b"P"):
            return None  # refused (the reason is in the server's log), or the server is ending
        pid = int(first[1:])

        def forward(signum, _frame):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signum)

        for signum in _FORWARDED:
            signal.signal(signum, forward)
        try:
            last = reader.readline()
        except OSError:
            last = b""
    if not last.startswith(b"X"):
        print(f"error: the warm stage process {pid} ended without an exit status ({SERVER_ENV})", file=sys.stderr)
        return 1
    status = int(last[1:])
    if status < 0:  # killed by a signal: end the same way, so DVC sees what it would have seen
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
        time.sleep(1)
        return 128 - status
    return status


# --- The server -------------------------------------------------------------------------------


def _preload(log) -> list[str]:
    import importlib

    loaded = []
    for name in PRELOAD:
        try:
            importlib.import_module(name)
            loaded.append(name)
        except Exception as error:  # noqa: BLE001 - a library missing here is imported by the stage, if at all
            print(json.dumps({"preload_failed": name, "error": repr(error)}), file=log, flush=True)
    return loaded


def _receive(conn: socket.socket) -> tuple[dict[str, Any], list[int]]:
    data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
    if len(data) < 4 or len(fds) != 3:
        for fd in fds:
            os.close(fd)
        raise OSError(f"a request of {len(data)} bytes with {len(fds)} of 3 streams")
    size = struct.unpack("!I", data[:4])[0]
    body = data[4:]
    while len(body) < size:
        more = conn.recv(size - len(body))
        if not more:
            raise OSError("request cut short")
        body += more
    return json.loads(body), fds


def _refusal(request: dict[str, Any], env: dict[str, str], cwd: str) -> str | None:
    if request.get("cwd") != cwd:
        return f"working directory {request.get('cwd')!r}, not {cwd!r}"
    theirs = request.get("env") or {}
    differ = sorted(k for k in set(theirs) | set(env) if k not in MAY_DIFFER and theirs.get(k) != env.get(k))
    if differ:
        return f"environment differs in {differ}"
    return None


def serve(address: str, parent: int | None, log_path: str | None = None) -> dict[str, Any] | None:
    """Accept stage commands until ``parent`` (the process that started it) ends or SIGTERM; in a forked worker, return the
    request it is to run (the caller runs it); in the server, return None at the end."""
    import selectors

    # the environment a stage process starts with; its imports may add to it (torch's
    # TORCHINDUCTOR_CACHE_DIR), and a fork keeps what they added, as the stage's own imports would
    env, cwd = dict(os.environ), os.getcwd()
    log = open(log_path, "a", encoding="utf-8") if log_path else open(os.devnull, "w")  # noqa: SIM115
    loaded = _preload(log)
    server_pid = os.getpid()
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    temp = f"{address}.{server_pid}"
    listener.bind(temp)
    listener.listen(64)
    os.replace(temp, address)  # clients see the socket only once it accepts
    print(json.dumps({"ready": True, "preloaded": loaded}), file=log, flush=True)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    try:
        while not stopping and (parent is None or os.getppid() == parent):
            with contextlib.suppress(ChildProcessError):
                while os.waitpid(-1, os.WNOHANG)[0]:
                    pass  # supervisors that ended
            if not selector.select(timeout=1.0):
                continue
            try:
                conn, _ = listener.accept()
            except OSError:
                continue
            try:
                request, fds = _receive(conn)
            except (OSError, ValueError) as error:
                print(json.dumps({"bad_request": repr(error)}), file=log, flush=True)
                conn.close()
                continue
            reason = _refusal(request, env, cwd)
            print(json.dumps({"stage": request.get("env", {}).get("DVC_STAGE") or request.get("module"),
                              "warm": reason is None, **({"refused": reason} if reason else {})}), file=log, flush=True)
            if reason is not None:
                with contextlib.suppress(OSError):
                    conn.sendall(b"R" + reason.encode() + b"\n")
                conn.close()
                for fd in fds:
                    os.close(fd)
                continue
            sys.stdout.flush()
            sys.stderr.flush()
            if os.fork() == 0:  # the supervisor: forks the worker, waits, reports its status
                selector.close()
                listener.close()
                log.close()
                worker = os.fork()
                if worker == 0:
                    conn.close()
                    _become(request, fds)
                    return request
                for fd in fds:
                    os.close(fd)
                _supervise(conn, worker)
            conn.close()
            for fd in fds:
                os.close(fd)
    finally:
        if os.getpid() == server_pid:
            with contextlib.suppress(OSError):
                os.unlink(address)
            log.close()
    return None


def _supervise(conn: socket.socket, worker: int) -> None:
    """In the supervisor: tell the command the worker's pid, kill the worker if the command
    goes away (its socket closes), and send the worker's exit status. Never returns."""
    import threading

    reaped = threading.Event()
    try:
        try:
            conn.sendall(b"P%d\n" % worker)
        except OSError:  # the command is gone already
            os.kill(worker, signal.SIGKILL)

        def watch() -> None:  # the command's end of the socket closes only when it is gone
            with contextlib.suppress(OSError):
                conn.recv(1)
            if not reaped.is_set():  # once reaped, the pid may be another process's
                with contextlib.suppress(ProcessLookupError):
                    os.kill(worker, signal.SIGKILL)

        threading.Thread(target=watch, daemon=True).start()
        _, raw = os.waitpid(worker, 0)
        reaped.set()
        with contextlib.suppress(OSError):
            conn.sendall(b"X%d\n" % os.waitstatus_to_exitcode(raw))
    finally:
        os._exit(0)


def _become(request: dict[str, Any], fds: list[int]) -> None:
    """In the worker: the command's streams, directory, environment, arguments and signal
    defaults, and fresh seeds, as a new process would have them."""
    _die_with_parent()
    for target, fd in zip((0, 1, 2), fds):
        os.dup2(fd, target)
    for fd in fds:
        os.close(fd)
    os.chdir(request["cwd"])
    theirs = request["env"]
    for key in MAY_DIFFER:  # everything else is equal (_refusal)
        if key in theirs:
            os.environ[key] = theirs[key]
        else:
            os.environ.pop(key, None)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    sys.argv = ["-m", *request["args"]]  # run_module puts the module's file first, as python -m does
    if request.get("orig_argv"):
        sys.orig_argv = list(request["orig_argv"])
    import random

    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()


def _die_with_parent() -> None:
    """The worker ends when its supervisor does (Linux's PR_SET_PDEATHSIG), so that nothing
    runs a stage no command waits for."""
    try:
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except (OSError, AttributeError):
        pass  # not Linux: the supervisor's watch on the command's socket still applies


@contextlib.contextmanager
def running_server(directory: Path | str, env: dict[str, str], cwd: Path | str | None = None) -> Iterator[dict[str, str]]:
    """Start the server in ``env`` (the environment the stages get) and ``cwd`` (their working
    directory) on a socket in ``directory``; yield the variable that points the stages at it;
    stop it on exit. Stages that start before it is ready run by themselves."""
    address = str(Path(directory) / "warm.sock")
    log = str(Path(directory) / "warm.jsonl")
    # Its own session: a Ctrl-C reaches a stage's fork through the command, once. Its streams
    # go to a file, not a terminal: a fork's stdout is block-buffered as a new process's pipe is.
    with open(Path(directory) / "warm.out", "ab") as out:
        process = subprocess.Popen([sys.executable, "-m", "stages.warm", address, str(os.getpid()), log],
                                   env=env, cwd=cwd, stdin=subprocess.DEVNULL, stdout=out, stderr=out, start_new_session=True)
    try:
        yield {SERVER_ENV: address}
    finally:
        stop_process(process)


def read_log(directory: Path | str) -> list[dict[str, Any]]:
    """The server's log lines (one per stage command it was asked to run)."""
    path = Path(directory) / "warm.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def main(argv: list[str]) -> None:
    if len(argv) not in (2, 3) or not argv[1].isdigit():
        raise SystemExit("usage: python -m stages.warm SOCKET PARENT_PID [LOG]")
    request = serve(argv[0], int(argv[1]), argv[2] if len(argv) > 2 else None)
    if request is None:
        return
    import runpy

    runpy.run_module(request["module"], run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])
