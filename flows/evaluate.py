"""Prefect flow ``evaluate``: every configured model plays the held-out goals (Avg@k).

    check config -> load corpus and goals -> for each model: load policy -> play episodes
      -> score -> publish episodes (Parquet) -> write reports (JSON, markdown, plot rows)
      -> markdown artifact (the table) on the flow run

The DVC stage ``evaluate`` (``python -m stages.evaluate``) runs it; each run is a Prefect
flow run (``PREFECT_HOME=.prefect prefect server start`` shows them, with the table as the
run's artifact). Loading a model retries on transient ``OSError`` s (hub, busy disk);
playing does not: a failure there is a bug or a configuration error.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from prefect import flow, get_run_logger, task
from prefect.artifacts import create_markdown_artifact
from prefect.cache_policies import NO_CACHE

from flows.train import retry_on_transient
from pipelines.errors import ConfigError
from pipelines.evaluation.config import EvalConfig
from pipelines.evaluation.metrics import avg_at_k, bootstrap_summary_seeds, fault_counts, score_episode
from pipelines.evaluation.policy import PolicySpec, check_policy
from pipelines.evaluation.report import pattern_notes, plot_rows, report_markdown

#: The rates reported per training seed beside a pooled row.
SEED_COLUMNS = ("success", "turns", "inform_rate", "request_rate", "clarifications_per_dialogue", "malformed_per_dialogue")

_TASK = {"cache_policy": NO_CACHE, "persist_result": False}
_RETRY = {"retries": 2, "retry_delay_seconds": 3, "retry_condition_fn": retry_on_transient}


def check_inputs(config: EvalConfig) -> None:
    """Every local model directory and the corpus exist (ConfigError otherwise)."""
    for spec in config.policy_specs():
        check_policy(spec)
    if not Path(config.source).is_dir():
        raise ConfigError(f"params.yaml evaluate.source: {config.source} does not exist")
    if config.workers != 1:
        raise ConfigError("params.yaml evaluate.workers: processes are for the GPU job (askflow gpu run); this stage plays in one process")


@task(name="check-config", **_TASK)
def check_config(config: EvalConfig) -> None:
    check_inputs(config)


@task(name="load-goals", **_TASK, **_RETRY)
def load_goals(config: EvalConfig) -> tuple[Any, list[Any]]:
    from catalog.multiwoz_dir import held_out_world

    database, goals = held_out_world(config.source, config.db_dir, config.split, config.max_goals, "evaluate.split")
    get_run_logger().info("%d held-out goals (%s split) x %d seeds", len(goals), config.split, len(config.seeds))
    return database, goals


def build_simulator(config: EvalConfig, database: Any, client: Any = None, sampling: Any = None) -> Any:
    """``config.simulator``'s user; an LLM user writes with ``client`` at ``sampling`` (the
    ``user_simulator`` role's)."""
    from pipelines.simulators.factory import simulator_from_config

    return simulator_from_config(config.simulator.kind, database=database, client=client, spec=config.simulator, sampling=sampling)


@task(name="load-policy", **_TASK, **_RETRY)
def load_policy(config: EvalConfig, spec: PolicySpec) -> Any:
    from pipelines.episodes import get_format
    from pipelines.evaluation.policy import load_policy as load

    return load(spec, get_format(config.agent_format), config.generation)


@task(name="play", **_TASK)
def play(config: EvalConfig, agent: Any, goals: list[Any], simulator: Any, database: Any) -> tuple[list[Any], float]:
    from pipelines.evaluation.play import play_policy

    from pipelines.progress import Progress

    logger = get_run_logger()
    plan = config.plan()
    total = len(goals) * len(plan.seeds)
    started = time.monotonic()
    # finished episodes at least every 30 s with the time left; one line at the end
    with Progress(total, f"{agent.name} evaluation", unit="episodes", emit=lambda line: logger.info("%s", line)) as progress:
        episodes = play_policy(agent, goals, simulator, database, plan, progress.update)
    logger.info("%s: %d/%d episodes", agent.name, len(episodes), total)
    return episodes, time.monotonic() - started


@task(name="score", **_TASK)
def score(name: str, episodes: list[Any], goals: list[Any], wall_s: float) -> tuple[dict[str, Any], list[Any]]:
    """The model's Avg@k summary (no clock readings: it is a DVC metric) and the episode scores."""
    by_id = {d.dialogue_id: d.goal for d in goals}
    scores = [score_episode(e, by_id[e.dialogue_id]) for e in episodes]
    summary = avg_at_k(scores)  # for the log; the report's figures come with their intervals
    summary["faults"] = fault_counts(episodes)
    faults = summary["faults"]
    if faults["user_simulator"]["faults"] or faults["agent"]["llm_failures"]:
        get_run_logger().warning(
            "%s: user simulator %d fault(s) (%d LLM), %d fallback turn(s); agent %d LLM failure(s), %d fallback(s)",
            name, faults["user_simulator"]["faults"], faults["user_simulator"]["llm_failures"],
            faults["user_simulator"]["fallbacks"], faults["agent"]["llm_failures"], faults["agent"]["fallbacks"],
        )
    get_run_logger().info(
        "%s: success %.3f ± %.3f, turns %.2f ± %.2f, %.2f questions/dialogue, %.2f dialogues/s",
        name, summary["success"]["mean"], summary["success"]["std"], summary["turns"]["mean"], summary["turns"]["std"],
        summary["clarifications_per_dialogue"]["mean"], len(episodes) / wall_s if wall_s else 0.0,
    )
    return summary, scores


