"""Every DVC stage's code deps are its module's import closure (issue 31, :mod:`catalog.deps`).

``dvc.yaml`` must list, for each stage, deps that cover every repository file that
``python -m stages.<name>`` executes (so a change to any of them re-runs the stage) and no code
dep that covers none of them (a needless re-run). The checker's own tests run on small
temporary project trees: a new import in a stage, or in a module it imports, without a dep
fails the check; ``--write`` fixes dvc.yaml and keeps its non-code deps and comments.
Regenerate: ``python -m catalog.deps --write``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import yaml

from catalog import deps
from catalog.deps import check, closure, generated, main, stages, write

ROOT = Path(__file__).resolve().parents[1]


def test_dvc_yaml_deps_cover_every_stage_closure_and_list_no_stale_code_dep() -> None:
    found = stages()
    assert found, "no stage in dvc.yaml"
    assert all(s.modules and s.modules[0].startswith("stages.") for s in found), [(s.name, s.modules) for s in found]
    problems = {name: p for name, p in check(found=found).items() if p}
    assert not problems, "dvc.yaml deps disagree with the stages' import closures (run `python -m catalog.deps --write`):\n" + "\n".join(
        f"{name}: missing {p.missing}, stale {p.stale}" for name, p in problems.items())


def test_the_lock_records_the_committed_code() -> None:
    """Every dependency dvc.lock records that git tracks (code, vendored data, params.yaml)
    has the checkout's hash: a code change committed without its lock entries (ab3730c left
    the directory dep pipelines/policy so) makes ``make run`` on a clean clone retrain from
    bootstrap on. Deps that stages produce (absent before ``make run``) are not this test's."""
    status = subprocess.run([sys.executable, "-m", "dvc", "status", "--json"], cwd=ROOT, capture_output=True, text=True, check=True)
    changed = sorted({(stage, path) for stage, items in json.loads(status.stdout or "{}").items() for item in items
                      if isinstance(item, dict) for path in item.get("changed deps", {})})
    tracked = [(stage, path) for stage, path in changed
               if subprocess.run(["git", "ls-files", "--", path], cwd=ROOT, capture_output=True, text=True, check=True).stdout.strip()]
    assert not tracked, f"dvc.lock is stale for {tracked[:10]}: update their hashes once a rerun of those stages shows their outputs unchanged"


def test_every_templated_stage_is_resolved() -> None:
    """foreach stages are checked like the others (their deps are in ``do``)."""
    document = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))
    templated = {name for name, d in document["stages"].items() if "foreach" in d or "matrix" in d}
    if not templated:
        pytest.skip("dvc.yaml has no foreach or matrix stage")
    by_name = {s.name: s for s in stages()}
    for name in templated:
        assert by_name[name].modules and by_name[name].closure, name


def test_the_exclusions_are_few_and_explained() -> None:
    assert len(deps.EXCLUDED) <= 2
    for path, reason in deps.EXCLUDED.items():
        assert (ROOT / path).is_file(), f"{path} is excluded but does not exist"
        assert len(reason) > 20, path


# --- The checker on a small project tree -------------------------------------------------------

BASE = {
    "stages/__init__.py": "def _warm():\n    from stages.warm import delegate\n",
    "stages/warm.py": "from pipelines.files import stop_process\n",
    "stages/entry.py": "from pipelines.errors import AskflowError\n",
    "stages/a.py": "from stages.entry import main_wrapper\nfrom catalog.io import publish\n",
    "catalog/__init__.py": "",
    "catalog/io.py": "from pipelines.errors import DataError\n",
    "catalog/extra.py": "",
    "pipelines/__init__.py": "",
    "pipelines/errors.py": "",
    "pipelines/files.py": "",
    "pipelines/new.py": "",
    "pipelines/old.py": "",
    "pipelines/pkg/__init__.py": "",
    "pipelines/pkg/deep.py": "from ..errors import ConfigError\n",
}
CLEAN_DEPS = ["stages/__init__.py", "stages/a.py", "stages/entry.py", "catalog/__init__.py", "catalog/io.py",
              "pipelines/__init__.py", "pipelines/errors.py"]


