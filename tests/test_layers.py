"""Import layers (issue 31): stages -> flows -> catalog -> pipelines, imports only downward.

* no stage imports another stage: a module under ``stages/`` imports from ``stages`` only
  :mod:`stages.entry`, :mod:`stages.common` (the shared stage helpers) and :mod:`stages.warm`;
* flows never import stages;
* the catalog imports neither flows nor stages;
* the library (``pipelines/``) imports none of catalog, flows and stages.

Every module is parsed (nothing is imported), imports inside functions included, and so are
``importlib.import_module("...")`` calls with a literal name. Rerun: ``pytest tests/test_layers.py``.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("stages", "flows", "catalog", "pipelines")  # top to bottom
# what a stage may import from stages; stages.warm is make run's warm start, which the package's
# __init__ hands a stage command to (no stage imports it)
STAGE_SHARED = {"stages.entry", "stages.common", "stages.warm"}

# Known upward imports ((path, module), each with its reason); a new one fails the test. None
# is left: `make run`'s entry point, which sets up what the stages share, moved from
# catalog/repro.py (which keeps the DVC side) to stages/run.py.
KNOWN: set[tuple[str, str]] = set()


def imports(path: Path, root: Path = ROOT) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``path``; ``from a import b`` gives ``a.b``
    (``b`` may be a module), a relative import is resolved against the file's package."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = list(package[: len(package) - node.level + 1]) if node.level else []
            module = ".".join(base + ([node.module] if node.module else []))
            found += [(node.lineno, f"{module}.{alias.name}" if alias.name != "*" else module) for alias in node.names]
        elif (isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant)
              and isinstance(node.args[0].value, str)
              and getattr(node.func, "attr", getattr(node.func, "id", None)) in ("import_module", "__import__")):
            found.append((node.lineno, node.args[0].value))
    return found


def violations(root: Path = ROOT) -> list[str]:
    """Every import that breaks a rule, as ``path:line: module (rule)``."""
    found = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            rel = path.relative_to(root).as_posix()
            for line, module in imports(path, root):
                top = module.split(".")[0]
                if top not in LAYERS:
                    continue
                if layer == "stages" and top == "stages":
                    # stages.entry.main_wrapper is stages.entry; bare "stages" (a namespace) names nothing
                    if module == "stages" or any(module == m or module.startswith(m + ".") for m in STAGE_SHARED):
                        continue
                    rule = "a stage imports another stage"
                elif LAYERS.index(top) < LAYERS.index(layer):
                    rule = f"{layer} imports {top}, a higher layer"
                else:
                    continue
                if (rel, module) in KNOWN or (rel, module.rsplit(".", 1)[0]) in KNOWN:
                    continue
                found.append(f"{rel}:{line}: {module} ({rule})")
    return found


def test_imports_go_only_downward() -> None:
    found = violations()
    assert not found, "import-layer violations:\n" + "\n".join(found)


@pytest.mark.parametrize("source, bad", [
    ("from stages.train import configure_prefect\n", True),
    ("def f():\n    from stages import hindsight\n", True),
    ("import stages.evaluate\n", True),
    ("from stages.entry import main_wrapper\nfrom stages.common import configure_threads\n", False),
    ("from . import train\n", True),
    ("import importlib\nimportlib.import_module('stages.train')\n", True),
])
def test_the_checker_sees_stage_to_stage_imports(tmp_path: Path, source: str, bad: bool) -> None:
    (tmp_path / "stages").mkdir()
    (tmp_path / "stages" / "x.py").write_text(source)
    assert bool(violations(tmp_path)) == bad


def test_the_checker_sees_upward_imports(tmp_path: Path) -> None:
    for layer, source in {"flows": "from stages.train import run\n", "catalog": "import flows.train\n",
                          "pipelines/sub": "def f():\n    from catalog.io import publish\n"}.items():
        (tmp_path / layer).mkdir(parents=True)
        (tmp_path / layer / "m.py").write_text(source)
    (tmp_path / "pipelines" / "ok.py").write_text("from pipelines.errors import ConfigError\n")
    assert [v.split(":")[0] for v in violations(tmp_path)] == ["flows/m.py", "catalog/m.py", "pipelines/sub/m.py"]
