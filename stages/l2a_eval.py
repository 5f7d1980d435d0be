"""DVC stage ``l2a_eval``: Learn-to-Ask's held-out proxy metrics (Table 1) for each policy.

Every policy answers the same held-out samples of ``l2a_samples`` (the ``split``, test by
default: no training stage reads it) with greedy decoding, and each answer is scored against
its hindsight target (I*_t, s*_t): WA, WA-GH, WC, WS, AA, FC, TR as appendix F.6 defines them
(:mod:`pipelines.learn_to_ask.metrics`), with percentile bootstrap intervals over the samples
and paired intervals of each ``compare`` pair's differences.

params.yaml ``l2a.eval``:

* ``samples``: the ``l2a_samples`` Parquet file; ``split`` (default ``test``);
  ``max_samples``: a stable sample of that many usable samples (hash order of session and
  turn; null: all);
* ``models``: ``{name: model directory}`` (Hugging Face layout);
* ``max_prompt_tokens``: the prompt (policy system prompt + full context C_{t-1}, oldest
  history cut first as in training, :func:`pipelines.training.data.fit_prompt`) and the
  answer fit in this many tokens; ``generation``: ``{max_new_tokens, batch_size}``;
* ``beta`` (eq. 5, default 2); ``stats``: ``{resamples, alpha, seed}``; ``compare``: a list of
  ``[model, baseline]`` pairs;
* ``output``: ``{generations (l2a_eval Parquet), metrics (JSON), markdown}``.

The policy's system prompt is the one ``l2a_train`` carries (the ROLLOUT prompt of the
``hindsight.prompts`` file, else appendix G's sampler prompt). The content score R_a is the
``rules`` grader's (:class:`pipelines.rewards.learn_to_ask.RulesGrader`) on the output's
questions only, 0 for an output that asks none (appendix G grades "the question(s)";
:class:`pipelines.learn_to_ask.metrics.QuestionGrader`).
"""

from __future__ import annotations

from collections import Counter

import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.metrics import METRICS, QuestionGrader, bootstrap, bootstrap_difference, counts_of, markdown_table, metrics_of, score_output
from pipelines.learn_to_ask.tables import L2A_EVAL, SPECS as L2A_SPECS, eval_table
from pipelines.rewards.learn_to_ask import BETA, RulesGrader
from stages.entry import main_wrapper
from catalog.io import publish, read_artifact, read_params, write_json_atomic, write_text_atomic, write_timings

_KEYS = {"samples", "split", "max_samples", "models", "max_prompt_tokens", "generation", "beta", "stats", "compare", "output"}
_SALT = "askflow-l2a-eval"


def _positive_int(value: Any, where: str, allow_none: bool = False) -> int | None:
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"params.yaml {where}: expected a positive integer{' or null' if allow_none else ''}, got {value!r}")
    return value


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    unknown = sorted(set(params) - _KEYS)
    if unknown:
        raise ConfigError(f"params.yaml l2a.eval: unknown key(s) {unknown}; allowed: {sorted(_KEYS)}")
    for required in ("samples", "models", "output"):
        if required not in params:
            raise ConfigError(f"params.yaml l2a.eval: {required!r} is required")
    models = params["models"]
    if not isinstance(models, Mapping) or not models:
        raise ConfigError("params.yaml l2a.eval.models: expected a mapping of name -> model directory")
    output = params["output"]
    if not isinstance(output, Mapping) or sorted(output) != ["generations", "markdown", "metrics"]:
        raise ConfigError("params.yaml l2a.eval.output: expected {generations, metrics, markdown}")
    for pair in params.get("compare") or ():
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in models for p in pair)):
            raise ConfigError(f"params.yaml l2a.eval.compare: {pair!r} is not a [model, baseline] pair of l2a.eval.models")
    generation = dict(params.get("generation") or {})
    unknown = sorted(set(generation) - {"max_new_tokens", "batch_size"})
    if unknown:
        raise ConfigError(f"params.yaml l2a.eval.generation: unknown key(s) {unknown}")
    stats = {"resamples": 1000, "alpha": 0.05, "seed": 0, **(params.get("stats") or {})}
    if sorted(stats) != ["alpha", "resamples", "seed"]:
        raise ConfigError("params.yaml l2a.eval.stats: expected {resamples, alpha, seed}")
    return {
        "samples": Path(params["samples"]),
        "split": params.get("split", "test"),
        "max_samples": _positive_int(params.get("max_samples"), "l2a.eval.max_samples", allow_none=True),
        "models": {str(k): Path(v) for k, v in models.items()},
        "max_prompt_tokens": _positive_int(params.get("max_prompt_tokens", 512), "l2a.eval.max_prompt_tokens"),
        "max_new_tokens": _positive_int(generation.get("max_new_tokens", 48), "l2a.eval.generation.max_new_tokens"),
        "batch_size": _positive_int(generation.get("batch_size", 16), "l2a.eval.generation.batch_size"),
        "beta": float(params.get("beta", BETA)),
        "stats": stats,
        "compare": [tuple(p) for p in params.get("compare") or ()],
        "output": {k: Path(v) for k, v in output.items()},
    }