def make_project(root: Path, dvc_yaml: str, files: dict[str, str] | None = None, params: str = "x: 1\n") -> Path:
    for rel, text in {**BASE, **(files or {})}.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    (root / "dvc.yaml").write_text(textwrap.dedent(dvc_yaml))
    (root / "params.yaml").write_text(params)
    return root


def stage_yaml(dep_list: list[str], cmd: str = "python -m stages.a") -> str:
    return "stages:\n  a:\n    cmd: " + cmd + "\n    deps:\n" + "".join(f"      - {d}\n" for d in dep_list)


def test_the_small_project_is_clean(tmp_path: Path) -> None:
    root = make_project(tmp_path, stage_yaml(["data/in.csv", *CLEAN_DEPS]))
    assert not check(root)["a"]
    # stages/__init__.py hands a command to stages/warm.py: excluded, and what it imports is not followed
    assert "stages/warm.py" not in stages(root)[0].closure
    assert {"stages/warm.py", "pipelines/files.py"} <= closure(["stages.a"], root, excluded=())


@pytest.mark.parametrize("where, source, new", [
    ("stages/a.py", "from pipelines.new import f\n", ["pipelines/new.py"]),
    ("stages/a.py", "def run():\n    from pipelines import new\n", ["pipelines/new.py"]),
    ("stages/a.py", "import importlib\nimportlib.import_module('pipelines.new')\n", ["pipelines/new.py"]),
    ("stages/a.py", "import pipelines.pkg.deep\n", ["pipelines/pkg/__init__.py", "pipelines/pkg/deep.py"]),
    ("stages/a.py", "from pipelines.pkg import something\n", ["pipelines/pkg/__init__.py"]),
    ("catalog/io.py", "def f():\n    from . import extra\n", ["catalog/extra.py"]),  # relative, one step down
    ("stages/a.py", "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from pipelines.new import T\n", []),
])
def test_a_new_import_without_a_dep_fails_the_check(tmp_path: Path, where: str, source: str, new: list[str]) -> None:
    root = make_project(tmp_path, stage_yaml(["data/in.csv", *CLEAN_DEPS]))
    (root / where).write_text((root / where).read_text() + source)
    assert check(root)["a"].missing == new
    assert check(root)["a"].stale == []


def test_a_dep_that_covers_nothing_is_stale(tmp_path: Path) -> None:
    root = make_project(tmp_path, stage_yaml(["data/in.csv", "${src}", "catalog/stage_seconds.json", "vendor/db",
                                              "pipelines/old.py", "pipelines/gone", "pipelines/pkg", *CLEAN_DEPS]))
    assert check(root)["a"].stale == ["pipelines/old.py", "pipelines/gone", "pipelines/pkg"]
    assert check(root)["a"].missing == []


def test_a_directory_dep_covers_its_files(tmp_path: Path) -> None:
    root = make_project(tmp_path, stage_yaml(["stages", "catalog/", "pipelines"]))
    assert check(root)["a"].missing == []


def test_templated_stages_and_module_paths_in_params(tmp_path: Path) -> None:
    """foreach / matrix stages with the module in a template; a ``package.module:function`` in
    the stage's params (a loss mask, a reward) is imported by name, so it is a root too."""
    dvc_yaml = """\
        stages:
          each:
            foreach: ${names}
            do:
              cmd: python -m stages.${item} --seed 1
              deps: [stages/a.py]
          grid:
            matrix:
              name: [a]
              seed: [1, 2]
            cmd: python -m stages.${item.name} --seed ${item.seed}
            deps: [stages/a.py]
            params: [section.sft]
        """
    root = make_project(tmp_path, dvc_yaml, files={"stages/b.py": ""},
                        params="names: [a, b]\nsection: {sft: {objective: {loss_mask: 'pipelines.new:spans'}}}\n")
    by_name = {s.name: s for s in stages(root)}
    assert by_name["each"].modules == ["stages.a", "stages.b"]
    assert by_name["grid"].modules == ["stages.a", "pipelines.new"]
    assert "stages/b.py" in check(root)["each"].missing
    assert "pipelines/new.py" in check(root)["grid"].missing


