"""Tests that check a benchmark script's figures load the script as a module (benchmarks/ is
not a package) and compare what the README states with whitespace folded."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


def load_benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py`` as a module (registered, for the dataclasses that look theirs up)."""
    spec = importlib.util.spec_from_file_location(f"askflow_benchmark_{name}", ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def flat(text: str) -> str:
    """``text`` with every run of whitespace one space (README lines wrap anywhere)."""
    return " ".join(text.split())
