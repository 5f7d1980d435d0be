"""The data catalog (catalog/datasets.py, issue 31): every Parquet artifact by name, its path
from the writing stage's params section, its expectation suite; dvc.yaml and the catalog agree."""

from __future__ import annotations

import ast
import re
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest
import yaml

from catalog import datasets
from pipelines.errors import ConfigError, ValidationFailed

ROOT = Path(__file__).resolve().parents[1]
PARAMS = yaml.safe_load((ROOT / "params.yaml").read_text(encoding="utf-8"))
DVC = yaml.safe_load((ROOT / "dvc.yaml").read_text(encoding="utf-8"))["stages"]


def _lookup(dotted: str) -> Any:
    value: Any = PARAMS
    for key in dotted.split("."):
        value = value[key]
    return value


def _resolve(text: str) -> str:
    """A dvc.yaml path with its ``${a.b}`` filled from params.yaml, as DVC does."""
    return re.sub(r"\$\{([\w.]+)\}", lambda m: str(_lookup(m.group(1))), text)


def _paths(stage: str, key: str) -> list[str]:
    body = DVC[stage].get("do", DVC[stage])
    return [_resolve(entry if isinstance(entry, str) else next(iter(entry))) for entry in body.get(key, [])]


def _declared(path: Path, paths: list[str]) -> bool:
    """``path`` is one of ``paths`` or lies in a directory among them."""
    return any(path == Path(p) or Path(p) in path.parents for p in paths)


@pytest.mark.parametrize("name", sorted(datasets.DATASETS))
def test_every_dataset_is_declared_in_dvc_yaml(name: str) -> None:
    entry = datasets.DATASETS[name]
    for stage in entry.stages:
        path = datasets.path(name, _lookup(entry.section_of(stage)))
        declared = _paths(stage, "outs" if entry.role == "out" else "deps")
        assert _declared(path, declared), f"{name}: {path} is not among dvc.yaml {stage}'s {entry.role}s {declared}"


def test_every_parquet_out_of_dvc_yaml_is_a_dataset() -> None:
    catalogued = set()
    for name, entry in datasets.DATASETS.items():
        for stage in entry.stages:
            catalogued.add(datasets.path(name, _lookup(entry.section_of(stage))))
    outs = [Path(p) for stage, body in DVC.items() if "foreach" not in body for p in _paths(stage, "outs") if p.endswith(".parquet")]
    assert outs and not [p for p in outs if p not in catalogued], "Parquet outs of dvc.yaml the catalog lacks"


def test_no_stage_or_flow_writes_or_reads_an_artifact_around_the_catalog() -> None:
    # publish / publish_empty / read_artifact pick the suite from what the caller passes: only
    # the catalog (and the GPU packer, inside catalog/) may call them.
    calls = []
    for layer in ("stages", "flows"):
        for path in sorted((ROOT / layer).rglob("*.py")):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Call):
                    name = getattr(node.func, "id", None) or getattr(node.func, "attr", None)
                    if name in {"publish", "publish_empty", "read_artifact"}:
                        calls.append(f"{path.relative_to(ROOT)}:{node.lineno}: {name}")
    assert not calls, "call catalog.datasets.save / save_empty / load instead:\n" + "\n".join(calls)


def test_save_then_load_round_trip(tmp_path: Path, small_corpus) -> None:
    from pipelines.multiwoz.tables import corpus_tables

    tables = corpus_tables(small_corpus)
    section = {"output": str(tmp_path / "processed")}
    report = datasets.save(tables, section, report=tmp_path / "report.json")
    assert report["success"] and sorted(report["artifacts"]) == sorted(tables)
    assert datasets.load("turns", section).equals(pa.Table.from_arrays(
        [tables["turns"].column(f.name).cast(f.type) for f in datasets.spec_of("turns").schema], schema=datasets.spec_of("turns").schema))


def test_save_writes_nothing_when_a_suite_fails(tmp_path: Path) -> None:
    section = {"output": str(tmp_path / "l2a" / "l2a_samples.parquet")}
    empty = pa.Table.from_pylist([], schema=datasets.spec_of("l2a_samples").schema)
    with pytest.raises(ValidationFailed):  # min_rows: an empty table is not an artifact
        datasets.save({"l2a_samples": empty, "l2a_train": pa.Table.from_pylist([], schema=datasets.spec_of("l2a_train").schema)}, section)
    assert not list(tmp_path.rglob("*.parquet"))
    datasets.save_empty("l2a_samples", empty, section)  # a declared out with nothing in it
    written = tmp_path / "l2a" / "l2a_samples.parquet"
    assert written.is_file()
    with pytest.raises(ValidationFailed):  # and load validates before any use
        datasets.load("l2a_eval.samples", {"samples": str(written)})


def test_unknown_names_and_missing_keys_are_config_errors() -> None:
    with pytest.raises(ConfigError, match="no dataset 'speaker_stf'.*speaker_sft"):
        datasets.path("speaker_stf", {"output": "x"})
    with pytest.raises(ConfigError, match=r"evaluate.output.episodes"):
        datasets.path("evaluate.episodes", {"output": {"metrics": "m.json"}})


def test_path_reads_typed_sections_too() -> None:
    class Output:
        episodes = "data/episodes/eval"

    class Config:
        output = Output()

    assert datasets.path("evaluate.episode_events", Config()) == Path("data/episodes/eval/episode_events.parquet")
