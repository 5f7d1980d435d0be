"""Configuration of the LLM backends, as dataclasses validated from a params section.

Each role of the pipeline picks its own backend::

    llm:
      judge:
        backend: openai
        base_url: http://127.0.0.1:8000/v1
        model: Qwen/Qwen2.5-7B-Instruct
        api_key_env: OPENAI_API_KEY      # the *name* of the variable; never the key itself
        max_concurrency: 8
        sampling: {temperature: 0.0, max_tokens: 256}
      synthesizer:
        backend: rules

Only the roles some code path calls are accepted (:data:`ROLE_BACKENDS`), each with the
backends that code supports: a method that calls a new role (an extractor, a grader, a
teacher) adds it there, with its code; until then the configuration refuses it.

``backends_from_dict(section)`` turns such a section into ``{role: BackendConfig}``. The library
never reads params.yaml itself: the caller hands over the already-parsed mapping, and ``where``
says where it came from so that errors point at the right place.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field, fields
from types import MappingProxyType
from typing import Any, Callable, Literal, Mapping, TypeVar
from urllib.parse import urlsplit

from pipelines.config import positive_int, rate
from pipelines.errors import ConfigError
from pipelines.secrets import refuse_secrets

BACKEND_KINDS: tuple[str, ...] = ("rules", "openai", "hf")

#: Every role a code path uses, with the backends that code accepts. ``hf`` (a local
#: transformers model, :class:`pipelines.llm.hf.HFBackend`) is the extractor's only: the
#: evaluated policies load their models through ``evaluate.models``, not through a role.
ROLE_BACKENDS: Mapping[str, tuple[str, ...]] = MappingProxyType({
    "synthesizer": ("rules", "openai"),  # SpeakER synthesis (stages/speaker.py)
    "user_simulator": ("rules", "openai"),  # rules: the agenda simulator; openai: goal_llm / guide_llm
    "judge": ("rules", "openai"),  # rules: the verifiable judge; openai: the LLM clarification judge
    # The policy under evaluation when it sits behind an endpoint (the openai agent); its
    # calls are accounted apart from the helper roles above.
    "agent": ("openai",),
    # PIR (stage pir_augment): the teacher whose token log-probabilities score reasoning steps,
    # and the model that writes the inserted question and simulated answer.
    "pir_teacher": ("hf",),
    "pir_inserter": ("rules", "openai"),
    # Learn-to-Ask hindsight (stages/hindsight.py): rules reads the source's annotations; hf / openai
    # run the paper's extractor prompt.
    "extractor": ("rules", "openai", "hf"),
    # Learn-to-Ask content grades: rules (the l2a reward, verifiable against I*_t); hf / openai run
    # appendix G's grading prompt (stages/calibrate.py calibrates it).
    "grader": ("rules", "openai", "hf"),
    # Auto-Prompt (stages/calibrate.py): rules mutates prompts deterministically.
    "prompt_proposer": ("rules",),
    # The τ-bench Clarifier (pipelines/clarifier; stages/clarifier_data.py teacher, stages/clarifier_eval.py):
    # rules: task-grounded offline; openai: the paper's prompt at an endpoint; hf: a local (trained) model.
    "clarifier": ("rules", "openai", "hf"),
})
ROLES: tuple[str, ...] = tuple(ROLE_BACKENDS)
STRUCTURED_OUTPUT_MODES: tuple[str, ...] = ("auto", "prompt")

T = TypeVar("T")


# ---------------------------------------------------------------------------
# small validation helpers: each names the offending field and what was expected
# ---------------------------------------------------------------------------


def _check_mapping(value: Any, where: str) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(f"{where}: expected a mapping, got {type(value).__name__}")
    return value


def _check_keys(section: Mapping[str, Any], allowed: set[str], where: str) -> None:
    unknown = sorted(set(section) - allowed)
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: {sorted(allowed)}")


def _number(value: Any, where: str, *, minimum: float | None = None) -> float:
    # bool is an int subclass; `temperature: true` is a typo, not 1.0.
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"{where}: expected a number, got {value!r}")
    if minimum is not None and value < minimum:
        raise ConfigError(f"{where}: must be >= {minimum}, got {value!r}")
    return float(value)


def _string(value: Any, where: str) -> str:
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(f"{where}: expected a non-empty string, got {value!r}")
    return value


def _choice(value: Any, choices: tuple[str, ...], where: str) -> str:
    if value not in choices:
        raise ConfigError(f"{where}: expected one of {list(choices)}, got {value!r}")
    return value


def _prefixed(where: str, build: Callable[[], T]) -> T:
    """Run a constructor whose validation names bare field names, and anchor those names at the
    params location: "top_p: ..." becomes "llm.judge.sampling.top_p: ..."."""
    try:
        return build()
    except ConfigError as exc:
        raise ConfigError(f"{where}.{exc}") from None


# ---------------------------------------------------------------------------
# SamplingParams
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class SamplingParams:
    """Sampling parameters, sent as given (``None`` fields are not sent at all, so that servers
    which reject unknown or unsupported fields, like ``transformers serve``, are not provoked).

    ``extra_body`` carries server-specific parameters (vLLM's ``top_k``, ``min_p``, ...) through
    the OpenAI client unchanged. Everything here is part of the response-cache key."""

    temperature: float = 0.0
    top_p: float | None = None
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    extra_body: Mapping[str, Any] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        # Programmatic construction is validated like from_dict, so a bad value cannot slip in.
        _number(self.temperature, "temperature", minimum=0.0)
        rate(self.top_p, "top_p", optional=True)
        positive_int(self.max_tokens, "max_tokens")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise ConfigError(f"stop: expected a list of strings, got {self.stop!r}")
        for penalty in ("presence_penalty", "frequency_penalty"):
            if getattr(self, penalty) is not None:
                _number(getattr(self, penalty), penalty)
        # Normalise to immutable values: the params are shared between concurrent calls.
        object.__setattr__(self, "stop", tuple(self.stop))
        object.__setattr__(self, "extra_body", MappingProxyType(dict(_check_mapping(self.extra_body, "extra_body"))))
        refuse_secrets(dict(self.extra_body), "extra_body", strict=True)  # sent with every request

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    def as_dict(self) -> dict[str, Any]:
        """Every field, plain JSON values: what the cache key and the run records hold."""
        return {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "max_tokens": self.max_tokens,
            "stop": list(self.stop),
            "presence_penalty": self.presence_penalty,
            "frequency_penalty": self.frequency_penalty,
            "extra_body": dict(self.extra_body),
        }

    def key_dict(self) -> dict[str, Any]:
        """``as_dict()`` as the response-cache key holds it: ``extra_body``, when set, only as
        the sha256 of its canonical JSON, so that its values (a server's custom parameters,
        which may carry what no check recognises as a secret) are never written in clear into
        a cache key or record. An empty ``extra_body`` stays ``{}``, keeping the keys of
        every other call as they were.

        >>> SamplingParams(extra_body={"top_k": 20}).key_dict()["extra_body"]
        'sha256:176a4381cf64c185af602bd9ed7aec5d929994f6c57bf1c8463def3c3d90eb7b'
        """
        fields_ = self.as_dict()
        if fields_["extra_body"]:
            canonical = json.dumps(fields_["extra_body"], sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
            fields_["extra_body"] = "sha256:" + hashlib.sha256(canonical.encode("utf-8")).hexdigest()
        return fields_

    def request_fields(self) -> dict[str, Any]:
        """The standard OpenAI request fields that are set; ``extra_body`` travels separately."""
        sent = {"temperature": self.temperature, "max_tokens": self.max_tokens}
        if self.top_p is not None:
            sent["top_p"] = self.top_p
        if self.stop:
            sent["stop"] = list(self.stop)
        if self.presence_penalty is not None:
            sent["presence_penalty"] = self.presence_penalty
        if self.frequency_penalty is not None:
            sent["frequency_penalty"] = self.frequency_penalty
        return sent

    @classmethod
    def from_dict(cls, section: Any, where: str = "sampling") -> "SamplingParams":
        section = _check_mapping(section, where)
        _check_keys(section, {f.name for f in fields(cls)}, where)
        stop = section.get("stop", ())
        if isinstance(stop, str):
            stop = (stop,)
        if not isinstance(stop, (list, tuple)) or not all(isinstance(s, str) for s in stop):
            raise ConfigError(f"{where}.stop: expected a string or a list of strings, got {stop!r}")
        return _prefixed(where, lambda: cls(**{**section, "stop": tuple(stop)}))


# ---------------------------------------------------------------------------
# ClientConfig: one OpenAI-compatible endpoint
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class ClientConfig:
    """How to reach and use one OpenAI-compatible endpoint (OpenAI, vLLM, Ollama, transformers serve).

    ``api_key_env`` names the environment variable holding the key; None for servers without
    authentication. ``timeout_s`` bounds every single HTTP request. A failed request is retried
    up to ``max_retries`` times, waiting a random time in [0, min(backoff_max_s,
    backoff_base_s * 2**k)] before retry k ("full jitter"). ``repair_retries`` bounds the extra
    requests spent on replies that do not validate against the requested JSON schema.

    ``structured_output``: "auto" sends the schema as ``response_format`` and falls back to
    prompt instructions if the server rejects it; "prompt" always uses prompt instructions, for
    servers that silently ignore ``response_format`` (``transformers serve`` does).
    ``server_side_n``: ask the server for ``n`` choices in one request; when it rejects ``n`` or
    answers fewer choices, the client falls back to one request per seed by itself.
    """

    base_url: str
    model: str
    api_key_env: str | None = None
    max_concurrency: int = 8
    timeout_s: float = 60.0
    max_retries: int = 4
    backoff_base_s: float = 0.5
    backoff_max_s: float = 30.0
    repair_retries: int = 1
    price_in_per_1k: float = 0.0
    price_out_per_1k: float = 0.0
    structured_output: Literal["auto", "prompt"] = "auto"
    server_side_n: bool = True

    def __post_init__(self) -> None:
        _string(self.base_url, "base_url")
        parts = urlsplit(self.base_url)
        if parts.username or parts.password or parts.query:
            # Credentials in the URL would end up in cache keys and logs; the message must not
            # repeat the URL for the same reason (hence this check comes first).
            raise ConfigError(
                "base_url: must not contain credentials or a query string; "
                "put the key in an environment variable and name it with api_key_env"
            )
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ConfigError(f"base_url: expected an http(s) URL, got {self.base_url!r}")
        _string(self.model, "model")
        if self.api_key_env is not None:
            _string(self.api_key_env, "api_key_env")
        positive_int(self.max_concurrency, "max_concurrency")
        _number(self.timeout_s, "timeout_s", minimum=0.001)
        positive_int(self.max_retries, "max_retries", minimum=0)
        _number(self.backoff_base_s, "backoff_base_s", minimum=0.0)
        _number(self.backoff_max_s, "backoff_max_s", minimum=0.0)
        positive_int(self.repair_retries, "repair_retries", minimum=0)
        _number(self.price_in_per_1k, "price_in_per_1k", minimum=0.0)
        _number(self.price_out_per_1k, "price_out_per_1k", minimum=0.0)
        _choice(self.structured_output, STRUCTURED_OUTPUT_MODES, "structured_output")
        if not isinstance(self.server_side_n, bool):
            raise ConfigError(f"server_side_n: expected true or false, got {self.server_side_n!r}")

    @property
    def endpoint(self) -> str:
        """The base URL in one canonical spelling, as used in cache keys."""
        return self.base_url.rstrip("/")

    @classmethod
    def from_dict(cls, section: Any, where: str = "client") -> "ClientConfig":
        section = _check_mapping(section, where)
        _check_keys(section, {f.name for f in fields(cls)}, where)
        for required in ("base_url", "model"):
            if required not in section:
                raise ConfigError(f"{where}: missing required key {required!r}")
        return _prefixed(where, lambda: cls(**section))


# ---------------------------------------------------------------------------
# HFConfig: a local transformers model
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class HFConfig:
    """A local transformers model: directory (or hub id already in the local cache), device,
    dtype ("auto" keeps the checkpoint's) and the largest batch one forward pass may take."""

    model_path: str
    device: str = "cpu"
    dtype: str = "auto"
    batch_size: int = 8

    def __post_init__(self) -> None:
        _string(self.model_path, "model_path")
        _string(self.device, "device")
        _string(self.dtype, "dtype")
        positive_int(self.batch_size, "batch_size")

    @classmethod
    def from_dict(cls, section: Any, where: str = "hf") -> "HFConfig":
        section = _check_mapping(section, where)
        _check_keys(section, {f.name for f in fields(cls)}, where)
        if "model_path" not in section:
            raise ConfigError(f"{where}: missing required key 'model_path'")
        return _prefixed(where, lambda: cls(**section))


# ---------------------------------------------------------------------------
# BackendConfig: one role's choice
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class BackendConfig:
    """The backend one role uses: ``rules`` (implemented elsewhere), ``openai`` (``client`` is
    set) or ``hf`` (``hf`` is set); ``sampling`` is the role's default sampling."""

    role: str
    kind: Literal["rules", "openai", "hf"]
    sampling: SamplingParams = field(default_factory=SamplingParams)
    client: ClientConfig | None = None
    hf: HFConfig | None = None

    def __post_init__(self) -> None:
        _choice(self.role, ROLES, "role")
        _choice(self.kind, ROLE_BACKENDS[self.role], f"{self.role}.backend")
        if (self.kind == "openai") != (self.client is not None):
            raise ConfigError(f"{self.role}: a client configuration is required for, and only for, backend 'openai'")
        if (self.kind == "hf") != (self.hf is not None):
            raise ConfigError(f"{self.role}: an hf configuration is required for, and only for, backend 'hf'")

    @classmethod
    def from_dict(cls, role: str, section: Any, where: str | None = None) -> "BackendConfig":
        """Validate one role's section. Client/HF keys sit flat next to ``backend`` and
        ``sampling``; keys that do not belong to the chosen backend are errors, not ignored."""
        where = where or role
        if role not in ROLES:
            raise ConfigError(f"{where}: {_unknown_role(role)}")
        section = _check_mapping(section, where)
        # Anywhere in the section (sampling.extra_body too), before any of it reaches a cache
        # key or a record; the message names the place, not the value. Strict: any value under
        # a credential-like key name (``key``, ``api_token``, ``bearer``) or in ``headers``.
        refuse_secrets(section, where, strict=True)
        if "backend" not in section:
            raise ConfigError(f"{where}: missing required key 'backend' (one of {list(BACKEND_KINDS)})")
        kind = _choice(section["backend"], BACKEND_KINDS, f"{where}.backend")
        if kind not in ROLE_BACKENDS[role]:
            raise ConfigError(
                f"{where}.backend: {kind!r} is not supported for role {role!r} (no code path runs it); "
                f"expected one of {list(ROLE_BACKENDS[role])}"
            )
        sampling = SamplingParams.from_dict(section.get("sampling", {}), f"{where}.sampling")
        rest = {k: v for k, v in section.items() if k not in ("backend", "sampling")}
        if kind == "rules":
            _check_keys(rest, set(), f"{where} (backend 'rules')")
            return cls(role=role, kind="rules", sampling=sampling)
        if kind == "openai":
            return cls(role=role, kind="openai", sampling=sampling, client=ClientConfig.from_dict(rest, where))
        return cls(role=role, kind="hf", sampling=sampling, hf=HFConfig.from_dict(rest, where))


def _unknown_role(role: str) -> str:
    return (f"unknown role {role!r}: no code path uses it (a method that calls a role adds it to "
            f"pipelines/llm/config.py ROLE_BACKENDS); roles: {list(ROLES)}")


def backends_from_dict(section: Any, where: str = "llm") -> dict[str, BackendConfig]:
    """``{role: BackendConfig}`` for every role named in the section; a role no code path
    uses, or a backend its code does not support, is an error."""
    section = _check_mapping(section, where)
    for role in section:
        if role not in ROLES:
            raise ConfigError(f"{where}.{role}: {_unknown_role(role)}")
    return {role: BackendConfig.from_dict(role, sub, f"{where}.{role}") for role, sub in section.items()}