def held_out_samples(rows: list[dict[str, Any]], split: str, max_samples: int | None) -> list[dict[str, Any]]:
    """The usable samples of ``split`` (a stable sample of ``max_samples``), by session and turn."""
    from pipelines.training.data import holdout_score

    usable = [r for r in rows if r["failure"] is None and r["split"] == split]
    for r in usable:
        if r["decision_truth"] is None or r["info_truth"] is None:
            raise DataError("l2a_samples", "a usable sample without its target", record=f"{r['session_id']}/{r['turn']}", field="decision_truth")
    if max_samples is not None:
        usable = sorted(usable, key=lambda r: holdout_score(f"{r['session_id']}/{r['turn']}", _SALT))[:max_samples]
    return sorted(usable, key=lambda r: (r["session_id"], r["turn"]))


def policy_prompts(samples: list[dict[str, Any]], system_prompt: str) -> list[list[dict[str, str]]]:
    """The policy's system prompt and the full context C_{t-1}, compacted as training does."""
    from pipelines.training.config import DataSpec
    from pipelines.training.data import compact

    spec = DataSpec(sources=(), compact_prompts=False, max_history_messages=None)
    return [compact([{"role": "system", "content": system_prompt}, *s["context"]], spec) for s in samples]


def answer(model_dir: Path, prompts: list[list[dict[str, str]]], settings: Mapping[str, Any]) -> tuple[list[str | None], int]:
    """Greedy answers of one model (None where the prompt cannot fit), and how many did not fit."""
    from transformers import AutoModelForCausalLM

    from pipelines.training.config import ModelSpec
    from pipelines.training.data import TokenCounter, fit_prompt
    from pipelines.training.evaluation import generate
    from pipelines.training.modeling import load_tokenizer

    if not model_dir.is_dir():
        raise ConfigError(f"params.yaml l2a.eval.models: {model_dir} does not exist (run its training stage first)")
    tokenizer = load_tokenizer(ModelSpec(path=str(model_dir)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir))
    count = TokenCounter(tokenizer)
    fitted = [fit_prompt(p, [], count, settings["max_prompt_tokens"], reserve=settings["max_new_tokens"]) for p in prompts]
    kept = [i for i, p in enumerate(fitted) if p is not None]
    texts = generate(model, tokenizer, [fitted[i] for i in kept], max_new_tokens=settings["max_new_tokens"], batch_size=settings["batch_size"])
    answers: list[str | None] = [None] * len(prompts)
    for i, text in zip(kept, texts):
        answers[i] = text
    return answers, len(prompts) - len(kept)


