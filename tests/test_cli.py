"""`askflow tables` and `askflow sql` over real Parquet files."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from stages.cli import view_names
from tests.conftest import run_cli

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data"
    (data / "raw").mkdir(parents=True)
    (data / "interim").mkdir()
    (data / "processed").mkdir()
    pq.write_table(pa.table({"dialogue_id": ["SNG01", "SNG02"], "split": ["train", "val"]}), data / "interim" / "dialogues.parquet")
    pq.write_table(
        pa.table({"dialogue_id": ["SNG01", "SNG01", "SNG02"], "index": [0, 1, 0], "speaker": ["user", "system", "user"]}),
        data / "interim" / "turns.parquet",
    )
    # Two artifacts with the same stem: named after their directories.
    pq.write_table(pa.table({"name": ["acorn", "bridge"], "stars": [4.5, None]}), data / "raw" / "hotels.parquet")
    pq.write_table(pa.table({"name": ["acorn"], "stars": [4.0]}), data / "processed" / "hotels.parquet")
    # Not artifacts: a temporary file of an atomic write, and a non-Parquet file.
    (data / "interim" / ".turns.parquet.1a2b3c.tmp").write_bytes(b"partial")
    (data / "raw" / "notes.txt").write_text("not parquet")
    return tmp_path


run = run_cli


def test_tables_lists_every_artifact_as_a_view(root: Path, capsys):
    status, out, err = run(capsys, "tables", "--root", str(root))
    assert (status, err) == (0, "")
    lines = out.splitlines()
    assert lines[0].split() == ["name", "rows", "path"]
    rows = [line.split() for line in lines[2:-1]]
    assert rows == [
        ["dialogues", "2", "data/interim/dialogues.parquet"],
        ["turns", "3", "data/interim/turns.parquet"],
        ["processed_hotels", "1", "data/processed/hotels.parquet"],
        ["raw_hotels", "2", "data/raw/hotels.parquet"],
    ]
    assert lines[-1] == "(4 rows)"
    # Aligned: every column starts at the same offset on every line.
    assert len({line.index("data/") for line in lines[2:-1]}) == 1


def test_view_names_grow_only_as_far_as_needed():
    paths = [Path("a/x/t.parquet"), Path("b/x/t.parquet"), Path("c/u.parquet"), Path("my-set.parquet")]
    assert view_names(paths) == ["a_x_t", "b_x_t", "u", "my_set"]


def test_sql_prints_an_aligned_table(root: Path, capsys):
    query = "SELECT d.split, count(*) AS turns FROM turns t JOIN dialogues d USING (dialogue_id) GROUP BY 1 ORDER BY 1"
    status, out, _ = run(capsys, "sql", query, "--root", str(root))
    assert status == 0
    assert out.splitlines() == [
        "split  turns",
        "-----  -----",
        "train      2",
        "val        1",
        "(2 rows)",
    ]


def test_sql_shows_null_and_reads_colliding_views(root: Path, capsys):
    status, out, _ = run(capsys, "sql", "SELECT name, stars FROM raw_hotels ORDER BY name", "--root", str(root))
    assert status == 0
    assert out.splitlines()[2:4] == ["acorn     4.5", "bridge   NULL"]


def test_sql_csv(root: Path, capsys):
    status, out, _ = run(capsys, "sql", "SELECT * FROM raw_hotels ORDER BY name", "--format", "csv", "--root", str(root))
    assert status == 0
    assert list(csv.reader(io.StringIO(out))) == [["name", "stars"], ["acorn", "4.5"], ["bridge", ""]]


def test_sql_json(root: Path, capsys):
    query = "SELECT dialogue_id, index, speaker FROM turns ORDER BY dialogue_id, index"
    status, out, _ = run(capsys, "sql", query, "--format", "json", "--root", str(root))
    assert status == 0
    assert json.loads(out) == [
        {"dialogue_id": "SNG01", "index": 0, "speaker": "user"},
        {"dialogue_id": "SNG01", "index": 1, "speaker": "system"},
        {"dialogue_id": "SNG02", "index": 0, "speaker": "user"},
    ]


def test_sql_json_encodes_dates(root: Path, capsys):
    status, out, _ = run(capsys, "sql", "SELECT DATE '2024-05-01' AS day", "--format", "json", "--root", str(root))
    assert (status, json.loads(out)) == (0, [{"day": "2024-05-01"}])


def test_bad_query_exits_1_with_a_message(root: Path, capsys):
    status, out, err = run(capsys, "sql", "SELECT * FROM no_such_table", "--root", str(root))
    assert (status, out) == (1, "")
    assert err.startswith("error: query failed: Catalog Error")
    assert "no_such_table" in err
    assert "Traceback" not in err


def test_an_unreadable_parquet_is_skipped_with_a_warning_naming_it(root: Path, capsys):
    """Issue 28 item 7: one damaged file under data/ used to fail every query (exit 1)."""
    broken = root / "data" / "raw" / "broken.parquet"
    broken.write_bytes(b"not parquet at all")
    good = (root / "data" / "interim" / "turns.parquet").read_bytes()
    truncated = root / "data" / "processed" / "cut.parquet"
    truncated.write_bytes(good[: len(good) // 2])  # a copy interrupted half-way

    status, out, err = run(capsys, "sql", "SELECT count(*) AS n FROM turns", "--root", str(root), "--format", "csv")
    assert (status, out) == (0, "n\n3\n"), err
    assert f"warning: {broken}: cannot read as Parquet, skipped (no view 'broken')" in err
    assert f"warning: {truncated}: cannot read as Parquet, skipped (no view 'cut')" in err
    assert "Traceback" not in err

    status, out, err = run(capsys, "tables", "--root", str(root))
    assert status == 0 and "(4 rows)" in out and "broken" not in out and "cut" not in out
    assert str(broken) in err and str(truncated) in err

    status, _, err = run(capsys, "sql", "SELECT * FROM broken", "--root", str(root))
    assert status == 1 and "Catalog Error" in err, "the skipped file has no view"


def test_tables_without_data_directory(tmp_path: Path, capsys):
    status, out, err = run(capsys, "tables", "--root", str(tmp_path))
    assert (status, out) == (0, "")
    assert "no Parquet files under" in err


def test_module_entry_point_uses_the_current_directory(root: Path):
    """End to end as a user runs it: a subprocess, the root defaulting to the cwd."""
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    ok = subprocess.run(
        [sys.executable, "-m", "stages.cli", "sql", "SELECT count(*) AS n FROM turns", "--format", "csv"],
        cwd=root, env=env, capture_output=True, text=True, check=False,
    )
    assert (ok.returncode, ok.stdout, ok.stderr) == (0, "n\n3\n", "")
    bad = subprocess.run(
        [sys.executable, "-m", "stages.cli", "sql", "SELEC 1"], cwd=root, env=env, capture_output=True, text=True, check=False
    )
    assert bad.returncode == 1
    assert bad.stderr.startswith("error: query failed: Parser Error")


def test_gpu_runs_are_one_view_per_table_with_the_run_named(root: Path, capsys):
    """Imported GPU runs (reports/gpu/<run>/...): every run's episodes in one view, matched by
    column name (a later run may add columns), each row with its run's folder."""
    first = root / "reports" / "gpu" / "2026-11-26_h100_speakrl_partial" / "evaluate"
    second = root / "reports" / "gpu" / "2026-12-01_h200_speakrl"
    first.mkdir(parents=True)
    second.mkdir(parents=True)
    pq.write_table(pa.table({"agent": ["sft", "zero_shot"], "success": [True, False]}), first / "episodes.parquet")
    pq.write_table(pa.table({"agent": ["grpo"], "success": [True], "n_turns": [12]}), second / "episodes.parquet")
    (second / ".episodes.parquet.tmp").write_bytes(b"partial")  # an import in progress: not a run's table
    pq.write_table(pa.table({"x": [1]}), root / "reports" / "gpu" / "stray.parquet")  # not inside a run: ignored

    query = "SELECT run, agent, success, n_turns FROM gpu_episodes ORDER BY agent"
    status, out, err = run(capsys, "sql", query, "--root", str(root), "--format", "json")
    assert (status, err) == (0, "")
    assert json.loads(out) == [
        {"run": "2026-12-01_h200_speakrl", "agent": "grpo", "success": True, "n_turns": 12},
        {"run": "2026-11-26_h100_speakrl_partial", "agent": "sft", "success": True, "n_turns": None},
        {"run": "2026-11-26_h100_speakrl_partial", "agent": "zero_shot", "success": False, "n_turns": None},
    ]
    status, out, err = run(capsys, "tables", "--root", str(root))
    assert (status, err) == (0, "")
    assert ["gpu_episodes", "3", "reports/gpu/*:", "2", "files"] in [line.split() for line in out.splitlines()]
    assert "stray" not in out and "(5 rows)" in out

    # A damaged run's table is left out of the view, named in a warning; the other run stays.
    (second / "episodes.parquet").write_bytes(b"not parquet")
    status, out, err = run(capsys, "sql", "SELECT count(*) AS n FROM gpu_episodes", "--root", str(root), "--format", "csv")
    assert (status, out) == (0, "n\n2\n")
    assert f"warning: {second / 'episodes.parquet'}: cannot read as Parquet, left out of view 'gpu_episodes'" in err


def test_the_readme_query_over_the_committed_gpu_run_gives_what_it_says(capsys):
    """The README's figures for `askflow sql ... from gpu_episodes` are the committed partial run's."""
    import re

    query = ("select agent, count(*) as n, avg(success::int) as s from gpu_episodes "
             "where run = '2026-11-26_nvidia-h100-80gb-hbm3_speakrl_partial' group by all order by agent")
    status, out, err = run(capsys, "sql", query, "--root", str(REPO), "--format", "json")
    assert (status, err) == (0, "")
    rows = {row["agent"]: row for row in json.loads(out)}
    readme = " ".join((REPO / "README.md").read_text(encoding="utf-8").split())
    said = re.search(r"the last query gives sft (\d+) dialogues, success ([\d.]+), zero_shot (\d+), ([\d.]+)", readme)
    assert said, "the README sentence about the committed GPU run"
    assert (int(said[1]), float(said[2])) == (rows["sft"]["n"], round(rows["sft"]["s"], 2))
    assert (int(said[3]), float(said[4])) == (rows["zero_shot"]["n"], round(rows["zero_shot"]["s"], 2))
