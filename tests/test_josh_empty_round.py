"""A JOSH round whose harvest has no training rows keeps `make run` green (issue 27): stage
josh publishes empty but schema-valid SFT / KTO tables and exits 0 (``require_training_data``:
fail instead, tests/test_josh_round.py); ``train_josh_sft`` / ``train_josh_kto`` (``allow_empty``)
exit 0 with a model directory holding only NOT_TRAINED.json and a ``trained: false`` report;
josh_evaluate reports them "not trained" without loading them. Any other training section with
an empty source still fails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import DataError
from pipelines.josh.tables import SPECS, josh_tables
from tests.test_josh import hand_built_tree

ROOT = Path(__file__).resolve().parents[1]
HOLDOUT = {"key": "dialogue_id", "split_column": "split", "split": "val", "fraction": 0.05}


@pytest.fixture(scope="module")
def empty_harvest(small_corpus_dir, tiny_model_dir, tmp_path_factory):
    """Stage josh (default: require_training_data false) with the tiny model as M, over the
    SFT / KTO tables of an earlier harvest (the rules agent's trees)."""
    from stages.josh import run

    tmp = tmp_path_factory.mktemp("empty_round")
    out = tmp / "data" / "processed" / "josh"
    out.mkdir(parents=True)
    for name, table in josh_tables([hand_built_tree()]).items():
        pq.write_table(table, out / f"{name}.parquet")
    params = {
        "source": str(small_corpus_dir), "output": str(out), "metrics": str(tmp / "reports" / "josh.json"),
        "work_dir": str(tmp / "ck"), "max_goals": 2,
        "agent": {"model_path": str(tiny_model_dir), "sampling": {"max_tokens": 12}},
        "beam": {"max_beam": 4, "branching_factor": 2, "max_turns": 2}, "test": {"max_goals": 2},
    }
    metrics = run(params)  # no exception: the harvest is reported, not an error
    return tmp, metrics


def test_stage_josh_publishes_empty_schema_valid_tables_and_the_counts(empty_harvest):
    tmp, metrics = empty_harvest
    report = json.loads((tmp / "reports" / "josh.json").read_text())
    assert report == json.loads(json.dumps(metrics))
    assert report["training_data"] is False and "nothing to train M' on" in report["no_training_data"]
    assert report["golden_paths"] == report["sft_rows"] == 0 and report["kto_rows"] == {"desirable": 0, "undesirable": 0}
    out = tmp / "data" / "processed" / "josh"
    for name in ("josh_sft", "josh_kto"):
        table = pq.read_table(out / f"{name}.parquet")
        assert table.num_rows == 0  # the earlier harvest's rows are gone
        assert table.schema.names == SPECS[name].schema.names
        assert table.schema.equals(SPECS[name].schema, check_metadata=False)
    assert pq.read_table(out / "josh_trees.parquet").num_rows == report["nodes"] > 2
    assert pq.read_table(out / "josh_eval.parquet").num_rows == report["test"]["episodes"] == 2


def _section(tmp: Path, name: str, start: str, source: str, **extra: object) -> dict:
    return {**extra, "model": {"path": start},
            "data": {"sources": [{"path": source, "system_prompt": "toolwoz_react", "grammar": "react"}], "max_history_messages": None},
            "optim": {"max_steps": 2, "batch_size": 2, "max_length": 960, "logging_steps": 1},
            "output": {"model_dir": f"models/{name}", "metrics": f"reports/train/{name}.json", "curve": f"reports/train/{name}_curve.csv"}}


def _workspace(tmp: Path, tiny_model_dir: Path, small_corpus_dir: Path) -> Path:
    """A working directory laid out like the repository's, with params.yaml's JOSH sections."""
    work = tmp / "work"
    work.mkdir()
    (work / "data").symlink_to(tmp / "data")
    (work / "reports").symlink_to(tmp / "reports")
    (work / "models").mkdir()
    (work / "models" / "josh_kto").mkdir()  # an earlier run's model must not survive
    (work / "models" / "josh_kto" / "config.json").write_text("{}")
    report = "reports/josh.json"
    params = {
        "train": {
            "holdout": HOLDOUT,
            "josh_sft": _section(tmp, "josh_sft", str(tiny_model_dir), "data/processed/josh/josh_sft.parquet",
                                 allow_empty=True, source_report=report),
            "josh_kto": _section(tmp, "josh_kto", "models/josh_sft", "data/processed/josh/josh_kto.parquet",
                                 allow_empty=True, source_report=report),
        },
        "josh_evaluate": {
            "source": str(small_corpus_dir), "max_goals": 2, "seeds": [0], "max_turns": 2,
            "generation": {"max_new_tokens": 8, "batch_size": 8, "threads": 1},
            "models": {"base": {"path": str(tiny_model_dir)}, "josh_sft": {"path": "models/josh_sft"},
                       "josh_kto": {"path": "models/josh_kto"}},
            "round": {"harvest": report, "start": "base", "trained": ["josh_sft", "josh_kto"]},
            "output": {"episodes": "data/episodes/toolwoz_eval.parquet", "metrics": "reports/josh_eval.json",
                       "markdown": "reports/josh_eval.md"},
        },
    }
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    return work


def test_the_three_stage_commands_exit_0_on_a_zero_row_harvest(empty_harvest, tiny_model_dir, small_corpus_dir):
    tmp, harvest = empty_harvest
    work = _workspace(tmp, tiny_model_dir, small_corpus_dir)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PREFECT_HOME": str(work / ".prefect")}
    # dvc.yaml's commands for train_josh_sft, train_josh_kto, josh_evaluate
    for command in (["stages.train", "sft", "--section", "train.josh_sft"], ["stages.train", "kto", "--section", "train.josh_kto"],
                    ["stages.josh_evaluate"]):
        done = subprocess.run([sys.executable, "-m", *command, "--params", "params.yaml"], cwd=work, env=env,
                              capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, (command, done.stdout[-2000:], done.stderr[-3000:])
    for name in ("josh_sft", "josh_kto"):
        # the model directory holds the note alone: never a copy of the start model
        assert sorted(p.name for p in (work / "models" / name).iterdir()) == ["NOT_TRAINED.json"]
        note = json.loads((work / "models" / name / "NOT_TRAINED.json").read_text())
        source = f"data/processed/josh/{name}.parquet"
        assert note["trained"] is False and note["rows"] == {source: 0} and note["source_report"] == "reports/josh.json"
        assert note["reason"].startswith(f"0 training rows in {source}") and harvest["no_training_data"] in note["reason"]
        metrics = json.loads((work / "reports" / "train" / f"{name}.json").read_text())
        assert metrics["trained"] is False and metrics["reason"] == note["reason"] and metrics["data"]["train_examples"] == 0
        assert (work / "reports" / "train" / f"{name}_curve.csv").read_text() == "step,epoch,loss\n"
    evaluation = json.loads((work / "reports" / "josh_eval.json").read_text())
    assert list(evaluation["models"]) == ["rules", "base"]  # M' are not loaded, not played
    assert set(evaluation["round"]["not_trained"]) == {"josh_sft", "josh_kto"}
    assert "| josh_kto (M') | not trained" in (work / "reports" / "josh_eval.md").read_text()


def test_another_section_with_an_empty_source_still_fails(empty_harvest, tiny_model_dir, tmp_path):
    from stages.train import run

    tmp, _ = empty_harvest
    source = str(tmp / "data" / "processed" / "josh" / "josh_sft.parquet")
    section = _section(tmp, "m", str(tiny_model_dir), source)
    section["output"] = {"model_dir": str(tmp_path / "m"), "metrics": str(tmp_path / "m.json"), "curve": str(tmp_path / "m.csv")}
    with pytest.raises(DataError, match=r"0 training rows in .*josh_sft.parquet: nothing to train sft on .*allow_empty"):
        run("sft", {"holdout": HOLDOUT, "sft": section})
    assert not (tmp_path / "m").exists() and not (tmp_path / "m.json").exists()
    with pytest.raises(Exception, match="allow_empty: expected true or false"):
        run("sft", {"holdout": HOLDOUT, "sft": {**section, "allow_empty": "yes"}})


def test_a_start_model_that_was_not_trained_is_an_error_when_there_are_rows(tiny_model_dir, tmp_path):
    from stages.train import run

    tables = josh_tables([hand_built_tree()])
    pq.write_table(tables["josh_kto"], tmp_path / "josh_kto.parquet")
    assert tables["josh_kto"].num_rows > 0
    start = tmp_path / "josh_sft"
    start.mkdir()
    (start / "NOT_TRAINED.json").write_text(json.dumps({"trained": False, "reason": "0 training rows in x.parquet"}))
    section = _section(tmp_path, "k", str(start), str(tmp_path / "josh_kto.parquet"), allow_empty=True)
    section["output"] = {"model_dir": str(tmp_path / "k"), "metrics": str(tmp_path / "k.json"), "curve": str(tmp_path / "k.csv")}
    with pytest.raises(DataError, match=r"start model .*josh_sft' was not trained \(0 training rows in x.parquet\)"):
        run("kto", {"holdout": HOLDOUT, "josh_kto": section}, section_name="josh_kto")


def test_params_yaml_lets_only_the_josh_sections_end_without_rows():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    assert params["josh"]["require_training_data"] is False
    allowed = {name for name, section in params["train"].items() if isinstance(section, dict) and section.get("allow_empty")}
    assert allowed == {"josh_sft", "josh_kto"}
    assert {params["train"][name]["source_report"] for name in allowed} == {params["josh"]["metrics"]}
    stages = yaml.safe_load((ROOT / "dvc.yaml").read_text())["stages"]
    for name in allowed:  # the reason comes from stage josh's report: a dependency
        assert f"${{train.{name}.source_report}}" in stages[f"train_{name}"]["deps"]


def test_the_committed_training_reports_are_this_harvests():
    harvest = json.loads((ROOT / "reports" / "josh.json").read_text())
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in ("josh_sft", "josh_kto"):
        report = json.loads((ROOT / "reports" / "train" / f"{name}.json").read_text())
        if harvest["training_data"]:
            assert report.get("trained", True) is True and report["train"]["steps"] > 0
        else:  # the README says so
            assert report["trained"] is False and harvest["no_training_data"] in report["reason"]
            assert "`reports/train/josh_{sft,kto}.json` say `trained: false` with this harvest's reason" in readme
