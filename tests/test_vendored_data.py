"""The data in the repository (issue 30): τ-bench and the real MultiWOZ val dialogues and
database under ``vendor/``, xz-compressed, each file under 5 MB, with licences; read
identically to the ``../shared`` originals (where present); the defaults point there and no
stage depends on anything outside the project; ``gold_replay_real`` runs on it, and the
README's figures are its report's."""

from __future__ import annotations

import gzip
import json
import lzma
import re
import zipfile
from pathlib import Path

import pytest
import yaml

from catalog import packed
from catalog.multiwoz_dir import load_multiwoz, read_raw_database
from catalog.taubench_dir import DEFAULT_TAUBENCH, load_ground_truth_replay, load_taubench_domain
from pipelines.errors import ConfigError, DataError
from tests.conftest import REPO, SHARED

VENDOR = REPO / "vendor"
DATASETS = ("taubench", "multiwoz_val", "multiwoz_db")
MAX_BYTES = 5 * 1024 * 1024


def _shared(name: str) -> Path:
    path = SHARED / "data" / name
    if not path.is_dir():
        pytest.skip(f"{path} not present: nothing to compare the vendored copy with")
    return path


# --- The files -------------------------------------------------------------------------------


def test_every_vendored_file_is_small_compressed_and_licensed():
    files = [p for p in VENDOR.rglob("*") if p.is_file()]
    assert len(files) >= 30
    too_big = [f"{p} ({p.stat().st_size} bytes)" for p in files if p.stat().st_size >= MAX_BYTES]
    assert not too_big
    plain_json = [str(p) for p in files if p.suffix in (".json", ".jsonl")]
    assert not plain_json, "every JSON file is stored compressed"
    for name in DATASETS:
        assert (VENDOR / name / "LICENSE").stat().st_size > 500
        source = (VENDOR / name / "SOURCE.md").read_text(encoding="utf-8")
        assert re.search(r"github|repository", source, re.I)
    assert "59a200c6d575d595120f1cb70fea53cef0632f6b" in (VENDOR / "taubench" / "SOURCE.md").read_text(encoding="utf-8")
    assert "2a168fc9843e54a468ddec71e001b7559c36aff4" in (VENDOR / "multiwoz_val" / "SOURCE.md").read_text(encoding="utf-8")


def test_vendored_taubench_is_byte_identical_to_shared_and_loads_the_same():
    shared = _shared("taubench")
    originals = [p for p in shared.rglob("*") if p.is_file()]
    for original in originals:
        rel = original.relative_to(shared)
        mine = packed.read_bytes(VENDOR / "taubench" / rel)
        if rel.name == "SOURCE.md":  # the original's text, and a paragraph on the compression
            assert mine.startswith(original.read_bytes()) and b"xz" in mine[len(original.read_bytes()):]
        else:
            assert mine == original.read_bytes(), rel
    vendored = {p.relative_to(VENDOR / "taubench").as_posix().removesuffix(".xz") for p in (VENDOR / "taubench").rglob("*") if p.is_file()}
    assert vendored == {p.relative_to(shared).as_posix() for p in originals}
    for domain in ("retail", "airline"):
        mine, theirs = load_taubench_domain(VENDOR / "taubench", domain), load_taubench_domain(shared, domain)
        assert mine.base.tables == theirs.base.tables and mine.tasks == theirs.tasks
        assert (mine.tool_schemas, mine.wiki, mine.rules) == (theirs.tool_schemas, theirs.wiki, theirs.rules)
        assert load_ground_truth_replay(VENDOR / "taubench", domain) == load_ground_truth_replay(shared, domain)


def test_vendored_multiwoz_is_byte_identical_to_shared_and_loads():
    with zipfile.ZipFile(_shared("multiwoz_val") / "val.json.zip") as archive:
        assert packed.read_bytes(VENDOR / "multiwoz_val" / "data.json") == archive.read("val.json")
    shared_db = _shared("multiwoz_db")
    for original in shared_db.glob("*_db.json"):
        assert packed.read_bytes(VENDOR / "multiwoz_db" / original.name) == original.read_bytes(), original.name
    assert read_raw_database(VENDOR / "multiwoz_db") == read_raw_database(shared_db)
    corpus = load_multiwoz(VENDOR / "multiwoz_val", VENDOR / "multiwoz_db")
    assert len(corpus.dialogues) == 999 and set(corpus.entities) >= {"restaurant", "hotel", "attraction", "train"}


# --- The reader ------------------------------------------------------------------------------


