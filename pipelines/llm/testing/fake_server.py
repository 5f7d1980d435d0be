"""A fault-injecting OpenAI-compatible chat server, for tests and benchmarks.

The replies are deterministic functions of the request, so a run that hit faults can be
compared with a fault-free run: the text is derived from the *first* user message, the seed
and the choice index only. Deriving it from the first user message (rather than from the whole
conversation) means that a repair request, which appends the invalid reply and the validation
error to the conversation, gets the same answer the original request would have got.

Function calling: when the request carries ``tools`` and the first user message contains
:data:`CALL_TOOL`, the fake model calls the first tool (arguments ``{}``, content null, an id
derived like the text) instead of answering in text; once the conversation ends with a tool
result (a ``tool`` message), it answers in text, so that an agent's turn can end.

Faults are chosen by the server-side request counter, not at random: with ``rate=0.2`` requests
5, 10, 15, ... are faulty, and the fault kinds are used in turn. Every injected fault is
counted per kind, so a test can check the client's retry counts against the server's.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any, Callable, Literal

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response

from pipelines.config import rate

FaultKind = Literal[
    "timeout",  # hang past the client's timeout, then answer normally
    "http_500",
    "http_429",
    "truncated",  # HTTP 200 whose JSON body is cut in half
    "invalid_content",  # HTTP 200, well-formed envelope, message content is not JSON
    "wrong_schema",  # HTTP 200, content is JSON that violates the usual test schema
    "echo_auth_401",  # HTTP 401 whose error message repeats the Authorization header
    "http_401",  # HTTP 401, as from a revoked key: an outage that retrying cannot fix
    "context_length_400",  # HTTP 400 "maximum context length" (OpenAI's wording, param "messages")
]
FAULT_KINDS: tuple[str, ...] = FaultKind.__args__  # type: ignore[attr-defined]

#: The fake "model" answers in JSON when the request asks for it, either through
#: ``response_format`` or through prompt instructions containing this phrase.
JSON_INSTRUCTION_MARKER = "JSON schema"
#: With ``tools`` in the request, a first user message containing this makes the fake model
#: call the first tool (unless the last message is a tool result, which it answers in text).
CALL_TOOL = "CALL_TOOL"


@dataclass(frozen=True)
class FaultPlan:
    """Which requests fail, and how: a deterministic fraction ``rate`` of the request counter."""

    rate: float = 0.0
    kinds: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        rate(self.rate, "fault rate")
        if self.rate > 0 and not self.kinds:
            raise ValueError("a fault rate > 0 needs at least one fault kind")
        unknown = set(self.kinds) - set(FAULT_KINDS)
        if unknown:
            raise ValueError(f"unknown fault kinds {sorted(unknown)}; known: {FAULT_KINDS}")

    def fault_for(self, request_number: int) -> str | None:
        """The fault of the ``request_number``-th request (1-based), or None.

        Request k is faulty when floor(k * rate) steps up at k: exactly ``rate`` of any
        prefix of requests (rounded down) is faulty, spread evenly."""
        if self.rate == 0.0:
            return None
        ordinal = math.floor(request_number * self.rate + 1e-9)
        if ordinal == math.floor((request_number - 1) * self.rate + 1e-9):
            return None
        return self.kinds[(ordinal - 1) % len(self.kinds)]


@dataclass
class ServerStats:
    requests: int = 0
    faults: Counter = field(default_factory=Counter)
    in_flight: int = 0
    max_in_flight: int = 0
    response_format_rejections: int = 0
    n_rejections: int = 0
    tool_requests: int = 0  # requests that carried ``tools``
    service_s: float = 0.0  # the reply delays, added up
    bodies: list[dict[str, Any]] = field(default_factory=list)
    authorizations: set[str] = field(default_factory=set)


def _first_user(messages: list[dict[str, Any]]) -> str:
    return next((str(m.get("content", "")) for m in messages if m.get("role") == "user"), "")


def _digest(first_user: str, seed: int | None, index: int) -> str:
    return hashlib.sha256(f"{first_user}\x00{seed}\x00{index}".encode()).hexdigest()[:12]


def reply_text(messages: list[dict[str, Any]], seed: int | None, index: int, as_json: bool) -> str:
    """The fake model's answer: a function of the first user message, the seed and the choice."""
    first_user = _first_user(messages)
    answer = f"echo {_digest(first_user, seed, index)}: {first_user[:48]}"
    if as_json:
        return json.dumps({"answer": answer, "seed": seed})
    return answer


