"""PIR's evaluation numbers (section 4.1) for played conversations
(:class:`pipelines.training.rollout.Rollout`): task success (the world's grade: on MultiWOZ the
goal checker), TTR (turns to resolution: the simulator's replies after its opening), tokens
(what the policy wrote), questions asked (in its reasoning and as visible clarifications),
helpfulness of the asking (H from a :class:`~pipelines.rewards.pir.HelpfulnessJudge`) and the
composite reward."""

from __future__ import annotations

import statistics
from typing import Any, Sequence

from pipelines.rewards.pir import HelpfulnessJudge, HelpItem, PIRReward


def _mean(values: Sequence[float]) -> float | None:
    return round(statistics.fmean(values), 4) if values else None


def helpfulness_scores(rollouts: Sequence[Any], unstated: Sequence[Sequence[str]], judge: HelpfulnessJudge) -> list[float | None]:
    """H per conversation that asked (None for one that did not ask, or that the judge could
    not score)."""
    items, where = [], []
    for i, (rollout, slots) in enumerate(zip(rollouts, unstated)):
        if rollout.questions:
            opening = rollout.episode.events[0].text if rollout.episode.events else ""
            items.append(HelpItem(opening or "", opening or "", "\n".join(rollout.questions), {"unstated_slots": list(slots)}))
            where.append(i)
    scores: list[float | None] = [None] * len(rollouts)
    for i, (score, _) in zip(where, judge.helpfulness(items) if items else []):
        scores[i] = score
    return scores


def conversation_metrics(rollouts: Sequence[Any], unstated: Sequence[Sequence[str]], reward: PIRReward) -> dict[str, Any]:
    """The table's numbers over ``rollouts`` (``unstated``: each goal's slots its opening
    turn left out, for the helpfulness judge and the reward).

    ``helpfulness`` is the mean H over the conversations that asked (null when none did);
    ``reward`` the mean composite reward of the policy's text, scored as in training."""
    n = len(rollouts)
    help_scores = helpfulness_scores(rollouts, unstated, reward.judge)
    rewards = reward(["" for _ in rollouts], [r.policy_text for r in rollouts], correct=[r.episode.success for r in rollouts],
                     unstated_slots=[list(s) for s in unstated])
    asked = [r for r in rollouts if r.questions]
    return {
        "conversations": n,
        "success": _mean([float(r.episode.success) for r in rollouts]),
        "inform": _mean([float(r.episode.result.inform) for r in rollouts]),
        "ttr": _mean([float(r.ttr) for r in rollouts]),
        "tokens": _mean([float(r.policy_tokens) for r in rollouts]),
        "questions": _mean([float(len(r.questions)) for r in rollouts]),
        "asks_in_reasoning": _mean([float(len(r.asks)) for r in rollouts]),
        "asked_share": _mean([float(bool(r.questions)) for r in rollouts]),
        "helpfulness": _mean([s for s in help_scores if s is not None]),
        "helpfulness_scored": sum(s is not None for s in help_scores),
        "reward": _mean([x for x in rewards if x is not None]),
        "malformed": _mean([float(r.episode.n_malformed) for r in rollouts]),
        "tool_calls": _mean([float(r.episode.n_tool_calls) for r in rollouts]),
        "truncated": sum(r.truncated for r in rollouts),
        "ended_by": dict(sorted(_count(r.episode.ended_by for r in rollouts).items())),
        "asked_conversations": len(asked),
    }


def play_and_score(rollout: Any, model: Any, dialogues: Sequence[Any], seed: int, reward: PIRReward) -> tuple[dict[str, Any], list]:
    """Play each dialogue's goal once (episode ``<id>#<seed>``, sampling seeded by ``seed``)
    with ``rollout`` (a :class:`pipelines.training.rollout.ConversationRollout`) and
    ``model``; PIR's numbers over them (:func:`conversation_metrics`) and the rollouts."""
    from pipelines.rewards.pir import unstated_slots
    from pipelines.episodes.runner import EpisodeSpec

    specs = [EpisodeSpec(f"{d.dialogue_id}#{seed}", d.goal, seed) for d in dialogues]
    played = rollout.play(model, specs, [seed] * len(specs))
    unstated = [unstated_slots(spec.goal, opening_text(r)) for spec, r in zip(specs, played)]
    return conversation_metrics(played, unstated, reward), played


