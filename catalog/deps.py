"""Each DVC stage's code dependencies from its module's import closure (issue 31).

Every stage of ``dvc.yaml`` runs ``python -m stages.<name>``. The files that command executes
inside the repository are the closure of ``stages.<name>`` over imports into the top packages
(``stages``, ``flows``, ``catalog``, ``pipelines``): every module is parsed (nothing is
imported), imports inside functions included (those under ``if TYPE_CHECKING:`` are not: they
never run), ``from a import b`` with ``b`` a submodule gives ``a/b.py``, relative imports are
resolved, ``importlib.import_module("a.b")`` with a literal name counts, and so does every
package ``__init__.py`` on the way to a module (Python runs them). A module a stage's params
name as ``package.module:function`` (e.g. ``pir_train.sft.objective.loss_mask``, which
``pipelines.training.data.loss_mask_function`` imports by name) is a root of its closure too.

    python -m catalog.deps           # per stage: closure files no dep covers, code deps that cover nothing
    python -m catalog.deps --write   # rewrite every stage's code deps in dvc.yaml from its closure

A dep *covers* a file when it is the same path or a directory above it. A *code dep* is a
``.py`` file or a directory under one of the top packages; the other deps (data, params files,
``vendor/``, ``models/``, ``reports/``, ``${...}`` paths) are never touched. ``--write`` keeps
them, in their order, then lists the generated code deps (stages, flows, catalog, pipelines;
a directory instead of its files when every ``.py`` file under it is in the closure), keeping
the comment of a code dep that stays; the rest of ``dvc.yaml`` round-trips unchanged
(ruamel.yaml). ``.dvcignore`` keeps ``__pycache__`` out of a directory dep's hash.
``tests/test_dvc_deps.py`` checks that dvc.yaml agrees.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import itertools
import re
import statistics
import sys
from pathlib import Path
from typing import Any, Iterable, Iterator

ROOT = Path(__file__).resolve().parents[1]
PACKAGES = ("stages", "flows", "catalog", "pipelines")  # the layers, top to bottom

#: Modules left out of every closure (not followed either), each with why it cannot change a
#: stage's outputs.
EXCLUDED: dict[str, str] = {
    "stages/warm.py": "make run's warm-start server, to which stages/__init__.py hands the same "
                      "`python -m stages.<name>`: it decides which process runs the stage, not what it writes",
}

_MODULE_CMD = re.compile(r"(?:^|\s)python3?\s+-m\s+([\w.]+)")
_TEMPLATE = re.compile(r"\$\{\s*([^}]+?)\s*\}")
_IMPORT_PATH = re.compile(rf"^((?:{'|'.join(PACKAGES)})(?:\.\w+)+):\w+$")


# --- Parsing ---------------------------------------------------------------------------------

def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def _nodes(tree: ast.AST, runtime: bool) -> Iterator[ast.AST]:
    """Every node of ``tree``; with ``runtime``, not the bodies of ``if TYPE_CHECKING:``."""
    stack = [tree]
    while stack:
        node = stack.pop()
        yield node
        if runtime and isinstance(node, ast.If) and _is_type_checking(node.test):
            stack.extend(reversed(node.orelse))
            continue
        stack.extend(reversed(list(ast.iter_child_nodes(node))))


def imports(path: Path, root: Path = ROOT, *, runtime: bool = False) -> list[tuple[int, str]]:
    """(line, dotted module) of every import in ``path``; ``from a import b`` gives ``a.b``
    (``b`` may be a module), a relative import is resolved against the file's package, and
    ``importlib.import_module("a.b")`` / ``__import__("a.b")`` with a literal name count. With
    ``runtime``, imports under ``if TYPE_CHECKING:`` are left out (they never run)."""
    package = path.relative_to(root).with_suffix("").parts[:-1]
    found: list[tuple[int, str]] = []
    for node in _nodes(ast.parse(path.read_text(encoding="utf-8"), str(path)), runtime):
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


def module_files(module: str, root: Path = ROOT) -> list[str]:
    """The files (relative, posix) that importing ``module`` runs inside the repository: the
    ``__init__.py`` of every package on the way and the module's own file. ``a.b.c`` where
    ``c`` is no module (a name ``from a.b import c`` takes) gives ``a.b``'s files."""
    parts = module.split(".")
    if not parts or parts[0] not in PACKAGES:
        return []
    for n in range(len(parts), 0, -1):
        base = root.joinpath(*parts[:n])
        if (base / "__init__.py").is_file() or base.with_suffix(".py").is_file() or base.is_dir():
            break
    else:
        return []
    files = [root.joinpath(*parts[:i], "__init__.py") for i in range(1, n + 1)]
    files.append(base.with_suffix(".py"))
    return [f.relative_to(root).as_posix() for f in files if f.is_file()]


