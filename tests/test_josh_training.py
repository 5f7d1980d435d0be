"""Training on the JOSH harvest and the ToolWOZ evaluation of models (issue 13, section 2):
per-source system prompts, the ``train.josh_*`` sections, stage ``josh_evaluate``."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import ConfigError
from pipelines.josh.tables import josh_tables
from pipelines.policy.prompts import COMPACT_SYSTEM_PROMPT, named_system_prompt
from pipelines.training.config import DataSpec, SourceSpec
from pipelines.training.data import prepare_source, system_prompt_name
from tests.test_josh import hand_built_tree

ROOT = Path(__file__).resolve().parents[1]


def chars(messages):
    return sum(len(m["content"]) for m in messages)


@pytest.fixture(scope="module")
def josh_dir(tmp_path_factory) -> Path:
    directory = tmp_path_factory.mktemp("josh")
    for name, table in josh_tables([hand_built_tree()]).items():
        pq.write_table(table, directory / f"{name}.parquet")
    return directory


# --------------------------------------------------------------------------------------
# Per-source system prompts
# --------------------------------------------------------------------------------------


def test_each_source_gets_its_own_system_prompt_in_one_run(josh_dir):
    josh = SourceSpec(str(josh_dir / "josh_sft.parquet"), system_prompt="toolwoz_react")
    other = SourceSpec(str(josh_dir / "josh_sft.parquet"))  # stands for a SpeakER source: the run's setting
    spec = DataSpec((josh, other), compact_prompts=True, max_history_messages=None)
    table = pq.read_table(josh_dir / "josh_sft.parquet")
    systems = {}
    for source in (josh, other):
        prepared = prepare_source(table.to_pylist(), table.column_names, source, "sft", spec, chars, 100_000)
        assert prepared.train, "every row fits"
        systems[source.system_prompt] = {r["prompt"][0]["content"] for r in prepared.train}
    assert systems["toolwoz_react"] == {named_system_prompt("toolwoz_react")}
    assert systems[None] == {COMPACT_SYSTEM_PROMPT}
    # own: the rows' system message as harvested
    assert system_prompt_name(DataSpec((), compact_prompts=True), SourceSpec("x", system_prompt="own")) == "own"


def test_the_compact_react_prompt_names_every_toolwoz_api_and_the_commands():
    from pipelines.env.toolwoz import API_SPECS

    prompt = named_system_prompt("toolwoz_react")
    assert all(f"{name}(" in prompt for name in API_SPECS)
    assert all(word in prompt for word in ("PLAN", "APICALL", "SPEAK", "<COMMAND_END>", "APIRETURN"))
    assert len(prompt) < len(COMPACT_SYSTEM_PROMPT) * 2


def test_an_unknown_system_prompt_is_a_config_error():
    from pipelines.evaluation.agent import PromptSpec

    with pytest.raises(ConfigError, match="system_prompt must be one of"):
        SourceSpec("x.parquet", system_prompt="react")
    with pytest.raises(ConfigError, match="system_prompt must be one of"):
        PromptSpec(system_prompt="react")


def test_evaluation_prompts_get_the_system_prompt_the_model_was_trained_with():
    from pipelines.evaluation.agent import PolicyPromptAgent, PromptSpec

    class Tok:  # every chat fits; messages are what matters here
        pass

    agent = PolicyPromptAgent(inner=type("A", (), {"name": "a", "format": None})(), tokenizer=Tok(),
                              spec=PromptSpec(system_prompt="toolwoz_react", max_prompt_tokens=None))
    messages = agent.messages([{"role": "system", "content": "LONG REACT PROMPT"}, {"role": "user", "content": "a hotel"}])
    assert messages == [{"role": "system", "content": named_system_prompt("toolwoz_react")}, {"role": "user", "content": "a hotel"}]


# --------------------------------------------------------------------------------------
# params.yaml: train.josh_* and josh_evaluate
# --------------------------------------------------------------------------------------


def params() -> dict:
    return yaml.safe_load((ROOT / "params.yaml").read_text())


def test_josh_train_sections_are_valid_and_train_in_the_react_format():
    from stages.train import train_config

    p = params()
    sft = train_config("sft", p["train"], policy=p["policy"], section_name="josh_sft")
    kto = train_config("kto", p["train"], policy=p["policy"], section_name="josh_kto")
    assert [s.system_prompt for s in sft.data.sources + kto.data.sources] == ["toolwoz_react", "toolwoz_react"]
    assert sft.model.path == p["policy"]["dir"] and kto.model.path == sft.output.model_dir
    assert (sft.output.model_dir, kto.output.model_dir) == ("models/josh_sft", "models/josh_kto")
    # A switched policy starts JOSH-SFT too; KTO keeps its JOSH-SFT start.
    switched = train_config("sft", p["train"], policy={"use": "smollm2", "dir": "models/smollm2"}, section_name="josh_sft")
    assert switched.model.path == "models/smollm2"


@pytest.mark.parametrize("section, change, message", [
    ("nope", {}, "train.nope: missing"),
    ("holdout", {}, "shared hold-out"),
    ("josh_sft", {"data": {"sources": [{"path": "x.parquet", "system_prompt": "react"}]}}, "system_prompt must be one of"),
    ("josh_kto", {"trainer": {}}, r"train.josh_kto: unknown key\(s\) \['trainer'\]"),
])
def test_bad_josh_train_sections_fail_naming_the_section(section, change, message):
    from stages.train import train_config

    p = params()
    if section in p["train"] and change:
        p["train"][section] = {**p["train"][section], **change}
    with pytest.raises(ConfigError, match=message):
        train_config("sft" if section != "josh_kto" else "kto", p["train"], section_name=section)


def test_josh_evaluate_params_are_valid():
    from stages.common import with_policy
    from stages.josh_evaluate import eval_config

    p = params()
    config = eval_config(with_policy(p["josh_evaluate"], p["policy"]))
    assert [name for name, _ in config.models] == ["base", "josh_sft", "josh_kto"]
    assert config.prompt.system_prompt == "toolwoz_react" and config.rules is not None
    switched = eval_config(with_policy(p["josh_evaluate"], {"use": "smollm2", "dir": "models/smollm2"}))
    assert dict(switched.models)["base"].path == "models/smollm2"


@pytest.mark.parametrize("change, message", [
    ({"models": {"a": {"path": "m", "hub_id": "h"}}}, "exactly one of path and hub_id"),
    ({"models": {"rules": {"path": "m"}}}, "the rules reference agent's"),
    ({"seeds": []}, "seeds distinct and not empty"),
    ({"format": "xml"}, "format: expected one of"),
    ({"prompt": {"system_prompt": "react"}}, "system_prompt must be one of"),
    ({"budget": 3}, r"unknown key\(s\) \['budget'\]"),
])
def test_bad_josh_evaluate_params_fail(change, message):
    from stages.josh_evaluate import eval_config

    with pytest.raises(ConfigError, match=message):
        eval_config({**params()["josh_evaluate"], **change})


# --------------------------------------------------------------------------------------
# A real small run: JOSH-SFT, JOSH-KTO from it, both on the ToolWOZ test goals
# --------------------------------------------------------------------------------------


def test_train_on_the_harvest_then_evaluate_on_toolwoz(prefect_api, single_torch_thread, tiny_model_dir, josh_dir,
                                                       small_corpus_dir, tmp_path):
    from flows.train import flow_for
    from catalog.io import read_artifact
    from stages.josh_evaluate import run as evaluate
    from stages.train import train_config

    out = tmp_path
    common = {"max_history_messages": None}
    optim = {"max_steps": 2, "batch_size": 2, "max_length": 960, "logging_steps": 1, "learning_rate": 1e-3}
    train = {
        "holdout": {"key": "dialogue_id", "split_column": "split", "split": "val", "fraction": 0.05},
        "josh_sft": {
            "model": {"path": str(tiny_model_dir)},
            "data": {"sources": [{"path": str(josh_dir / "josh_sft.parquet"), "system_prompt": "toolwoz_react"}], **common},
            "optim": optim, "eval": {"max_examples": 2, "before": False, "max_new_tokens": 8},
            "output": {"model_dir": str(out / "josh_sft"), "metrics": str(out / "josh_sft.json"), "curve": str(out / "josh_sft.csv")},
        },
        "josh_kto": {
            "model": {"path": str(out / "josh_sft")},
            "data": {"sources": [{"path": str(josh_dir / "josh_kto.parquet"), "system_prompt": "toolwoz_react"}], **common},
            "optim": optim, "eval": {"max_examples": 2, "generate": False},
            "output": {"model_dir": str(out / "josh_kto"), "metrics": str(out / "josh_kto.json"), "curve": str(out / "josh_kto.csv")},
        },
    }
    for method, section in (("sft", "josh_sft"), ("kto", "josh_kto")):
        config = train_config(method, train, section_name=section)
        report = flow_for(method)(config)
        assert report["train"]["steps"] == 2
        assert report["data"]["sources"][section]["train"] > 0  # the ReAct-prompted rows fit and trained
        assert (out / section / "config.json").is_file()
    assert json.loads((out / "josh_kto.json").read_text())["model"]["start"] == str(out / "josh_sft")

    params = {
        "source": str(small_corpus_dir), "max_goals": 2, "seeds": [0, 1], "max_turns": 2,
        "generation": {"max_new_tokens": 8, "batch_size": 8, "threads": 1},
        "models": {"josh_sft": {"path": str(out / "josh_sft")}, "josh_kto": {"path": str(out / "josh_kto")}},
        "output": {"episodes": str(out / "toolwoz_eval.parquet"), "metrics": str(out / "eval.json"), "markdown": str(out / "eval.md")},
    }
    report = evaluate(params)
    assert list(report["models"]) == ["rules", "josh_sft", "josh_kto"]
    table = read_artifact(out / "toolwoz_eval.parquet")  # validated against toolwoz_eval's suite
    rows = table.to_pylist()
    assert len(rows) == 3 * 2 * 2  # models x goals x seeds
    for name, scores in report["models"].items():
        mine = [r for r in rows if r["agent"] == name]
        assert scores["avg_reward"] == pytest.approx(sum(r["reward"] for r in mine) / len(mine))
        assert scores["success_rate"] == pytest.approx(sum(r["success"] for r in mine) / len(mine))
    # The tiny untrained models cannot write ReAct: their unparseable outputs are counted, not hidden.
    assert report["models"]["josh_sft"]["malformed_per_episode"] > 0
    assert all(json.loads(r["messages_json"])[0]["role"] == "user" for r in rows)
    assert "| josh_kto |" in (out / "eval.md").read_text()


def test_josh_evaluate_refuses_a_missing_model_before_playing(small_corpus_dir, tmp_path):
    from stages.josh_evaluate import run as evaluate

    with pytest.raises(ConfigError, match="does not exist"):
        evaluate({"source": str(small_corpus_dir), "models": {"josh_sft": {"path": str(tmp_path / "none")}},
                  "output": {"episodes": str(tmp_path / "e.parquet"), "metrics": str(tmp_path / "m.json"), "markdown": str(tmp_path / "m.md")}})
    assert not (tmp_path / "e.parquet").exists()
