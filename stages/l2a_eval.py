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
* ``model_grader``: null, or ``{samples: N, backend: hf | openai, ...}`` (the ``grader``
  role's keys, e.g. ``model_path: models/smollm2``; greedy): a model grader (appendix G's
  grading prompt; the calibrated GRADER prompt when ``hindsight.prompts`` has one) grades
  R_a on a fixed sample of N CONTINUE samples beside the rules grader, with their agreement;
* ``output``: ``{generations (l2a_eval Parquet), metrics (JSON), markdown}``.

Beside the model rows, two reference rows on the same samples (:data:`pipelines.learn_to_ask.
metrics.REFERENCES`): ``expert`` (the logged turn a_t, ``<stop />`` where s*_t is STOP: its
decisions are an oracle's) and ``catch_all`` (one fixed question listing every slot).

The policy's system prompt is the one ``l2a_train`` carries (the ROLLOUT prompt of the
``hindsight.prompts`` file, else appendix G's sampler prompt). The content score R_a is the
``rules`` grader's (:class:`pipelines.rewards.learn_to_ask.RulesGrader`, coverage and precision) on the output's
questions only, 0 for an output that asks none (appendix G grades "the question(s)";
:class:`pipelines.learn_to_ask.metrics.QuestionGrader`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Mapping

from pipelines.config import from_params, positive_int
from pipelines.learn_to_ask.config import L2aEvalParams
from pipelines.errors import ConfigError, DataError
from pipelines.evaluation.learn_to_ask import (
    GRADER_RULE, answer, held_out_samples, markdown, model_grader_agreement, policy_prompts, rounded, score_answers,
)
from pipelines.learn_to_ask.metrics import REFERENCES, QuestionGrader, markdown_table
from pipelines.learn_to_ask.tables import eval_table
from pipelines.progress import Progress
from pipelines.rewards.learn_to_ask import LLMGrader, RulesGrader
from stages.entry import main_wrapper
from catalog.io import read_params, write_json_atomic, write_text_atomic, write_timings
from catalog import datasets


def check_params(params: Mapping[str, Any]) -> dict[str, Any]:
    where = "params.yaml l2a.eval"
    config = from_params(L2aEvalParams, params, where)
    models = config.models
    if not isinstance(models, Mapping) or not models:
        raise ConfigError(f"{where}.models: expected a mapping of name -> model directory")
    for name, dirs in models.items():
        # a list: the same policy trained under several seeds (train --seed), one directory each
        if isinstance(dirs, list) and (not dirs or len(set(map(str, dirs))) != len(dirs) or not all(isinstance(d, str) for d in dirs)):
            raise ConfigError(f"{where}.models.{name}: expected a model directory or a list of distinct ones (one per training seed), got {dirs!r}")
        if not isinstance(dirs, (str, list)):
            raise ConfigError(f"{where}.models.{name}: expected a model directory or a list of them, got {dirs!r}")
    if config.output is None:
        raise ConfigError(f"{where}: missing required key(s) ['output']")
    output = config.output.check(f"{where}.output", ("generations", "metrics", "markdown"))
    for pair in config.compare or ():
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(p in models for p in pair)):
            raise ConfigError(f"{where}.compare: {pair!r} is not a [model, baseline] pair of l2a.eval.models")
    for name in models:
        if name in REFERENCES:
            raise ConfigError(f"{where}.models: {name!r} is a reference row's name; rename the model")
    return {
        **config.settings(where),
        "model_grader": _model_grader(config.model_grader),
        "models": {str(k): [Path(d) for d in (v if isinstance(v, list) else [v])] for k, v in models.items()},
        "compare": [tuple(p) for p in config.compare or ()],
        "output": {k: Path(getattr(output, k)) for k in ("generations", "metrics", "markdown")},
    }


def _model_grader(section: Any) -> dict[str, Any] | None:
    """``model_grader``: null, or ``{samples: N, backend: hf | openai, ...}`` (the ``grader``
    role's backend keys, greedy decoding)."""
    from pipelines.llm import BackendConfig

    if section is None:
        return None
    if not isinstance(section, Mapping) or "samples" not in section:
        raise ConfigError("params.yaml l2a.eval.model_grader: expected null or {samples, backend, ...}")
    samples = positive_int(section["samples"], "params.yaml l2a.eval.model_grader.samples")
    backend = BackendConfig.from_dict("grader", {k: v for k, v in section.items() if k != "samples"}, "params.yaml l2a.eval.model_grader")
    if backend.kind == "rules":
        raise ConfigError("params.yaml l2a.eval.model_grader.backend: a model grader is hf or openai (the rules grader is the default one)")
    if not backend.sampling.greedy:
        raise ConfigError("params.yaml l2a.eval.model_grader.sampling.temperature: the grader decodes greedily; set 0.0")
    return {"samples": samples, "backend": backend}


def run(params: Mapping[str, Any], hindsight: Mapping[str, Any] | None = None, llm: Mapping[str, Any] | None = None) -> dict[str, Any]:
    from catalog.learn_to_ask import grader_prompt, policy_prompt

    settings = check_params(params)
    started = time.perf_counter()
    # Checked as l2a_samples whatever the file is called (the catalog's entry, not its name).
    table = datasets.load("l2a_eval.samples", settings)
    samples = held_out_samples(table.to_pylist(), settings["split"], settings["max_samples"])
    if not samples:
        raise DataError(str(settings["samples"]), f"no usable sample in split {settings['split']!r}")
    prompts = policy_prompts(samples, policy_prompt((hindsight or {}).get("prompts")).render())
    grader = QuestionGrader(RulesGrader())
    answers: dict[str, list[list[str | None]]] = {}  # name -> one list per training seed
    timings: dict[str, float] = {}
    with Progress(sum(len(dirs) for dirs in settings["models"].values()), "l2a_eval answers", unit="models") as progress:
        for name, model_dirs in settings["models"].items():
            begun = time.perf_counter()
            answers[name] = []
            for model_dir in model_dirs:
                answers[name].append(answer(model_dir, prompts, settings)[0])
                progress.advance()
            timings[f"{name}_s"] = round(time.perf_counter() - begun, 2)
    stats = settings["stats"]
    scores = score_answers(samples, prompts, answers, settings["models"], grader, beta=settings["beta"], stats=stats,
                           compare=settings["compare"])
    kept, references = scores.kept, scores.references
    model_grading = None
    if settings["model_grader"] is not None:
        begun = time.perf_counter()
        prompt, origin = grader_prompt((hindsight or {}).get("prompts"))
        from pipelines.learn_to_ask.completion import completer
        from pipelines.llm import Accounting

        backend = settings["model_grader"]["backend"]
        # The hf backend's own batches, one call each (the same batches as one call for all:
        # the same grades), so that progress can be told; an endpoint's requests go together.
        chunk = backend.hf.batch_size if backend.hf is not None else backend.client.max_concurrency  # type: ignore[union-attr]
        model_grading = model_grader_agreement(
            [samples[i] for i in kept], [prompts[i] for i in kept], *scores.first_seed(),
            settings["model_grader"]["samples"], LLMGrader(completer(backend, llm, Accounting(), None), backend.kind, prompt),
            chunk=chunk)
        model_name = backend.hf.model_path if backend.hf is not None else backend.client.model  # type: ignore[union-attr]
        model_grading = {"backend": backend.kind, "model": str(model_name), "prompt": origin, **model_grading}
        timings["model_grader_s"] = round(time.perf_counter() - begun, 2)
    datasets.save({"l2a_eval": eval_table(scores.rows(samples))}, settings)
    report = {
        "split": settings["split"],
        "samples": len(samples),
        "dropped_too_long": len(samples) - len(kept),
        "grader": grader.name,
        "grader_rule": GRADER_RULE,
        "beta": settings["beta"],
        "decoding": {"greedy": True, "max_new_tokens": settings["max_new_tokens"], "max_prompt_tokens": settings["max_prompt_tokens"]},
        "stats": stats,
        "models": scores.results,
        "references": scores.reference_results,
        "compare": scores.comparisons,
        "model_grader": model_grading,
    }
    write_json_atomic(settings["output"]["metrics"], rounded(report))
    write_text_atomic(settings["output"]["markdown"], markdown(report))
    write_timings("l2a_eval", {**timings, "wall_s": round(time.perf_counter() - started, 2)})
    print(f"l2a_eval: {len(kept)} {settings['split']} samples x {len(answers)} models (+ {len(references)} reference rows) -> {settings['output']['metrics']}")
    print(markdown_table({**scores.results, **{f"ref: {k}": v for k, v in scores.reference_results.items()}}))
    return report


@main_wrapper
def main() -> None:
    import os

    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    l2a = read_params("l2a")
    if not isinstance(l2a, Mapping) or not isinstance(l2a.get("eval"), Mapping):
        raise ConfigError("params.yaml l2a.eval: missing (or not a mapping)")
    run(l2a["eval"], hindsight=read_params("hindsight", required=False), llm=read_params("llm", required=False))


if __name__ == "__main__":
    main()
