"""Real MultiWOZ oddities the loader tolerates by default and refuses with ``strict``: unknown
domain-goal fields, split lists naming dialogues that data.json lacks, and text-only
dialogues, which gold_replay counts as unverifiable. Fixture: tests/fixtures/multiwoz_odd
(hand-written, invented values, official layout)."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from pipelines.env.replay import has_annotations
from pipelines.errors import ConfigError, DataError
from pipelines.multiwoz.parse import parse_dialogue
from stages import gold_replay, seeds
from catalog.multiwoz_dir import load_multiwoz

REPO = Path(__file__).resolve().parents[1]
ODD = REPO / "tests" / "fixtures" / "multiwoz_odd"
ODD_FIELDS = {"ODD0001.json": ("goal.restaurant.restaurant",), "ODD0002.json": ("goal.attraction.attraction", "goal.attraction.hotel")}
TEXT_ONLY = ("SNG0003.json", "SNG0004.json")


def _copy(tmp_path: Path, edit=None) -> Path:
    """The fixture copied to ``tmp_path``; ``edit(data)`` may change its data.json."""
    target = tmp_path / "mw"
    shutil.copytree(ODD, target)
    if edit is not None:
        data = json.loads((target / "data.json").read_text(encoding="utf-8"))
        edit(data)
        (target / "data.json").write_text(json.dumps(data, indent=1), encoding="utf-8")
    return target


def _without_odd_goal_fields(data: dict) -> None:
    for dialogue_id, paths in ODD_FIELDS.items():
        for path in paths:
            _, domain, key = path.split(".")
            del data[dialogue_id]["goal"][domain][key]


def _text_only(data: dict) -> None:
    # Human dialogues without annotations, as a user may have them: text, nothing else.
    for dialogue in data.values():
        dialogue["log"] = [{"text": turn["text"]} for turn in dialogue["log"]]


def _stage_params(source: Path, out: Path, **extra) -> dict:
    return {"source": str(source), "output": str(out / "data"), "report": str(out / "report.json"), "metrics": str(out / "metrics.json"), **extra}


# -- unknown goal fields ----------------------------------------------------------------------


def test_unknown_goal_fields_are_skipped_and_recorded(capsys):
    corpus = load_multiwoz(ODD)
    by_id = {d.dialogue_id: d for d in corpus.dialogues}
    assert set(by_id) == {"ODD0001.json", "ODD0002.json", "SNG0003.json", "SNG0004.json"}
    for dialogue_id, paths in ODD_FIELDS.items():
        assert by_id[dialogue_id].ignored == paths
        assert by_id[dialogue_id].goal.ignored == paths
    for dialogue_id in TEXT_ONLY:
        assert by_id[dialogue_id].ignored == ()
    # The rest of the goal loads as if the odd key were not there; book flags stay accepted.
    restaurant = by_id["ODD0001.json"].goal.get("restaurant")
    assert dict(restaurant.info) == {"food": "moroccan", "area": "north"} and restaurant.reqt == ("phone",)
    assert dict(restaurant.book) == {} and restaurant.book_invalid is False
    assert dict(by_id["ODD0002.json"].goal.get("attraction").info) == {"type": "museum", "area": "west"}


def test_strict_refuses_an_unknown_goal_field_naming_file_record_and_field():
    with pytest.raises(DataError) as info:
        load_multiwoz(ODD, strict=True)
    error = info.value
    assert (error.source, error.record, error.field) == (str(ODD / "data.json"), "ODD0001.json", "goal.restaurant.restaurant")
    assert "unknown goal field 'restaurant'" in str(error)


def test_an_unknown_domain_is_refused_even_when_tolerant(tmp_path):
    # A goal for a domain no tool serves cannot be played or graded: not an oddity to skip.
    target = _copy(tmp_path, lambda data: data["ODD0001.json"]["goal"].__setitem__("spaceport", {"info": {"area": "north"}}))
    with pytest.raises(DataError, match=r"record 'ODD0001.json', field 'goal.spaceport': unknown domain"):
        load_multiwoz(target)


# -- split lists naming unknown dialogues -----------------------------------------------------


def test_unknown_split_ids_are_warned_about_and_recorded(capsys):
    corpus = load_multiwoz(ODD)
    assert dict(corpus.unknown_split_ids) == {"testListFile.json": ("ODD9999.json",), "valListFile.json": ("GHOST0042",)}
    assert corpus.splits == {"ODD0001.json": "test", "ODD0002.json": "val", "SNG0003.json": "test", "SNG0004.json": "train"}
    err = capsys.readouterr().err
    assert f"warning: {ODD / 'testListFile.json'}: 1 dialogue id(s) not in {ODD / 'data.json'}: ODD9999.json" in err
    assert f"warning: {ODD / 'valListFile.json'}: 1 dialogue id(s) not in {ODD / 'data.json'}: GHOST0042" in err


def test_many_unknown_split_ids_are_counted_and_the_first_few_named(tmp_path, capsys):
    target = _copy(tmp_path)
    ghosts = [f"GHOST{i:04d}.json" for i in range(8)]
    (target / "testListFile.json").write_text("ODD0001.json\n" + "".join(f"{g}\n" for g in ghosts), encoding="utf-8")
    corpus = load_multiwoz(target)
    assert corpus.unknown_split_ids["testListFile.json"] == tuple(ghosts)
    assert f"8 dialogue id(s) not in {target / 'data.json'}: {', '.join(ghosts[:5])}, ... (3 more)" in capsys.readouterr().err
    report = seeds.tolerated(corpus, strict=False)
    assert report["unknown_split_ids"]["testListFile.json"] == {"count": 8, "first": ghosts[:5]}
    assert report["tolerated"]["unknown_split_id"] == 9  # and GHOST0042 of valListFile.json


def test_strict_refuses_unknown_split_ids_naming_the_list_and_the_id(tmp_path):
    target = _copy(tmp_path, _without_odd_goal_fields)
    assert load_multiwoz(target).unknown_split_ids  # tolerated without strict
    with pytest.raises(DataError) as info:
        load_multiwoz(target, strict=True)
    assert info.value.source == str(target / "testListFile.json") and info.value.record == "ODD9999.json"
    assert "1 dialogue id(s) not in" in str(info.value)


# -- the seeds stage --------------------------------------------------------------------------


def test_seeds_loads_every_dialogue_and_counts_every_tolerated_oddity_by_kind(tmp_path, capsys):
    out = tmp_path / "out"
    metrics = seeds.run(_stage_params(ODD, out))
    assert metrics["dialogues"] == 4 and metrics["turns"] == 16
    assert metrics["dialogues_ignored"] == {"goal.attraction.attraction": 1, "goal.attraction.hotel": 1, "goal.restaurant.restaurant": 1}
    assert metrics["unknown_split_ids"] == {"testListFile.json": 1, "valListFile.json": 1}
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["success"] is True
    assert report["input"]["strict"] is False
    assert report["input"]["tolerated"] == {
        "unknown_goal_field": 3,
        "unknown_split_id": 2,
        "missing:turns.dialog_act": 2,
        "missing:turns.metadata": 2,
    }
    assert report["input"]["unknown_goal_fields"] == metrics["dialogues_ignored"]
    assert report["input"]["unknown_split_ids"] == {
        "testListFile.json": {"count": 1, "first": ["ODD9999.json"]},
        "valListFile.json": {"count": 1, "first": ["GHOST0042"]},
    }
    rows = {r["dialogue_id"]: r for r in pq.read_table(out / "data" / "dialogues.parquet").to_pylist()}
    assert {k: tuple(r["ignored"]) for k, r in rows.items() if r["ignored"]} == ODD_FIELDS
    assert sorted(rows["SNG0004.json"]["missing"]) == ["turns.dialog_act", "turns.metadata"]
    assert "unknown_goal_field 3, unknown_split_id 2" in capsys.readouterr().out


def test_seeds_on_a_clean_source_reports_zero_tolerated(tmp_path, small_corpus_dir):
    out = tmp_path / "out"
    seeds.run(_stage_params(small_corpus_dir, out))
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))["input"]
    assert report["tolerated"] == {"unknown_goal_field": 0, "unknown_split_id": 0}
    assert report["unknown_goal_fields"] == {} and report["unknown_split_ids"] == {}


def test_strict_seeds_exits_non_zero_with_a_clear_message_and_writes_nothing(tmp_path):
    out = tmp_path / "out"
    (tmp_path / "params.yaml").write_text(json.dumps({"seeds": _stage_params(ODD, out, strict=True)}), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    done = subprocess.run([sys.executable, "-m", "stages.seeds"], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 1
    assert done.stderr.strip() == (
        f"error: {ODD / 'data.json'}, record 'ODD0001.json', field 'goal.restaurant.restaurant': "
        "unknown goal field 'restaurant' (known: book, fail_book, fail_info, info, reqt)"
    )
    assert not out.exists()  # no artifact, no report, no metrics


def test_strict_seeds_on_unknown_split_ids_exits_non_zero_and_keeps_previous_artifacts(tmp_path, monkeypatch, capsys):
    source, out = _copy(tmp_path, _without_odd_goal_fields), tmp_path / "out"
    seeds.run(_stage_params(source, out))  # tolerant: published
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    (tmp_path / "params.yaml").write_text(json.dumps({"seeds": _stage_params(source, out, strict=True)}), encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit) as exit_:
        seeds.main()
    assert exit_.value.code == 1
    err = capsys.readouterr().err
    assert f"error: {source / 'testListFile.json'}, record 'ODD9999.json': 1 dialogue id(s) not in" in err
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before


def test_strict_must_be_a_boolean(tmp_path):
    with pytest.raises(ConfigError, match="seeds.strict"):
        seeds.run(_stage_params(ODD, tmp_path / "out", strict="yes"))
    with pytest.raises(ConfigError, match="gold_replay.strict"):
        gold_replay.run(_stage_params(ODD, tmp_path / "out", strict="yes"))


def test_gold_replay_honours_strict_too(tmp_path):
    with pytest.raises(DataError, match="goal.restaurant.restaurant"):
        gold_replay.run(_stage_params(ODD, tmp_path / "out", strict=True, simulator={"kind": "agenda"}))
    assert not (tmp_path / "out").exists()


# -- gold_replay: unverifiable references ----------------------------------------------------


def _replay(source: Path, out: Path) -> dict:
    return gold_replay.run(_stage_params(source, out, simulator={"kind": "agenda"}))


def test_gold_replay_rates_are_over_verifiable_episodes_only(tmp_path, capsys):
    out = tmp_path / "out"
    metrics = _replay(ODD, out)
    assert (metrics["episodes"], metrics["verifiable"], metrics["unverifiable"]) == (4, 2, 2)
    episodes = pq.read_table(out / "data" / "episodes.parquet").to_pylist()
    assert len(episodes) == 4  # unverifiable episodes are still played and stored
    verifiable = [e for e in episodes if e["dialogue_id"] not in TEXT_ONLY]
    assert metrics["success_rate"] == sum(e["success"] for e in verifiable) / 2 == 1.0
    assert metrics["inform_rate"] == sum(e["inform"] for e in verifiable) / 2
    assert all(e["n_tool_calls"] == 0 for e in episodes if e["dialogue_id"] in TEXT_ONLY)
    report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    assert report["unverifiable"] == {"count": 2, "reason": "reference has no belief-state annotations", "first": list(TEXT_ONLY)}
    assert "4 episodes, unverifiable: 2, success 1.0000 over 2 verifiable" in capsys.readouterr().out


def test_gold_replay_over_text_only_dialogues_reports_every_episode_unverifiable(tmp_path, capsys):
    source, out = _copy(tmp_path, _text_only), tmp_path / "out"
    assert not any(has_annotations(d) for d in load_multiwoz(source).dialogues)
    metrics = _replay(source, out)
    assert (metrics["episodes"], metrics["verifiable"], metrics["unverifiable"]) == (4, 0, 4)
    assert metrics["success_rate"] is None and metrics["inform_rate"] is None and metrics["tool_calls"] == 0
    assert json.loads((out / "metrics.json").read_text(encoding="utf-8"))["success_rate"] is None
    printed = capsys.readouterr().out
    assert "4 episodes, unverifiable: 4, success n/a over 0 verifiable" in printed
    assert "4 reference dialogue(s) have no belief-state annotations" in printed


def test_an_annotated_reference_is_verifiable_even_when_some_turns_lack_metadata():
    by_id = {d.dialogue_id: d for d in load_multiwoz(ODD).dialogues}
    assert has_annotations(by_id["ODD0001.json"]) and not has_annotations(by_id["SNG0003.json"])
    partial = json.loads((ODD / "data.json").read_text(encoding="utf-8"))["ODD0001.json"]
    partial["log"][3]["metadata"] = {}
    assert has_annotations(parse_dialogue("ODD0001.json", partial, "data.json", "train"))
