"""Real DVC runs of the pipeline in a temporary git repository."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any, Callable, Mapping

import pytest
import yaml

from tests.conftest import REPO

pytestmark = pytest.mark.slow

N_DIALOGUES = 60


def _run(args: list[str], cwd: Path, check: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}", "DVC_NO_ANALYTICS": "1",
           "GIT_AUTHOR_NAME": "askflow", "GIT_AUTHOR_EMAIL": "ci@askflow.invalid", "GIT_COMMITTER_NAME": "askflow", "GIT_COMMITTER_EMAIL": "ci@askflow.invalid"}
    proc = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"{' '.join(args)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return proc


def shrink_training_and_evaluation(params: dict) -> None:
    """A few steps of each training method and a few short episodes per model: the test is
    about the pipeline's wiring, not about learning."""
    train = params.get("train")
    if train:
        train["holdout"] = {**train.get("holdout", {}), "fraction": 0.2}
        for method in ("sft", "dpo", "kto", "grpo"):
            section = train[method]
            for source in section["data"]["sources"]:
                source["max_rows"] = 8
            section["optim"].update(max_steps=2, batch_size=4, logging_steps=1)
            section["eval"] = {**section.get("eval", {}), "max_examples": 4}
            if "max_new_tokens" in section["eval"]:
                section["eval"]["max_new_tokens"] = 8
        train["grpo"]["objective"].update(num_generations=2, max_completion_length=16)
        train["grpo"]["optim"]["batch_size"] = 4
    evaluate = params.get("evaluate")
    if evaluate:
        evaluate.update(max_goals=2, seeds=[0, 1], max_exchanges=2)
        evaluate["generation"].update(max_new_tokens=8)
    # Every method's training section (SpeakRL's again, JOSH, Learn-to-Ask, PIR, the Clarifier): a couple of steps.
    for section in _training_sections(params):
        for source in section.get("data", {}).get("sources", []):
            source["max_rows"] = 8
        section["optim"].update(max_steps=2, batch_size=4, logging_steps=1)
        if "eval" in section:
            section["eval"] = {**section["eval"], "max_examples": 4, **({"max_new_tokens": 8} if "max_new_tokens" in section["eval"] else {})}
        objective = section.get("objective") or {}
        if "num_generations" in objective:
            objective.update(num_generations=2, max_completion_length=min(objective.get("max_completion_length", 16), 64))
        if "env" in section:  # US-GRPO: a few short conversations
            section["env"].update(max_goals=2, eval_goals=2)
    if "l2a" in params:
        params["l2a"]["eval"]["max_samples"] = 8
        params["l2a"]["eval"]["model_grader"] = None  # SmolLM2 is not in the project copy
    if "pir_eval" in params:
        params["pir_eval"]["max_goals"] = 2


def _training_sections(params: Any) -> list[dict]:
    """Every training-method section of ``params`` (a dict with model, optim and data or env)."""
    if not isinstance(params, dict):
        return []
    if {"model", "optim"} <= set(params) and ("data" in params or "env" in params):
        return [params]
    return [section for value in params.values() for section in _training_sections(value)]


def pipeline_project(root: Path, edit_params: Callable[[dict], None], files: Mapping[str, str] | None = None) -> Path:
    """A copy of the repository's pipeline (code, dvc.yaml, params.yaml changed by
    ``edit_params``, plus ``files``) committed in a fresh git + DVC repository at ``root``."""
    root.mkdir(parents=True)
    for name in ("pipelines", "catalog", "stages", "flows", "vendor"):  # vendor: the data in the repository
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    edit_params(params)
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for name, text in (files or {}).items():
        (root / name).write_text(text)
    _run(["git", "init", "-q"], root)
    _run([sys.executable, "-m", "dvc", "init", "-q"], root)
    _run([sys.executable, "-m", "dvc", "config", "core.analytics", "false"], root)
    _run(["git", "add", "-A"], root)
    _run(["git", "commit", "-q", "-m", "init"], root)
    return root


def tiny_bootstrap(params: dict) -> None:
    """Stage bootstrap (models/base) as a token pre-training run: tests that need models/base only
    as an upstream path (a dependency in dvc.yaml) are about the pipeline, not learning."""
    if "bootstrap" in params:
        params["bootstrap"].update(vocab_size=1000, max_length=512)
        params["bootstrap"]["model"].update(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, num_key_value_heads=1, intermediate_size=64)
        params["bootstrap"]["train"].update(steps=3, warmup_steps=1)
        params["bootstrap"]["eval"].update(windows=4, prompts=3, max_new_tokens=8)


