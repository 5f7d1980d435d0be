"""``dvc repro`` less the stages whose inputs outside the repository this machine lacks.

τ-bench (params.yaml ``clarifier.data.taubench``) is read in place from ``../shared``, which
not every machine has. There ``make run`` and the retrain flow reproduce every other stage
and say which they left out and why, instead of failing on a missing dependency.

    python -m catalog.repro [dvc repro options]   # what `make run` runs
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Callable, Sequence

from pipelines.errors import ConfigError


def plan(root: Path) -> tuple[list[str], dict[str, str]]:
    """Every stage that can run here, and stage -> why it cannot: a dependency outside the
    repository that does not exist, or an upstream stage with one."""
    import networkx as nx
    from dvc.repo import Repo

    with Repo(str(root)) as repo:
        graph = repo.index.graph  # an edge goes from a stage to the stage it depends on
        why: dict[str, str] = {}
        for stage in graph:
            missing = [dep.def_path for dep in stage.deps if not dep.is_in_repo and not dep.exists]
            if missing:
                why[_name(stage, root)] = f"{', '.join(missing)} does not exist"
                for downstream in nx.ancestors(graph, stage):
                    why.setdefault(_name(downstream, root), f"it needs {_name(stage, root)}")
        runnable = sorted(n for n in (_name(s, root) for s in repo.index.stages) if n not in why)
    return runnable, dict(sorted(why.items()))


def _name(stage, root: Path) -> str:
    """The stage's name for ``dvc repro`` run in ``root`` (DVC's own is relative to the cwd)."""
    dvcfile = os.path.relpath(stage.path, root)
    return stage.name if dvcfile == "dvc.yaml" else f"{dvcfile}:{stage.name}"


def targets_here(root: Path, warn: Callable[[str], None]) -> list[str]:
    """``dvc repro``'s targets for "the whole pipeline" here: none (everything) when every stage
    can run, else the runnable ones; ``warn`` gets one line per stage left out."""
    runnable, skipped = plan(root)
    for stage, reason in skipped.items():
        warn(f"leaving out {stage}: {reason}")
    if skipped and not runnable:
        raise ConfigError(f"{root}: no stage can run here ({'; '.join(f'{k}: {v}' for k, v in skipped.items())})")
    return runnable if skipped else []


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    root = Path.cwd()
    from flows.local_api import clean_up_killed_runs

    clean_up_killed_runs()  # a killed stage's Prefect server and /tmp staging, before anything starts
    chosen: list[str] = []
    if all(a.startswith("-") for a in argv):  # no targets given: the whole pipeline that can run
        try:
            chosen = targets_here(root, lambda line: print(line, file=sys.stderr))
        except ConfigError as error:
            print(f"error: {error}", file=sys.stderr)
            return 1
    bin_dir = str(Path(sys.executable).parent)
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run([sys.executable, "-m", "dvc", "repro", *argv, *chosen], cwd=root, env=env).returncode


if __name__ == "__main__":
    raise SystemExit(main())
