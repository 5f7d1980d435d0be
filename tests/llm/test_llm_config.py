"""BackendConfig / ClientConfig / SamplingParams validation of params sections."""

from __future__ import annotations

import pytest

from pipelines.errors import ConfigError
from pipelines.llm import BackendConfig, ClientConfig, HFConfig, SamplingParams, backends_from_dict

SECTION = {
    "judge": {
        "backend": "openai",
        "base_url": "http://127.0.0.1:8000/v1",
        "model": "Qwen/Qwen2.5-7B-Instruct",
        "api_key_env": "OPENAI_API_KEY",
        "max_concurrency": 16,
        "price_in_per_1k": 0.15,
        "sampling": {"temperature": 0.2, "max_tokens": 64, "stop": "###", "extra_body": {"top_k": 20}},
    },
    "synthesizer": {"backend": "rules"},
}


def test_a_full_section_is_read_into_dataclasses():
    backends = backends_from_dict(SECTION)

    judge = backends["judge"]
    assert judge.kind == "openai" and judge.hf is None
    assert judge.client == ClientConfig(
        base_url="http://127.0.0.1:8000/v1",
        model="Qwen/Qwen2.5-7B-Instruct",
        api_key_env="OPENAI_API_KEY",
        max_concurrency=16,
        price_in_per_1k=0.15,
    )
    assert judge.sampling.stop == ("###",) and dict(judge.sampling.extra_body) == {"top_k": 20}
    assert judge.sampling.request_fields() == {"temperature": 0.2, "max_tokens": 64, "stop": ["###"]}
    assert backends["synthesizer"].kind == "rules" and backends["synthesizer"].client is None


@pytest.mark.parametrize(
    ("section", "message"),
    [
        ({"jduge": {"backend": "rules"}}, r"llm.jduge: unknown role 'jduge': no code path uses it"),
        ({"judge": {"backend": "gpt"}}, r"llm.judge.backend: expected one of \['rules', 'openai', 'hf'\]"),
        ({"judge": {}}, r"llm.judge: missing required key 'backend'"),
        ({"judge": {"backend": "openai", "model": "m"}}, r"llm.judge: missing required key 'base_url'"),
        ({"judge": {"backend": "rules", "model": "m"}}, r"llm.judge \(backend 'rules'\): unknown key\(s\) \['model'\]"),
        ({"judge": {"backend": "hf", "model_path": "m"}}, r"llm.judge.backend: 'hf' is not supported for role 'judge' \(no code path runs it\)"),
        ({"agent": {"backend": "rules"}}, r"llm.agent.backend: 'rules' is not supported for role 'agent'"),
        (
            {"judge": {"backend": "openai", "base_url": "http://h/v1", "model": "m", "max_concurrency": 0}},
            r"llm.judge.max_concurrency: expected an integer >= 1, got 0",
        ),
        (
            {"judge": {"backend": "openai", "base_url": "http://h/v1", "model": "m", "timeout_s": "10"}},
            r"llm.judge.timeout_s: expected a number, got '10'",
        ),
        (
            {"judge": {"backend": "openai", "base_url": "ftp://h", "model": "m"}},
            r"llm.judge.base_url: expected an http\(s\) URL",
        ),
        ({"judge": {"backend": "rules", "sampling": {"top_p": 1.5}}}, r"llm.judge.sampling.top_p: expected a number in \[0, 1\] or null, got 1.5"),
        ({"judge": {"backend": "rules", "sampling": {"temperature": True}}}, r"llm.judge.sampling.temperature"),
        ({"judge": {"backend": "rules", "sampling": {"seed": 1}}}, r"llm.judge.sampling: unknown key\(s\) \['seed'\]"),
        ({"judge": ["backend", "rules"]}, r"llm.judge: expected a mapping, got list"),
    ],
)
def test_errors_name_the_field_and_the_problem(section, message):
    with pytest.raises(ConfigError, match=message):
        backends_from_dict(section)


def test_credentials_in_configuration_are_refused_without_being_echoed():
    secret = "sk-live-do-not-print"
    with pytest.raises(ConfigError) as raised:
        BackendConfig.from_dict("judge", {"backend": "openai", "base_url": "http://h/v1", "model": "m", "api_key": secret})
    assert "api_key_env" in str(raised.value) and secret not in str(raised.value)

    with pytest.raises(ConfigError) as raised:
        ClientConfig(base_url=f"https://user:{secret}@host/v1", model="m")
    assert secret not in str(raised.value)


def test_programmatic_construction_is_validated_too():
    with pytest.raises(ConfigError, match="temperature: must be >= 0.0"):
        SamplingParams(temperature=-1)
    with pytest.raises(ConfigError, match="role"):
        BackendConfig(role="oracle", kind="rules")
    with pytest.raises(ConfigError, match="client configuration is required"):
        BackendConfig(role="judge", kind="openai")


def test_sampling_is_immutable_and_json_ready():
    sampling = SamplingParams(stop=["a", "b"], extra_body={"top_k": 5})
    assert sampling.stop == ("a", "b")
    with pytest.raises(TypeError):
        sampling.extra_body["top_k"] = 6  # type: ignore[index]
    assert sampling.as_dict()["extra_body"] == {"top_k": 5}


@pytest.mark.parametrize("role", ["teacher"])
def test_roles_without_a_code_path_are_refused_with_the_registry_named(role):
    # Each method adds its role to ROLE_BACKENDS with the code that calls it; until then the
    # configuration must not offer it.
    with pytest.raises(ConfigError, match=rf"llm.roles.{role}: unknown role '{role}': no code path uses it .*ROLE_BACKENDS"):
        backends_from_dict({role: {"backend": "rules"}}, "llm.roles")
    with pytest.raises(ConfigError, match="role"):
        BackendConfig(role=role, kind="rules")


def test_params_yaml_offers_only_roles_that_code_uses():
    import yaml
    from pathlib import Path

    from pipelines.llm.config import ROLE_BACKENDS

    params = yaml.safe_load((Path(__file__).resolve().parents[2] / "params.yaml").read_text(encoding="utf-8"))
    backends = backends_from_dict(params["llm"]["roles"], "params.yaml llm.roles")
    assert set(backends) <= set(ROLE_BACKENDS)
    # The hf loader (pipelines/llm/hf.py) runs the PIR teacher (token scores), the Learn-to-Ask
    # extractor and grader (stages/hindsight.py, stages/calibrate.py) and the τ-bench Clarifier.
    assert {role for role, kinds in ROLE_BACKENDS.items() if "hf" in kinds} == {"pir_teacher", "extractor", "grader", "clarifier"}
    with pytest.raises(ConfigError, match="hf"):
        BackendConfig(role="judge", kind="hf", hf=HFConfig(model_path="x"))
