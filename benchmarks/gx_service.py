"""What make run's validation service saves a stage (pipelines/artifacts/gx_service.py).

    python benchmarks/gx_service.py [STAGE ...]     # default: seeds hindsight clarifier_data

Runs each stage's module (``python -m stages.<name>``, after ``make run`` built its inputs;
it rewrites the stage's outputs with the same bytes) twice: validating in its own process,
and asking a running service, as ``make run``'s stages do. Prints the wall and CPU seconds of
the stage process each way (the service's own CPU for the validations is not in the second
figure: it is the part the stage would have spent anyway). Run from the repository root with
the project's venv.
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pipelines.artifacts.gx_service import SERVICE_ENV, running_service, wait_until_listening  # noqa: E402


def timed(stage: str, env: dict[str, str]) -> tuple[float, float]:
    """(wall s, CPU s) of one run of the stage's module."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", f"stages.{stage}"], env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode != 0:
        raise SystemExit(f"stages.{stage} failed:\n{result.stderr[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def main() -> int:
    stages = sys.argv[1:] or ["seeds", "hindsight", "clarifier_data"]
    alone = {stage: timed(stage, dict(os.environ)) for stage in stages}
    with tempfile.TemporaryDirectory(prefix="askflow-gx-") as tmp, running_service(tmp) as env:
        if not wait_until_listening(env[SERVICE_ENV].rpartition(":")[0]):
            raise SystemExit("the validation service did not start")
        time.sleep(1.0)
        served = {stage: timed(stage, {**os.environ, **env}) for stage in stages}
    for stage in stages:
        (wall, cpu), (wall_s, cpu_s) = alone[stage], served[stage]
        print(f"{stage:<16} alone {wall:5.1f} s wall {cpu:5.1f} s CPU | with the service {wall_s:5.1f} s wall {cpu_s:5.1f} s CPU "
              f"| saved {wall - wall_s:4.1f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
