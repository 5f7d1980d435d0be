"""Scheduled retraining: the retrain section, the record, ``askflow deploy`` and the
``retrain`` flow, run for real (dvc repro on a tiny project, a real Prefect server)."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path

import pytest
import yaml

from pipelines.errors import ConfigError
from pipelines.retrain import (
    build_record,
    flatten,
    markdown_report,
    record_name,
    retrain_config,
    stage_outs,
    stages_run,
)
from tests.conftest import REPO, run_cli

pytest_plugins = ["tests.prefect_support"]

GOOD = {"deployment": "askflow-retrain", "schedule": {"cron": "0 3 * * 1", "timezone": "UTC"}, "work_pool": "askflow", "targets": []}


cli = run_cli


@pytest.fixture
def project(tiny_project) -> Path:
    return tiny_project


def set_params(project: Path, section: str, values: dict | None) -> None:
    params = yaml.safe_load((project / "params.yaml").read_text())
    if values is None:
        params.pop(section)
    else:
        params[section] = {**params.get(section, {}), **values}
    (project / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


# --- Settings --------------------------------------------------------------------------------


def test_the_repository_params_have_a_valid_retrain_section():
    config = retrain_config(yaml.safe_load((REPO / "params.yaml").read_text())["retrain"])
    assert (config.cron, config.timezone, config.targets) == ("0 3 * * 1", "UTC", ())
    assert config.metrics == "reports/eval.json"


@pytest.mark.parametrize(
    "change, field, message",
    [
        ({"schedule": {"cron": "0 3 * *"}}, "retrain.schedule.cron", "expected 5 fields"),
        ({"schedule": {"cron": "0 25 * * 1"}}, "retrain.schedule.cron", "Invalid cron string"),
        ({"schedule": {"cron": "H 3 * * 1"}}, "retrain.schedule.cron", "Invalid cron string"),
        ({"schedule": {"cron": "0 3 * * 1", "timezone": "Mars/Olympus"}}, "retrain.schedule.timezone", "unknown time zone"),
        ({"schedule": "weekly"}, "retrain.schedule", "expected a mapping"),
        ({"targets": "corpus"}, "retrain.targets", "expected a list"),
        ({"targets": [" "]}, "retrain.targets", "list of stage names"),
        ({"deployment": None}, "retrain.deployment", "expected str"),
        ({"deployment": "a/b"}, "retrain.deployment", "expected a name"),
        ({"workpool": "x"}, "retrain", "unknown key(s) ['workpool']"),
    ],
)
def test_a_bad_retrain_section_names_the_field(change, field, message):
    with pytest.raises(ConfigError) as error:
        retrain_config({**GOOD, **change})
    assert f"params.yaml: {field}" in str(error.value) and message in str(error.value)


def test_deploy_refuses_a_bad_cron_or_a_missing_section_before_contacting_a_server(project, capsys):
    set_params(project, "retrain", {"schedule": {"cron": "every monday"}})
    status, out, err = cli(capsys, "deploy", "--root", str(project), "--api-url", "http://127.0.0.1:9/api")
    assert status == 1 and out == ""
    assert err.startswith("error: ") and "retrain.schedule.cron" in err and "'every monday'" in err

    set_params(project, "retrain", None)
    status, _, err = cli(capsys, "deploy", "--root", str(project))
    assert status == 1 and "no section 'retrain'" in err and "params.yaml" in err


def test_deploy_without_a_server_says_to_start_one(project, capsys, monkeypatch, unused_port):
    from prefect.settings import PREFECT_API_URL, temporary_settings

    monkeypatch.delenv("PREFECT_API_URL", raising=False)
    with temporary_settings(restore_defaults={PREFECT_API_URL}):
        status, _, err = cli(capsys, "deploy", "--root", str(project))
    assert status == 1 and "set PREFECT_API_URL or pass --api-url" in err and "askflow ui" in err

    status, _, err = cli(capsys, "deploy", "--root", str(project), "--api-url", f"http://127.0.0.1:{unused_port}")
    assert status == 1 and "no Prefect server at" in err and "askflow ui" in err


def test_api_url_from_the_flag_the_setting_or_the_ui_address():
    from flows.deploy import resolve_api_url, ui_url

    assert resolve_api_url("http://127.0.0.1:4200", None) == "http://127.0.0.1:4200/api"
    assert resolve_api_url(None, "http://127.0.0.1:4200/api/") == "http://127.0.0.1:4200/api"
    assert resolve_api_url("http://h:1/api", "http://other:2/api") == "http://h:1/api"
    assert ui_url("http://h:1/api") == "http://h:1"
    with pytest.raises(ConfigError, match="expected http"):
        resolve_api_url("127.0.0.1:4200", None)


def test_the_ui_keeps_prefect_state_in_the_project_unless_prefect_home_is_set(tmp_path):
    from flows.deploy import server_environment

    env = server_environment(tmp_path, "127.0.0.1", 4200, environ={"PREFECT_API_URL": "http://elsewhere/api"})
    assert env["PREFECT_HOME"] == str(tmp_path / ".prefect")
    assert env["PREFECT_API_URL"] == "http://127.0.0.1:4200/api"
    assert env["PREFECT_SERVER_ANALYTICS_ENABLED"] == "false" and env["PREFECT_SERVER_UI_ENABLED"] == "true"
    assert server_environment(tmp_path, "127.0.0.1", 4200, environ={"PREFECT_HOME": "/x"})["PREFECT_HOME"] == "/x"


# --- The record ------------------------------------------------------------------------------


LOCK = {
    "schema": "2.0",
    "stages": {
        "corpus": {"cmd": "python -m stages.corpus", "outs": [{"path": "data/raw/embedded_multiwoz", "md5": "aa.dir", "nfiles": 10}]},
        "train_sft": {"outs": [{"path": "models/sft", "md5": "bb.dir"}, {"path": "reports/train/sft.json", "md5": "cc"}]},
    },
}


def test_stage_outs_and_the_stages_dvc_ran():
    assert stage_outs(LOCK) == {
        "corpus": {"data/raw/embedded_multiwoz": "aa.dir"},
        "train_sft": {"models/sft": "bb.dir", "reports/train/sft.json": "cc"},
    }
    assert stage_outs({}) == {} and stage_outs(None) == {}
    output = ["Stage 'corpus' didn't change, skipping", "Running stage 'train_sft':", "> python -m stages.train sft"]
    assert stages_run(output) == ["train_sft"]


def test_the_record_says_what_changed_and_the_markdown_shows_versions_outs_and_scores():
    before = {"corpus": {"data/raw/embedded_multiwoz": "aa.dir"}, "train_sft": {"models/sft": "old.dir", "reports/train/sft.json": "cc"}}
    scores = {"success_rate": 0.8125, "by_model": {"sft": {"clarify_rate": 0.5}}, "models": ["base", "sft"]}
    record = build_record(
        run={"id": "0192abcd-ef", "name": "brave-fox", "started": "2025-01-06T03:00:00+00:00"}, project=Path("/p"),
        command=["dvc", "repro"], git={"commit": "c0ffee" * 6 + "ab12", "dirty": False, "modified": []},
        params_sha256="ab" * 32, lock_md5="dd", outs_before=before, outs_after=stage_outs(LOCK), ran=["train_sft"],
        metrics_path="reports/eval.json", metrics=scores,
    )
    assert record["stages"]["train_sft"] == {"outs": {"models/sft": "bb.dir", "reports/train/sft.json": "cc"}, "changed": ["models/sft"], "ran": True}
    assert record["stages"]["corpus"]["changed"] == [] and record["stages"]["corpus"]["ran"] is False
    assert record["metrics"] == {"path": "reports/eval.json", "values": scores}
    assert json.loads(json.dumps(record)) == record

    text = markdown_report(record, "reports/retrain/x.json")
    assert "| git commit | `c0ffeec0ffee` |" in text
    assert f"| params.yaml | sha256 `{'ab' * 8}` |" in text
    assert "| train_sft | `models/sft` | `bb.dir` | changed |" in text
    assert "| corpus | `data/raw/embedded_multiwoz` | `aa.dir` |  |" in text
    assert "| success_rate | 0.8125 |" in text and "| by_model.sft.clarify_rate | 0.5 |" in text
    assert '| models | ["base", "sft"] |' in text
    assert "No evaluation metrics yet." in markdown_report({**record, "metrics": None})
    assert flatten(3) == [("value", 3)]
    assert record_name("2025-01-06T03:00:07+00:00", "0192abcd-ef") == "20250106T030007Z-0192abcd"


def test_a_project_outside_git_still_gets_a_record(tmp_path):
    from catalog.retrain import git_version

    version = git_version(tmp_path)
    assert (version["commit"], version["dirty"]) == (None, None) and "not a git repository" in version["error"]
    assert "not a git repository" in markdown_report({"git": {"commit": None}, "stages": {}})


def test_a_locked_repository_is_retried_and_a_failing_stage_is_not():
    from prefect.states import Failed

    from flows.retrain import ReproFailed, _retry_when_locked

    locked = ReproFailed(["dvc", "repro"], Path("/p"), 1, ["ERROR: Unable to acquire lock. Most likely another DVC process is running"])
    failed = ReproFailed(["dvc", "repro"], Path("/p"), 1, ["error: params.yaml corpus.n_dialogues: expected an integer >= 1, got 0"])
    # The state Prefect's task engine hands to a retry condition: Failed(data=<the exception>).
    assert _retry_when_locked(None, None, Failed(data=locked)) is True
    assert _retry_when_locked(None, None, Failed(data=failed)) is False
    assert str(failed).endswith("last lines of its output:\nerror: params.yaml corpus.n_dialogues: expected an integer >= 1, got 0")


# --- Real runs -------------------------------------------------------------------------------

def git_head(project: Path) -> str:
    return subprocess.run(["git", "rev-parse", "HEAD"], cwd=project, capture_output=True, text=True, check=True).stdout.strip()


@pytest.mark.slow
def test_deploy_creates_the_scheduled_deployment_once(prefect_ui, prefect_api_url, project, capsys):
    from prefect.client.orchestration import get_client

    status, out, err = cli(capsys, "deploy", "--root", str(project), "--api-url", prefect_ui.url)
    assert (status, err) == (0, ""), err
    deployment_id = out.split("(", 1)[1].split(")", 1)[0]
    assert f"{prefect_ui.url}/deployments/deployment/{deployment_id}" in out
    assert "prefect worker start --pool askflow" in out and "askflow ui --worker" in out

    set_params(project, "retrain", {"deployment": "askflow-retrain-test", "schedule": {"cron": "30 4 * * 2", "timezone": "Europe/Berlin"}})
    status, out, _ = cli(capsys, "deploy", "--root", str(project), "--api-url", prefect_ui.api_url)
    other_id = out.split("(", 1)[1].split(")", 1)[0]
    status, out, _ = cli(capsys, "deploy", "--root", str(project), "--api-url", prefect_ui.api_url)
    assert status == 0 and out.split("(", 1)[1].split(")", 1)[0] == other_id != deployment_id  # same name: updated

    with get_client(sync_client=True) as client:
        deployment = client.read_deployment_by_name("retrain/askflow-retrain-test")
        pool = client.read_work_pool("askflow")
    assert str(deployment.id) == other_id
    assert [(s.schedule.cron, s.schedule.timezone, s.active) for s in deployment.schedules] == [("30 4 * * 2", "Europe/Berlin", True)]
    assert deployment.parameters == {"project_dir": str(project), "targets": ["corpus"], "metrics": "reports/eval.json"}
    assert deployment.entrypoint == "flows/retrain.py:retrain" and deployment.work_pool_name == "askflow"
    assert pool.type == "process"


@pytest.mark.slow
def test_the_retrain_flow_records_versions_outs_and_scores(prefect_api_url, project):
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import LogFilter, LogFilterFlowRunId

    from flows.retrain import retrain

    # The evaluate stage's metrics, as a finished pipeline would have them: embedded as they are.
    scores = {"success_rate": 0.75, "by_model": {"sft": {"clarification_rate": 0.5}}}
    (project / "reports").mkdir()
    (project / "reports" / "eval.json").write_text(json.dumps(scores))

    state = retrain(project_dir=str(project), targets=["corpus"], return_state=True)
    assert state.is_completed(), state.message
    record = state.result()
    records = sorted((project / "reports" / "retrain").glob("*.json"))
    assert len(records) == 1 and json.loads(records[0].read_text()) == record

    lock = yaml.safe_load((project / "dvc.lock").read_text())
    corpus_md5 = lock["stages"]["corpus"]["outs"][0]["md5"]
    assert record["git"] == {"commit": git_head(project), "dirty": False, "modified": []}
    assert record["params"]["sha256"] == hashlib.sha256((project / "params.yaml").read_bytes()).hexdigest()
    assert record["dvc_lock"]["md5"] == hashlib.md5((project / "dvc.lock").read_bytes()).hexdigest()
    assert record["stages"]["corpus"] == {"outs": {"data/raw/embedded_multiwoz": corpus_md5}, "changed": ["data/raw/embedded_multiwoz"], "ran": True}
    assert corpus_md5.endswith(".dir")
    assert record["metrics"] == {"path": "reports/eval.json", "values": scores}
    assert record["command"] == ["dvc", "repro", "corpus"] and record["project"] == str(project)
    assert record["run"]["id"] == str(state.state_details.flow_run_id) and record["run"]["deployment_id"] is None

    with get_client(sync_client=True) as client:
        flow_run_id = state.state_details.flow_run_id
        logs = client.read_logs(LogFilter(flow_run_id=LogFilterFlowRunId(any_=[flow_run_id])))
        artifact = client.read_latest_artifacts()
    messages = [log.message for log in logs]
    assert "Running stage 'corpus':" in messages  # dvc's own output, line by line, in the run log
    published = [a for a in artifact if a.key == "askflow-retrain"]
    assert published and corpus_md5 in published[0].data and "| success_rate | 0.75 |" in published[0].data

    # Unchanged inputs: dvc runs nothing, the record says so, the history grows by one line.
    again = retrain(project_dir=str(project), targets=["corpus"])
    assert again["stages"]["corpus"]["ran"] is False and again["stages"]["corpus"]["changed"] == []
    assert again["git"]["commit"] == record["git"]["commit"]
    history = (project / "reports" / "retrain" / "history.jsonl").read_text().splitlines()
    assert [json.loads(line)["run"]["id"] for line in history] == [record["run"]["id"], again["run"]["id"]]


@pytest.mark.slow
def test_a_failing_stage_fails_the_flow_run_with_dvc_output(prefect_api_url, project):
    from flows.retrain import retrain

    set_params(project, "corpus", {"n_dialogues": 0})
    state = retrain(project_dir=str(project), targets=["corpus"], return_state=True)
    assert state.is_failed()
    assert "`dvc repro corpus` failed with exit status" in state.message
    assert "error: params.yaml corpus.n_dialogues: expected an integer >= 1, got 0" in state.message
    assert "no outputs to restore" in state.message  # the first run: no earlier outputs
    assert not (project / "reports" / "retrain").exists()


@pytest.mark.slow
def test_a_stage_that_fails_after_a_good_run_leaves_its_last_good_outputs(prefect_api_url, project):
    from flows.retrain import retrain

    assert retrain(project_dir=str(project), targets=["corpus"], return_state=True).is_completed()
    out = project / "data" / "raw" / "embedded_multiwoz"
    good = {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()}
    assert good
    set_params(project, "corpus", {"n_dialogues": 0})  # DVC deletes the outs, then the stage fails
    state = retrain(project_dir=str(project), targets=["corpus"], return_state=True)
    assert state.is_failed()
    assert {p.relative_to(out): p.read_bytes() for p in sorted(out.rglob("*")) if p.is_file()} == good
    assert "restored the last good outputs of corpus: data/raw/embedded_multiwoz" in state.message
