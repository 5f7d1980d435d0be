"""One JOSH self-improvement round (issue 27): the policy M harvests its own trees (``hf``, the
default; ``rules`` is the template harvester, a reference), a harvest without training data
says so and leaves nothing to train on, and stage josh_evaluate reports M beside its M' (or
says M' was not trained), with bootstrap intervals; the README's JOSH figures are the reports'."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import ConfigError, DataError
from pipelines.josh.tables import josh_tables
from tests.test_josh import hand_built_tree

ROOT = Path(__file__).resolve().parents[1]


def test_the_default_harvester_is_the_model_and_needs_its_path():
    from stages.josh import josh_config

    with pytest.raises(ConfigError, match="agent.model_path: required for backend 'hf'.*'rules' is the template harvester"):
        josh_config({"source": "x", "output": "o", "metrics": "m"})
    assert josh_config({"source": "x", "output": "o", "metrics": "m", "agent": {"model_path": "models/base"}}).agent.backend == "hf"


def test_params_yaml_harvests_with_the_model_josh_fine_tunes_and_evaluates_as_m():
    params = yaml.safe_load((ROOT / "params.yaml").read_text())
    agent = params["josh"]["agent"]
    assert agent["backend"] == "hf"
    start = params["josh_evaluate"]["round"]["start"]
    assert agent["model_path"] == params["train"]["josh_sft"]["model"]["path"] == params["josh_evaluate"]["models"][start]["path"]
    assert params["josh_evaluate"]["round"]["harvest"] == params["josh"]["metrics"]
    # M' are the models trained on M's harvest
    trained = params["josh_evaluate"]["round"]["trained"]
    assert {params["josh_evaluate"]["models"][name]["path"] for name in trained} == {
        params["train"]["josh_sft"]["output"]["model_dir"], params["train"]["josh_kto"]["output"]["model_dir"]}


@pytest.fixture(scope="module")
def no_data_round(small_corpus_dir, tiny_model_dir, tmp_path_factory):
    """Stage josh with the tiny model as M: it writes no ReAct, so no golden path; with
    require_training_data the stage fails (the default reports it: tests/test_josh_empty_round.py)."""
    from stages.josh import run

    tmp = tmp_path_factory.mktemp("round")
    out = tmp / "josh"
    out.mkdir()
    # The SFT / KTO tables of an earlier harvest (another harvester's trees) are there.
    for name, table in josh_tables([hand_built_tree()]).items():
        pq.write_table(table, out / f"{name}.parquet")
    params = {
        "source": str(small_corpus_dir), "output": str(out), "metrics": str(tmp / "josh.json"), "work_dir": str(tmp / "ck"),
        "max_goals": 2, "agent": {"model_path": str(tiny_model_dir), "sampling": {"max_tokens": 12}},
        "beam": {"max_beam": 4, "branching_factor": 2, "max_turns": 2}, "test": {"max_goals": 2}, "require_training_data": True,
    }
    with pytest.raises(DataError, match=r"no tree of the 2 goals harvested by .* 0 SFT rows, 0 KTO rows.*nothing to train M' on"
                                        r".*require_training_data: true") as error:
        run(params)
    return tmp, params, str(error.value)


def test_a_harvest_without_training_data_reports_its_counts_and_leaves_nothing_to_train_on(no_data_round, tiny_model_dir):
    from pipelines.preflight import preflight
    from stages.train import train_config

    tmp, params, message = no_data_round
    report = json.loads((tmp / "josh.json").read_text())
    assert report["training_data"] is False and report["no_training_data"] in message
    assert report["agent"] == {"backend": "hf", "format": "react", "role": "policy M (the method: M harvests its own trees)",
                               "model_path": str(tiny_model_dir)}
    assert report["goals"] == 2 and report["golden_paths"] == 0 and report["sft_rows"] == 0
    assert report["kto_rows"] == {"desirable": 0, "undesirable": 0} and report["agent_calls"] > 0
    assert report["successful_nodes"] == report["labels"]["golden"] + report["labels"]["successful"]
    trees = pq.read_table(tmp / "josh" / "josh_trees.parquet")
    assert trees.num_rows == report["nodes"] > 2
    # M's own test episodes, with intervals over the goals
    evaluation = pq.read_table(tmp / "josh" / "josh_eval.parquet").to_pylist()
    assert len(evaluation) == report["test"]["episodes"] == 2
    low, high = report["test"]["avg_reward_ci95"]
    assert low <= report["test"]["avg_reward"] <= high
    # the earlier harvest's training tables are gone: a training stage fails naming its file
    assert not (tmp / "josh" / "josh_sft.parquet").exists() and not (tmp / "josh" / "josh_kto.parquet").exists()
    section = {"model": {"path": str(tiny_model_dir)},
               "data": {"sources": [{"path": str(tmp / "josh" / "josh_sft.parquet"), "system_prompt": "toolwoz_react"}]},
               "output": {"model_dir": str(tmp / "m"), "metrics": str(tmp / "m.json"), "curve": str(tmp / "m.csv")}}
    config = train_config("sft", {"josh_sft": section}, section_name="josh_sft")
    with pytest.raises(ConfigError, match=re.escape(f"dataset {str(tmp / 'josh' / 'josh_sft.parquet')!r} does not exist")):
        preflight(config)


def _eval_params(tmp: Path, harvest: Path, start: Path, **round_: object) -> dict:
    return {
        "source": "", "max_goals": 2, "seeds": [0], "max_turns": 2,
        "generation": {"max_new_tokens": 8, "batch_size": 8, "threads": 1},
        "models": {"base": {"path": str(start)}, "josh_sft": {"path": str(tmp / "no_sft")}, "josh_kto": {"path": str(tmp / "no_kto")}},
        "round": {"harvest": str(harvest), "start": "base", "trained": ["josh_sft", "josh_kto"], **round_},
        "output": {"episodes": str(tmp / "e.parquet"), "metrics": str(tmp / "eval.json"), "markdown": str(tmp / "eval.md")},
    }


def test_josh_evaluate_plays_m_and_says_m_prime_was_not_trained(no_data_round, small_corpus_dir, tiny_model_dir):
    from pipelines.josh.config import RULES_LABEL
    from stages.josh_evaluate import run as evaluate

    tmp, _, _ = no_data_round
    params = {**_eval_params(tmp, tmp / "josh.json", tiny_model_dir), "source": str(small_corpus_dir)}
    report = evaluate(params)  # M' directories do not exist: they are not played
    assert list(report["models"]) == ["rules", "base"]
    assert report["labels"] == {"rules": RULES_LABEL} and "template harvester" in RULES_LABEL
    rnd = report["round"]
    assert rnd["self_improvement"] is True and rnd["harvester"] == str(tiny_model_dir) and rnd["training_data"] is False
    assert set(rnd["not_trained"]) == {"josh_sft", "josh_kto"} and "0 training rows" in rnd["not_trained"]["josh_sft"]
    for scores in report["models"].values():
        assert scores["avg_reward_ci95"][0] <= scores["avg_reward"] <= scores["avg_reward_ci95"][1]
        assert scores["success_rate_ci95"][0] <= scores["success_rate"] <= scores["success_rate_ci95"][1]
    md = (tmp / "eval.md").read_text()
    assert f"| {RULES_LABEL} |" in md and "| base (M) |" in md and "| josh_sft (M') | not trained" in md
    assert "self-improvement: yes" in md


def test_josh_evaluate_round_with_training_data_needs_m_prime(no_data_round, small_corpus_dir, tiny_model_dir):
    from stages.josh_evaluate import run as evaluate

    tmp, _, _ = no_data_round
    harvest = json.loads((tmp / "josh.json").read_text())
    (tmp / "trained.json").write_text(json.dumps({**harvest, "training_data": True, "sft_rows": 5}))
    params = {**_eval_params(tmp, tmp / "trained.json", tiny_model_dir), "source": str(small_corpus_dir)}
    with pytest.raises(ConfigError, match="model 'josh_sft': .*no_sft does not exist"):
        evaluate(params)
    (tmp / "old.json").write_text(json.dumps({k: v for k, v in harvest.items() if k != "training_data"}))
    with pytest.raises(DataError, match="field 'training_data' is missing"):
        evaluate({**params, "round": {**params["round"], "harvest": str(tmp / "old.json")}})
    with pytest.raises(ConfigError, match="round: 'm2' is not one of the models"):
        evaluate({**params, "round": {**params["round"], "trained": ["m2"]}})


# --------------------------------------------------------------------------------------
# The README's JOSH figures are the committed reports'
# --------------------------------------------------------------------------------------


def _josh_section(readme: str) -> str:
    start = readme.index("## JOSH on ToolWOZ")
    return readme[start:readme.index("\n## ", start + 1)]


def test_the_readme_round_block_is_the_committed_reports():
    from pipelines.josh.report import README_END, README_START, readme_block, round_markdown

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    harvest = json.loads((ROOT / "reports/josh.json").read_text(encoding="utf-8"))
    evaluation = json.loads((ROOT / "reports/josh_eval.json").read_text(encoding="utf-8"))
    section = _josh_section(readme)
    assert README_START in section and README_END in section
    assert readme_block(readme) == round_markdown(harvest, evaluation)
    # the headline is the honest setting: M harvested its own trees, and josh_eval's round is that harvest
    assert harvest["agent"]["backend"] == "hf" and evaluation["round"]["self_improvement"] is True
    assert evaluation["round"]["golden_paths"] == harvest["golden_paths"] and evaluation["round"]["sft_rows"] == harvest["sft_rows"]
    # josh_eval.md is the same table the stage wrote from the same report
    from pipelines.josh.report import evaluation_markdown

    assert (ROOT / "reports/josh_eval.md").read_text(encoding="utf-8") == evaluation_markdown(
        evaluation["models"], evaluation["goals"], evaluation["seeds"], evaluation.get("round"))


def test_a_changed_report_changes_the_readme_block_and_nothing_else():
    from pipelines.josh.report import README_END, README_START, readme_block, readme_with_round

    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    harvest = json.loads((ROOT / "reports/josh.json").read_text(encoding="utf-8"))
    evaluation = json.loads((ROOT / "reports/josh_eval.json").read_text(encoding="utf-8"))
    harvest["nodes"] = 987654
    updated = readme_with_round(readme, harvest, evaluation)
    assert readme_block(updated) != readme_block(readme) and "987654 nodes" in readme_block(updated)
    assert updated.split(README_START)[0] == readme.split(README_START)[0]
    assert updated.split(README_END)[1] == readme.split(README_END)[1]
