"""params.yaml's top-level ``kernels`` and ``threads`` reach torch before a stage computes
(``stages/__init__.py``): a stage process computes on ``threads`` threads whatever the
environment it inherited or the machine's core count (a model's bytes depend on the count),
and a bad value stops the stage before any work, naming the key."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PROBE = "import stages, torch, os; print(torch.get_num_threads(), os.environ.get('ATEN_CPU_CAPABILITY'))"


def _probe(workdir: Path, params: str, inherited: int = 2) -> subprocess.CompletedProcess:
    (workdir / "params.yaml").write_text(params)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(inherited), "MKL_NUM_THREADS": str(inherited)}
    env.pop("ATEN_CPU_CAPABILITY", None)
    return subprocess.run([sys.executable, "-c", PROBE], cwd=workdir, env=env, capture_output=True, text=True, timeout=120)


def test_threads_and_kernels_from_params_override_the_environment(tmp_path):
    assert _probe(tmp_path, "kernels: default\nthreads: 1\n").stdout.split() == ["1", "None"]
    assert _probe(tmp_path, "kernels: portable\nthreads: 2\n", inherited=1).stdout.split() == ["2", "default"]
    # No key: one thread, the machine's fastest kernels (the defaults of params.yaml).
    assert _probe(tmp_path, "corpus: {}\n").stdout.split() == ["1", "None"]


def test_a_bad_threads_value_stops_the_stage_naming_the_key(tmp_path):
    for bad in ("0", "two", "1.5", "true"):
        proc = _probe(tmp_path, f"threads: {bad}\n")
        assert proc.returncode == 1 and "params.yaml threads: expected an integer >= 1" in proc.stderr, (bad, proc.stderr)


def test_every_stage_lists_kernels_and_threads_among_its_params():
    """Switching either re-runs every stage (they change a model's bytes)."""
    import yaml

    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]
    for name, stage in stages.items():
        stage = stage.get("do", stage)
        params = [p for p in stage.get("params", []) if isinstance(p, str)]
        assert {"kernels", "threads"} <= set(params), f"dvc.yaml {name}: params lack kernels/threads: {params}"
