"""Import layers (issue 31): stages -> flows -> catalog -> pipelines, imports only downward.

* no stage imports another stage: a module under ``stages/`` imports from ``stages`` only
  :mod:`stages.entry`, :mod:`stages.common` (the shared stage helpers) and :mod:`stages.warm`;
* flows never import stages;
* the catalog imports neither flows nor stages;
* the library (``pipelines/``) imports none of catalog, flows and stages.

Every module is parsed (nothing is imported), imports inside functions included, and so are
``importlib.import_module("...")`` calls with a literal name (:func:`catalog.deps.imports`, the
parser that also gives every DVC stage's code deps). Rerun: ``pytest tests/test_layers.py``.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Sequence

import pytest

from catalog.deps import imports

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ("stages", "flows", "catalog", "pipelines")  # top to bottom
# what a stage may import from stages; stages.warm is make run's warm start, which the package's
# __init__ hands a stage command to (no stage imports it)
STAGE_SHARED = {"stages.entry", "stages.common", "stages.warm"}

# Known upward imports ((path, module), each with its reason); a new one fails the test. None
# is left: `make run`'s entry point, which sets up what the stages share, moved from
# catalog/repro.py (which keeps the DVC side) to stages/run.py.
KNOWN: set[tuple[str, str]] = set()


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


# --- Inside the library: floors ------------------------------------------------------------------
# pipelines/'s packages (and top-level modules) from the bottom floor up. A module may import
# from its own package and from lower floors, never from a higher floor nor sideways (another
# package of its own floor). A new package fails the test until it is given a floor.
PIPELINE_FLOORS: tuple[tuple[str, ...], ...] = (
    ("__init__", "errors"),        # the package and its error types
    # foundations: files, records, bootstrap statistics, hardware, the config vocabulary
    ("files", "progress", "secrets", "kernels", "config", "records", "stats", "gpu"),
    ("retrain",),                  # scheduled retraining's settings (read by config.from_params)
    ("artifacts", "llm"),          # artifact contracts and their validation; the LLM client
    ("multiwoz",),                 # the corpus, its ontology and text views
    ("env",),                      # tools, database, goal checker, τ-bench and ToolWOZ worlds
    ("simulators",),               # user simulators
    ("episodes",),                 # the episode runner, agent formats, episode tables
    ("policy", "clarifier"),       # the embedded policy; the Clarifier's agents, judges, data
    ("rewards",),                  # every reward (the Clarifier's goal reward uses its judges)
    ("speaker", "learn_to_ask"),   # SpeakER (its audit uses the verifiable judge); Learn-to-Ask
    ("training",),                 # TRL recipes and GRPO rollouts
    ("evaluation",),               # MultiWOZ evaluation of trained policies
    ("pir", "josh"),               # PIR (trains and evaluates), JOSH (evaluates on ToolWOZ)
    ("registry",),                 # every artifact spec, by name: knows every method
    ("preflight",),                # a run's checks before it loads anything: needs the registry
)


def _floor(package: str, floors: Sequence[Sequence[str]]) -> int | None:
    return next((i for i, floor in enumerate(floors) if package in floor), None)


def library_violations(root: Path = ROOT, floors: Sequence[Sequence[str]] = PIPELINE_FLOORS) -> list[str]:
    """Every import inside ``pipelines/`` that goes up a floor or sideways, and every package
    without a floor, as ``path:line: module (rule)``."""
    found = []
    for path in sorted((root / "pipelines").rglob("*.py")):
        rel = path.relative_to(root)
        package = rel.parts[1].removesuffix(".py")
        here = _floor(package, floors)
        if here is None:
            found.append(f"{rel.as_posix()}: pipelines.{package} (has no floor in PIPELINE_FLOORS)")
            continue
        for line, module in imports(path, root):
            parts = module.split(".")
            if parts[0] != "pipelines" or len(parts) < 2 or parts[1] == package:
                continue
            there = _floor(parts[1], floors)
            if there is None or there > here:
                found.append(f"{rel.as_posix()}:{line}: {module} (pipelines.{package} imports a higher floor)")
            elif there == here:
                found.append(f"{rel.as_posix()}:{line}: {module} (pipelines.{package} imports sideways)")
    return found


def test_the_library_imports_only_downward() -> None:
    found = library_violations()
    assert not found, "import-floor violations inside pipelines/:\n" + "\n".join(found)


def test_the_floor_checker_sees_upward_sideways_and_unplaced(tmp_path: Path) -> None:
    floors = (("low",), ("mid", "side"), ("top",))
    for name, source in {"low/a.py": "from pipelines.top.x import y\n",          # up
                         "mid/b.py": "def f():\n    import pipelines.side.c\n",   # sideways
                         "side/c.py": "from pipelines.low import a\n",           # down: fine
                         "top/d.py": "from pipelines.mid.b import f\nfrom pipelines.top import e\n",  # fine
                         "new/e.py": "x = 1\n"}.items():                          # no floor
        (tmp_path / "pipelines" / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / "pipelines" / name).write_text(source)
    assert [v.split(" (")[1] for v in library_violations(tmp_path, floors)] == [
        "pipelines.low imports a higher floor)", "pipelines.mid imports sideways)", "has no floor in PIPELINE_FLOORS)"]


def test_the_readme_layout_names_every_library_package() -> None:
    """README's Layout block lists every package and module of pipelines/ (the floors' members)."""
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    block = readme.split("## Layout", 1)[1].split("```", 2)[1]
    entries = {p.name + "/" if p.is_dir() else p.name for p in (ROOT / "pipelines").iterdir()
               if (p.is_dir() and any(p.glob("*.py"))) or (p.suffix == ".py" and p.name != "__init__.py")}
    missing = sorted(e for e in entries if e not in block.split())
    assert not missing, f"README.md Layout does not name {missing}"
    placed = {m for floor in PIPELINE_FLOORS for m in floor} - {"__init__"}
    assert placed == {e.removesuffix("/").removesuffix(".py") for e in entries}


# --- Params: typed, no hand-kept key sets (issue 31) --------------------------------------------
# Every stage has one shape: typed config from its params section (pipelines.config.from_params, which
# refuses unknown keys and ill-typed values), then load, call the library, publish. A
# module-level ``..._KEYS`` set beside a hand-written unknown-key check is the shape it replaced.
PARAM_LAYERS = ("stages", "flows", "catalog")
_COLLECTIONS = (ast.Set, ast.Dict, ast.SetComp, ast.DictComp)


def _is_key_collection(value: ast.expr | None) -> bool:
    """A set / frozenset / dict: a literal, a comprehension, a call, or an operation on one."""
    if isinstance(value, _COLLECTIONS):
        return True
    if isinstance(value, ast.Call):
        name = value.func.id if isinstance(value.func, ast.Name) else getattr(value.func, "attr", None)
        return name in ("set", "frozenset", "dict")
    if isinstance(value, ast.BinOp):
        return _is_key_collection(value.left) or _is_key_collection(value.right)
    if isinstance(value, ast.Tuple):  # A_KEYS, B_KEYS = {...}, {...}
        return any(_is_key_collection(item) for item in value.elts)
    return False


def _module_level(body: list[ast.stmt]):
    """The module's statements, those inside module-level if / try / with blocks included (not
    functions' and classes')."""
    for node in body:
        yield node
        if isinstance(node, (ast.If, ast.Try, ast.With)):
            for block in ("body", "orelse", "finalbody"):
                yield from _module_level(getattr(node, block, []))
            for handler in getattr(node, "handlers", []):
                yield from _module_level(handler.body)


def key_sets(root: Path = ROOT) -> list[str]:
    """Every module-level name ending in ``_KEYS`` (any case) assigned a set, frozenset or dict
    in stages/, flows/ and catalog/, as ``path:line: NAME``."""
    found = []
    for layer in PARAM_LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
            for node in _module_level(tree.body):
                if isinstance(node, ast.Assign):
                    targets, value = node.targets, node.value
                elif isinstance(node, (ast.AnnAssign, ast.AugAssign)):
                    targets, value = [node.target], node.value
                else:
                    continue
                names = [n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name)]
                for name in names:
                    if name.upper().endswith("_KEYS") and _is_key_collection(value):
                        found.append(f"{path.relative_to(root).as_posix()}:{node.lineno}: {name}")
    return found


def test_no_module_keeps_a_set_of_allowed_keys() -> None:
    found = key_sets()
    assert not found, ("allowed-key sets kept by hand (read the section with pipelines.config.from_params into a "
                       "dataclass instead):\n" + "\n".join(found))


@pytest.mark.parametrize("source, bad", [
    ('_KEYS = {"source", "output"}\n', True),
    ('POLICY_KEYS = frozenset(["model_path"])\n', True),
    ('_eval_keys = {"windows": "eval_windows"}\n', True),
    ('ALL_KEYS: set[str] = _A | {"epochs"}\n', True),
    ('_TRAIN_KEYS, _GPU_KEYS = set(), {"epochs"}\n', True),
    ('_KEYS = dict(a=1)\n', True),
    ('if True:\n    _KEYS = {k for k in "ab"}\n', True),
    ('def f():\n    _KEYS = {"a"}\n', False),          # not module-level
    ('class C:\n    _KEYS = {"a"}\n', False),
    ('_KEYS = ("a", "b")\n', False),                    # a tuple: an order, not a key check
    ('KEYSTONE = {"a"}\nMONKEYS = {"b"}\n', False),     # not ..._KEYS
    ('_KEYS_DOC = {"a"}\n', False),
])
def test_the_key_set_checker(tmp_path: Path, source: str, bad: bool) -> None:
    for layer in PARAM_LAYERS:
        (tmp_path / layer).mkdir()
    (tmp_path / "flows" / "x.py").write_text(source)
    (tmp_path / "catalog" / "ok.py").write_text("ROLES = {'a'}\n")
    found = key_sets(tmp_path)
    assert bool(found) == bad, found
    assert all(f.startswith("flows/x.py:") for f in found)


# Config-like dataclasses (names ending Config, Spec, Params, Settings or Objective) in the four
# layers. Issue 31 asks for at most 25; the typed stage sections that replaced the stages' key
# sets took the count from 56 to 73, one SimulatorSpec for evaluate, gold replays and JOSH to 71
# (2026-11-27); 66 on 2026-11-28 (one SimulatorSpec for the agenda settings too, the resolved
# device a DeviceSpec, the pir section is PirConfig, one TrainSectionConfig for the stages',
# US-GRPO's and the GPU profiles' training sections), 65 with one OutputSpec for every section's
# outputs; 62 with the bootstrap and speaker sections the library's configs and the LLM users'
# protection settings in SimulatorSpec; 61 with the LLM users' sampling the role's. A ratchet: it may only go down.
CONFIG_DATACLASSES_CEILING = 61


def _name(node: ast.expr) -> str | None:
    return getattr(node, "id", None) or getattr(node, "attr", None)  # dataclass or dataclasses.dataclass


def config_dataclasses(root: Path = ROOT) -> list[str]:
    """``path:Name`` of every config-like dataclass under stages/, flows/, catalog/, pipelines/."""
    found = []
    for layer in LAYERS:
        for path in sorted((root / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.ClassDef) and re.search(r"(Config|Spec|Params|Settings|Objective)$", node.name) and any(
                        _name(d.func if isinstance(d, ast.Call) else d) == "dataclass" for d in node.decorator_list):
                    found.append(f"{path.relative_to(root).as_posix()}:{node.name}")
    return found


def test_config_dataclasses_do_not_grow() -> None:
    found = config_dataclasses()
    assert len(found) <= CONFIG_DATACLASSES_CEILING, f"{len(found)} config dataclasses (ceiling {CONFIG_DATACLASSES_CEILING}):\n" + "\n".join(found)


def test_the_config_counter_sees_dataclasses(tmp_path: Path) -> None:
    (tmp_path / "pipelines").mkdir()
    (tmp_path / "pipelines" / "m.py").write_text(
        "from dataclasses import dataclass\n@dataclass(frozen=True)\nclass AConfig:\n    x: int = 1\n"
        "@dataclass\nclass BSpec:\n    y: int = 2\nclass CParams:\n    pass\n@dataclass\nclass Record:\n    z: int = 0\n")
    assert config_dataclasses(tmp_path) == ["pipelines/m.py:AConfig", "pipelines/m.py:BSpec"]


def test_the_readme_states_the_count() -> None:
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    stated = re.search(r"The price so far: (\d+) config-like dataclasses", readme)
    assert stated and int(stated.group(1)) == len(config_dataclasses()) == CONFIG_DATACLASSES_CEILING
