"""Run profiles: named sets of ``params.yaml`` values, ``profiles/<name>.yaml``.

``params.yaml`` as committed is the default profile, the one ``make run`` runs (sized to finish
in about 20 minutes on 2 CPU cores). Another profile is a file of the same nesting that holds
only the values it changes; ``make run PROFILE=full`` (``python -m stages.run --profile
full``) writes them into ``params.yaml`` before ``dvc repro``, as ``dvc exp run -S`` would, so
DVC sees changed params and re-runs what they reach, and ``git diff params.yaml`` shows what
the profile set (``git checkout params.yaml`` returns to the default).

Mappings merge key by key; any other value (a list included) replaces the one in
``params.yaml``. A profile may only set keys that ``params.yaml`` has: a misspelt key is an
error naming the profile file and the key, and nothing is written.
"""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

from pipelines.errors import ConfigError

PROFILE_DIR = "profiles"


def profile_path(root: Path, name: str) -> Path:
    if not name or "/" in name or name.startswith("."):
        raise ConfigError(f"profile name {name!r}: a file name under {PROFILE_DIR}/, without .yaml")
    path = Path(root) / PROFILE_DIR / f"{name}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in (Path(root) / PROFILE_DIR).glob("*.yaml"))
        raise ConfigError(f"{path}: no such profile (known: {', '.join(known) or 'none'})")
    return path


def _yaml():
    from ruamel.yaml import YAML

    yaml = YAML()  # round trip: params.yaml keeps its comments and layout
    yaml.width = 4096
    yaml.preserve_quotes = True
    yaml.indent(mapping=2, sequence=4, offset=2)  # params.yaml's own block-list layout
    # null stays written as null (ruamel's default writes nothing after the colon)
    yaml.representer.add_representer(type(None), lambda rep, _: rep.represent_scalar("tag:yaml.org,2002:null", "null"))
    return yaml


def _like(old: Any, new: Any) -> Any:
    """``new`` in ``old``'s flow style where ``old`` was a flow list (``seeds: [0, 1, 2]``)."""
    from ruamel.yaml.comments import CommentedSeq

    if isinstance(new, list) and isinstance(old, CommentedSeq) and old.fa.flow_style():
        seq = CommentedSeq(new)
        seq.fa.set_flow_style()
        return seq
    return new


def merge(target: Any, overrides: Any, where: str, source: str) -> list[str]:
    """Write ``overrides`` into the mapping ``target`` in place; returns the dotted keys whose
    value changed. Every key must already be in ``target``.

    >>> params = {"train": {"steps": 400, "eval": {"n": 96}}}
    >>> merge(params, {"train": {"steps": 100}}, "", "p.yaml"), params
    (['train.steps'], {'train': {'steps': 100, 'eval': {'n': 96}}})
    >>> merge(params, {"train": {"step": 1}}, "", "p.yaml")
    Traceback (most recent call last):
    ...
    pipelines.errors.ConfigError: p.yaml: train.step: params.yaml has no such key (a profile only sets existing ones)
    """
    changed: list[str] = []
    if not isinstance(overrides, dict):
        raise ConfigError(f"{source}: {where or 'top level'}: a mapping of params.yaml keys, not {type(overrides).__name__}")
    for key, value in overrides.items():
        dotted = f"{where}.{key}" if where else str(key)
        if not isinstance(target, dict) or key not in target:
            raise ConfigError(f"{source}: {dotted}: params.yaml has no such key (a profile only sets existing ones)")
        if isinstance(value, dict) and isinstance(target[key], dict):
            changed += merge(target[key], value, dotted, source)
        elif target[key] != value:
            target[key] = _like(target[key], value)
            changed.append(dotted)
    return changed


def apply_profile(root: Path, name: str, params_file: str = "params.yaml") -> list[str]:
    """Write profile ``name``'s values into ``params_file`` (atomically); returns the dotted keys
    that changed (empty when ``params.yaml`` already holds the profile)."""
    source = profile_path(root, name)
    yaml = _yaml()
    try:
        overrides = yaml.load(source.read_text(encoding="utf-8"))
    except Exception as exc:  # ruamel's parser errors name line and column
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    target_path = Path(root) / params_file
    params = yaml.load(target_path.read_text(encoding="utf-8"))
    changed = merge(params, overrides or {}, "", str(source))
    if changed:
        buffer = io.StringIO()
        yaml.dump(params, buffer)
        tmp = target_path.with_name(f".{target_path.name}.profile-tmp")
        tmp.write_text(buffer.getvalue(), encoding="utf-8")
        os.replace(tmp, target_path)
    return changed
