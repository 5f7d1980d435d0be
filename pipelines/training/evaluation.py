"""Held-out evaluation of a policy: what it writes, and what it prefers.

* :func:`generate` - greedy completions for chat prompts, batched with left padding.
* :func:`generation_metrics` - how those completions score: the format reward
  (``well_formed``: full credit, a ``<think>`` followed by one action), the decision they
  take (``clarify_rate``) and, where the reference completion is known, whether it is the
  reference's decision (``decision_match``). Where the rows say whether asking is needed
  (``ask_needed``), ``over_asking`` is the share of act-here prompts answered with a
  question (asking where none was needed) and ``clarify_rate_when_needed`` the share of
  clarification prompts answered with one: an always-ask policy scores 1 on both.
* :func:`next_action_metrics` - CPU-measurable proxies of task success, on held-out decision
  rows with teacher forcing (the prompt is the reference conversation so far; the policy's
  greedy output is its next action): ``action_kind_accuracy`` (clarify / tool call / answer,
  as the reference), ``tool_name_accuracy`` and ``argument_exact_match`` (on the rows whose
  reference calls a tool), and, where the rows carry the hidden ``goal``,
  ``clarify_precision`` (the share of the policy's questions that ask about a goal
  constraint the user has not stated yet, read by the verifiable judge as the evaluation
  reads episodes) and ``clarify_recall`` (the share of rows whose reference asks where the
  policy asks such a question).
* :func:`reward_metrics` - the mean of each training reward and of their weighted total,
  as GRPO sees them.
* :func:`preference_metrics` - the log-probability margin of chosen over rejected
  completions (``margin``: mean of ``log p(chosen) - log p(rejected)``; ``accuracy``: the
  share of pairs with a positive margin; ``accuracy_ask`` / ``accuracy_act`` on the pairs
  at clarification and at act-here points). DPO must raise it; it is measured the same way
  before and after training. For unpaired data (``label`` rows) :func:`labeled_metrics`
  gives the mean log-probability of desirable and of undesirable completions.

:func:`evaluate_heldout` runs what applies to each held-out source.
"""

from __future__ import annotations

import math
from statistics import fmean
from typing import Any, Callable, Mapping, Sequence

from pipelines.episodes.formats import CLARIFY, TOOL_CALL, Malformed, SpeakRLFormat, decision
from pipelines.rewards import FULL_CREDIT, completion_text, format_score
from pipelines.training.config import EvalSpec, GRPOObjective, Objective
from pipelines.training.data import COMPLETION, LABELED, PAIRS, SourceRows
from pipelines.training.trainers import reward_functions, reward_name

Messages = list[dict[str, Any]]


# --- Generation ------------------------------------------------------------------------------


def generate(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Messages],
    *,
    max_new_tokens: int,
    batch_size: int = 16,
    temperature: float | None = None,
    seed: int = 0,
) -> list[str]:
    """One completion per prompt, decoded without control tokens, in the order of
    ``prompts``: greedy, or sampled at ``temperature`` (no top-k/top-p cut, as GRPO
    samples) with torch's RNG seeded with ``seed`` (the caller's RNG state is restored
    afterwards). Prompts are batched by length to waste little on padding."""
    import torch
    from transformers import GenerationConfig

    texts = [tokenizer.apply_chat_template(p, tokenize=False, add_generation_prompt=True) for p in prompts]
    order = sorted(range(len(texts)), key=lambda i: len(texts[i]))
    sampling = {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0} if temperature else {"do_sample": False}
    settings = GenerationConfig(
        max_new_tokens=max_new_tokens,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        **sampling,
    )
    device = next(model.parameters()).device
    was_training, padding_side = model.training, tokenizer.padding_side
    model.eval()
    tokenizer.padding_side = "left"
    outputs: dict[int, str] = {}
    try:
        with torch.random.fork_rng(devices=[]), torch.no_grad():  # the caller's RNG state is left as it was
            torch.manual_seed(seed)
            for start in range(0, len(order), batch_size):
                batch = order[start : start + batch_size]
                encoded = tokenizer([texts[i] for i in batch], return_tensors="pt", padding=True, add_special_tokens=False)
                encoded = encoded.to(device)
                generated = model.generate(**encoded, generation_config=settings)
                new_tokens = generated[:, encoded["input_ids"].shape[1] :]
                for i, text in zip(batch, tokenizer.batch_decode(new_tokens, skip_special_tokens=True)):
                    outputs[i] = text.strip()
    finally:
        tokenizer.padding_side = padding_side
        model.train(was_training)
    return [outputs[i] for i in range(len(texts))]