def run(params: Mapping[str, Any], hindsight: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from catalog.learn_to_ask import policy_prompt

    settings = check_params(params)
    started = time.perf_counter()
    # Checked as l2a_samples whatever the file is called (issue 28: not by its name).
    table = read_artifact(settings["samples"], L2A_SPECS["l2a_samples"])
    samples = held_out_samples(table.to_pylist(), settings["split"], settings["max_samples"])
    if not samples:
        raise DataError(str(settings["samples"]), f"no usable sample in split {settings['split']!r}")
    prompts = policy_prompts(samples, policy_prompt((hindsight or {}).get("prompts")).render())
    grader = QuestionGrader(RulesGrader())
    answers: dict[str, list[str | None]] = {}
    timings: dict[str, float] = {}
    too_long = 0
    for name, model_dir in settings["models"].items():
        begun = time.perf_counter()
        answers[name], dropped = answer(model_dir, prompts, settings)
        too_long = max(too_long, dropped)
        timings[f"{name}_s"] = round(time.perf_counter() - begun, 2)
    # Every model is scored on the samples all of them answered: paired comparisons.
    kept = [i for i in range(len(samples)) if all(answers[name][i] is not None for name in answers)]
    scored = {
        name: [score_output(answers[name][i], samples[i]["decision_truth"], samples[i]["info_truth"], grader, prompts[i], settings["beta"])
               for i in kept]
        for name in answers
    }
    stats = settings["stats"]
    results = {
        name: {
            "path": str(settings["models"][name]),
            "metrics": metrics_of(values),
            "ci": bootstrap(values, stats["resamples"], stats["alpha"], stats["seed"]),
            "counts": counts_of(values),
            "reasons": dict(sorted(Counter(s.reason for s in values).items())),
        }
        for name, values in scored.items()
    }
    comparisons = {
        f"{a} - {b}": {
            "difference": {m: _diff(results[a]["metrics"][m], results[b]["metrics"][m]) for m in METRICS},
            "ci": bootstrap_difference(scored[a], scored[b], stats["resamples"], stats["alpha"], stats["seed"]),
        }
        for a, b in settings["compare"]
    }
    rows = [{"model": name, "session_id": samples[i]["session_id"], "turn": samples[i]["turn"], "output": answers[name][i], "scored": s}
            for name, values in scored.items() for i, s in zip(kept, values)]
    publish({settings["output"]["generations"]: (eval_table(rows), L2A_EVAL)})
    report = {
        "split": settings["split"],
        "samples": len(samples),
        "dropped_too_long": len(samples) - len(kept),
        "grader": grader.name,
        "beta": settings["beta"],
        "decoding": {"greedy": True, "max_new_tokens": settings["max_new_tokens"], "max_prompt_tokens": settings["max_prompt_tokens"]},
        "stats": stats,
        "models": results,
        "compare": comparisons,
    }
    write_json_atomic(settings["output"]["metrics"], _rounded(report))
    write_text_atomic(settings["output"]["markdown"], markdown(report))
    write_timings("l2a_eval", {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    print(f"l2a_eval: {len(kept)} {settings['split']} samples x {len(answers)} models -> {settings['output']['metrics']}")
    print(markdown_table(results))
    return report


def _diff(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def _rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, Mapping):
        return {k: _rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_rounded(v) for v in value]
    return value


def markdown(report: Mapping[str, Any]) -> str:
    """reports/l2a.md: the table, its setting, and each comparison's paired differences."""
    lines = [
        "# Learn-to-Ask held-out proxy metrics (paper Table 1)",
        "",
        f"{report['samples'] - report['dropped_too_long']} `{report['split']}` samples of `l2a_samples`, greedy decoding, "
        f"grader `{report['grader']}`, beta {report['beta']:g}; 95 % percentile bootstrap intervals over the samples "
        f"({report['stats']['resamples']} resamples). Definitions: paper appendix F.6 (pipelines/learn_to_ask/metrics.py).",
        "",
        markdown_table(report["models"]),
    ]
    for name, comparison in report["compare"].items():
        lines += ["", f"Paired difference {name}:", "", "| Metric | difference | 95 % interval |", "|---|---|---|"]
        for metric in METRICS:
            value, ci = comparison["difference"][metric], comparison["ci"][metric]
            text = "-" if value is None else f"{value:+.3f}"
            interval = "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"
            lines.append(f"| {metric} | {text} | {interval} |")
    return "\n".join(lines) + "\n"


@main_wrapper
def main() -> None:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    l2a = read_params("l2a")
    if not isinstance(l2a, Mapping) or not isinstance(l2a.get("eval"), Mapping):
        raise ConfigError("params.yaml l2a.eval: missing (or not a mapping)")
    run(l2a["eval"], hindsight=read_params("hindsight", required=False))


if __name__ == "__main__":
    main()
