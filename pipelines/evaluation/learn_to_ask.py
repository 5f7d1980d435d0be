"""Learn-to-Ask's held-out proxy metrics (paper Table 1) for trained policies, as stage
``l2a_eval`` runs them: the held-out samples and the policy's prompts, each model's greedy
answers, every answer scored against its hindsight target (:mod:`pipelines.learn_to_ask.metrics`)
with bootstrap intervals (over training seeds too), a model grader beside the rules grader,
and the report's Markdown and README block."""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from pipelines.errors import ConfigError, DataError
from pipelines.learn_to_ask.metrics import (
    METRICS, REFERENCES, QuestionGrader, bootstrap, bootstrap_seeds, bootstrap_seeds_difference, counts_of, markdown_table, metrics_of,
    reference_outputs, score_output,
)
from pipelines.progress import Progress
from pipelines.rewards.learn_to_ask import CONTINUE, Grade, LLMGrader, grader_case, questions

SALT = "askflow-l2a-eval"
GRADER_SALT = "askflow-l2a-model-grader"


def held_out_samples(rows: list[dict[str, Any]], split: str, max_samples: int | None) -> list[dict[str, Any]]:
    """The usable samples of ``split`` (a stable sample of ``max_samples``), by session and turn."""
    from pipelines.training.data import holdout_score

    usable = [r for r in rows if r["failure"] is None and r["split"] == split]
    for r in usable:
        if r["decision_truth"] is None or r["info_truth"] is None:
            raise DataError("l2a_samples", "a usable sample without its target", record=f"{r['session_id']}/{r['turn']}", field="decision_truth")
    if max_samples is not None:
        usable = sorted(usable, key=lambda r: holdout_score(f"{r['session_id']}/{r['turn']}", SALT))[:max_samples]
    return sorted(usable, key=lambda r: (r["session_id"], r["turn"]))


def policy_prompts(samples: list[dict[str, Any]], system_prompt: str) -> list[list[dict[str, str]]]:
    """The policy's system prompt and the full context C_{t-1}, compacted as training does."""
    from pipelines.training.config import DataSpec
    from pipelines.training.data import compact

    spec = DataSpec(sources=(), compact_prompts=False, max_history_messages=None)
    return [compact([{"role": "system", "content": system_prompt}, *s["context"]], spec) for s in samples]


def answer(model_dir: Path, prompts: list[list[dict[str, str]]], settings: Mapping[str, Any]) -> tuple[list[str | None], int]:
    """Greedy answers of one model (None where the prompt cannot fit), and how many did not fit;
    float32, on the accelerator where there is one (the GPU job's ``l2a_eval``)."""
    import torch
    from transformers import AutoModelForCausalLM

    from pipelines.training.config import ModelSpec
    from pipelines.training.data import TokenCounter, fit_prompt
    from pipelines.training.evaluation import generate
    from pipelines.training.modeling import load_tokenizer

    if not model_dir.is_dir():
        raise ConfigError(f"params.yaml l2a.eval.models: {model_dir} does not exist (run its training stage first)")
    tokenizer = load_tokenizer(ModelSpec(path=str(model_dir)))
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    if torch.cuda.is_available():
        model.to("cuda")
    count = TokenCounter(tokenizer)
    fitted = [fit_prompt(p, [], count, settings["max_prompt_tokens"], reserve=settings["max_new_tokens"]) for p in prompts]
    kept = [i for i, p in enumerate(fitted) if p is not None]
    texts = generate(model, tokenizer, [fitted[i] for i in kept], max_new_tokens=settings["max_new_tokens"], batch_size=settings["batch_size"])
    answers: list[str | None] = [None] * len(prompts)
    for i, text in zip(kept, texts):
        answers[i] = text
    return answers, len(prompts) - len(kept)


