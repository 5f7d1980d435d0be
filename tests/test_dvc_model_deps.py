"""A stage that reads another stage's model must run after it: every ``models/...`` path a
stage's params name is produced by the stage itself or by a stage it depends on (directly or
through others), so that ``make run``, which runs independent stages side by side, never
starts a stage before the model it loads exists. Stage josh named ``models/base`` (its M) in
its params without depending on bootstrap: a serial ``dvc repro`` happened to run bootstrap
first; side by side, on a fresh clone, josh started first and failed."""

from __future__ import annotations

from pathlib import Path

import networkx as nx
import yaml

ROOT = Path(__file__).resolve().parents[1]

#: (stage, path): why the stage names a model it does not read.
NOT_READ = {
    ("train_l2a_grpo_seeds@1", "models/l2a_sft"): "--start models/l2a_sft_s1 replaces the section's start model",
    ("train_l2a_grpo_seeds@2", "models/l2a_sft"): "--start models/l2a_sft_s2 replaces the section's start model",
}


def _strings(value):
    """The strings in a params value, except under ``output`` keys (where a stage writes)."""
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            if key != "output":
                yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


def _lookup(params: dict, key: str):
    value = params
    for part in key.split("."):
        if not isinstance(value, dict) or part not in value:
            return None
        value = value[part]
    return value


def unordered_model_reads(root: Path) -> list[str]:
    """``<stage>: <path>`` for every model path a stage's params name whose producing stage is
    neither the stage nor one it depends on."""
    from dvc.repo import Repo

    params = yaml.safe_load((root / "params.yaml").read_text(encoding="utf-8"))
    problems = []
    with Repo(str(root)) as repo:
        graph = repo.index.graph  # edge (a, b): a depends on b
        producer = {out.def_path.rstrip("/"): stage for stage in graph.nodes for out in stage.outs}
        for stage in graph.nodes:
            upstream = nx.descendants(graph, stage) | {stage}
            keys = [key for dep in stage.deps if dep.def_path.endswith("params.yaml") for key in (getattr(dep, "params", None) or [])]
            for key in keys:
                for path in _strings(_lookup(params, key)):
                    made_by = producer.get(path.rstrip("/"))
                    if path.startswith("models/") and made_by is not None and made_by not in upstream \
                            and (stage.name, path) not in NOT_READ:
                        problems.append(f"{stage.name}: params {key} name {path}, made by {made_by.name}, not upstream")
    return sorted(set(problems))


def test_every_model_a_stage_names_is_made_upstream_of_it():
    assert unordered_model_reads(ROOT) == []


def test_the_check_finds_a_model_read_without_its_dependency(tmp_path):
    """josh before the fix: its dep on models/base removed, the check names it."""
    import shutil

    for name in ("dvc.yaml", "params.yaml", "dvc.lock"):
        shutil.copy(ROOT / name, tmp_path / name)
    (tmp_path / ".dvc").mkdir()
    (tmp_path / ".dvc" / "config").write_text("[core]\n    no_scm = true\n")
    text = (tmp_path / "dvc.yaml").read_text(encoding="utf-8")
    line = next(line for line in text.splitlines() if "${josh.agent.model_path}" in line)
    (tmp_path / "dvc.yaml").write_text(text.replace(line + "\n", ""), encoding="utf-8")
    problems = unordered_model_reads(tmp_path)
    assert any(p.startswith("josh: params josh name models/base, made by bootstrap") for p in problems), problems
