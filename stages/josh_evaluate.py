"""DVC stage ``josh_evaluate``: every model plays the ToolWOZ test goals (JOSH paper, Table 1).

    python -m stages.josh_evaluate [--params params.yaml]

params.yaml ``josh_evaluate``: ``source`` / ``db_dir`` / ``strict`` (any MultiWOZ-layout
corpus), ``max_goals`` (the official test set: the first ``max_goals`` sorted test ids with
goal APIs), ``seeds``, ``max_turns``, ``format`` (react: JOSH's ReAct), ``rules`` (the
harvesting rules agent's probabilities, a reference row; null leaves it out), ``simulator``
(agenda, or goal_llm / guide_llm with the ``user_simulator`` LLM role), ``generation``
(greedy by default), ``prompt`` (how each model's prompts are built: ``system_prompt:
toolwoz_react``, the compact ReAct prompt ``train.josh_*`` trains with), ``models`` (name ->
``{path: ...}`` or ``{hub_id: ...}``, optionally with its own ``prompt``), ``output``.

Each model plays every goal once per seed against the user simulator without branching
(:func:`pipelines.josh.evaluate.play_toolwoz`, the code that scores the harvesting agent in
stage ``josh``). Outputs: ``data/episodes/toolwoz_eval.parquet`` (``josh_eval``'s schema: one
row per model, goal and seed with the reward, 100 % success, api calls, malformed outputs, rejected
calls and the conversation), ``reports/josh_eval.json`` (average reward and 100 % success per
model, and the evidence columns' means) and ``reports/josh_eval.md`` (the table).
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.errors import ConfigError, DataError
from pipelines.josh.config import RULES_LABEL, ToolWozEvalConfig
from pipelines.josh.evaluate import ToolWozEpisode, toolwoz_summary
from pipelines.josh.report import evaluation_markdown
from pipelines.josh.tables import eval_table
from stages.common import with_policy
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_text_atomic, write_timings
from pipelines.config import from_params
from catalog import datasets


def eval_config(params: Mapping[str, Any]) -> ToolWozEvalConfig:
    """The stage's settings; ``models`` is a mapping name -> ``{path: ...}`` or ``{hub_id: ...}``, in table order."""
    where = "params.yaml josh_evaluate"
    models = params.get("models") or {}
    if not isinstance(models, Mapping):
        raise ConfigError(f"{where}.models: expected a mapping name -> {{path: ...}} or {{hub_id: ...}}")
    return from_params(ToolWozEvalConfig, {**params, "models": models}, where)


def harvest_round(config: ToolWozEvalConfig) -> tuple[dict[str, Any] | None, dict[str, str]]:
    """The round's harvest (from stage josh's report) and the M' models left unplayed because
    that harvest had nothing to train them on (name -> why)."""
    if config.round is None:
        return None, {}
    from catalog.io import read_json

    path = Path(config.round.harvest)
    if not path.is_file():
        raise DataError(str(path), "round.harvest: stage josh's report does not exist (run stage josh first)")
    harvest = read_json(path)
    try:
        agent = harvest["agent"]
        figures = {key: harvest[key] for key in ("goals", "nodes", "successful_nodes", "golden_paths", "sft_rows", "kto_rows")}
        training_data = bool(harvest["training_data"])
    except KeyError as missing:
        raise DataError(str(path), f"round.harvest: field {missing} is missing (a report of an older stage josh; run it again)") from None
    start = dict(config.models)[config.round.start]
    harvester = agent.get("model_path") if agent.get("backend") == "hf" else agent.get("backend")
    report = {"harvest": str(path), "harvester": harvester, "harvester_role": agent.get("role"), "start": config.round.start,
              "trained": list(config.round.trained),
              # M harvested its own trees only when the harvester is the model evaluated as M
              "self_improvement": agent.get("backend") == "hf" and harvester == start.path,
              **figures, "training_data": training_data, "harvester_test": harvest.get("test")}
    not_trained = {} if training_data else {
        name: f"not trained: the harvest by {harvester} has 0 training rows ({figures['golden_paths']} golden paths)"
        for name in config.round.trained}
    return report, not_trained


