"""Progress of a long loop (training steps, episodes, trees, prompts): one line at most every
``every_s`` seconds, with the share done, the time spent and an estimate of what remains.

    with Progress(400, "train sft", unit="steps", emit=logger.info) as progress:
        for step in ...:
            progress.update(step)   # a line when every_s has passed since the last one

    train sft: 120/400 steps (30 %), 45 s elapsed, ~1 min 45 s remaining

Used as a context manager it also reports while nothing moves (a heartbeat thread), so a line
comes at least every ``every_s`` seconds even when one step takes longer than that. The lines
go to ``emit`` (a logger's ``info`` inside a Prefect flow, which writes to stderr and the run's
log), by default to stderr: never into an artifact, a report or a metrics file.
"""

from __future__ import annotations

import sys
import threading
import time
from typing import Any, Callable

#: How often a stage reports progress at most (issue 30: at least every 30 s).
EVERY_S = 30.0
#: When a :class:`Progress` last wrote a line, on ``time.monotonic``'s clock: a stage's
#: :class:`Heartbeat` stays quiet while a Progress speaks.
_last_line = time.monotonic()


def format_duration(seconds: float) -> str:
    """``45 s``, ``2 min 05 s``, ``1 h 02 min``."""
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"
    whole = round(seconds)
    if whole < 3600:
        return f"{whole // 60} min {whole % 60:02d} s"
    return f"{whole // 3600} h {whole % 3600 // 60:02d} min"


def _stderr(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


class Progress:
    """``done`` of ``total`` units of work labelled ``label``; ``update``/``advance`` emit a line
    when ``every_s`` seconds have passed since the last one (or since the start). ``clock`` is
    injectable for tests. The estimate of what remains assumes the units left take as long as
    the units done did on average."""

    def __init__(
        self,
        total: int | None,
        label: str,
        *,
        unit: str = "",
        every_s: float = EVERY_S,
        emit: Callable[[str], Any] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ):
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        self.total = total
        self.label = label
        self.unit = unit
        self.every_s = every_s
        self.emit = emit or _stderr
        self.clock = clock
        self.done = 0
        self.started = clock()
        self._last = self.started
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # --- counting ------------------------------------------------------------------------------

    def update(self, done: int, total: int | None = None) -> str | None:
        """Set the units done (and the total, when it changes); the line emitted, if one was due."""
        with self._lock:
            self.done = done
            if total is not None:
                self.total = total
        return self.poll()

    def advance(self, n: int = 1) -> str | None:
        with self._lock:
            self.done += n
        return self.poll()

    def poll(self, force: bool = False) -> str | None:
        """Emit the current line if ``every_s`` has passed since the last one (or ``force``)."""
        with self._lock:
            now = self.clock()
            if not force and now - self._last < self.every_s:
                return None
            self._last = now
            line = self.line(now)
            self.emit(line)
            _spoke()
            return line

    def line(self, now: float | None = None) -> str:
        elapsed = (self.clock() if now is None else now) - self.started
        unit = f" {self.unit}" if self.unit else ""
        if not self.total:
            return f"{self.label}: {self.done}{unit}, {format_duration(elapsed)} elapsed"
        share = 100 * self.done / self.total
        done = f"{self.done:.1f}" if isinstance(self.done, float) else str(self.done)  # a share of units in play
        head = f"{self.label}: {done}/{self.total}{unit} ({share:.0f} %), {format_duration(elapsed)} elapsed"
        if self.done <= 0:
            return f"{head}, remaining time not known yet"
        remaining = elapsed / self.done * max(0, self.total - self.done)
        return f"{head}, ~{format_duration(remaining)} remaining"

    # --- heartbeat -----------------------------------------------------------------------------

    def __enter__(self) -> Progress:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat, name=f"progress {self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
        self._thread = None

    def _beat(self) -> None:
        while True:
            with self._lock:
                due = self._last + self.every_s - self.clock()
            if self._stop.wait(max(0.01, due)):
                return
            self.poll()


def _spoke() -> None:
    global _last_line
    _last_line = time.monotonic()


class Heartbeat:
    """``<label> still running, <elapsed> elapsed`` every ``every_s`` seconds in which no
    :class:`Progress` wrote a line: a stage's steps without a count of their own (loading,
    writing, one long call) still say within ``every_s`` that the stage is alive. A context
    manager; its thread is a daemon and ends with the block."""

    def __init__(self, label: str, *, every_s: float = EVERY_S, emit: Callable[[str], Any] | None = None):
        if every_s <= 0:
            raise ValueError(f"every_s must be positive, got {every_s}")
        self.label = label
        self.every_s = every_s
        self.emit = emit or _stderr
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.started = time.monotonic()

    def __enter__(self) -> Heartbeat:
        self.started = time.monotonic()
        _spoke()  # the stage's start line
        self._thread = threading.Thread(target=self._beat, name=f"heartbeat {self.label}", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
        self._thread = None

    def _beat(self) -> None:
        while not self._stop.wait(max(0.01, _last_line + self.every_s - time.monotonic())):
            now = time.monotonic()
            if now - _last_line >= self.every_s:
                self.emit(f"{self.label} still running, {format_duration(now - self.started)} elapsed")
                _spoke()


__all__ = ["EVERY_S", "Heartbeat", "Progress", "format_duration"]
