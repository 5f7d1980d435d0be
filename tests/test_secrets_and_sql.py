"""No secret from params reaches a cache, dvc.lock or DVC's run cache; `askflow sql` is
read-only unless --write (issue 19, item 8)."""

from __future__ import annotations

import copy
import sys
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import yaml

from pipelines.errors import ConfigError
from tests.conftest import REPO, run_cli

# Not the session's canary key (that one must appear in no file at all): this one is
# written into the test projects' params.yaml on purpose.
FAKE_KEY = f"sk-proj-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    "section, location",
    [
        ({"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
          "sampling": {"extra_body": {"api_key": FAKE_KEY}}}, "llm.roles.judge.sampling.extra_body.api_key"),
        ({"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
          "sampling": {"extra_body": {"headers": {"Authorization": f"Bearer {FAKE_KEY}"}}}},
         "llm.roles.judge.sampling.extra_body.headers.Authorization"),
        ({"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m",
          "sampling": {"extra_body": {"chat_template_kwargs": {"notes": [1, FAKE_KEY]}}}},
         "llm.roles.judge.sampling.extra_body.chat_template_kwargs.notes[1]"),
        ({"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m", "api_key_env": FAKE_KEY},
         "llm.roles.judge.api_key_env"),
        ({"backend": "rules", "sampling": {"extra_body": {"x-api-key": "abc"}}}, "llm.roles.judge.sampling.extra_body.x-api-key"),
    ],
)
def test_a_secret_anywhere_in_a_role_is_refused_without_echoing_it(section, location):
    from pipelines.llm import BackendConfig

    with pytest.raises(ConfigError) as error:
        BackendConfig.from_dict("judge", section, "llm.roles.judge")
    assert str(error.value).startswith(f"{location}: looks like a secret")
    assert FAKE_KEY not in str(error.value)


_OPENAI = {"backend": "openai", "base_url": "http://127.0.0.1:9/v1", "model": "m"}


@pytest.mark.parametrize(
    "section, location",
    [
        ({**_OPENAI, "api_token": "plainvalue"}, "llm.roles.judge.api_token"),
        ({**_OPENAI, "sampling": {"extra_body": {"key": "plainvalue"}}}, "llm.roles.judge.sampling.extra_body.key"),
        ({**_OPENAI, "sampling": {"extra_body": {"bearer": "plainvalue"}}}, "llm.roles.judge.sampling.extra_body.bearer"),
        ({**_OPENAI, "sampling": {"extra_body": {"headers": {"Ocp-Apim-Subscription-Key": "plainvalue"}}}},
         "llm.roles.judge.sampling.extra_body.headers.Ocp-Apim-Subscription-Key"),
        ({**_OPENAI, "sampling": {"extra_body": {"headers": {"X-Request-Source": "plainvalue"}}}},
         "llm.roles.judge.sampling.extra_body.headers.X-Request-Source"),
        ({**_OPENAI, "headers": {"X-Anything": "plainvalue"}}, "llm.roles.judge.headers.X-Anything"),
        ({"backend": "rules", "sampling": {"extra_body": {"client_secret_id": "plainvalue"}}},
         "llm.roles.judge.sampling.extra_body.client_secret_id"),
        ({"backend": "rules", "sampling": {"extra_body": {"x_session_token": "plainvalue"}}},
         "llm.roles.judge.sampling.extra_body.x_session_token"),
    ],
)
def test_a_plain_credential_by_key_name_or_in_headers_is_refused(section, location):
    """Issue 28 item 5: values of no recognisable shape under credential-like keys, and any
    header value, used to be accepted and copied into dvc.lock and every cache record."""
    from pipelines.llm import BackendConfig

    with pytest.raises(ConfigError) as error:
        BackendConfig.from_dict("judge", section, "llm.roles.judge")
    assert str(error.value).startswith(f"{location}: looks like a secret")
    assert "plainvalue" not in str(error.value)


def test_params_refuse_headers_and_api_tokens_in_any_section(tmp_path):
    from catalog.io import read_params

    for section, location in [({"synthesizer": {"headers": {"Ocp-Apim-Subscription-Key": "plainvalue"}}},
                               "speaker.synthesizer.headers.Ocp-Apim-Subscription-Key"),
                              ({"synthesizer": {"api_token": "plainvalue"}}, "speaker.synthesizer.api_token")]:
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump({"speaker": section}))
        with pytest.raises(ConfigError, match=f"{location}: looks like a secret"):
            read_params("speaker", path)


