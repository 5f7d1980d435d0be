"""DVC stages ``train_sft``, ``train_dpo``, ``train_kto``, ``train_grpo``: one Prefect flow
run each (:mod:`flows.train`).

    python -m stages.train sft|dpo|kto|grpo [--section NAME] [--seed N [--start DIR]] [--params params.yaml]

``--section`` trains ``method`` with another section of ``train`` (default: the method's
own), e.g. ``train_josh_sft`` is ``sft --section josh_sft`` and ``train_josh_kto`` is
``kto --section josh_kto``: the same flow on the JOSH harvest, with its own model, data and
outputs. ``--seed N`` trains the section again under training seed N (``optim.seed``; every
output path gets the suffix ``_s<N>``, :func:`pipelines.training.config.with_training_seed`),
``--start DIR`` from another start model (GRPO of seed N from SFT's ``models/..._s<N>``):
Learn-to-Ask's ``train_l2a_*_seeds`` stages.

params.yaml ``train``:

* ``holdout``: ``{key, split_column, split, fraction, salt}``, shared by every method so
  that the same dialogues (the corpus val split) are held out everywhere (:class:`pipelines.training.config.HoldoutSpec`);
* one section per method, ``sft`` / ``dpo`` / ``kto`` / ``grpo``, each with
  ``model`` (``{path: models/base}`` or ``{hub_id: ..., revision: ...}``, optional
  ``lora: {r, alpha, dropout, target_modules, merge}`` and ``quantization: {quant_type,
  compute_dtype, double_quant}``), ``data`` (``sources: [{path, max_rows,
  completion_column, schema, ...}]``; ``schema``: the artifact the file is validated as,
  whatever its name, :mod:`pipelines.preflight.inputs`), ``compact_prompts``, ``max_history_messages``, ``seed``),
  ``optim``, ``device`` (``bf16`` / ``gradient_checkpointing``: true, false or auto;
  ``use_vllm``, ``vllm_mode``), ``eval``, ``objective`` (the method's settings: e.g. GRPO's
  ``num_generations``, ``beta``, ``rewards: {format: 1.0, clarify_verifiable: 1.0}``) and
  ``output: {model_dir, metrics, curve}``. Field names and defaults are those of
  :mod:`pipelines.training.config`; an unknown key is an error. ``allow_empty`` (default
  false) and ``source_report``: sources with no rows at all are an error, or with
  ``allow_empty: true`` (JOSH's sections: a harvest may have no golden path) the run ends
  before anything loads, with exit 0: ``<model_dir>/NOT_TRAINED.json`` alone (the reason,
  the rows, ``source_report``: the report of the stage that wrote the sources, whose
  ``no_training_data`` joins the reason), the metrics with ``trained: false`` and a
  header-only curve (:mod:`pipelines.training.not_trained`).

A bad configuration (unknown method or key, missing dataset column, missing model
directory, bf16 on a CPU-only machine, ...) or a bad row in a dataset (checked by its
declared schema, whatever the file is called: the error names file, record and field)
fails here, before the Prefect server, the tokenizer or torch start, with
``error: <message>`` and exit status 1.

Prefect: without ``PREFECT_API_URL``, each run uses a temporary local API whose database
lives in ``PREFECT_HOME`` (default here: ``.prefect/`` in the working directory, git-ignored);
``PREFECT_HOME=.prefect prefect server start`` shows the runs afterwards. What a killed run
left (its server, a flow run still ``RUNNING``, staging directories) is cleaned up by the next
run (:mod:`flows.local_api`, :mod:`pipelines.files`).
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.errors import ConfigError, DataError
from pipelines.training.config import (
    NOT_IN_STAGE_SECTION,
    TRAIN_OUTPUTS,
    OutputSpec,
    TrainConfig,
    TrainSectionConfig,
    method_outputs,
    with_training_seed,
)
from pipelines.preflight.inputs import check_schema_name
from pipelines.training.not_trained import EMPTY_CURVE, NOT_TRAINED, check_start_model, no_rows_reason, not_trained_records, source_rows
from pipelines.preflight import check_data, check_method, check_numbers, preflight
from stages.common import apply_policy, configure_prefect, configure_threads, judge_backend
from stages.entry import main_wrapper
from catalog.io import read_json, read_params, write_json_atomic, write_text_atomic
from pipelines.config import from_params


def train_config(method: str, params: Mapping[str, Any], *, llm: Mapping[str, Any] | None = None,
                 policy: Mapping[str, Any] | None = None, section_name: str | None = None) -> TrainConfig:
    """The :class:`TrainConfig` of ``method`` from the ``train`` section of params.yaml (its
    subsection ``section_name``, default ``method``), its ``policy`` switch (None: the
    method's own model) and the ``judge`` role's backend from ``llm.roles.judge`` (for
    LLM-judged GRPO rewards)."""
    check_method(method)
    name = section_name or method
    if name == "holdout":
        raise ConfigError("params.yaml train.holdout is the shared hold-out, not a training section")
    section = params.get(name)
    if not isinstance(section, Mapping):
        raise ConfigError(f"params.yaml train.{name}: missing (or not a mapping)")
    if policy:
        section = apply_policy(section, method, policy)
    where = f"params.yaml train.{name}"
    settings = from_params(TrainSectionConfig, section, where, without=NOT_IN_STAGE_SECTION)
    data = dict(settings.data or {})
    if "holdout" in data:
        raise ConfigError(f"{where}.data.holdout: the hold-out is shared; set it in train.holdout")
    data["holdout"] = params.get("holdout") or {}
    if "sources" not in data:
        raise ConfigError(f"{where}.data.sources: required (a list of {{path: ...}})")
    output = settings.output
    config = settings.train_config(
        method, where, data=data, judge=judge_backend(llm),
        output=from_params(OutputSpec, output, f"{where}.output").check(f"{where}.output", TRAIN_OUTPUTS) if output else method_outputs(method))
    for index, source in enumerate(config.data.sources):
        check_schema_name(source.schema, f"{where}.data.sources[{index}].schema")
    return config


# --- Entry point -----------------------------------------------------------------------------


def run(method: str, params: Mapping[str, Any], *, llm: Mapping[str, Any] | None = None,
        policy: Mapping[str, Any] | None = None, section_name: str | None = None,
        seed: int | None = None, start: str | None = None) -> dict[str, Any]:
    config = train_config(method, params, llm=llm, policy=policy, section_name=section_name)
    if seed is not None:  # another training seed of the same run: its own outputs (``_s<seed>``)
        config = with_training_seed(config, seed, start)
    elif start is not None:
        raise ConfigError("--start names the start model of another training seed: give --seed too")
    name = section_name or method
    if (empty := _no_rows(config, params[name], name)) is not None:
        return empty
    check_start_model(config)  # a start model that was not trained says so
    preflight(config)  # fail fast, before a flow run exists
    configure_prefect(Path.cwd())
    from flows.local_api import local_prefect_api
    from flows.train import flow_for

    # Its own recorded temporary API: a run killed with SIGKILL leaves a server and a RUNNING
    # flow run, which the next run stops and marks Crashed.
    with local_prefect_api(os.environ["PREFECT_HOME"]):
        report = flow_for(method)(config)
    after = report["eval"].get("after", {})
    print(f"train_{section_name or method}: {report['train']['steps']} steps ({report['train']['stopped_by']}) -> {config.output.model_dir}; "
          f"held-out after: {after}")
    return report


def _no_rows(config: TrainConfig, section: Mapping[str, Any], name: str) -> dict[str, Any] | None:
    """Sources with no rows at all, before the start model, Prefect or the tokenizer are
    touched: with the section's ``allow_empty: true``, the declared outputs say nothing was
    trained (the model directory holds only NOT_TRAINED.json) and the report is returned;
    without it, an error naming the files. None when there are rows to train on."""
    settings = from_params(TrainSectionConfig, section, f"params.yaml train.{name}", without=NOT_IN_STAGE_SECTION)
    allow_empty, source_report = settings.allow_empty, settings.source_report
    if not all(Path(source.path).is_file() for source in config.data.sources):
        return None  # preflight names the missing file
    rows = source_rows(config)
    if sum(rows.values()):
        return None  # preflight's checks, in their order
    check_numbers(config)
    check_data(config)  # the empty tables have their columns
    report_data = read_json(source_report) if source_report and Path(source_report).is_file() else None
    reason = no_rows_reason(rows, source_report, report_data)
    if not allow_empty:
        raise DataError(", ".join(rows), f"{reason}: nothing to train {name} on (params.yaml train.{name}.allow_empty: "
                        f"true reports it as not trained instead)")
    note, report = not_trained_records(config, rows, reason, section=name, source_report=source_report)
    model_dir = Path(config.output.model_dir)
    if model_dir.is_dir():  # never leave an earlier run's model there as if trained on this data
        shutil.rmtree(model_dir)
    model_dir.mkdir(parents=True)
    write_json_atomic(model_dir / NOT_TRAINED, note)
    write_json_atomic(Path(config.output.metrics), report)
    write_text_atomic(Path(config.output.curve), EMPTY_CURVE)
    print(f"train_{name}: not trained: {reason}; {model_dir / NOT_TRAINED} and {config.output.metrics} say so")
    return report


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.train", description=__doc__.split("\n\n")[0])
    parser.add_argument("method", help="sft, dpo, kto or grpo")
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--section", default=None,
                        help="the method's params section, dotted; its parent holds the shared holdout (default: "
                             "train.<method>; JOSH: train.josh_sft; the τ-bench Clarifier: clarifier.train.sft)")
    parser.add_argument("--seed", type=int, default=None,
                        help="another training seed of the section's run (optim.seed); outputs get the suffix _s<seed>")
    parser.add_argument("--start", default=None, help="with --seed: the start model of that seed (e.g. its SFT model)")
    args = parser.parse_args(argv)
    configure_threads()
    check_method(args.method)
    # A params file without an llm (or policy) section has no judge role (or switch); a bad one is an error.
    # The policy switch is the agent policy's: another parent (the Clarifier) trains its own model.
    *parent, name = (args.section or f"train.{args.method}").split(".")
    if not parent:
        raise ConfigError(f"--section {args.section!r}: expected <parent>.<section>, e.g. train.{args.method}")
    run(args.method, _section(".".join(parent), args.params), llm=read_params("llm", args.params, required=False),
        policy=read_params("policy", args.params, required=False) if parent == ["train"] else None, section_name=name,
        seed=args.seed, start=args.start)


def _section(dotted: str, path: str) -> dict[str, Any]:
    first, *rest = dotted.split(".")
    section: Any = read_params(first, path)
    for key in rest:
        section = section.get(key) if isinstance(section, Mapping) else None
        if not isinstance(section, Mapping):
            raise ConfigError(f"params.yaml {dotted}: missing (or not a mapping)")
    return dict(section)


if __name__ == "__main__":
    sys.exit(main())
