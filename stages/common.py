"""What several stages share: process set-up (OpenMP threads, Prefect's offline defaults),
the ``policy`` switch of params.yaml and the ``judge`` role's backend. Every stage may import
this module and :mod:`stages.entry`; no stage imports another (``tests/test_layers.py``)."""

from __future__ import annotations

import argparse
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

from catalog.io import read_params
from pipelines.config import from_params
from pipelines.errors import ConfigError
from pipelines.llm import BackendConfig
from pipelines.training.config import POLICY_DIRS, policy_model

# --- Process set-up --------------------------------------------------------------------------


def configure_threads() -> None:
    """Idle OpenMP threads sleep instead of spinning: on a shared CPU a spinning thread
    waits for a core another process holds, and a small model's many short parallel
    regions then run several times slower. Set before torch is imported."""
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def configure_prefect(root: Path) -> None:
    """Offline defaults: a repo-local Prefect home (unless one is set), no telemetry, and the
    library's own log lines (``pipelines.*``) in the flow run's log."""
    os.environ.setdefault("PREFECT_HOME", str(root / ".prefect"))
    os.environ.setdefault("PREFECT_SERVER_ANALYTICS_ENABLED", "false")
    os.environ.setdefault("PREFECT_LOGGING_EXTRA_LOGGERS", "pipelines")
    os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")


# --- The policy switch (params.yaml ``policy``) ----------------------------------------------

@dataclass(frozen=True)
class PolicyParams:
    """params.yaml ``policy``: ``use`` (``base``, ``smollm2`` or a hub id), ``dir`` (the local
    directory it reads, DVC's dependency: ``models/base`` for a hub id; None: that one),
    ``lora`` and ``optim`` (given to the methods' ``model.lora`` and ``optim``, which read them)."""

    use: str = "base"
    dir: str | None = None
    lora: Any = None
    optim: Any = None


def policy_params(policy: Mapping[str, Any]) -> PolicyParams:
    """params.yaml ``policy``, checked: ``dir``, where given, must be ``use``'s."""
    config = from_params(PolicyParams, policy, "params.yaml policy")
    expected = POLICY_DIRS.get(config.use, POLICY_DIRS["base"])
    if "dir" in policy and config.dir != expected:
        raise ConfigError(f"params.yaml policy.dir: {config.dir!r} does not go with use: {config.use!r}; set dir: {expected}")
    return config


def check_policy(policy: Mapping[str, Any]) -> str:
    """params.yaml ``policy`` checked (:func:`policy_params`). Returns ``use``."""
    return policy_params(policy).use


def policy_source(use: str) -> dict[str, Any]:
    """Where the starting policy ``use`` is read from, as a model section's keys: the typed
    :func:`~pipelines.training.config.policy_model`'s ``path`` or ``hub_id`` (training's
    ``model`` and evaluation's ``models.base`` take the same keys)."""
    spec = policy_model(use)
    return {"path": spec.path} if spec.local else {"path": None, "hub_id": spec.hub_id}


def apply_policy(section: Mapping[str, Any], method: str, policy: Mapping[str, Any]) -> dict[str, Any]:
    """A method's params with the policy switch applied: other than ``base``, SFT starts
    from the policy, every method without its own ``lora`` gets ``policy.lora`` and
    ``policy.optim`` overrides the method's optim keys (e.g. a LoRA learning rate)."""
    config = policy_params(policy)
    use = config.use
    section = dict(section)
    if use == "base":
        return section
    model = dict(section.get("model") or {})
    if method == "sft":
        model = {key: value for key, value in model.items() if key not in ("path", "hub_id", "revision")}
        model.update(policy_source(use))
    if "lora" not in model and config.lora is not None:
        model["lora"] = config.lora
    section["model"] = model
    section["optim"] = {**(section.get("optim") or {}), **(config.optim or {})}
    return section


def with_policy(params: Mapping[str, Any], policy: Mapping[str, Any] | None) -> dict[str, Any]:
    """``evaluate`` params whose ``base`` model (the starting policy) is the one params.yaml
    ``policy.use`` names: ``base`` keeps it, ``smollm2`` or a hub id replaces it."""
    params = dict(params)
    use = check_policy(policy) if policy else "base"
    models = dict(params.get("models") or {})
    if use != "base" and "base" in models:
        entry = {key: value for key, value in dict(models["base"]).items() if key not in ("path", "hub_id", "revision")}
        entry.update({key: value for key, value in policy_source(use).items() if value is not None})  # ModelEntry's path defaults to None
        models["base"] = entry
        params["models"] = models
    return params


# --- Tables across training seeds (issue 28) --------------------------------------------------


def evaluation_parser(prog: str, description: str, name: str) -> argparse.ArgumentParser:
    """An evaluation stage's command line: ``--params`` and ``--seeds-table NAME`` (its stage
    ``name`` of the seeds profile evaluates params.yaml ``name.models`` and writes outputs
    named NAME; :func:`for_seeds_table`)."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--seeds-table", default=None, metavar="NAME",
                        help=f"stage {name}: {name}.models (rows over training seeds), outputs named NAME")
    return parser


def for_seeds_table(section: Mapping[str, Any], args: argparse.Namespace, name: str, output: Mapping[str, Any],
                    models_key: str = "models") -> dict[str, Any]:
    """``section`` as parsed, or with ``--seeds-table`` that table's section
    (:func:`seeds_table_section` of params.yaml ``name``)."""
    if args.seeds_table is None:
        return dict(section)
    return seeds_table_section(section, read_params(name, args.params), args.seeds_table, name, output, models_key)


def seeds_table_section(section: Mapping[str, Any], seeds: Mapping[str, Any], table: str, name: str,
                        output: Mapping[str, Any], models_key: str = "models") -> dict[str, Any]:
    """An evaluation section for table ``table`` of the switch section ``seeds`` (params.yaml
    ``name``: ``tables``, the tables the seeds profile switches on, and ``models``, rows that
    may list one model per training seed): ``section`` with those models under ``models_key``
    and ``output`` (paths with ``{table}``) written over its outputs.

    >>> seeds_table_section({"split": "test", "models": {"base": "b"}}, {"tables": ["t"], "models": {"sft": ["s", "s_s1"]}},
    ...                     "t", "x_seeds", {"output": {"metrics": "reports/{table}.json"}})
    {'split': 'test', 'models': {'sft': ['s', 's_s1']}, 'output': {'metrics': 'reports/t.json'}}
    """
    where = f"params.yaml {name}"
    unknown = sorted(set(seeds) - {"tables", "models"})
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {unknown}; allowed: ['models', 'tables']")
    if table not in (seeds.get("tables") or []):
        raise ConfigError(f"{where}.tables: {table!r} is not one of them ({seeds.get('tables')})")
    if not table or not table.replace("_", "").isalnum():
        raise ConfigError(f"{where}.tables: {table!r}: a file name of letters, digits and _")

    def named(value: Any) -> Any:
        return {k: named(v) for k, v in value.items()} if isinstance(value, Mapping) else value.format(table=table)

    return {**section, models_key: seeds.get("models"), **named(output)}


# --- The judge role --------------------------------------------------------------------------


def judge_backend(llm: Mapping[str, Any] | None) -> BackendConfig | None:
    """The ``judge`` role's backend from params.yaml ``llm.roles.judge`` (for LLM-judged GRPO
    rewards); None without one."""
    roles = (llm or {}).get("roles") or {}
    if "judge" not in roles:
        return None
    return BackendConfig.from_dict("judge", roles["judge"], "params.yaml llm.roles.judge")