def test_extra_body_reaches_the_server_but_the_cache_only_as_a_hash(server, tmp_path):
    """extra_body values are sent, but the cache key (and so every record) holds their hash."""
    from pipelines.llm import LLMClient, ResponseCache
    from pipelines.llm.config import ClientConfig, SamplingParams

    marker = f"custom-{uuid.uuid4().hex}"
    cache = ResponseCache(tmp_path / "cache")
    client = LLMClient(ClientConfig(base_url=server.base_url, model="m", max_retries=0), cache=cache)
    sampling = SamplingParams(extra_body={"routing_hint": marker})
    first = client.complete_sync([{"role": "user", "content": "hi"}], "judge", sampling, seed=1)
    assert first.ok and server.stats.bodies[-1]["routing_hint"] == marker
    records = list((tmp_path / "cache").rglob("*.json"))
    assert records and not [r for r in records if marker in r.read_text()], "extra_body written in clear"
    assert '"extra_body":"sha256:' in records[0].read_text()
    again = LLMClient(ClientConfig(base_url=server.base_url, model="m", max_retries=0), cache=cache)
    assert again.complete_sync([{"role": "user", "content": "hi"}], "judge", sampling, seed=1).cached
    other = SamplingParams(extra_body={"routing_hint": marker + "x"})
    assert not again.complete_sync([{"role": "user", "content": "hi"}], "judge", other, seed=1).cached


def test_sampling_built_in_code_refuses_a_secret_too():
    """extra_body is part of the response-cache key: a secret there would be cached."""
    from pipelines.llm.config import SamplingParams

    with pytest.raises(ConfigError, match=r"^extra_body.token: looks like a secret"):
        SamplingParams(extra_body={"token": FAKE_KEY})
    assert SamplingParams(extra_body={"top_k": 20, "max_tokens_per_turn": 3}).extra_body["top_k"] == 20


def test_ordinary_settings_are_not_mistaken_for_secrets():
    from pipelines.secrets import find_secret

    params = yaml.safe_load((REPO / "params.yaml").read_text())
    assert find_secret(params, "params.yaml") is None
    assert find_secret({"api_key_env": "OPENAI_API_KEY", "max_tokens": 5, "holdout": {"key": "dialogue_id"},
                        "hub_id": "Qwen/Qwen2.5-7B-Instruct", "task": "task-abcdefghijklmnopqrstu"}, "x") is None


def _params_with(tmp_path: Path, edit) -> Path:
    params = copy.deepcopy(yaml.safe_load((REPO / "params.yaml").read_text()))
    edit(params)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(params, sort_keys=False))
    return path


def test_evaluate_checks_every_llm_role_even_unused_ones(tmp_path, capsys):
    """The agenda simulator uses no role, but llm is a DVC param of evaluate: a secret in
    the unused judge role would be copied into dvc.lock, so the stage refuses to start."""
    from stages.evaluate import main

    def secret_in_judge(params):
        params["llm"]["roles"]["judge"] = {"backend": "rules", "sampling": {"extra_body": {"nested": {"api_key": FAKE_KEY}}}}

    with pytest.raises(SystemExit) as exit_:
        main(["--params", str(_params_with(tmp_path, secret_in_judge))])
    err = capsys.readouterr().err
    assert exit_.value.code == 1
    assert "llm.roles.judge.sampling.extra_body.nested.api_key: looks like a secret" in err
    assert FAKE_KEY not in err

    def typo_in_judge(params):
        params["llm"]["roles"]["judge"] = {"backend": "rules", "modle": "x"}

    with pytest.raises(SystemExit):
        main(["--params", str(_params_with(tmp_path, typo_in_judge))])
    assert "llm.roles.judge (backend 'rules'): unknown key(s) ['modle']" in capsys.readouterr().err


def test_llm_is_a_declared_param_of_evaluate():
    stages = yaml.safe_load((REPO / "dvc.yaml").read_text())["stages"]
    assert "llm" in stages["evaluate"]["params"]


