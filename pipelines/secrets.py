"""Refuse secrets in configuration, at any depth.

Params are recorded everywhere: DVC copies a stage's params into ``dvc.lock`` and its run
cache, the LLM response cache keys on the sampling settings (``extra_body`` included), run
records and model cards quote them. A key written into params.yaml would therefore be copied
into all of these, so a secret is refused wherever it sits: by key name (``api_key``,
``Authorization``, ``token``, ... under any mapping, e.g. ``sampling.extra_body.headers``) or
by value (strings shaped like an API key or a bearer credential). The error names the
location, never the value.

>>> find_secret({"sampling": {"extra_body": {"top_k": 20}}}, "llm.judge") is None
True
>>> find_secret({"sampling": {"extra_body": {"headers": {"X-Api-Key": "x"}}}}, "llm.judge")
'llm.judge.sampling.extra_body.headers.X-Api-Key'
>>> find_secret({"stop": ["Bearer abcdefghijklmnop1234"]}, "s")
's.stop[0]'
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
    "proxyauthorization", "credentials", "privatekey", "cookie",
})
_SECRET_SUFFIXES = ("apikey", "accesstoken", "authtoken", "secret", "secretkey", "password")

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


def is_secret_name(key: str) -> bool:
    normalised = re.sub(r"[^a-z]", "", key.lower())
    return normalised in _SECRET_NAMES or normalised.endswith(_SECRET_SUFFIXES)


def find_secret(value: Any, where: str, _depth: int = 0) -> str | None:
    """The location (``where`` plus keys and indexes) of the first secret in ``value``, or
    None. Mappings, lists and tuples are searched to any depth."""
    if _depth > 100:  # a params file is not this deep; do not recurse forever on a cycle
        return None
    if isinstance(value, Mapping):
        for key, item in value.items():
            location = f"{where}.{key}"
            if isinstance(key, str) and is_secret_name(key) and item not in (None, "", {}, []):
                return location
            if isinstance(key, str) and _SECRET_VALUE.search(key):
                return f"{where}.<key>"
            found = find_secret(item, location, _depth + 1)
            if found:
                return found
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            found = find_secret(item, f"{where}[{index}]", _depth + 1)
            if found:
                return found
    elif isinstance(value, str) and _SECRET_VALUE.search(value):
        return where
    return None


def refuse_secrets(value: Any, where: str) -> None:
    """ConfigError naming where a secret sits in ``value`` (but not the secret)."""
    location = find_secret(value, where)
    if location is not None:
        raise ConfigError(
            f"{location}: looks like a secret (an API key, token or credential); secrets are not "
            "accepted in configuration, which is copied into dvc.lock, DVC's run cache and the LLM "
            "response cache. Set the key in an environment variable and name it with api_key_env"
        )


__all__ = ["find_secret", "is_secret_name", "refuse_secrets"]