def shrink(params: dict) -> None:
    params["corpus"]["n_dialogues"] = N_DIALOGUES
    # The τ-bench stages (vendor/taubench) are left out here to keep the run short; their DVC
    # run is tests/taubench/test_clarifier_dvc.py.
    params["clarifier"]["enable"] = []
    tiny_bootstrap(params)
    if "calibrate" in params:  # Auto-Prompt with a real model: one anchor, one candidate, a few tokens
        params["calibrate"].update(n_anchors=1, n_pool=1, iterations=1, k=1)
        for role in ("extractor", "grader", "policy"):
            params["calibrate"][role]["sampling"]["max_tokens"] = 8
        params["calibrate"]["policy"]["samples"] = 1
    shrink_training_and_evaluation(params)
    if "pir" in params:
        params["pir"]["max_traces"] = 12


@pytest.fixture()
def project(tmp_path) -> Path:
    """A copy of the repository's pipeline (code, dvc.yaml, params.yaml) as a fresh git + DVC repo."""
    return pipeline_project(tmp_path / "project", shrink)


@pytest.mark.timeout(2400)
def test_dvc_repro_builds_validated_artifacts_and_is_idempotent(project):
    # every stage of dvc.yaml (34 with the L2A seed stages), each with its process start: over
    # 10 minutes on 2 busy cores
    first = _run([sys.executable, "-m", "dvc", "repro"], project, timeout=1800)
    out = project / "data" / "processed" / "multiwoz"
    for name in ("dialogues", "turns", "goals", "entities", "splits"):
        assert (out / f"{name}.parquet").exists(), name
    report = json.loads((project / "reports" / "validation" / "seeds.json").read_text())
    assert report["success"] is True
    metrics = json.loads((project / "reports" / "seeds.json").read_text())
    assert metrics["dialogues"] == N_DIALOGUES
    assert "Running stage 'seeds'" in first.stdout

    count = _run([sys.executable, "-m", "stages.cli", "sql", "select count(*) as n from dialogues", "--format", "json"], project)
    assert json.loads(count.stdout) == [{"n": N_DIALOGUES}]

    # Every stage's wall time is in reports/timings/, and no DVC metric holds one.
    from tests.test_timings import timing_keys

    timings = {p.stem for p in (project / "reports" / "timings").glob("*.json")}
    assert {"gold_replay", "speaker", "bootstrap", "train_sft", "train_dpo", "train_kto", "train_grpo", "evaluate"} <= timings
    for path in [project / "reports" / "eval.json", *(project / "reports").glob("*.json"), *(project / "reports" / "train").glob("*.json")]:
        assert timing_keys(json.loads(path.read_text())) == [], path

    mtimes = {p: p.stat().st_mtime_ns for p in out.glob("*.parquet")}
    second = _run([sys.executable, "-m", "dvc", "repro"], project)
    assert "Running stage" not in second.stdout, second.stdout
    assert {p: p.stat().st_mtime_ns for p in out.glob("*.parquet")} == mtimes
    status = _run([sys.executable, "-m", "dvc", "status"], project)
    assert "up to date" in status.stdout


def test_bad_source_fails_the_stage_with_a_clear_message_and_no_artifact(project, tmp_path):
    from pipelines.multiwoz.embedded import generate_corpus
    from catalog.multiwoz_dir import write_multiwoz

    bad = tmp_path / "bad_multiwoz"
    write_multiwoz(generate_corpus(5, seed=1), bad)
    data = json.loads((bad / "data.json").read_text())
    victim = sorted(data)[2]
    data[victim]["goal"] = "find me a hotel"  # a goal that is not a dict
    (bad / "data.json").write_text(json.dumps(data))
    params = yaml.safe_load((project / "params.yaml").read_text())
    params["seeds"]["source"] = str(bad)
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))

    proc = _run([sys.executable, "-m", "dvc", "repro", "seeds"], project, check=False)
    assert proc.returncode != 0
    assert "data.json" in proc.stderr + proc.stdout and victim in proc.stderr + proc.stdout and "'goal'" in proc.stderr + proc.stdout
    assert not list(project.glob("data/processed/**/*.parquet"))


def test_a_forced_rerun_leaves_metrics_and_lock_unchanged(project):
    # Wall times and speeds go to reports/timings/ (not hashed): re-running a stage on the same
    # inputs must give the same output hashes, and `dvc metrics diff` must print nothing.
    _run([sys.executable, "-m", "dvc", "repro", "gold_replay"], project)
    _run(["git", "add", "-A"], project)
    _run(["git", "commit", "-q", "-m", "first run"], project)
    lock = (project / "dvc.lock").read_text()
    assert (project / "reports" / "timings" / "gold_replay.json").is_file()

    _run([sys.executable, "-m", "dvc", "repro", "--force", "--single-item", "gold_replay"], project)
    assert (project / "dvc.lock").read_text() == lock
    diff = _run([sys.executable, "-m", "dvc", "metrics", "diff"], project)
    assert diff.stdout.strip() == "", diff.stdout
