"""What make run's warm stage processes save a stage command (stages/warm.py).

    python benchmarks/warm_stages.py ["MODULE ARGS" ...]   # default: "stages.hindsight" "stages.train kto"

Runs each stage command (``python -m MODULE ARGS``, after ``make run`` built its inputs; it
rewrites the stage's outputs with the same bytes) twice: as a new process, and handed to a
running warm server, as ``make run``'s stages are. Prints the wall seconds each way (a stage
computes on one thread: its wall time is its CPU time on an idle machine) and the server's
start-up (the imports it does once for every stage); ``tests/test_warm.py`` checks that the
outputs are the same. Run from the repository root with the project's venv, on an otherwise
idle machine.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from stages.warm import SERVER_ENV, read_log, running_server  # noqa: E402


def timed(command: str, env: dict[str, str]) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", *command.split()], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"{command} failed:\n{result.stderr[-2000:]}")
    return wall


def main() -> int:
    commands = sys.argv[1:] or ["stages.hindsight", "stages.train kto"]
    env = {k: v for k, v in os.environ.items() if k != SERVER_ENV}
    alone = {command: timed(command, env) for command in commands}
    with tempfile.TemporaryDirectory(prefix="askflow-warm-") as tmp:
        started = time.perf_counter()
        with running_server(tmp, env) as warm_env:
            while not Path(warm_env[SERVER_ENV]).exists():
                time.sleep(0.05)
            ready = time.perf_counter() - started
            warm = {command: timed(command, {**env, **warm_env}) for command in commands}
        forked = [entry for entry in read_log(tmp) if "warm" in entry]
    print(f"warm server ready after {ready:.1f} s (once per make run)")
    for command, entry in zip(commands, forked):
        how = "a fork" if entry["warm"] else f"by itself ({entry['refused']})"
        print(f"{command:<28} new process {alone[command]:6.1f} s | {how} {warm[command]:6.1f} s | saved {alone[command] - warm[command]:5.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