# --- Scoring generations ---------------------------------------------------------------------


def _speakrl(text: str) -> tuple[float, str | None]:
    return format_score(text), decision(text)


def _clarifier(text: str) -> tuple[float, str | None]:
    from pipelines.clarifier.prompts import parse_clarifier

    parsed = parse_clarifier(text)
    return (0.0, None) if parsed.malformed else (FULL_CREDIT, "clarify" if parsed.asks else "no_need")


def _react(text: str) -> tuple[float, str | None]:
    from pipelines.env.toolwoz import toolwoz_tools
    from pipelines.episodes.formats import Malformed, get_format

    parsed = get_format("react", toolwoz_tools()).parse(text)
    if isinstance(parsed, Malformed):
        return 0.0, None
    kinds = [action.kind for action in parsed if action.kind != "think"]
    return FULL_CREDIT, kinds[0] if kinds else None


#: How a source's generations are read: text -> (format score, decision or None when malformed).
GRAMMARS: Mapping[str, Callable[[str], tuple[float, str | None]]] = {"speakrl": _speakrl, "clarifier": _clarifier, "react": _react}


def generation_metrics(
    texts: Sequence[str], references: Sequence[str] | None = None, ask_needed: Sequence[bool | None] | None = None,
    grammar: str = "speakrl",
) -> dict[str, float]:
    """Format and decision statistics of generated texts (module docstring), read in the
    source's ``grammar`` (:data:`GRAMMARS`).

    >>> ask, act = "<think>a</think><clarify>Which area?</clarify>", "<think>b</think>Here it is."
    >>> m = generation_metrics([ask, ask, act], ask_needed=[True, False, False])
    >>> m["clarify_rate"], m["over_asking"], m["clarify_rate_when_needed"]
    (0.6666666666666666, 0.5, 1.0)
    >>> m = generation_metrics(["<think>x</think>YES [QUESTION]Which order?[/QUESTION]", "NO NEED TO ASK"], grammar="clarifier")
    >>> m["clarify_rate"], m["well_formed"]
    (0.5, 1.0)
    """
    if not texts:
        return {}
    read = GRAMMARS[grammar]
    scores, decisions = zip(*(read(t) for t in texts))
    metrics = {
        "n": len(texts),
        "format_reward": fmean(scores),
        "well_formed": fmean(s == FULL_CREDIT for s in scores),
        "clarify_rate": fmean(d == "clarify" for d in decisions),
    }
    if references is not None:
        metrics["decision_match"] = fmean(d is not None and d == read(r)[1] for d, r in zip(decisions, references))
    if ask_needed is not None:
        act_here = [d == "clarify" for d, needed in zip(decisions, ask_needed) if needed is False]
        needed = [d == "clarify" for d, n in zip(decisions, ask_needed) if n is True]
        if act_here:
            metrics["over_asking"] = fmean(act_here)
            metrics["n_act_here"] = len(act_here)
        if needed:
            metrics["clarify_rate_when_needed"] = fmean(needed)
    return metrics


_SPEAKRL = SpeakRLFormat()
#: Next-action kinds: a response and the closing response are both an answer.
ACTION_KINDS: Mapping[str | None, str] = {"clarify": "clarify", "tool_call": "tool_call", "respond": "answer", "end": "answer"}