def test_packed_reads_plain_xz_and_gz_alike_and_names_the_file_on_errors(tmp_path):
    document = {"ü": [1, 2.5, None], "k": "v"}
    raw = json.dumps(document).encode()
    (tmp_path / "plain.json").write_bytes(raw)
    (tmp_path / "x.json.xz").write_bytes(lzma.compress(raw))
    (tmp_path / "g.json.gz").write_bytes(gzip.compress(raw))
    for name in ("plain.json", "x.json", "g.json"):
        assert packed.read_json(tmp_path / name) == document
        assert packed.exists(tmp_path / name)
    assert packed.resolve(tmp_path / "x.json") == tmp_path / "x.json.xz"
    assert [p.name for p in packed.logical_glob(tmp_path, "*.json")] == ["g.json", "plain.json", "x.json"]
    with pytest.raises(DataError, match=r"missing\.json: file not found"):
        packed.read_json(tmp_path / "missing.json")
    (tmp_path / "broken.json.xz").write_bytes(b"not xz at all")
    with pytest.raises(DataError, match=r"broken\.json\.xz: cannot decompress"):
        packed.read_json(tmp_path / "broken.json")
    (tmp_path / "dup.json.xz").write_bytes(lzma.compress(b'{"a": 1, "a": 2}'))
    with pytest.raises(DataError, match=r"dup\.json\.xz: duplicate key 'a'"):
        packed.read_json(tmp_path / "dup.json")
    (tmp_path / "nan.json.gz").write_bytes(gzip.compress(b"[NaN]"))
    with pytest.raises(DataError, match=r"nan\.json\.gz: invalid JSON: NaN"):
        packed.read_json(tmp_path / "nan.json")
    (tmp_path / "latin.json.xz").write_bytes(lzma.compress('["é"]'.encode("latin-1")))
    with pytest.raises(DataError, match=r"latin\.json\.xz: not valid UTF-8"):
        packed.read_json(tmp_path / "latin.json")


# --- The defaults ----------------------------------------------------------------------------


def _strings(value):
    if isinstance(value, dict):
        for item in value.values():
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)
    elif isinstance(value, str):
        yield value


def test_defaults_point_into_the_project_and_no_stage_depends_on_anything_outside():
    params = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))
    outside = [s for s in _strings(params) if "../shared" in s or s.startswith("../")]
    assert not outside, outside
    assert params["clarifier"]["data"]["taubench"] == params["clarifier"]["eval"]["taubench"] == "vendor/taubench" == DEFAULT_TAUBENCH
    assert (params["gold_replay_real"]["source"], params["gold_replay_real"]["db_dir"]) == ("vendor/multiwoz_val", "vendor/multiwoz_db")
    from catalog.repro import outside_dependencies

    assert outside_dependencies(REPO) == {}


# --- gold_replay_real ------------------------------------------------------------------------


def test_gold_replay_real_runs_on_vendored_dialogues_with_its_section(tmp_path, monkeypatch):
    """The stage's code on 12 real dialogues read from a compressed data.json, with the
    section's own settings (the committed report is the whole 999)."""
    from stages.gold_replay import main, run

    monkeypatch.chdir(REPO)  # the section's relative paths
    section = yaml.safe_load((REPO / "params.yaml").read_text(encoding="utf-8"))["gold_replay_real"]
    dialogues = json.loads(packed.read_bytes(VENDOR / "multiwoz_val" / "data.json"))
    subset = dict(sorted(dialogues.items())[:12])
    (tmp_path / "val").mkdir()
    (tmp_path / "val" / "data.json.xz").write_bytes(lzma.compress(json.dumps(subset).encode()))
    monkeypatch.setattr("catalog.io.TIMINGS_DIR", tmp_path / "timings")  # not the real run's timings
    params = {**section, "source": str(tmp_path / "val"), "output": str(tmp_path / "episodes"),
              "report": str(tmp_path / "report.json"), "metrics": str(tmp_path / "metrics.json")}
    metrics = run(params, "gold_replay_real")
    assert metrics["episodes"] == metrics["verifiable"] == 12 and metrics["tool_calls"] > 12
    assert json.loads((tmp_path / "metrics.json").read_text()) == metrics
    assert (tmp_path / "episodes" / "episodes.parquet").exists()
    with pytest.raises(ConfigError, match=r"params.yaml gold_replay_real\.max_exchanges"):
        run({**params, "max_exchanges": 0}, "gold_replay_real")
    with pytest.raises(SystemExit) as exit_:
        main(["--section", "no_such_section"])
    assert exit_.value.code == 1


def test_readme_states_the_committed_gold_replay_real_report():
    report = json.loads((REPO / "reports" / "gold_replay_real.json").read_text(encoding="utf-8"))
    assert report["episodes"] == 999 and report["unverifiable"] == 0
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    successes = round(report["success_rate"] * report["verifiable"])
    stated = (f"succeeds on {report['success_rate']:.4f} of them ({successes}/{report['verifiable']} episodes, "
              f"inform {report['inform_rate']:.4f}, {report['tool_calls']} tool calls, {report['tool_errors']} tool errors;")
    assert stated in readme
