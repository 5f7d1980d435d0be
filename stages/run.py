"""``make run``'s entry point: ``dvc repro`` of every stage (:mod:`catalog.repro`), with one
Prefect server for all stages, the stages' run log and a summary at the end.

    python -m stages.run [--profile NAME] [--jobs N] [dvc repro options]

It sits with the stages because it sets up what they share (their Prefect settings, the
Prefect server, the Great Expectations process that validates for them
(:mod:`pipelines.artifacts.gx_service`), the warm process whose forks run them
(:mod:`stages.warm`), the run log each stage appends its wall time to, ``stages.entry``); it
is no stage itself. ``--profile NAME`` first writes ``profiles/NAME.yaml``'s values into
params.yaml; ``--jobs N`` runs N stages side by side (default one per CPU core).
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Sequence

from catalog.repro import read_run_log, record_seconds, repro_keeping_outputs, stage_environment, summary


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root = Path.cwd()
    started = time.monotonic()
    profile, argv = _profile_argument(argv)
    try:
        jobs, argv = _jobs_argument(argv)
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr, flush=True)
        return 1
    if profile is not None:
        from catalog.profiles import apply_profile
        from pipelines.errors import ConfigError

        try:
            changed = apply_profile(root, profile)
        except ConfigError as exc:
            print(f"error: {exc}", file=sys.stderr, flush=True)
            return 1
        print(f"profile {profile}: {len(changed)} value(s) of params.yaml set from profiles/{profile}.yaml"
              + (" (git diff params.yaml shows them; git checkout params.yaml returns to the default)" if changed else " (already set)"),
              flush=True)
    from flows.local_api import clean_up_killed_runs, shared_prefect_api
    from pipelines.artifacts.gx_service import running_service
    from stages.common import configure_prefect
    from stages.entry import RUN_LOG_ENV
    from stages.warm import read_log, running_server

    configure_prefect(root)
    clean_up_killed_runs()  # a killed stage's Prefect server and /tmp staging, before anything starts
    with (tempfile.TemporaryDirectory(prefix="askflow-run-") as tmp, running_service(tmp) as gx_env,
          shared_prefect_api(os.environ["PREFECT_HOME"]) as prefect_env):
        log = Path(tmp) / "stages.jsonl"  # one line per stage that ran (stages.entry)
        # gx_env: one Great Expectations process validates for every stage (pipelines.artifacts.gx_service)
        env = {RUN_LOG_ENV: str(log), **prefect_env, **gx_env, **{k: v for k, v in MALLOC_ENV.items() if k not in os.environ}}
        # one process with the libraries imported forks for every stage command (stages.warm)
        with running_server(tmp, stage_environment(env)) as warm_env:
            result = repro_keeping_outputs(root, argv, env={**env, **warm_env}, jobs=jobs)
        runs = read_run_log(log)
        warm = read_log(tmp)
    record_seconds(root, runs)
    print(summary(root, runs, [*result.notes, *warm_lines(warm, len(runs))], time.monotonic() - started, result.returncode), flush=True)
    return result.returncode


def warm_lines(log: Sequence[dict], stages_run: int) -> list[str]:
    """The summary's line on the warm stage processes (:mod:`stages.warm`): how many of the
    ``stages_run`` stages a fork ran, how many started before the server was ready, and why
    the others it was asked to run ran by themselves."""
    asked = [entry for entry in log if "warm" in entry]
    if not asked:
        return []
    refused = [entry for entry in asked if not entry["warm"]]
    early = max(0, stages_run - len(asked))
    line = (f"warm starts: {len(asked) - len(refused)} of {stages_run} stage(s) ran in a fork of one process with the libraries imported"
            + (f"; {early} started before it was ready" if early else ""))
    return [line] + [f"  {entry['stage']} ran by itself: {entry['refused']}" for entry in refused]


#: glibc's allocator keeps freed memory instead of handing every large tensor's pages back to
#: the kernel and faulting them in again: a training step's system time fell from ~11 s to ~3 s
#: (train_dpo, 8 steps; peak memory 1.9 -> 2.4 GB) and the model bytes stayed the same. Only the
#: speed changes, so it is set here, for make run's stages, and a variable the user set wins.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "4294967296", "MALLOC_TRIM_THRESHOLD_": "4294967296", "MALLOC_TOP_PAD_": "268435456"}


def _profile_argument(argv: list[str]) -> tuple[str | None, list[str]]:
    """``--profile NAME`` (or ``--profile=NAME``) out of the arguments; the rest go to dvc repro.
    An empty name (``make run PROFILE=``) is the default profile: params.yaml as it is."""
    rest: list[str] = []
    profile: str | None = None
    args = iter(argv)
    for arg in args:
        if arg == "--profile":
            profile = next(args, "")
        elif arg.startswith("--profile="):
            profile = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    return (profile or None), rest


def _jobs_argument(argv: list[str]) -> tuple[int, list[str]]:
    """``--jobs N`` (or ``-j N``, ``--jobs=N``) out of the arguments: how many stages run side
    by side; default one per CPU core."""
    rest: list[str] = []
    jobs: str | None = None
    args = iter(argv)
    for arg in args:
        if arg in ("--jobs", "-j"):
            jobs = next(args, "")
        elif arg.startswith("--jobs="):
            jobs = arg.split("=", 1)[1]
        else:
            rest.append(arg)
    if jobs is None:
        return default_jobs(), rest
    if not jobs.isdigit() or int(jobs) < 1:
        raise ValueError(f"--jobs: expected an integer >= 1, got {jobs!r}")
    return int(jobs), rest


def default_jobs() -> int:
    """One stage per CPU core this process may use (each stage computes on one thread)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


if __name__ == "__main__":
    raise SystemExit(main())