def _parsed(text: str) -> tuple[str | None, tuple[str, dict[str, str]] | None, str]:
    """(action kind, (tool, arguments) of a tool call, the question of a clarification)."""
    parsed = _SPEAKRL.parse(text)
    if isinstance(parsed, Malformed):
        return None, None, ""
    kind = ACTION_KINDS.get(decision(text))
    call = next((a for a in parsed if a.kind == TOOL_CALL), None)
    arguments = {str(k): str(v).strip().lower() for k, v in (call.arguments or {}).items()} if call is not None else {}
    question = " ".join(a.text for a in parsed if a.kind == CLARIFY)
    return kind, (call.tool_name, arguments) if call is not None else None, question


def _open_goal_slots(prompt: Messages, goal: Any) -> tuple[list[str], list[str]]:
    """(open, known): the goal's constraint slots the user has not said yet and has said
    (whole words in the user's messages, tool results left out), as the evaluation reads them."""
    import json

    from pipelines.rewards.verifiable import words
    from pipelines.speaker.audit import goal_constraints

    constraints = goal_constraints(json.loads(goal) if isinstance(goal, str) else goal)
    said = " " + " ".join(words(m["content"]) for m in prompt if m["role"] == "user" and not str(m["content"]).startswith("<tool_response>")) + " "
    known = sorted(s for s, values in constraints.items() if any(words(v) and f" {words(v)} " in said for v in values))
    return sorted(s for s in constraints if s not in known), known


def next_action_metrics(texts: Sequence[str], rows: Sequence[Mapping[str, Any]]) -> dict[str, float]:
    """The teacher-forced next-action proxies of ``texts`` (the policy's outputs) against the
    rows' reference ``completion`` (module docstring).

    >>> ask = "<think>a</think><clarify>What kind of food would you like?</clarify>"
    >>> call = '<think>b</think><tool_call>{"name": "query_restaurant", "arguments": {"food": "thai"}}</tool_call>'
    >>> goal = '{"restaurant": {"info": {"food": "thai", "area": "north"}}}'
    >>> rows = [{"prompt": [{"role": "user", "content": "A restaurant in the north."}], "completion": [{"role": "assistant", "content": c}], "goal": goal}
    ...         for c in (ask, call, call)]
    >>> m = next_action_metrics([ask, call.replace("thai", "indian"), ask], rows)
    >>> m["action_kind_accuracy"], m["tool_name_accuracy"], m["argument_exact_match"], m["clarify_precision"], m["clarify_recall"]
    (0.6666666666666666, 0.5, 0.0, 1.0, 1.0)
    """
    if not texts:
        return {}
    from pipelines.rewards.verifiable import VerifiableJudge

    judge = VerifiableJudge()
    kind_hits, name_hits, argument_hits = [], [], []
    asked, asked_well, needed, needed_well = 0, 0, 0, 0
    has_goal = all(row.get("goal") for row in rows)
    for text, row in zip(texts, rows):
        reference = completion_text(row["completion"])
        kind, call, question = _parsed(text)
        ref_kind, ref_call, _ = _parsed(reference)
        kind_hits.append(kind is not None and kind == ref_kind)
        if ref_call is not None:
            name_hits.append(call is not None and call[0] == ref_call[0])
            argument_hits.append(call is not None and call == ref_call)
        if not has_goal:
            continue
        good = False
        if kind == "clarify":
            open_slots, known = _open_goal_slots(row["prompt"], row["goal"])
            verdict = judge.verdict(question, {"discriminating_slots": open_slots, "known_slots": known}) if open_slots else None
            good = verdict is not None and verdict.score >= 1.0
            asked += 1
            asked_well += good
        if ref_kind == "clarify":
            needed += 1
            needed_well += good
    metrics: dict[str, float] = {"n": len(texts), "action_kind_accuracy": fmean(kind_hits)}
    if name_hits:
        metrics.update(n_tool_calls=len(name_hits), tool_name_accuracy=fmean(name_hits), argument_exact_match=fmean(argument_hits))
    if has_goal:
        metrics.update(n_questions=asked, n_clarify_needed=needed)
        if asked:
            metrics["clarify_precision"] = asked_well / asked
        if needed:
            metrics["clarify_recall"] = needed_well / needed
    return metrics


