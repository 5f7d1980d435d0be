"""DVC stages (``python -m stages.<name>``).

Before any stage module loads torch, the CPU math kernels that params.yaml's top-level
``kernels`` names are set in the environment, where ATen, oneDNN and MKL read them
(:mod:`pipelines.kernels`; issue 28): ``default`` leaves the machine's fastest kernels,
``portable`` gives the same model bytes on any x86 machine at 2-5x the training time. The
top-level ``threads`` (default 1) is every stage's number of CPU threads (OpenMP and MKL read
it from the environment when torch starts): torch splits its sums by thread, so a model's
bytes depend on it, and one thread gives the same bytes on any number of cores (``make run``
runs stages side by side instead, one per core). Every stage lists ``kernels`` and
``threads`` among its DVC params, so switching re-runs what it changes.
"""

from __future__ import annotations


def _set_cpu() -> None:
    import os
    import sys
    from pathlib import Path

    path = Path("params.yaml")
    if not path.is_file():
        return
    import yaml

    try:
        # libyaml's parser where PyYAML has it: the pure-Python one takes ~0.3 s for params.yaml
        document = yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))  # noqa: S506
    except (OSError, yaml.YAMLError):
        return  # the stage's own reading of params.yaml reports it, with the file and line
    if not isinstance(document, dict):
        return
    from pipelines.kernels import kernel_environment, thread_environment

    try:
        os.environ.update(kernel_environment(document.get("kernels", "default")))
        os.environ.update(thread_environment(document.get("threads", 1)))
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        raise SystemExit(1) from None


def _run_warm() -> None:
    """Inside ``make run``, hand ``python -m stages.<name>`` to the process that has the
    libraries imported already (:mod:`stages.warm`); without one, or when it refuses, return
    and run here."""
    import os
    import sys

    if not os.environ.get("ASKFLOW_WARM_STAGES"):  # stages.warm.SERVER_ENV, without importing it
        return
    argv = list(getattr(sys, "orig_argv", []))
    if len(argv) < 3 or argv[1] != "-m" or not argv[2].startswith("stages."):
        return  # not a plain python -m stages.<name> (interpreter options, an import)
    from stages.warm import delegate

    status = delegate(argv[2], argv[3:])
    if status is not None:
        raise SystemExit(status)


_set_cpu()
_run_warm()