def reply_tool_call(
    messages: list[dict[str, Any]], tools: list[dict[str, Any]], seed: int | None, index: int, arguments: Any = "{}"
) -> dict[str, Any]:
    """The fake model's call of the first tool, with an id derived like :func:`reply_text`'s text
    and ``arguments`` as given (a JSON string, as OpenAI sends them, or an object, as some servers do)."""
    return {
        "id": f"call_{_digest(_first_user(messages), seed, index)}",
        "type": "function",
        "function": {"name": tools[0]["function"]["name"], "arguments": arguments},
    }


def wants_tool_call(body: dict[str, Any]) -> bool:
    """Whether the fake model answers ``body`` with a tool call (see the module docstring)."""
    messages, tools = body.get("messages") or [], body.get("tools")
    if not tools or CALL_TOOL not in _first_user(messages):
        return False
    return not (messages and messages[-1].get("role") == "tool")


def _count_tokens(text: str) -> int:
    return len(text.split())


class FakeOpenAIServer:
    """An OpenAI-compatible ``/v1/chat/completions`` server on 127.0.0.1, in a background thread.

    ``n_mode``: "native" answers ``n`` choices, "ignore" answers one choice whatever ``n`` is
    (as ``transformers serve`` does), "reject" answers 400 to ``n > 1``.
    ``response_format_mode``: "native" honours ``response_format``, "reject" answers 400 to it.
    ``latency_s`` delays every reply; with ``latency_spread`` s, request k's delay is spread
    evenly over ``latency_s * (1 +- s)`` by a hash of k (a model's replies take unequal times;
    the mean stays ``latency_s``), and ``stats.service_s`` adds up the delays.
    ``hang_s`` is how long a "timeout" fault hangs.
    ``tool_arguments``: the arguments of every tool call, sent as given (default ``"{}"``).
    ``reply_fn``: the fake model, ``(messages, seed, index, as_json) -> text``, in place of
    :func:`reply_text` (a test's stand-in for a model that writes what its task needs).

    Use as a context manager; ``base_url`` is the address to give the client.
    """

    def __init__(
        self,
        faults: FaultPlan = FaultPlan(),
        *,
        n_mode: Literal["native", "ignore", "reject"] = "native",
        response_format_mode: Literal["native", "reject"] = "native",
        latency_s: float = 0.0,
        latency_spread: float = 0.0,
        hang_s: float = 2.0,
        keep_bodies: bool = True,
        tool_arguments: Any = "{}",
        reply_fn: Callable[[list[dict[str, Any]], int | None, int, bool], str] | None = None,
    ):
        rate(latency_spread, "latency_spread")
        self.latency_spread = latency_spread
        self.tool_arguments = tool_arguments
        self.reply_fn = reply_fn
        self.faults = faults
        self.n_mode = n_mode
        self.response_format_mode = response_format_mode
        self.latency_s = latency_s
        self.hang_s = hang_s
        self.keep_bodies = keep_bodies
        self.stats = ServerStats()
        self._lock = threading.Lock()
        self._server = None
        self._thread: threading.Thread | None = None
        self.port: int | None = None

    # ---- lifecycle ----

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the fake server is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeOpenAIServer":
        import uvicorn

        # Port 0: the OS picks a free port at bind time, so there is no find-then-bind race.
        config = uvicorn.Config(
            self._build_app(), host="127.0.0.1", port=0, log_level="warning", timeout_graceful_shutdown=0.5
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, name="fake-openai-server", daemon=True)
        self._thread.start()
        for _ in range(500):
            if self._server.started:
                break
            if not self._thread.is_alive():
                raise RuntimeError("the fake OpenAI server failed to start")
            threading.Event().wait(0.01)
        else:
            raise RuntimeError("the fake OpenAI server did not start within 5 s")
        self.port = self._server.servers[0].sockets[0].getsockname()[1]
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(timeout=10)
        self._server = self._thread = None
        self.port = None

    def __enter__(self) -> "FakeOpenAIServer":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()

    def delay(self, request_number: int) -> float:
        """The reply delay of the ``request_number``-th request (see the class docstring).

        >>> server = FakeOpenAIServer(latency_s=0.1, latency_spread=0.5)
        >>> delays = [server.delay(k) for k in range(1, 2001)]
        >>> 0.05 <= min(delays) < 0.052 and 0.148 < max(delays) <= 0.15, round(sum(delays) / 2000, 2)
        (True, 0.1)
        """
        if not self.latency_spread:
            return self.latency_s
        unit = int.from_bytes(hashlib.sha256(str(request_number).encode()).digest()[:4], "big") / 0xFFFFFFFF
        return self.latency_s * (1 + self.latency_spread * (2 * unit - 1))

    def reset_stats(self) -> None:
        with self._lock:
            self.stats = ServerStats()

    # ---- the app ----

    def _build_app(self) -> FastAPI:
        app = FastAPI()

        @app.post("/v1/chat/completions")
        async def chat_completions(request: Request):
            body = await request.json()
            with self._lock:
                self.stats.requests += 1
                number = self.stats.requests
                self.stats.in_flight += 1
                self.stats.max_in_flight = max(self.stats.max_in_flight, self.stats.in_flight)
                if self.keep_bodies:
                    self.stats.bodies.append(body)
                if body.get("tools"):
                    self.stats.tool_requests += 1
                self.stats.authorizations.add(request.headers.get("authorization", ""))
            try:
                if self.latency_s:
                    delay = self.delay(number)
                    with self._lock:
                        self.stats.service_s += delay
                    await asyncio.sleep(delay)
                fault = self.faults.fault_for(number)
                if fault is not None:
                    with self._lock:
                        self.stats.faults[fault] += 1
                return await self._answer(body, fault, request.headers.get("authorization", ""))
            finally:
                with self._lock:
                    self.stats.in_flight -= 1

        @app.get("/stats")
        async def stats():
            """The counters, and this process's CPU seconds (for a server in its own process)."""
            with self._lock:
                return {"requests": self.stats.requests, "max_in_flight": self.stats.max_in_flight,
                        "service_s": self.stats.service_s, "faults": dict(self.stats.faults), "cpu_s": time.process_time()}

        return app

    async def _answer(self, body: dict[str, Any], fault: str | None, authorization: str) -> Response:
        if fault == "timeout":
            await asyncio.sleep(self.hang_s)
        elif fault == "http_500":
            return JSONResponse({"error": {"message": "injected server error"}}, status_code=500)
        elif fault == "http_429":
            return JSONResponse({"error": {"message": "injected rate limit"}}, status_code=429)
        elif fault == "echo_auth_401":
            # A careless server that repeats the credentials it was sent.
            message = f"invalid credentials: {authorization}"
            return JSONResponse({"error": {"message": message}}, status_code=401)
        elif fault == "http_401":
            return JSONResponse({"error": {"message": "Incorrect API key provided", "code": "invalid_api_key"}}, status_code=401)
        elif fault == "context_length_400":
            message = (
                "This model's maximum context length is 4096 tokens. However, your messages resulted in "
                "5000 tokens. Please reduce the length of the messages."
            )
            return JSONResponse(
                {"error": {"message": message, "type": "invalid_request_error", "param": "messages", "code": "context_length_exceeded"}},
                status_code=400,
            )

        n = int(body.get("n") or 1)
        if n > 1 and self.n_mode == "reject":
            with self._lock:
                self.stats.n_rejections += 1
            return JSONResponse({"error": {"message": "n > 1 is not supported"}}, status_code=400)
        if body.get("response_format") is not None and self.response_format_mode == "reject":
            with self._lock:
                self.stats.response_format_rejections += 1
            return JSONResponse({"error": {"message": "response_format is not supported"}}, status_code=400)
        if self.n_mode == "ignore":
            n = 1

        messages = body.get("messages", [])
        wants_json = body.get("response_format") is not None or any(
            JSON_INSTRUCTION_MARKER in str(m.get("content", "")) for m in messages
        )
        # reply_text looked up per request (not bound at construction): tests may patch it.
        reply = self.reply_fn or reply_text
        texts: list[str | None] = [reply(messages, body.get("seed"), i, wants_json) for i in range(n)]
        tool_calls: list[list[dict[str, Any]]] = [[] for _ in texts]
        if fault == "invalid_content":
            texts = ['{"answer": "cut off' for _ in texts]
        elif fault == "wrong_schema":
            texts = [json.dumps({"answer": 42, "seed": body.get("seed")}) for _ in texts]
        elif wants_tool_call(body):
            tool_calls = [[reply_tool_call(messages, body["tools"], body.get("seed"), i, self.tool_arguments)] for i in range(n)]
            texts = [None for _ in texts]

        prompt_tokens = sum(_count_tokens(str(m.get("content") or "")) for m in messages)
        completion_tokens = sum(_count_tokens(t or "") for t in texts) + sum(
            _count_tokens(f"{c['function']['name']} {json.dumps(c['function']['arguments'])}") for calls in tool_calls for c in calls
        )
        payload = {
            "id": "chatcmpl-fake",
            "object": "chat.completion",
            "created": 0,
            "model": body.get("model", ""),
            "choices": [_choice(i, t, calls) for i, (t, calls) in enumerate(zip(texts, tool_calls))],
            "usage": {
                "prompt_tokens": prompt_tokens,
                "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens,
            },
        }
        encoded = json.dumps(payload)
        if fault == "truncated":
            encoded = encoded[: len(encoded) // 2]
        return Response(encoded, media_type="application/json")


def _choice(index: int, text: str | None, tool_calls: list[dict[str, Any]]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return {"index": index, "message": message, "finish_reason": "tool_calls" if tool_calls else "stop"}


class FakeServerProcess:
    """The fake server in a child process of its own, as a real server would be: its CPU time
    is not the client's, and it does not share the client's event loop or GIL.

    ``with FakeServerProcess(latency_s=0.05) as server: server.base_url ...``;
    ``server.stats()`` reads the child's counters (``requests``, ``max_in_flight``,
    ``service_s``, ``faults``, ``cpu_s``: the child's CPU seconds so far). Only the fault plan
    and the latency travel to the child; it keeps no request bodies."""

    def __init__(
        self, faults: FaultPlan = FaultPlan(), *, latency_s: float = 0.0, latency_spread: float = 0.0, startup_timeout_s: float = 30.0
    ):
        self.faults = faults
        self.latency_s = latency_s
        self.latency_spread = latency_spread
        self.startup_timeout_s = startup_timeout_s
        self.port: int | None = None
        self._process: subprocess.Popen | None = None

    @property
    def base_url(self) -> str:
        if self.port is None:
            raise RuntimeError("the fake server process is not running")
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> "FakeServerProcess":
        command = [sys.executable, "-m", "pipelines.llm.testing.fake_server", "--latency-s", repr(self.latency_s),
                   "--latency-spread", repr(self.latency_spread),
                   "--fault-rate", repr(self.faults.rate), *(f"--fault={k}" for k in self.faults.kinds)]
        # The child imports the same pipelines package as this process (a worktree's, not an installed one).
        root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
        env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [root, os.environ.get("PYTHONPATH")])), "PYTHONUNBUFFERED": "1"}
        self._process = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env, start_new_session=True)
        assert self._process.stdout is not None
        deadline = time.monotonic() + self.startup_timeout_s
        line = ""
        while time.monotonic() < deadline and not line.startswith("port "):
            ready, _, _ = select.select([self._process.stdout], [], [], max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            line = self._process.stdout.readline()
            if not line and self._process.poll() is not None:
                raise RuntimeError(f"the fake server process exited with {self._process.returncode}")
        if not line.startswith("port "):
            self.stop()
            raise RuntimeError(f"the fake server process did not start within {self.startup_timeout_s} s")
        self.port = int(line.split()[1])
        return self

    def stats(self) -> dict[str, Any]:
        import httpx

        return httpx.get(f"http://127.0.0.1:{self.port}/stats", timeout=10).json()

    def stop(self) -> None:
        process, self._process = self._process, None
        self.port = None
        if process is None:
            return
        if process.poll() is None:
            process.terminate()  # uvicorn shuts down on SIGTERM
            try:
                process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait(timeout=10)
        if process.stdout is not None:
            process.stdout.close()

    def __enter__(self) -> "FakeServerProcess":
        return self.start()

    def __exit__(self, *exc_info: object) -> None:
        self.stop()


def main(argv: list[str] | None = None) -> None:
    """Serve until terminated; print ``port N`` once listening (what FakeServerProcess reads)."""
    parser = argparse.ArgumentParser(prog="python -m pipelines.llm.testing.fake_server", description=__doc__.split("\n\n")[0])
    parser.add_argument("--latency-s", type=float, default=0.0)
    parser.add_argument("--latency-spread", type=float, default=0.0)
    parser.add_argument("--fault-rate", type=float, default=0.0)
    parser.add_argument("--fault", action="append", default=[], choices=FAULT_KINDS)
    args = parser.parse_args(argv)
    server = FakeOpenAIServer(FaultPlan(args.fault_rate, tuple(args.fault)), latency_s=args.latency_s,
                               latency_spread=args.latency_spread, keep_bodies=False).start()
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    print(f"port {server.port}", flush=True)
    try:
        stop.wait()
    except KeyboardInterrupt:
        pass
    finally:
        server.stop()


if __name__ == "__main__":
    main()