def reward_metrics(
    prompts: Sequence[Messages],
    texts: Sequence[str],
    rows: Sequence[Mapping[str, Any]],
    functions: Sequence[Callable[..., list]],
    weights: Sequence[float],
    names: Sequence[str],
) -> dict[str, float]:
    """Mean of each reward over the completions and of their weighted total (a reward of
    None, a sample its judge could not score, counts in no mean)."""
    if not texts:
        return {}
    completions = [[{"role": "assistant", "content": t}] for t in texts]
    columns = {k: [row.get(k) for row in rows] for k in rows[0] if k != "prompt"}
    metrics: dict[str, float] = {}
    totals = [0.0] * len(texts)
    for function, weight, name in zip(functions, weights, names):
        values = function(prompts=list(prompts), completions=completions, **columns)
        scored = [v for v in values if v is not None]
        metrics[f"reward/{name}"] = fmean(scored) if scored else math.nan
        totals = [t + weight * (v or 0.0) for t, v in zip(totals, values)]
    metrics["reward/total"] = fmean(totals)
    return metrics


# --- Preferences -----------------------------------------------------------------------------


def completion_logprobs(
    model: Any, tokenizer: Any, prompts: Sequence[Messages], completions: Sequence[Messages], *, batch_size: int = 16
) -> list[float]:
    """``log p(completion | prompt)`` under the chat template: the summed log-probabilities
    of the completion's tokens (its end-of-turn token included)."""
    import torch

    sequences: list[tuple[list[int], int]] = []
    for prompt, completion in zip(prompts, completions):
        head = tokenizer.apply_chat_template(prompt, tokenize=False, add_generation_prompt=True)
        full = tokenizer.apply_chat_template(list(prompt) + list(completion), tokenize=False)
        if not full.startswith(head):
            raise ValueError("the chat template does not render the prompt as a prefix of prompt + completion")
        head_ids = tokenizer(head, add_special_tokens=False)["input_ids"]
        tail_ids = tokenizer(full[len(head) :], add_special_tokens=False)["input_ids"]
        sequences.append((head_ids + tail_ids, len(head_ids)))

    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    pad = tokenizer.pad_token_id
    logps: list[float] = []
    try:
        for start in range(0, len(sequences), batch_size):
            batch = sequences[start : start + batch_size]
            width = max(len(ids) for ids, _ in batch)
            input_ids = torch.tensor([ids + [pad] * (width - len(ids)) for ids, _ in batch], device=device)
            attention = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in batch], device=device)
            with torch.no_grad():
                logits = model(input_ids=input_ids, attention_mask=attention).logits.float()
            token_logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)
            for row, (ids, prompt_len) in enumerate(batch):
                logps.append(token_logps[row, prompt_len - 1 : len(ids) - 1].sum().item())
    finally:
        model.train(was_training)
    return logps


def preference_metrics(
    model: Any,
    tokenizer: Any,
    prompts: Sequence[Messages],
    chosen: Sequence[Messages],
    rejected: Sequence[Messages],
    *,
    batch_size: int = 16,
    ask_needed: Sequence[bool | None] | None = None,
) -> dict[str, float]:
    """The chosen-over-rejected log-probability margin on pairs (module docstring)."""
    if not prompts:
        return {}
    good = completion_logprobs(model, tokenizer, prompts, chosen, batch_size=batch_size)
    bad = completion_logprobs(model, tokenizer, prompts, rejected, batch_size=batch_size)
    margins = [g - b for g, b in zip(good, bad)]
    return {
        "n_pairs": len(margins),
        "margin": fmean(margins),
        "accuracy": fmean(m > 0 for m in margins),
        "logp_chosen": fmean(good),
        "logp_rejected": fmean(bad),
        **_accuracy_by_point(margins, ask_needed),
    }