def test_generated_lists_a_directory_when_all_its_files_are_in_the_closure(tmp_path: Path) -> None:
    root = make_project(tmp_path, stage_yaml([]), files={"stages/a.py": "import pipelines.pkg.deep\n"})
    assert generated(stages(root)[0].closure, root) == [
        "stages/__init__.py", "stages/a.py", "pipelines/__init__.py", "pipelines/errors.py", "pipelines/pkg"]


def test_write_fixes_a_missing_and_a_stale_dep_and_keeps_the_rest(tmp_path: Path) -> None:
    dvc_yaml = """\
        # the pipeline (comment kept)
        stages:
          a:
            cmd: python -m stages.a
            deps:
              - data/in.csv   # the input
              - pipelines/old.py   # stale: nothing imports it
              - stages/a.py   # the stage
              - ${src}
              # a full-line comment above a data dep
              - models/base
              - catalog/io.py
            params:
              - x   # a params comment
            outs:
              - out/a.json

          # a templated stage
          b:
            foreach: [1, 2]
            do:
              cmd: python -m stages.a --seed ${item}
              deps:
                - catalog/io.py
                - reports/a.json
              outs:
                - out/b_${item}.json
        """
    root = make_project(tmp_path, dvc_yaml, files={"stages/a.py": "from stages.entry import main_wrapper\nfrom catalog.io import publish\n"
                                                                     "import pipelines.pkg.deep\n"})
    assert check(root)["a"].missing and check(root)["a"].stale == ["pipelines/old.py"]
    assert main(["--root", str(root)]) == 1
    assert sorted(write(root)) == ["a", "b"]
    assert (root / "dvc.yaml").read_text() == textwrap.dedent("""\
        # the pipeline (comment kept)
        stages:
          a:
            cmd: python -m stages.a
            deps:
              - data/in.csv   # the input
              - ${src}
              # a full-line comment above a data dep
              - models/base
              - stages/__init__.py
              - stages/a.py   # the stage
              - stages/entry.py
              - catalog/__init__.py
              - catalog/io.py
              - pipelines/__init__.py
              - pipelines/errors.py
              - pipelines/pkg
            params:
              - x   # a params comment
            outs:
              - out/a.json

          # a templated stage
          b:
            foreach: [1, 2]
            do:
              cmd: python -m stages.a --seed ${item}
              deps:
                - reports/a.json
                - stages/__init__.py
                - stages/a.py
                - stages/entry.py
                - catalog/__init__.py
                - catalog/io.py
                - pipelines/__init__.py
                - pipelines/errors.py
                - pipelines/pkg
              outs:
                - out/b_${item}.json
        """)
    assert not any(check(root).values())
    assert write(root) == []  # a second run changes nothing
    assert main(["--root", str(root)]) == 0


CODE_LINE = r"^\s*- (stages|flows|catalog|pipelines)(/\S*)?(\s+#.*)?$"


def test_write_on_a_copy_of_dvc_yaml_fixes_it_and_keeps_every_other_line(tmp_path: Path) -> None:
    import re

    for name in deps.PACKAGES:
        shutil.copytree(ROOT / name, tmp_path / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(ROOT / name, tmp_path / name)
    original = (tmp_path / "dvc.yaml").read_text(encoding="utf-8")
    write(tmp_path)
    baseline = (tmp_path / "dvc.yaml").read_text(encoding="utf-8")
    assert not any(check(tmp_path).values())

    def other(text: str) -> list[str]:
        return [line for line in text.splitlines() if not re.match(CODE_LINE, line)]

    assert other(baseline) == other(original)  # non-code deps, comments, params, outs: all in place

    first = stages(tmp_path)[0]
    victim = f"      - {generated(first.closure, tmp_path)[-1]}"
    lines = baseline.splitlines(keepends=True)
    lines.remove(next(line for line in lines if line.rstrip("\n").split("   #")[0] == victim))
    at = next(i for i, line in enumerate(lines) if line.strip() == "deps:")
    lines.insert(at + 1, "      - pipelines/no_such_module.py   # a module that was removed\n")
    (tmp_path / "dvc.yaml").write_text("".join(lines), encoding="utf-8")
    problems = check(tmp_path)[first.name]
    assert problems.missing and problems.stale == ["pipelines/no_such_module.py"]

    assert first.name in write(tmp_path)
    assert (tmp_path / "dvc.yaml").read_text(encoding="utf-8") == baseline