def unmarked_models(config: ToolWozEvalConfig, known: Mapping[str, str]) -> dict[str, str]:
    """Models whose directory holds only a training stage's NOT_TRAINED.json (sources without
    rows): not played, reported "not trained" with the note's reason (name -> why); models
    already in ``known`` keep their reason."""
    from catalog.io import read_json
    from pipelines.training.not_trained import NOT_TRAINED

    found = {}
    for name, entry in config.models:
        marker = Path(entry.path) / NOT_TRAINED if entry.path else None
        if name not in known and marker is not None and marker.is_file():
            note = read_json(marker)
            found[name] = f"not trained: {note.get('reason', 'no reason given') if isinstance(note, dict) else 'no reason given'}"
    return found


def run(params: Mapping[str, Any], llm_params: Mapping[str, Any] | None = None, policy: Mapping[str, Any] | None = None) -> dict[str, Any]:
    config = eval_config(with_policy(params, policy))
    from pipelines.evaluation.policy import check_policy, load_policy
    from pipelines.josh.agent import RulesToolWozAgent
    from pipelines.llm.accounting import check_failure_rate
    from pipelines.progress import Progress
    from catalog.josh import open_toolwoz_test

    round_report, not_trained = harvest_round(config)
    not_trained.update(unmarked_models(config, not_trained))  # train.josh_*'s NOT_TRAINED.json directories
    specs = [entry.policy(name, config.prompt) for name, entry in config.models if name not in not_trained]
    for spec in specs:
        check_policy(spec)  # every model exists before any plays
    test = open_toolwoz_test(config, llm_params)

    episodes: dict[str, list[ToolWozEpisode]] = {}
    timings: dict[str, float] = {}
    for name, spec in ([("rules", None)] if config.rules is not None else []) + [(spec.name, spec) for spec in specs]:
        started = time.perf_counter()  # a model's load included
        agent = RulesToolWozAgent(test.database, test.fmt, config.rules) if spec is None else load_policy(spec, test.fmt, config.generation)
        with Progress(len(test.goals) * len(config.seeds), f"josh_evaluate {name}", unit="episodes") as progress:
            episodes[name] = test.play(agent, name, progress=progress.update)
        timings[name] = round(time.perf_counter() - started, 2)
        scores = toolwoz_summary(episodes[name])
        print(f"josh_evaluate: {name}: avg reward {scores['avg_reward']:.3f}, 100% success {scores['success_rate']:.3f}, "
              f"malformed/episode {scores['malformed_per_episode']:.2f} ({timings[name]:.1f} s)")
    if test.simulator_client is not None:  # an LLM simulator's outage is an error, never a score
        check_failure_rate(test.simulator_client.accounting, config.max_llm_failure_rate, "josh_evaluate (user_simulator)")

    datasets.save({"toolwoz_eval": eval_table([e for eps in episodes.values() for e in eps])}, config)
    results = {name: toolwoz_summary(eps) for name, eps in episodes.items()}
    report = {"goals": len(test.goals), "seeds": list(config.seeds), "simulator": config.simulator.kind, "format": config.format,
              "models": results, "labels": {"rules": RULES_LABEL} if "rules" in results else {}}
    if round_report is not None:
        report["round"] = {**round_report, "not_trained": not_trained}
    elif not_trained:
        report["not_trained"] = not_trained
    write_json_atomic(Path(config.output.metrics), report)
    write_text_atomic(Path(config.output.markdown), evaluation_markdown(results, len(test.goals), config.seeds, report.get("round"), report.get("not_trained")))
    write_timings("josh_evaluate", {"wall_s": timings})
    return report


@main_wrapper
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.josh_evaluate", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    args = parser.parse_args(argv)
    from stages.common import configure_threads

    configure_threads()
    run(read_params("josh_evaluate", args.params), read_params("llm", args.params, required=False),
        read_params("policy", args.params, required=False))


if __name__ == "__main__":
    sys.exit(main())
