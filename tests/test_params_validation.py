"""params.yaml sections corpus, seeds and gold_replay are validated like the training ones;
params.yaml refuses duplicate keys; JSON inputs refuse NaN, Infinity and deep nesting
(issue 19, item 9). Each case runs a stage's real entry point in a temporary directory."""

from __future__ import annotations

import copy
import sys
import re
from pathlib import Path

import pytest
import yaml

from tests.conftest import REPO

BASE = yaml.safe_load((REPO / "params.yaml").read_text())


def _stage_error(monkeypatch, capsys, tmp_path: Path, stage: str, section: dict | None = None, text: str | None = None) -> str:
    """Run ``python -m stages.<stage>`` (in process) with ``section`` as its params; the
    stage must exit 1 with one ``error:`` line and no traceback; returns that message."""
    import importlib

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", [f"stages/{stage}.py"])  # the stage's own arguments, not pytest's
    if text is None:
        params = copy.deepcopy(BASE)
        params[stage] = section
        text = yaml.safe_dump(params, sort_keys=False)
    Path("params.yaml").write_text(text)
    module = importlib.import_module(f"stages.{stage}")
    with pytest.raises(SystemExit) as exit_:
        module.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert err.startswith("error: ") and "Traceback" not in err, err
    assert not list(tmp_path.glob("data/**/*.*")), "nothing may be written"
    return err


def _corpus(**changes) -> dict:
    return {**BASE["corpus"], "n_dialogues": 20, **changes}


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"n_dialogues": 12.7}, "corpus.n_dialogues: expected int, got 12.7"),  # was truncated to 12
        ({"n_dialogues": "many"}, "corpus.n_dialogues: expected int, got 'many'"),  # was a traceback-free but vague message
        ({"n_dialogues": True}, "corpus.n_dialogues: expected int, got True"),
        ({"n_dialogues": 0}, "corpus.n_dialogues: expected an integer >= 1"),
        ({"seed": [1]}, "corpus.seed: expected int, got [1]"),
        ({"val_fraction": 2.0}, "corpus.val_fraction: expected a fraction in [0, 1), got 2.0"),  # was accepted
        ({"test_fraction": -0.1}, "corpus.test_fraction: expected a fraction in [0, 1)"),
        ({"val_fraction": "nan"}, "corpus.val_fraction: expected a finite number"),
        ({"val_fraction": 0.5, "test_fraction": 0.5}, "leaving no training dialogue"),
        ({"val_fraction": {"a": 1}}, "corpus.val_fraction: expected a number"),  # was a traceback
        ({"n_dialogue": 5}, "corpus: unknown key(s) ['n_dialogue']"),  # was ignored
        ({"db_dir": 3}, "corpus.db_dir"),
    ],
)
def test_corpus_params_are_validated(monkeypatch, capsys, tmp_path, changes, expected):
    assert expected in _stage_error(monkeypatch, capsys, tmp_path, "corpus", _corpus(**changes))


def test_corpus_requires_its_keys(monkeypatch, capsys, tmp_path):
    section = _corpus()
    del section["output"]
    assert "params.yaml corpus: missing required key(s) ['output']" in _stage_error(monkeypatch, capsys, tmp_path, "corpus", section)


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"source": 5}, "seeds.source: expected str, got 5"),  # was a traceback (Path(5))
        ({"output": ["a"]}, "seeds.output: expected str"),
        ({"report": 1}, "seeds.report"),
        ({"sorce": "x"}, "seeds: unknown key(s) ['sorce']"),
    ],
)
def test_seeds_params_are_validated(monkeypatch, capsys, tmp_path, changes, expected):
    assert expected in _stage_error(monkeypatch, capsys, tmp_path, "seeds", {**BASE["seeds"], **changes})


