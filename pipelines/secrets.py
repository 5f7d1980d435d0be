"""Refuse secrets in configuration, at any depth.

Params are recorded everywhere: DVC copies a stage's params into ``dvc.lock`` and its run
cache, the LLM response cache keys on the sampling settings (``extra_body`` included), run
records and model cards quote them. A key written into params.yaml would therefore be copied
into all of these, so a secret is refused wherever it sits: by key name (``api_key``,
``Authorization``, ``token``, ``api_token``, ``bearer``, ... under any mapping), by place (every
value under a ``headers`` mapping: an HTTP header in configuration is a credential more often
than not) or by value (strings shaped like an API key or a bearer credential). An LLM role's
configuration (``strict``) also refuses any key whose name merely looks like a credential
(``key``, ``Ocp-Apim-Subscription-Key``, ``*_token``, ``*secret*``, ...): no setting of a role
has such a name, and a plain value under one is not recognisable by its shape. The error
names the location, never the value.

>>> find_secret({"sampling": {"extra_body": {"top_k": 20}}}, "llm.judge") is None
True
>>> find_secret({"sampling": {"extra_body": {"headers": {"X-Api-Key": "x"}}}}, "llm.judge")
'llm.judge.sampling.extra_body.headers.X-Api-Key'
>>> find_secret({"stop": ["Bearer abcdefghijklmnop1234"]}, "s")
's.stop[0]'
>>> find_secret({"headers": {"Ocp-Apim-Subscription-Key": "x"}}, "llm.judge")
'llm.judge.headers.Ocp-Apim-Subscription-Key'
>>> find_secret({"api_token": "x"}, "llm.judge"), find_secret({"bearer": "x"}, "llm.judge")
('llm.judge.api_token', 'llm.judge.bearer')
>>> find_secret({"holdout": {"key": "dialogue_id"}}, "train") is None
True
>>> find_secret({"sampling": {"extra_body": {"key": "x"}}}, "llm.judge", strict=True)
'llm.judge.sampling.extra_body.key'
"""

from __future__ import annotations

import re
from typing import Any, Mapping

from pipelines.errors import ConfigError

# Key names (lower case, letters only) that hold credentials. ``api_key_env`` (the *name* of
# an environment variable) and token counts such as ``max_tokens`` are not among them.
_SECRET_NAMES = frozenset({
    "apikey", "xapikey", "token", "accesstoken", "authtoken", "bearertoken", "sessiontoken", "refreshtoken",
    "idtoken", "secret", "secretkey", "clientsecret", "password", "passwd", "authorization", "auth",
    "proxyauthorization", "credentials", "privatekey", "cookie", "apitoken", "bearer", "credential",
    "subscriptionkey", "passphrase",
})
_SECRET_SUFFIXES = ("apikey", "accesstoken", "authtoken", "apitoken", "secret", "secretkey", "password", "subscriptionkey")
# Every value under a mapping of this name is refused (HTTP headers carry credentials).
_HEADER_NAMES = frozenset({"headers", "httpheaders", "extraheaders", "defaultheaders"})
# strict (LLM role configurations): names that merely look like a credential. ``api_key_env``
# names an environment variable and is allowed; token *counts* (``max_tokens``) end in "tokens".
_STRICT_SECRET = re.compile(r"(key|token|bearer)$|secret|passw|credential|auth|cookie|signature")
_STRICT_ALLOWED = frozenset({"apikeyenv"})

# Values shaped like the credentials of common providers, or an HTTP credential.
_SECRET_VALUE = re.compile(
    r"""
    \b(?:sk|pk|rk)-[A-Za-z0-9_-]{16,}      # OpenAI, Anthropic and alike
    | \bhf_[A-Za-z0-9]{20,}                # Hugging Face
    | \bgh[pousr]_[A-Za-z0-9]{20,}         # GitHub
    | \bxox[abprs]-[A-Za-z0-9-]{10,}       # Slack
    | \bAKIA[0-9A-Z]{16}\b                 # AWS access key id
    | \bAIza[0-9A-Za-z_-]{30,}             # Google
    | \b(?:Bearer|Basic)\s+[A-Za-z0-9._~+/=-]{8,}
    """,
    re.VERBOSE,
)


def is_secret_name(key: str, strict: bool = False) -> bool:
    normalised = re.sub(r"[^a-z]", "", key.lower())
    if normalised in _SECRET_NAMES or normalised.endswith(_SECRET_SUFFIXES):
        return True
    return strict and normalised not in _STRICT_ALLOWED and _STRICT_SECRET.search(normalised) is not None


def _empty(value: Any) -> bool:
    return value is None or (isinstance(value, (str, Mapping, list, tuple)) and not value)


def find_secret(value: Any, where: str, _depth: int = 0, *, strict: bool = False) -> str | None:
    """The location (``where`` plus keys and indexes) of the first secret in ``value``, or
    None. Mappings, lists and tuples are searched to any depth. ``strict``: the rules of an
    LLM role's configuration (module docstring)."""
    if _depth > 100:  # a params file is not this deep; do not recurse forever on a cycle
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            location = f"{where}.{key}"
            if isinstance(key, str) and is_secret_name(key, strict) and not _empty(item):
                return location
            if isinstance(key, str) and _SECRET_VALUE.search(key):
                return f"{where}.<key>"
            if isinstance(key, str) and re.sub(r"[^a-z]", "", key.lower()) in _HEADER_NAMES and not _empty(item):
                if isinstance(item, Mapping):
                    header = next((name for name, v in item.items() if not _empty(v)), None)
                    if header is not None:
                        return f"{location}.{header}"
                else:
                    return location
            found = find_secret(item, location, _depth + 1, strict=strict)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_secret(item, f"{where}[{index}]", _depth + 1, strict=strict)
            if found:
                return found
    elif isinstance(value, str) and _SECRET_VALUE.search(value):
        return where
    return None


def refuse_secrets(value: Any, where: str, *, strict: bool = False) -> None:
    """ConfigError naming where a secret sits in ``value`` (but not the secret)."""
    location = find_secret(value, where, strict=strict)
    if location is not None:
        raise ConfigError(
            f"{location}: looks like a secret (an API key, token or credential); secrets are not "
            "accepted in configuration, which is copied into dvc.lock, DVC's run cache and the LLM "
            "response cache. Set the key in an environment variable and name it with api_key_env"
        )


__all__ = ["find_secret", "is_secret_name", "refuse_secrets"]