def result(values: list[Any], stats: Mapping[str, Any], **extra: Any) -> dict[str, Any]:
    return {
        **extra,
        "metrics": metrics_of(values),
        "ci": bootstrap(values, stats["resamples"], stats["alpha"], stats["seed"]),
        "counts": counts_of(values),
        "reasons": dict(sorted(Counter(s.reason for s in values).items())),
    }


def seeds_result(per_seed: list[list[Any]], paths: list[Path], stats: Mapping[str, Any]) -> dict[str, Any]:
    """A model row: one training seed as before; several: the metrics over the seeds' outputs
    pooled, intervals resampling seeds and samples, and every seed's own metrics."""
    if len(per_seed) == 1:
        return result(per_seed[0], stats, path=str(paths[0]))
    pooled = [s for values in per_seed for s in values]
    return {
        "path": [str(p) for p in paths],
        "seeds": len(per_seed),
        "metrics": metrics_of(pooled),
        "ci": bootstrap_seeds(per_seed, stats["resamples"], stats["alpha"], stats["seed"]),
        "per_seed": [metrics_of(values) for values in per_seed],
        "counts": counts_of(pooled),
        "reasons": dict(sorted(Counter(s.reason for s in pooled).items())),
    }


#: How the rules grader scores a question's content R_a (the report's ``grader_rule``).
GRADER_RULE = ("coverage and precision: 1 = asks about an item of I*_t and about no slot outside it; 0.5 = at most as many "
               "slots outside I*_t as inside, or another slot of an item's domain; 0 = more outside than inside, or irrelevant")