#: What pooling training seeds adds up rather than averages.
_COUNTS = ("conversations", "helpfulness_scored", "truncated", "asked_conversations")


def pool_seeds(per_seed: Sequence[dict[str, Any]]) -> dict[str, Any]:
    """One row for a policy trained under several seeds from each seed's
    :func:`conversation_metrics` on the same goals: counts summed, every other number the
    mean over the seeds that have it, ``seed_range`` its lowest and highest value
    (issue 28: what a re-training moves), ``training_seeds`` how many.

    >>> row = pool_seeds([{"conversations": 4, "success": 0.5, "helpfulness": None, "ended_by": {"goal": 2}},
    ...                   {"conversations": 4, "success": 0.0, "helpfulness": 0.8, "ended_by": {"goal": 1}}])
    >>> row["conversations"], row["success"], row["helpfulness"], row["seed_range"]["success"], row["ended_by"]
    (8, 0.25, 0.8, [0.0, 0.5], {'goal': 3})
    """
    pooled: dict[str, Any] = {}
    ranges: dict[str, list[float]] = {}
    for key in per_seed[0]:
        values = [m.get(key) for m in per_seed]
        if key in _COUNTS:
            pooled[key] = sum(v or 0 for v in values)
        elif isinstance(values[0], dict):
            merged: dict[str, int] = {}
            for v in values:
                for k, n in (v or {}).items():
                    merged[k] = merged.get(k, 0) + n
            pooled[key] = dict(sorted(merged.items()))
        else:
            numbers = [float(v) for v in values if v is not None]
            pooled[key] = _mean(numbers)
            if numbers:
                ranges[key] = [min(numbers), max(numbers)]
    pooled["training_seeds"] = len(per_seed)
    pooled["seed_range"] = ranges
    return pooled


def opening_text(rollout: Any) -> str:
    """The user's opening turn of a played conversation."""
    return next((e.text or "" for e in rollout.episode.events if e.actor == "user"), "")


def _count(values: Any) -> dict[str, int]:
    out: dict[str, int] = {}
    for v in values:
        out[str(v)] = out.get(str(v), 0) + 1
    return out


COLUMNS = (("success", "success", True), ("ttr", "TTR", False), ("tokens", "tokens", False),
           ("questions", "questions", False), ("helpfulness", "help.", False), ("reward", "reward", False))


def markdown_table(results: dict[str, dict[str, Any]]) -> str:
    """One row per model.

    >>> print(markdown_table({"base": {"success": 0.0, "ttr": 2.0, "tokens": 80.5, "questions": 0.0, "helpfulness": None, "reward": 0.0, "conversations": 4}}))
    | model | conversations | success | TTR | tokens | questions | help. | reward |
    |---|---|---|---|---|---|---|---|
    | base | 4 | 0.0 % | 2.00 | 80.50 | 0.00 | – | 0.000 |
    """
    head = "| model | conversations | " + " | ".join(label for _, label, _ in COLUMNS) + " |"
    lines = [head, "|" + "---|" * (len(COLUMNS) + 2)]

    def cells(m: dict[str, Any]) -> str:
        return " | ".join("–" if m.get(key) is None else (f"{100 * m[key]:.1f} %" if percent else (
            f"{m[key]:.3f}" if key == "reward" else f"{m[key]:.2f}")) for key, _, percent in COLUMNS)

    for name, m in results.items():
        seeds = f" ({m['training_seeds']} seeds)" if m.get("training_seeds") else ""
        lines.append(f"| {name}{seeds} | {m.get('conversations')} | {cells(m)} |")
        for seed_name, seed_metrics in (m.get("per_training_seed") or {}).items():  # each re-training alone
            seed = seed_name.rsplit("@", 1)[1] if "@" in seed_name else "0"
            lines.append(f"| seed {seed} ({seed_name}) | {seed_metrics.get('conversations')} | {cells(seed_metrics)} |")
    return "\n".join(lines)
