"""Issue 30, progress: the throttled reporter (an injected clock), its heartbeat while nothing
moves (the real clock), the training callback's lines, and a real stage's start and end lines."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest

from pipelines.progress import Progress, format_duration

REPO = Path(__file__).resolve().parents[1]


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_line_at_most_every_every_s_with_the_time_left():
    clock, lines = Clock(), []
    progress = Progress(400, "train sft", unit="steps", every_s=30, emit=lines.append, clock=clock)
    clock.now += 10
    assert progress.update(40) is None and lines == []  # 10 s: not due yet
    clock.now += 20
    assert progress.update(120) == "train sft: 120/400 steps (30 %), 30 s elapsed, ~1 min 10 s remaining"
    clock.now += 29
    assert progress.advance(10) is None  # 29 s since the last line
    clock.now += 1
    assert progress.advance() == "train sft: 131/400 steps (33 %), 1 min 00 s elapsed, ~2 min 03 s remaining"
    assert len(lines) == 2


def test_no_estimate_before_the_first_unit_and_none_without_a_total():
    clock, lines = Clock(), []
    progress = Progress(9, "calibrate", unit="prompts scored", every_s=5, emit=lines.append, clock=clock)
    clock.now += 5
    assert progress.poll() == "calibrate: 0/9 prompts scored (0 %), 5.0 s elapsed, remaining time not known yet"
    unknown = Progress(None, "josh harvest", unit="trees", every_s=5, emit=lines.append, clock=clock)
    clock.now += 3725
    assert unknown.update(3) == "josh harvest: 3 trees, 1 h 02 min elapsed"
    assert progress.poll(force=True).endswith("1 h 02 min elapsed, remaining time not known yet")


def test_durations():
    assert [format_duration(s) for s in (0.04, 9.96, 45.2, 125, 3599.6, 7260)] == [
        "0.0 s", "10.0 s", "45 s", "2 min 05 s", "1 h 00 min", "2 h 01 min"]
    with pytest.raises(ValueError):
        Progress(1, "x", every_s=0)


def test_the_heartbeat_reports_while_one_unit_takes_longer_than_every_s():
    lines: list[str] = []
    with Progress(3, "slow", unit="prompts", every_s=0.05, emit=lines.append) as progress:
        time.sleep(0.3)  # nothing finished: still a line at least every 0.05 s
        progress.update(1)
        time.sleep(0.12)
    stopped = len(lines)
    time.sleep(0.15)
    assert len(lines) == stopped  # the heartbeat ends with the block
    assert sum(line.startswith("slow: 0/3 prompts") for line in lines) >= 3, lines
    assert any(line.startswith("slow: 1/3 prompts (33 %)") and "remaining" in line for line in lines), lines


def test_a_stage_heartbeat_speaks_only_while_no_progress_line_does():
    """A stage's steps without a count of their own still give a line every every_s seconds;
    while a Progress reports, the heartbeat stays quiet."""
    from pipelines.progress import Heartbeat

    beats: list[str] = []
    with Heartbeat("[stage x]", every_s=0.2, emit=beats.append):
        time.sleep(0.7)  # nothing else speaks: about three beats
    assert 2 <= len(beats) <= 4 and all(b.startswith("[stage x] still running, ") and b.endswith(" elapsed") for b in beats), beats

    beats.clear()
    lines: list[str] = []
    with Heartbeat("[stage y]", every_s=0.2, emit=beats.append), Progress(10, "y", every_s=0.05, emit=lines.append) as progress:
        for _ in range(10):
            time.sleep(0.07)
            progress.advance()
    assert len(lines) >= 5 and beats == [], (lines, beats)


def test_the_training_callback_reports_steps_between_logging_steps(caplog):
    from pipelines.training.callbacks import LoggingCallback

    logger = logging.getLogger("test-progress-training")
    callback = LoggingCallback(logger, "sft", every_s=0.05)
    state = SimpleNamespace(max_steps=10, global_step=0)
    with caplog.at_level(logging.INFO, logger=logger.name):
        callback.on_train_begin(None, state, None)
        for step in (1, 2, 3):
            time.sleep(0.06)
            state.global_step = step
            callback.on_step_end(None, state, None)
        time.sleep(0.12)  # the last step takes long: the heartbeat reports it
        callback.on_train_end(None, state, None)
        ended = len(caplog.records)
        time.sleep(0.15)
    messages = [r.getMessage() for r in caplog.records]
    assert len(caplog.records) == ended  # no heartbeat after training ended
    assert messages[0] == "sft: training for at most 10 steps" and messages[-1].startswith("sft: finished at step 3")
    steps = [m for m in messages if m.startswith("sft training: ")]
    assert steps and any(m.startswith("sft training: 3/10 steps (30 %)") and "remaining" in m for m in steps), messages


def _stage(args: list[str], cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "DVC_STAGE"}
    return subprocess.run([sys.executable, "-m", *args], cwd=cwd, env={**env, "PYTHONPATH": str(REPO)},
                          capture_output=True, text=True, timeout=300)


def test_a_stage_prints_its_start_and_its_wall_time(tmp_path):
    (tmp_path / "params.yaml").write_text(
        "corpus: {n_dialogues: 12, seed: 0, val_fraction: 0.25, test_fraction: 0.25, output: data/raw/corpus}\n")
    done = _stage(["stages.corpus"], tmp_path)
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0] == "[stage corpus] start"
    assert lines[-1].startswith("[stage corpus] done in ") and lines[-1].endswith(" s"), lines
    # A failing stage says so; stderr still holds its error message only.
    (tmp_path / "params.yaml").write_text("corpus: {n_dialogues: 0}\n")
    failed = _stage(["stages.corpus"], tmp_path)
    assert failed.returncode == 1 and failed.stderr.startswith("error: ")
    assert failed.stdout.splitlines()[0] == "[stage corpus] start"
    assert failed.stdout.splitlines()[-1].startswith("[stage corpus] failed after ")


def test_the_askflow_command_is_no_stage(capsys):
    from stages.cli import main

    with pytest.raises(SystemExit):
        main(["--help"])
    assert "[stage" not in capsys.readouterr().out