@pytest.mark.parametrize(
    "changes, expected",
    [
        ({"seed": "zero"}, "gold_replay.seed: expected int, got 'zero'"),  # was a traceback (int('zero'))
        ({"max_exchanges": 2.5}, "gold_replay.max_exchanges: expected int, got 2.5"),  # was truncated
        ({"max_exchanges": 0}, "gold_replay.max_exchanges: expected an integer >= 1"),
        ({"agent_format": "xml"}, "gold_replay.agent_format: expected one of"),  # was a ValueError traceback
        ({"simulator": {"kind": "agenda", "noise": 2}}, "gold_replay.simulator: noise: expected a number in [0, 1]"),
        ({"simulator": {"kind": "agenda", "verbosity": "loud"}}, "gold_replay.simulator.verbosity: expected one of"),
        ({"simulator": {"kind": "goal_llm"}}, "gold_replay.simulator.kind: only 'agenda'"),
        ({"simulator": "agenda"}, "gold_replay.simulator: expected a mapping"),  # was a traceback
        ({"simulator": {"kind": "agenda", "nosie": 0.1}}, "gold_replay.simulator: unknown key(s) ['nosie']"),
        ({"max_turns": 5}, "gold_replay: unknown key(s) ['max_turns']"),
    ],
)
def test_gold_replay_params_are_validated(monkeypatch, capsys, tmp_path, changes, expected):
    assert expected in _stage_error(monkeypatch, capsys, tmp_path, "gold_replay", {**BASE["gold_replay"], **changes})


def test_duplicate_keys_in_params_yaml_are_refused(monkeypatch, capsys, tmp_path):
    # The corpus section's n_dialogues line whatever its value (issue 28 item 9: a fixed
    # "n_dialogues: 2500" made this a no-op, and the stage ran, once params.yaml said otherwise).
    text, count = re.subn(r"(?m)^(corpus:\n(?:(?:  .*|\s*#.*|)\n)*?  n_dialogues: .*\n)", r"\1  n_dialogues: 20\n",
                          (REPO / "params.yaml").read_text(), count=1)
    assert count == 1 and yaml.load(text, Loader=yaml.BaseLoader)["corpus"]["n_dialogues"] == "20"  # last one wins in plain YAML
    err = _stage_error(monkeypatch, capsys, tmp_path, "corpus", text=text)
    assert "duplicate key 'n_dialogues'" in err and "params.yaml" in err


def test_repository_params_pass(monkeypatch, tmp_path):
    from stages.corpus import corpus_params
    from stages.gold_replay import gold_replay_params
    from catalog.io import read_params
    from pipelines.config import from_params
    from stages.seeds import SeedsParams

    monkeypatch.chdir(REPO)
    assert corpus_params(read_params("corpus")).n_dialogues == BASE["corpus"]["n_dialogues"]
    assert gold_replay_params(read_params("gold_replay")).simulator.kind == "agenda"
    assert from_params(SeedsParams, read_params("seeds"), "seeds").source == BASE["seeds"]["source"]


@pytest.mark.parametrize(
    "text, expected",
    [
        ('{"a": NaN}', "NaN is not a JSON value"),
        ('{"a": [1, Infinity]}', "Infinity is not a JSON value"),
        ('{"a": -Infinity}', "-Infinity is not a JSON value"),
        ("[" * 100_000 + "]" * 100_000, "nested too deeply"),
    ],
)
def test_json_input_refuses_nan_infinity_and_deep_nesting(monkeypatch, capsys, tmp_path, text, expected):
    """The seeds stage on a MultiWOZ directory whose data.json is not strict JSON."""
    from pipelines.multiwoz.embedded import generate_corpus
    from catalog.multiwoz_dir import write_multiwoz

    source = tmp_path / "multiwoz"
    write_multiwoz(generate_corpus(3, seed=1), source)
    (source / "data.json").write_text(text)
    err = _stage_error(monkeypatch, capsys, tmp_path, "seeds", {**BASE["seeds"], "source": str(source)})
    assert f"{source / 'data.json'}: invalid JSON: {expected}" in err


def test_split_list_refuses_deep_nesting(tmp_path):
    from pipelines.errors import DataError
    from pipelines.multiwoz.parse import parse_split_list

    with pytest.raises(DataError, match="nested too deeply"):
        parse_split_list("[" * 100_000 + "]" * 100_000, "testListFile.json")


def test_a_generated_tool_call_nested_too_deeply_is_malformed_not_a_crash():
    from pipelines.episodes.formats import Malformed, get_format

    deep = "[" * 100_000 + "]" * 100_000
    parsed = get_format("speakrl").parse(f'<tool_call>\n{{"name": "query_hotel", "arguments": {deep}}}\n</tool_call>')
    assert isinstance(parsed, Malformed) and "nested too deeply" in parsed.reason