@task(name="publish-episodes", **_TASK, **_RETRY)
def publish_episodes(config: EvalConfig, episodes: list[Any]) -> None:
    from pipelines.episodes import episode_tables
    from catalog import datasets

    tables = episode_tables(episodes)
    datasets.save({"evaluate.episodes": tables["episodes"], "evaluate.episode_events": tables["episode_events"]}, config)


@task(name="write-reports", **_TASK, **_RETRY)
def write_reports(config: EvalConfig, report: dict[str, Any], markdown: str, timings: dict[str, Any]) -> None:
    from catalog.io import write_json_atomic, write_text_atomic, write_timings

    write_json_atomic(Path(config.output.metrics), report)
    write_text_atomic(Path(config.output.markdown), markdown)
    rows = plot_rows(report["models"])
    header = list(rows[0])
    csv = "\n".join([",".join(header), *(",".join(str(r[h]) for h in header) for r in rows)]) + "\n"
    write_text_atomic(Path(config.output.plot), csv)
    # Machine-dependent: outside the metrics (DVC hashes those; `dvc metrics diff` stays clean).
    # reports/timings/evaluate.json for reports/eval.json, else named after the report (a seeds table's)
    stem = Path(config.output.metrics).stem
    write_timings("evaluate" if stem == "eval" else stem, timings)


def setup_summary(config: EvalConfig, n_goals: int) -> dict[str, Any]:
    return {
        "source": config.source,
        "split": config.split,
        "goals": n_goals,
        "seeds": list(config.seeds),
        "simulator": config.simulator.kind,
        "max_exchanges": config.max_exchanges,
        "agent_format": config.agent_format,
        "temperature": config.generation.temperature,
        "max_new_tokens": config.generation.max_new_tokens,
        "batched": config.batched,
    }


@flow(name="evaluate", validate_parameters=False, log_prints=False)
def evaluate(config: EvalConfig, simulator_client: Any = None, simulator_sampling: Any = None) -> dict[str, Any]:
    """Every model of ``config`` against the user simulator; returns the report."""
    check_config(config)
    database, goals = load_goals(config)
    simulator = build_simulator(config, database, simulator_client, simulator_sampling)
    started = time.monotonic()
    scores: dict[str, list[list[Any]]] = {}
    summaries: dict[str, list[dict[str, Any]]] = {}  # each training seed's Avg@k, as score() logged it
    faults: dict[str, dict[str, Any]] = {}
    episodes: list[Any] = []
    timings: dict[str, Any] = {"models": {}}
    rows = config.rows()
    for row, specs in rows.items():
        scores[row], summaries[row], played_row = [], [], []
        for spec in specs:  # one per training seed of the row
            agent = load_policy(config, spec)
            played, wall_s = play(config, agent, goals, simulator, database)
            summary, seed_scores = score(spec.name, played, goals, wall_s)
            scores[row].append(seed_scores)
            summaries[row].append(summary)
            timings["models"][spec.name] = {
                "episodes": len(played), "wall_s": round(wall_s, 2),
                "dialogues_per_second": round(len(played) / wall_s, 3) if wall_s else None,
            }
            played_row += played
            del agent
        faults[row] = fault_counts(played_row) if len(specs) > 1 else summary["faults"]
        episodes += played_row
    if simulator_client is not None:
        from pipelines.llm.accounting import check_failure_rate

        # An outage of the simulator's endpoint leaves fallback turns only: no evaluation.
        check_failure_rate(simulator_client.accounting, config.max_llm_failure_rate, "evaluate")
    results, statistics = bootstrap_summary_seeds(scores, resamples=config.stats.resamples, seed=config.stats.seed, alpha=config.stats.alpha)
    if any(len(per_seed) > 1 for per_seed in scores.values()):
        # What the first seed alone would have called significant: the differences re-training keeps, or not
        _, first = bootstrap_summary_seeds({row: per_seed[:1] for row, per_seed in scores.items()},
                                           resamples=config.stats.resamples, seed=config.stats.seed, alpha=config.stats.alpha)
        statistics["first_seed_only"] = first["comparisons"]
    for row, specs in rows.items():
        if len(specs) > 1:  # what each re-training scored alone, beside the pooled row
            results[row]["per_training_seed"] = {
                spec.name: {key: (summary[key] or {}).get("mean") for key in SEED_COLUMNS}
                for spec, summary in zip(specs, summaries[row])
            }
    for name, counts in faults.items():
        results[name]["faults"] = counts
    setup = setup_summary(config, len(goals))
    report = {"setup": setup, "models": results, "statistics": statistics}
    if simulator_client is not None:
        # Every LLM call of the run, per role: failures by reason, retries, cache hits.
        report["llm"] = simulator_client.accounting.as_dict()
    markdown = report_markdown(results, setup, notes=pattern_notes(results, statistics), statistics=statistics)
    publish_episodes(config, episodes)
    timings["wall_s"] = round(time.monotonic() - started, 2)
    write_reports(config, report, markdown, timings)
    create_markdown_artifact(markdown=markdown, key="evaluation", description="Avg@k success and turns per model")
    return report


__all__ = ["build_simulator", "check_inputs", "evaluate"]
