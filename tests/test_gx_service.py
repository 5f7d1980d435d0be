"""make run's one Great Expectations process (pipelines/artifacts/gx_service.py): a stage that
asks it gets the report it would compute itself, and validates by itself without it."""

from __future__ import annotations

import pyarrow as pa
import pytest

import pipelines.artifacts.validate as validate_module
from pipelines.artifacts.gx_service import SERVICE_ENV, running_service, wait_until_listening
from pipelines.artifacts.spec import ArtifactSpec, Expectation, between, in_set, length_between, not_null
from pipelines.artifacts.validate import validate
from pipelines.errors import ConfigError

SPEC = ArtifactSpec(
    name="turns",
    min_rows=1,
    schema=pa.schema([pa.field("dialogue_id", pa.string()), pa.field("index", pa.int32()), pa.field("speaker", pa.string()),
                      pa.field("text", pa.string()), pa.field("tags", pa.list_(pa.string()))]),
    keys=("dialogue_id", "index"),
    expectations=(in_set("speaker", ("user", "system")), between("index", 0, 200), length_between("text", 1), not_null("tags")),
)


def _table(speakers=("user", "system", "user"), indexes=(0, 1, 2)) -> pa.Table:
    n = len(speakers)
    return pa.table({"dialogue_id": ["D1"] * n, "index": pa.array(indexes, pa.int32()), "speaker": list(speakers),
                     "text": ["hello"] * n, "tags": [["a"]] * n}, schema=SPEC.schema)


@pytest.fixture
def service(tmp_path, monkeypatch):
    with running_service(tmp_path) as env:
        assert wait_until_listening(env[SERVICE_ENV].rpartition(":")[0])
        yield env


def test_the_service_gives_the_report_a_stage_computes_itself(service, monkeypatch):
    tables = [_table(), _table(speakers=("user", "robot", "user"), indexes=(0, 1, 500))]
    local = [validate(t, SPEC).to_dict() for t in tables]
    assert local[0]["success"] and not local[1]["success"]
    monkeypatch.setenv(SERVICE_ENV, service[SERVICE_ENV])

    def no_gx_here(*args, **kwargs):
        raise AssertionError("validated in the stage's process although the service was there")

    monkeypatch.setattr(validate_module, "_run_gx", no_gx_here)
    assert [validate(t, SPEC).to_dict() for t in tables] == local


def test_a_suite_error_in_the_service_is_raised_in_the_stage(service, monkeypatch):
    monkeypatch.setenv(SERVICE_ENV, service[SERVICE_ENV])
    broken = ArtifactSpec(name="t", min_rows=1, schema=pa.schema([("speaker", pa.string())]),
                          expectations=(Expectation("expect_column_values_to_be_fabulous", {"column": "speaker"}),))
    with pytest.raises(ConfigError, match="GX has no expectation 'expect_column_values_to_be_fabulous'"):
        validate(pa.table({"speaker": ["user"]}), broken)


def test_without_a_reachable_service_the_stage_validates_itself(tmp_path, monkeypatch):
    expected = validate(_table(speakers=("user", "robot", "user")), SPEC).to_dict()
    monkeypatch.setenv(SERVICE_ENV, f"{tmp_path / 'nobody.sock'}:{'00' * 32}")
    assert validate(_table(speakers=("user", "robot", "user")), SPEC).to_dict() == expected


def test_a_wrong_key_is_refused_and_the_stage_validates_itself(service, monkeypatch):
    address = service[SERVICE_ENV].rpartition(":")[0]
    monkeypatch.setenv(SERVICE_ENV, f"{address}:{'11' * 32}")
    calls = []
    real = validate_module._run_gx
    monkeypatch.setattr(validate_module, "_run_gx", lambda *a, **k: calls.append(1) or real(*a, **k))
    assert validate(_table(), SPEC).success
    assert calls == [1]


def test_the_service_ends_when_the_process_that_started_it_is_killed(tmp_path):
    """A make run killed with SIGKILL cannot stop its service: the service notices it was orphaned."""
    import os
    import signal
    import subprocess
    import sys
    import time

    code = ("import sys, time; from pipelines.artifacts.gx_service import running_service\n"
            f"with running_service({str(tmp_path)!r}):\n    print('up', flush=True); time.sleep(120)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    assert parent.stdout.readline().strip() == "up"
    socket = str(tmp_path / "gx.sock")

    def service_pids() -> list[int]:
        found = []
        for entry in os.listdir("/proc"):
            if entry.isdigit():
                try:
                    cmdline = open(f"/proc/{entry}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if socket.encode() in cmdline and b"pipelines.artifacts.gx_service" in cmdline:
                    found.append(int(entry))
        return found

    deadline = time.monotonic() + 30
    while not service_pids() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert service_pids(), "the service did not start"
    os.kill(parent.pid, signal.SIGKILL)
    parent.wait()
    deadline = time.monotonic() + 15
    while service_pids() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not service_pids(), "the service outlived the killed run"