def closure(modules: Iterable[str], root: Path = ROOT, excluded: Iterable[str] = EXCLUDED,
            _cache: dict | None = None) -> set[str]:
    """Every repository file (relative, posix) that running ``modules`` executes, by imports,
    less ``excluded`` (whose imports are not followed)."""
    excluded = set(excluded)
    cache = {} if _cache is None else _cache
    seen: set[str] = set()
    todo = [f for m in modules for f in module_files(m, root)]
    while todo:
        rel = todo.pop()
        if rel in seen or rel in excluded:
            continue
        seen.add(rel)
        if rel not in cache:
            cache[rel] = [f for _, m in imports(root / rel, root, runtime=True) for f in module_files(m, root)]
        todo += cache[rel]
    return seen


# --- dvc.yaml --------------------------------------------------------------------------------

def _lookup(context: dict, key: str) -> Any:
    value: Any = context
    for part in key.split("."):
        if isinstance(value, dict) and part in value:
            value = value[part]
        elif isinstance(value, list) and part.isdigit() and int(part) < len(value):
            value = value[int(part)]
        else:
            raise KeyError(key)
    return value


def _resolve(text: str, context: dict) -> str:
    """``${a.b}`` in ``text`` replaced from ``context``; an unknown name is left as it is."""
    def one(match: re.Match) -> str:
        try:
            return str(_lookup(context, match.group(1)))
        except KeyError:
            return match.group(0)
    return _TEMPLATE.sub(one, text)


def _value(spec: Any, context: dict) -> Any:
    """A ``foreach`` / ``matrix`` value: a whole ``${...}`` is looked up, anything else kept."""
    if isinstance(spec, str):
        match = _TEMPLATE.fullmatch(spec.strip())
        if match:
            try:
                return _lookup(context, match.group(1))
            except KeyError:
                return spec
    return spec


def _items(definition: dict, context: dict) -> list[dict]:
    """The template contexts (``item``, ``key``) a stage definition expands to: one (empty)
    for a plain stage."""
    if "foreach" in definition:
        values = _value(definition["foreach"], context)
        # An empty foreach (a stage the default switches off, e.g. evaluate_seeds) still
        # gets its code deps: a profile that switches it on must find them right.
        if isinstance(values, dict) and values:
            return [{"key": k, "item": v} for k, v in values.items()]
        if isinstance(values, list) and values:
            return [{"item": v} for v in values]
        return [{}]
    if "matrix" in definition:
        matrix = {name: _value(v, context) for name, v in (definition["matrix"] or {}).items()}
        names = list(matrix)
        lists = [v if isinstance(v, list) else [v] for v in matrix.values()]
        return [{"item": dict(zip(names, combo))} for combo in itertools.product(*lists)]
    return [{}]


def _body(definition: dict) -> dict:
    """Where a stage's cmd and deps are: ``do`` under ``foreach``, else the stage itself."""
    return definition["do"] if "foreach" in definition and isinstance(definition.get("do"), dict) else definition


def _params(root: Path) -> dict:
    import yaml

    path = root / "params.yaml"
    if not path.is_file():
        return {}
    return yaml.load(path.read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}  # noqa: S506


def _strings(value: Any) -> Iterator[str]:
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


@dataclasses.dataclass
class Stage:
    name: str                      # as in dvc.yaml (a foreach / matrix stage once, unexpanded)
    modules: list[str]             # what its cmd runs with python -m, and import paths its params name
    deps: list[str]                # as written
    closure: set[str]


def stages(root: Path = ROOT, excluded: Iterable[str] = EXCLUDED) -> list[Stage]:
    """Every stage definition of ``root/dvc.yaml`` with the modules its command runs and their
    closure. A stage whose cmd runs no ``python -m <module>`` has an empty module list."""
    import yaml

    document = yaml.load((root / "dvc.yaml").read_text(encoding="utf-8"), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}  # noqa: S506
    params = _params(root)
    cache: dict = {}
    found = []
    for name, definition in (document.get("stages") or {}).items():
        body = _body(definition)
        commands = body.get("cmd") or []
        commands = [commands] if isinstance(commands, str) else list(commands)
        modules: list[str] = []
        for extra in _items(definition, params):
            context = {**params, **extra}
            for command in commands:
                modules += [m for m in _MODULE_CMD.findall(_resolve(command, context)) if m not in modules]
            for entry in body.get("params") or []:
                if isinstance(entry, str):
                    keys = [entry]
                else:  # {file: [keys]}: only params.yaml's are looked at
                    keys = [k for f, v in entry.items() if str(f).endswith("params.yaml") for k in (v or [])]
                for key in keys:
                    try:
                        value = _lookup(params, _resolve(key, context))
                    except KeyError:
                        continue
                    modules += [m.group(1) for s in _strings(value) if (m := _IMPORT_PATH.match(s)) and m.group(1) not in modules]
        deps = [d if isinstance(d, str) else next(iter(d)) for d in body.get("deps") or []]
        found.append(Stage(name, modules, deps, closure(modules, root, excluded, cache)))
    return found


def is_code(dep: str, root: Path = ROOT) -> bool:
    """A ``.py`` file or a directory under a top package (a path that no longer exists counts
    when it ends in ``.py`` or has no suffix); never a ``${...}`` path."""
    if "${" in dep:
        return False
    path = Path(dep.rstrip("/"))
    if not path.parts or path.parts[0] not in PACKAGES:
        return False
    return path.suffix == ".py" or (root / path).is_dir() or (not (root / path).exists() and not path.suffix)