@pytest.mark.slow
def test_a_secret_in_params_reaches_neither_dvc_lock_nor_the_run_cache(tmp_path):
    """A real `dvc repro speaker` with a key nested in the synthesizer's extra_body (rules
    backend: before the fix the stage ran, and DVC locked the key)."""
    from tests.test_dvc_pipeline import _run, pipeline_project

    def edit(params):
        params["corpus"]["n_dialogues"] = 20
        params["speaker"]["synthesizer"] = {"backend": "rules", "sampling": {"extra_body": {"auth": {"token": FAKE_KEY}}}}

    project = pipeline_project(tmp_path / "project", edit)
    result = _run([sys.executable, "-m", "dvc", "repro", "speaker"], project, check=False)
    assert result.returncode != 0
    assert "params.yaml speaker.synthesizer.sampling.extra_body.auth: looks like a secret" in result.stderr
    assert FAKE_KEY not in result.stdout + result.stderr
    # The whole project: dvc.lock, .dvc/cache (the run cache under runs/), data/, reports/.
    leaks = [p for p in project.rglob("*") if p.is_file() and p.name != "params.yaml" and FAKE_KEY.encode() in p.read_bytes()]
    assert not leaks, leaks
    runs = [p for p in project.glob(".dvc/cache/runs/**/*") if p.is_file()]
    assert runs and not [p for p in runs if b"stages.speaker" in p.read_bytes()]  # corpus ran; speaker never
    lock = yaml.safe_load((project / "dvc.lock").read_text()) if (project / "dvc.lock").exists() else {}
    assert "speaker" not in (lock or {}).get("stages", {})


# --- askflow sql ----------------------------------------------------------------------------


@pytest.fixture
def root(tmp_path: Path) -> Path:
    data = tmp_path / "data" / "processed"
    data.mkdir(parents=True)
    pq.write_table(pa.table({"dialogue_id": ["SNG01", "SNG02"], "split": ["train", "val"]}), data / "dialogues.parquet")
    return tmp_path


def _files(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in root.rglob("*") if p.is_file()}


@pytest.mark.parametrize(
    "query, expected",
    [
        ("COPY dialogues TO '{root}/out.csv'", "a COPY statement is not allowed"),
        ("COPY (SELECT 1 AS dialogue_id) TO '{root}/data/processed/dialogues.parquet'", "a COPY statement is not allowed"),
        ("SELECT * FROM read_csv('/etc/hostname')", "Permission Error"),
        ("SELECT * FROM read_text('/etc/hostname')", "Permission Error"),
        ("SELECT * FROM glob('/etc/*')", "Permission Error"),
        ("ATTACH '{root}/x.duckdb' AS x", "a ATTACH statement is not allowed"),
        ("INSTALL httpfs", "not allowed"),
        ("SET enable_external_access = true; SELECT 1", "a SET statement is not allowed"),
        ("SELECT 1; COPY dialogues TO '{root}/out.parquet'", "a COPY statement is not allowed"),
        ("CREATE TABLE t AS SELECT 1", "a CREATE statement is not allowed"),
    ],
)
def test_sql_is_read_only_by_default(root, capsys, query, expected):
    before = _files(root)
    status, out, err = run_cli(capsys, "sql", query.format(root=root), "--root", str(root))
    assert (status, out) == (1, ""), err
    assert expected in err and "Traceback" not in err
    assert _files(root) == before  # nothing written, nothing overwritten


def test_sql_reads_artifacts_and_inspects_them(root, capsys):
    for query in ("SELECT count(*) AS n FROM dialogues", "DESCRIBE dialogues", "SHOW TABLES",
                  "EXPLAIN SELECT * FROM dialogues", "WITH d AS (SELECT * FROM dialogues) SELECT count(*) FROM d"):
        status, out, err = run_cli(capsys, "sql", query, "--root", str(root))
        assert status == 0, (query, err)
    status, out, _ = run_cli(capsys, "sql", f"SELECT count(*) AS n FROM '{root}/data/processed/dialogues.parquet'",
                             "--root", str(root), "--format", "csv")
    assert (status, out) == (0, "n\n2\n")


def test_sql_write_opts_in(root, capsys):
    status, _, err = run_cli(capsys, "sql", f"COPY dialogues TO '{root}/out.csv'", "--root", str(root), "--write")
    assert status == 0, err
    assert (root / "out.csv").read_text().splitlines()[0] == "dialogue_id,split"