@dataclass
class Scores:
    """Every model's answers scored on the samples all of them answered (``kept``, positions in
    the samples: paired comparisons), with the reference rows on the same samples."""

    kept: list[int]
    outputs: dict[str, list[list[str]]]          # model -> one list per training seed
    scored: dict[str, list[list[Any]]]           # the same, scored
    references: dict[str, list[str]]             # reference row -> its outputs
    scored_references: dict[str, list[Any]]
    results: dict[str, Any]                      # the report's ``models``
    reference_results: dict[str, Any]            # ... ``references``
    comparisons: dict[str, Any]                  # ... ``compare``

    def first_seed(self) -> tuple[dict[str, list[str]], dict[str, list[Any]]]:
        """Each row's outputs and scores (a model's first training seed's): the model grader's sample."""
        return ({**{name: texts[0] for name, texts in self.outputs.items()}, **self.references},
                {**{name: values[0] for name, values in self.scored.items()}, **self.scored_references})

    def rows(self, samples: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """One ``l2a_eval`` row per model, seed and sample: a later seed's rows under ``<name>@<k>``."""
        seeded = {(name if k == 0 else f"{name}@{k}"): (texts, self.scored[name][k])
                  for name, per_seed in self.outputs.items() for k, texts in enumerate(per_seed)}
        seeded.update({name: (texts, self.scored_references[name]) for name, texts in self.references.items()})
        return [{"model": name, "session_id": samples[i]["session_id"], "turn": samples[i]["turn"], "output": text, "scored": s}
                for name, (texts, values) in seeded.items()
                for i, text, s in zip(self.kept, texts, values)]


def score_answers(samples: Sequence[Mapping[str, Any]], prompts: Sequence[Any], answers: Mapping[str, list[list[str | None]]],
                  paths: Mapping[str, list[Path]], grader: QuestionGrader, *, beta: float, stats: Mapping[str, Any],
                  compare: Sequence[tuple[str, str]]) -> Scores:
    """Each model's answers (None: the prompt did not fit) against the hindsight targets, the
    reference rows (the expert's own turn, the catch-all question) on the same samples, the
    intervals and each ``compare`` pair's paired differences."""
    kept = [i for i in range(len(samples)) if all(seed[i] is not None for name in answers for seed in answers[name])]
    seed_outputs: dict[str, list[list[str]]] = {name: [[seed[i] for i in kept] for seed in answers[name]] for name in answers}  # type: ignore[misc]
    references = reference_outputs([samples[i] for i in kept])

    def scored_rows(texts: list[str]) -> list[Any]:
        return [score_output(text, samples[i]["decision_truth"], samples[i]["info_truth"], grader, prompts[i], beta)
                for i, text in zip(kept, texts)]

    seed_scored = {name: [scored_rows(texts) for texts in per_seed] for name, per_seed in seed_outputs.items()}
    scored_refs = {name: scored_rows(texts) for name, texts in references.items()}
    results = {name: seeds_result(per_seed, paths[name], stats) for name, per_seed in seed_scored.items()}
    reference_results = {name: result(values, stats, description=REFERENCES[name]) for name, values in scored_refs.items()}
    comparisons = {
        f"{a} - {b}": {
            "difference": {m: difference(results[a]["metrics"][m], results[b]["metrics"][m]) for m in METRICS},
            "ci": bootstrap_seeds_difference(seed_scored[a], seed_scored[b], stats["resamples"], stats["alpha"], stats["seed"]),
        }
        for a, b in compare
    }
    return Scores(kept, seed_outputs, seed_scored, references, scored_refs, results, reference_results, comparisons)


def grading_sample(samples: list[dict[str, Any]], size: int) -> list[int]:
    """The fixed sample the model grader reads: ``size`` CONTINUE samples (positions in
    ``samples``), in a stable hash order of session and turn."""
    from pipelines.training.data import holdout_score

    continuing = [i for i, s in enumerate(samples) if s["decision_truth"] == CONTINUE]
    chosen = sorted(continuing, key=lambda i: holdout_score(f"{samples[i]['session_id']}/{samples[i]['turn']}", GRADER_SALT))[:size]
    return sorted(chosen)


def model_grader_agreement(samples: list[dict[str, Any]], prompts: list[Any], outputs: Mapping[str, list[str]],
                           scored: Mapping[str, list[Any]], size: int, llm_grader: LLMGrader, chunk: int | None = None) -> dict[str, Any]:
    """R_a by a model grader (appendix G's grading prompt, ``grader`` role) beside the rules
    grader's on a fixed sample of CONTINUE samples, for every row whose output there is a
    right CONTINUE that asks a question (an output without one is 0 for both by construction:
    counted as ``no_question``, never called, and no part of the agreement). Per row WA and
    WA-GH by each grader on the pairs the model graded, and their agreement over all such
    pairs (exact share, confusion counts ``rules->model``); an unreadable grade is counted,
    never scored, and the first few unreadable replies are kept."""
    from pipelines.rewards.learn_to_ask import parse_grade

    chosen = grading_sample(samples, size)
    jobs: list[tuple[str, int]] = []  # (row, sample position) graded by the model
    cases: list[str] = []
    no_question: Counter[str] = Counter()
    for name, values in scored.items():
        for i in chosen:
            if values[i].content is None:
                continue  # a wrong decision (or an ungraded one): no R_a for either grader
            asked = questions(outputs[name][i])
            if asked:
                jobs.append((name, i))
                cases.append(grader_case(prompts[i], " ".join(asked), [(x["field"], x["value"]) for x in samples[i]["info_truth"]]))
            else:
                no_question[name] += 1
    replies: list[Any] = []
    step = chunk or max(1, len(cases))
    with Progress(len(cases), "l2a_eval model grader", unit="grades") as progress:
        for start in range(0, len(cases), step):
            replies += llm_grader.complete([llm_grader.messages(case) for case in cases[start:start + step]])
            progress.update(len(replies))
    if len(replies) != len(cases):
        raise RuntimeError(f"model grader: {len(replies)} replies for {len(cases)} cases")
    grades = [Grade(None, f"llm_{r[0]}") if isinstance(r, tuple) else parse_grade(r) for r in replies]
    unreadable_replies = [str(r)[:200] for r, g in zip(replies, grades) if g.score is None][:3]
    by_job = dict(zip(jobs, grades))
    rows: dict[str, Any] = {}
    pairs: list[tuple[float, float]] = []
    unreadable: Counter[str] = Counter()
    for name, values in scored.items():
        rules_scores, model_scores, failed = [], [], 0
        for i in chosen:
            grade = by_job.get((name, i))
            if grade is None:
                continue
            if grade.score is None:
                unreadable[grade.reason] += 1
                failed += 1
                continue
            rules_scores.append(values[i].content)
            model_scores.append(grade.score)
            pairs.append((values[i].content, grade.score))
        rows[name] = {
            "graded": len(rules_scores), "unreadable": failed, "no_question": no_question[name],
            "rules": {"WA": _mean_or_none(rules_scores), "WA-GH": _mean_or_none([float(x == 1.0) for x in rules_scores])},
            "model": {"WA": _mean_or_none(model_scores), "WA-GH": _mean_or_none([float(x == 1.0) for x in model_scores])},
        }
    confusion = Counter(f"{a:g}->{b:g}" for a, b in pairs)
    return {
        "samples": len(chosen),
        "calls": len(cases),
        "rows": rows,
        "agreement": {
            "pairs": len(pairs),
            "exact": _mean_or_none([float(a == b) for a, b in pairs]),
            "confusion": dict(sorted(confusion.items())),
            "unreadable": dict(sorted(unreadable.items())),
        },
        "unreadable_replies": unreadable_replies,
    }


def _mean_or_none(values: list[float]) -> float | None:
    return sum(values) / len(values) if values else None


def difference(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None else a - b


def rounded(value: Any) -> Any:
    if isinstance(value, float):
        return round(value, 4)
    if isinstance(value, Mapping):
        return {k: rounded(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [rounded(v) for v in value]
    return value


def _seeds_lines(models: Mapping[str, Any]) -> list[str]:
    """The training-seed note under the table's setting: which rows pool several seeds, and
    each seed's WA-GH and TR (what a re-training moves)."""
    seeded = {name: result for name, result in models.items() if result.get("seeds", 1) > 1}
    if not seeded:
        return []
    lines = ["", "Rows trained under several seeds (" + ", ".join(f"`{name}` {result['seeds']}" for name, result in seeded.items())
             + "): the metrics pool their outputs, and the intervals and paired differences resample the seeds, then the samples "
               "(seed k of one row paired with seed k of the other; an untrained row with every seed). Per seed:"]
    for name, result in seeded.items():
        per_seed = result["per_seed"]
        lines.append(f"- `{name}`: WA-GH " + ", ".join("-" if m["WA-GH"] is None else f"{m['WA-GH']:.2f}" for m in per_seed)
                     + "; TR " + ", ".join("-" if m["TR"] is None else f"{m['TR']:.2f}" for m in per_seed))
    return lines


def markdown(report: Mapping[str, Any]) -> str:
    """reports/l2a.md: the table with its reference rows, its setting, each comparison's paired
    differences, and the model grader beside the rules grader."""
    references = report.get("references") or {}
    table = {**report["models"], **{f"ref: {name}": result for name, result in references.items()}}
    lines = [
        "# Learn-to-Ask held-out proxy metrics (paper Table 1)",
        "",
        f"{report['samples'] - report['dropped_too_long']} `{report['split']}` samples of `l2a_samples`, greedy decoding, "
        f"grader `{report['grader']}` ({report.get('grader_rule', 'coverage only')}), beta {report['beta']:g}; "
        f"95 % percentile bootstrap intervals over the samples ({report['stats']['resamples']} resamples; over the training "
        "seeds too where a row has several, its n then counting every seed's outputs). "
        "Definitions: paper appendix F.6 (pipelines/learn_to_ask/metrics.py).",
        *_seeds_lines(report["models"]),
        "",
        markdown_table(table),
    ]
    if references:
        lines += ["", "Reference rows, on the same samples:", ""]
        lines += [f"- `ref: {name}`: {result['description']}." for name, result in references.items()]
    for name, comparison in report["compare"].items():
        lines += ["", f"Paired difference {name}:", "", "| Metric | difference | 95 % interval |", "|---|---|---|"]
        for metric in METRICS:
            value, ci = comparison["difference"][metric], comparison["ci"][metric]
            text = "-" if value is None else f"{value:+.3f}"
            interval = "-" if ci is None else f"[{ci[0]:+.3f}, {ci[1]:+.3f}]"
            lines.append(f"| {metric} | {text} | {interval} |")
    grading = report.get("model_grader")
    if grading:
        agreement = grading["agreement"]
        exact = "-" if agreement["exact"] is None else f"{agreement['exact']:.2f}"
        lines += [
            "",
            f"## Model grader beside the rules grader ({grading['samples']} fixed CONTINUE samples)",
            "",
            f"`{grading['model']}` ({grading['backend']}, {grading['prompt']} grading prompt, greedy) grades the questions of every "
            f"right CONTINUE that asks a question on the sample ({grading['calls']} calls; an output without a question is 0 for both "
            f"by construction and is left out of the agreement). "
            f"Agreement with the rules grader: {exact} exact over {agreement['pairs']} pairs; "
            f"confusion (rules->model) {agreement['confusion'] or '-'}; unreadable grades {agreement['unreadable'] or 'none'}.",
            *[f"\nAn unreadable reply: \"{' '.join(r.split())}\"" for r in grading.get("unreadable_replies", [])[:1]],
            "",
            "| Row | graded by the model | unreadable | no question | WA rules | WA model | WA-GH rules | WA-GH model |",
            "|---|---|---|---|---|---|---|---|",
        ]

        def cell(value: float | None) -> str:
            return "-" if value is None else f"{value:.2f}"

        for name, row in grading["rows"].items():
            label = f"ref: {name}" if name in references else name
            lines.append(f"| {label} | {row['graded']} | {row['unreadable']} | {row['no_question']} | {cell(row['rules']['WA'])} | {cell(row['model']['WA'])} | "
                         f"{cell(row['rules']['WA-GH'])} | {cell(row['model']['WA-GH'])} |")
    return "\n".join(lines) + "\n"


def readme_block(report: Mapping[str, Any]) -> str:
    """README's Learn-to-Ask table, generated from ``reports/l2a.json`` (a test compares them):
    the model rows, the two reference rows, GRPO's paired difference and the model grader."""
    references = report.get("references") or {}
    rows = {**report["models"], **{f"ref: {name}": result for name, result in references.items()}}

    def value(x: float | None, signed: bool = False) -> str:
        return "-" if x is None else (f"{x:+.2f}" if signed else f"{x:.2f}")

    lines = ["| Row | " + " | ".join(METRICS) + " |", "|" + "---|" * (len(METRICS) + 1)]
    for name, result in rows.items():
        lines.append(f"| {name} | " + " | ".join(value(result["metrics"][m]) for m in METRICS) + " |")
    for line in _seeds_lines(report["models"])[2:]:
        lines += ["", f"Per training seed, {line[2:]}."]
    for name, comparison in report["compare"].items():
        parts = []
        for metric in ("WA", "WA-GH", "WS", "TR"):
            ci = comparison["ci"][metric]
            interval = "" if ci is None else f" [{value(ci[0], True)}, {value(ci[1], True)}]"
            parts.append(f"{metric} {value(comparison['difference'][metric], True)}{interval}")
        lines += ["", f"{name}, paired 95 % intervals: " + ", ".join(parts) + "."]
    grading = report.get("model_grader")
    if grading:
        agreement = grading["agreement"]
        unreadable = sum(agreement["unreadable"].values())
        lines += ["", f"Model grader `{grading['model']}` ({grading['prompt']} prompt) on {grading['samples']} fixed CONTINUE samples: "
                  f"{grading['calls']} calls, {unreadable} unreadable grades, {agreement['pairs']} pairs graded by both, "
                  f"exact agreement with the rules grader {value(agreement['exact'])}."]
    return "\n".join(lines)