def covers(dep: str, file: str) -> bool:
    dep = dep.rstrip("/")
    return file == dep or file.startswith(dep + "/")


def generated(files: set[str], root: Path = ROOT) -> list[str]:
    """The code deps for a closure: a directory instead of its files when every ``.py`` file
    under it is in the closure (the highest such directory), ordered stages, flows, catalog,
    pipelines."""
    outside: set[str] = set()  # the directories with a .py file that is not in the closure
    for package in PACKAGES:
        for path in (root / package).rglob("*.py"):
            rel = path.relative_to(root)
            if "__pycache__" not in rel.parts and rel.as_posix() not in files:
                outside.update("/".join(rel.parts[:n]) for n in range(1, len(rel.parts)))
    listed: set[str] = set()
    for file in files:
        parts = Path(file).parts
        # the highest directory (the top packages too) all of whose .py files are in the closure
        listed.add(next(("/".join(parts[:n]) for n in range(1, len(parts)) if "/".join(parts[:n]) not in outside), file))
    return sorted(listed, key=lambda p: (PACKAGES.index(p.split("/")[0]), p))


@dataclasses.dataclass
class Problems:
    missing: list[str]   # closure files no dep covers
    stale: list[str]     # code deps that cover no closure file

    def __bool__(self) -> bool:
        return bool(self.missing or self.stale)


def check(root: Path = ROOT, excluded: Iterable[str] = EXCLUDED, found: list[Stage] | None = None) -> dict[str, Problems]:
    """Per stage of ``dvc.yaml`` (or of ``found``, what :func:`stages` gave): the closure files
    that no dep covers, and the code deps that cover no file of the closure. A stage whose cmd
    runs no module gets ``missing == ["<cmd runs no python -m module>"]``."""
    result = {}
    for stage in stages(root, excluded) if found is None else found:
        if not stage.modules:
            result[stage.name] = Problems(["<cmd runs no python -m module>"], [])
            continue
        missing = sorted(f for f in stage.closure if not any(covers(d, f) for d in stage.deps))
        stale = [d for d in stage.deps if is_code(d, root) and not any(covers(d, f) for f in stage.closure)]
        result[stage.name] = Problems(missing, stale)
    return result


def write(root: Path = ROOT, excluded: Iterable[str] = EXCLUDED) -> list[str]:
    """Rewrite every stage's code deps in ``root/dvc.yaml`` from its closure (non-code deps
    kept, in their order, first; a code dep that stays keeps its comment); the names of the
    stages whose deps changed."""
    import io

    from ruamel.yaml import YAML

    path = root / "dvc.yaml"
    text = path.read_text(encoding="utf-8")
    yaml = YAML()
    yaml.preserve_quotes = True
    yaml.width = 4096
    yaml.indent(mapping=2, sequence=4, offset=2)
    document = yaml.load(text)
    changed = []
    for stage in stages(root, excluded):
        if not stage.modules:
            continue
        body = _body(document["stages"][stage.name])
        seq = body.get("deps")
        code = generated(stage.closure, root)
        if seq is None:
            if code:
                body["deps"] = code
                changed.append(stage.name)
            continue
        entries = [(item, seq.ca.items.get(i)) for i, item in enumerate(seq)]
        keep = [(item, c) for item, c in entries if not (isinstance(item, str) and is_code(item, root))]
        comments = {item.rstrip("/"): c for item, c in entries if isinstance(item, str) and is_code(item, root)}
        new = keep + [(dep, comments.get(dep)) for dep in code]
        if [item for item, _ in new] == list(seq):
            continue
        seq.clear()
        seq.ca.items.clear()
        for i, (item, comment) in enumerate(new):
            seq.append(item)
            if comment is not None:
                seq.ca.items[i] = comment
        changed.append(stage.name)
    if changed:
        out = io.StringIO()
        yaml.dump(document, out)
        path.write_text(out.getvalue(), encoding="utf-8")
    return changed


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m catalog.deps", description=__doc__.split("\n\n")[0])
    parser.add_argument("--write", action="store_true", help="rewrite the code deps of every stage in dvc.yaml")
    parser.add_argument("--root", type=Path, default=ROOT, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.write:
        changed = write(args.root)
        print(f"dvc.yaml: code deps rewritten for {len(changed)} stage(s)" + (f": {', '.join(changed)}" if changed else ""))
    found = stages(args.root)
    problems = check(args.root, found=found)
    sizes = sorted(len(s.closure) for s in found if s.modules)
    bad = 0
    for name, found in problems.items():
        for file in found.missing:
            print(f"{name}: missing {file}")
        for dep in found.stale:
            print(f"{name}: stale {dep}")
        bad += bool(found)
    if sizes:
        print(f"{len(sizes)} stages, closure {sizes[0]}/{statistics.median(sizes):g}/{sizes[-1]} files (min/median/max); "
              f"{bad} with missing or stale code deps; excluded: {', '.join(EXCLUDED) or 'none'}")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
