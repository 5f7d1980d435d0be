"""Run ``transformers serve`` as a child process on a free localhost port.

The server is started with ``--port 0`` and the port uvicorn actually bound is read from its
log, so there is no window in which another process can take a port picked in advance. The
log (stdout and stderr) goes to a file; ``chat_requests()`` counts the access-log lines of
chat completions in it, since the server itself exposes no request counter.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Mapping

_LISTENING = re.compile(r"Uvicorn running on http://[^:]+:(\d+)")
_CHAT_REQUEST = re.compile(r'"POST /v1/chat/completions HTTP/[\d.]+" \d{3}')


def serve_executable() -> Path:
    """The ``transformers`` console script of the running interpreter's environment."""
    return Path(sys.executable).parent / "transformers"


def serve_command(model_path: str | os.PathLike[str], port: int = 0) -> list[str]:
    return [
        str(serve_executable()),
        "serve",
        str(model_path),  # preloaded ("force model"): requests must name exactly this path
        "--host",
        "127.0.0.1",
        "--port",
        str(port),
        "--device",
        "cpu",
    ]


class TransformersServe:
    """``with TransformersServe(model_dir, log_path) as server: server.base_url ...``

    ``env`` adds to the child's environment (e.g. ``OMP_NUM_THREADS``)."""

    def __init__(
        self,
        model_path: str | os.PathLike[str],
        log_path: str | os.PathLike[str],
        *,
        env: Mapping[str, str] | None = None,
        startup_timeout_s: float = 120.0,
    ):
        self.model_path = str(model_path)
        self.log_path = Path(log_path)
        self.extra_env = dict(env or {})
        self.startup_timeout_s = startup_timeout_s
        self.command = serve_command(self.model_path)
        self.port: int | None = None
        self._process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("transformers serve is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "TransformersServe":
        env = {
            **os.environ,
            "HF_HUB_OFFLINE": "1",  # never reach for the hub: the model is a local directory
            "TRANSFORMERS_OFFLINE": "1",
            "PYTHONUNBUFFERED": "1",  # the port line must reach the log file at once
            **self.extra_env,
        }
        with open(self.log_path, "wb") as log:
            self._process = subprocess.Popen(
                self.command, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True
            )
        deadline = time.monotonic() + self.startup_timeout_s
        while time.monotonic() < deadline:
            match = _LISTENING.search(self.log())
            if match:
                self.port = int(match.group(1))
                return self
            if self._process.poll() is not None:
                raise RuntimeError(f"transformers serve exited with {self._process.returncode}:\n{self.log()[-4000:]}")
            time.sleep(0.2)
        self.stop()
        raise RuntimeError(f"transformers serve did not start within {self.startup_timeout_s} s:\n{self.log()[-4000:]}")

    def stop(self) -> None:
        process, self._process = self._process, None
        self.port = None
        if process is None or process.poll() is not None:
            return
        # Its own session (start_new_session), so signalling the group reaches only its children.
        os.killpg(process.pid, signal.SIGTERM)
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait(timeout=15)

    def log(self) -> str:
        try:
            return self.log_path.read_text(encoding="utf-8", errors="replace")
        except FileNotFoundError:
            return ""

    def chat_requests(self) -> int:
        """Chat-completion requests the server has answered so far, from its access log."""
        return len(_CHAT_REQUEST.findall(self.log()))

    def __enter__(self) -> "TransformersServe":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()