def _accuracy_by_point(margins: Sequence[float], ask_needed: Sequence[bool | None] | None) -> dict[str, float]:
    """Pair accuracy at clarification points and at act-here points, where rows say which."""
    if ask_needed is None:
        return {}
    out: dict[str, float] = {}
    for name, flag in (("ask", True), ("act", False)):
        chosen = [m > 0 for m, needed in zip(margins, ask_needed) if needed is flag]
        if chosen:
            out[f"accuracy_{name}"] = fmean(chosen)
            out[f"n_pairs_{name}"] = len(chosen)
    return out


def labeled_metrics(
    model: Any, tokenizer: Any, rows: Sequence[Mapping[str, Any]], *, batch_size: int = 16
) -> dict[str, float]:
    """Mean log-probability of desirable and of undesirable completions, and the gap."""
    logps = completion_logprobs(
        model, tokenizer, [r["prompt"] for r in rows], [r["completion"] for r in rows], batch_size=batch_size
    )
    good = [lp for lp, r in zip(logps, rows) if r["label"]]
    bad = [lp for lp, r in zip(logps, rows) if not r["label"]]
    metrics: dict[str, float] = {"n_desirable": len(good), "n_undesirable": len(bad)}
    if good:
        metrics["logp_desirable"] = fmean(good)
    if bad:
        metrics["logp_undesirable"] = fmean(bad)
    if good and bad:
        metrics["gap"] = metrics["logp_desirable"] - metrics["logp_undesirable"]
    return metrics


# --- Everything that applies -----------------------------------------------------------------


def evaluate_heldout(
    model: Any,
    tokenizer: Any,
    sources: Sequence[SourceRows],
    spec: EvalSpec,
    objective: Objective,
    judge: Any = None,
) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Metrics per held-out source (``{source: {"preference" | "labeled" | "generation" |
    "rewards": {...}}}``) and the generated texts per source."""
    results: dict[str, dict[str, Any]] = {}
    generations: dict[str, list[str]] = {}
    for source in sources:
        rows = source.heldout
        if not rows:
            continue
        prompts = [r["prompt"] for r in rows]
        metrics: dict[str, Any] = {}
        if source.layout == PAIRS:
            metrics["preference"] = preference_metrics(
                model, tokenizer, prompts, [r["chosen"] for r in rows], [r["rejected"] for r in rows],
                batch_size=spec.batch_size, ask_needed=_ask_needed(rows),
            )
        if source.layout == LABELED:
            metrics["labeled"] = labeled_metrics(model, tokenizer, rows, batch_size=spec.batch_size)
        if spec.generate:
            # n samples per prompt: the prompts repeated, each copy drawing its own sample.
            copies = max(spec.samples, 1)
            repeated = [row for row in rows for _ in range(copies)]
            texts = generate(
                model, tokenizer, [r["prompt"] for r in repeated], max_new_tokens=spec.max_new_tokens,
                batch_size=spec.batch_size, temperature=spec.temperature if spec.samples else None, seed=spec.seed,
            )
            generations[source.name] = texts[::copies]
            reference_column = {COMPLETION: "completion", PAIRS: "chosen"}.get(source.layout)
            references = [completion_text(r[reference_column]) for r in repeated] if reference_column else None
            metrics["generation"] = generation_metrics(texts, references, _ask_needed(repeated), source.grammar)
            if source.layout == COMPLETION and source.grammar == "speakrl":
                metrics["next_action"] = next_action_metrics(texts, repeated)
            if isinstance(objective, GRPOObjective):
                functions, weights = reward_functions(objective, judge)
                names = [reward_name(f) for f in functions]
                metrics["rewards"] = reward_metrics([r["prompt"] for r in repeated], texts, repeated, functions, weights, names)
        results[source.name] = metrics
    return results, generations


def _ask_needed(rows: Sequence[Mapping[str, Any]]) -> list[bool | None] | None:
    """The rows' ``ask_needed`` column, or None when they have none."""
    if not any("ask_needed" in row for row in rows):
        return None
    return [row.get("ask_needed") for row in rows]


__all__ = [
    "evaluate_heldout",
    "labeled_metrics",
    "next_action_metrics",
    "completion_logprobs",
    "completion_text",
    "decision",
    "generate",
    "generation_metrics",
    "preference_metrics",
    "reward_metrics",
]
