"""Published files and directories get 0644 / 0755 whatever the umask (issue 28 item 6; issue 19
item 10 had them follow it, so ``umask 000`` gave world-writable artifacts); models are swapped in by
renames and a killed writer's leftovers are removed by the next one (issue 19 item 7)."""

from __future__ import annotations

import os
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from pipelines.files import remove_stale_staging, replace_directory, staging_path


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture(params=[0o022, 0o002, 0o000, 0o077], ids=["umask022", "umask002", "umask000", "umask077"])
def umask(request):
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


def test_corpus_directory_and_files_get_fixed_modes(tmp_path, umask):
    from pipelines.multiwoz.embedded import generate_corpus
    from catalog.multiwoz_dir import write_multiwoz

    target = tmp_path / "raw" / "embedded"
    write_multiwoz(generate_corpus(5, seed=1), target)
    write_multiwoz(generate_corpus(5, seed=2), target)  # the replacing write, too
    assert _mode(target) == 0o755  # was 0700 (mkdtemp), then 0777 & ~umask
    assert _mode(target.parent) == 0o755, "a new parent directory too"
    for path in target.rglob("*"):
        assert _mode(path) == (0o755 if path.is_dir() else 0o644), path
    assert sorted(p.name for p in target.parent.iterdir()) == ["embedded"]  # no staging left


def test_saved_model_gets_fixed_modes(tiny_model_dir, tmp_path, umask):
    from catalog.models import save_model
    from pipelines.training.modeling import load_tokenizer
    from pipelines.training.config import ModelSpec
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    tokenizer = load_tokenizer(ModelSpec(path=str(tiny_model_dir)))
    out = save_model(model, tokenizer, tmp_path / "models" / "sft", card="# card\n")
    weights = out / "model.safetensors"
    assert weights.exists()
    assert _mode(weights) == 0o644  # safetensors alone writes 0600
    assert _mode(out) == 0o755
    assert all(_mode(p) == 0o644 for p in out.iterdir())


def test_atomic_writers_and_publish_get_fixed_modes(tmp_path, umask):
    """catalog.io's writers: JSON, text, timings and published Parquet tables, and the
    directories they create, are 0644 / 0755 under any umask."""
    import pyarrow as pa

    from catalog.io import _write_all_atomic, write_json_atomic, write_text_atomic, write_timings

    write_json_atomic(tmp_path / "reports" / "m.json", {"a": 1})
    write_json_atomic(tmp_path / "reports" / "m.json", {"a": 2})  # the replacing write, too
    write_text_atomic(tmp_path / "reports" / "deep" / "t.txt", "x")
    write_timings("stage", {"wall_s": 1.0}, tmp_path / "reports" / "timings")
    _write_all_atomic({tmp_path / "reports" / "data" / "t.parquet": pa.table({"x": [1, 2]})})  # what publish writes with
    assert len(list((tmp_path / "reports").rglob("*"))) == 7
    for path in [tmp_path / "reports", *(tmp_path / "reports").rglob("*")]:
        assert _mode(path) == (0o755 if path.is_dir() else 0o644), (oct(_mode(path)), path)


def _dead_pid() -> int:
    process = subprocess.Popen([sys.executable, "-c", "pass"])
    process.wait()
    return process.pid


def _leftover(target: Path, pid: int, suffix: str) -> Path:
    name = staging_path(target, suffix).name.replace(f"-{os.getpid()}-", f"-{pid}-")
    return target.with_name(name)


def test_replace_directory_never_deletes_the_old_version_first(tmp_path, monkeypatch):
    target, staging = tmp_path / "model", tmp_path / "staging"
    target.mkdir(), staging.mkdir()
    (target / "weights").write_text("old")
    (staging / "weights").write_text("new")

    # A crash on the second rename (kill -9 at that instant) must leave the old version.
    real_replace = os.replace

    def failing(src, dst):
        if Path(src) == staging:
            raise OSError("simulated crash")
        return real_replace(src, dst)

    monkeypatch.setattr(os, "replace", failing)
    with pytest.raises(OSError, match="simulated crash"):
        replace_directory(staging, target)
    monkeypatch.setattr(os, "replace", real_replace)
    assert (target / "weights").read_text() == "old"

    replace_directory(staging, target)
    assert (target / "weights").read_text() == "new"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]


def test_leftovers_of_a_dead_writer_are_removed_and_a_model_mid_swap_restored(tmp_path):
    dead = _dead_pid()
    target = tmp_path / "sft"
    # kill -9 between the two renames of a swap: the old model under .old, no target.
    old = _leftover(target, dead, ".old")
    old.mkdir()
    (old / "model.safetensors").write_text("old")
    partial = _leftover(target, dead, ".tmp")  # a half-written staging directory
    partial.mkdir()
    (partial / "model.safetensors").write_text("half")
    temp_file = _leftover(tmp_path / "sft.json", dead, ".tmp")  # a torn JSON write
    temp_file.write_text("{")
    live = staging_path(target)  # this process's: still being written, kept
    live.mkdir()

    handled = remove_stale_staging(target)
    assert set(handled) == {old, partial}
    assert (target / "model.safetensors").read_text() == "old"
    assert not partial.exists() and live.exists()
    assert remove_stale_staging(tmp_path / "sft.json") == [temp_file] and not temp_file.exists()


def test_json_writer_removes_a_killed_writers_temporary_file(tmp_path):
    from catalog.io import write_json_atomic

    target = tmp_path / "reports" / "speaker.json"
    target.parent.mkdir()
    leftover = _leftover(target, _dead_pid(), ".tmp")
    leftover.write_text('{"torn": ')
    write_json_atomic(target, {"ok": True})
    assert sorted(p.name for p in target.parent.iterdir()) == ["speaker.json"]
