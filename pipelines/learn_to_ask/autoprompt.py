"""Auto-Prompt (Learn-to-Ask section 3.5, appendix E, Algorithm 1): greedy search over prompts.

Starting from a seed prompt, each iteration a proposer makes ``k`` variations of the current
best prompt; each candidate runs its track's pipeline on the calibration set and is scored
against the anchor set; the best of the current prompt and its candidates becomes the new
best (a tie keeps the current one, so the search never drifts for nothing). Every candidate,
its score and its lineage (parent, mutation, iteration) is recorded.

Tracks and their scores (higher is better):

* EXTRACT: :func:`extraction_f1`, micro F1 of the extracted items against the anchors';
* GRADER: :func:`negative_mse` of the grades against the anchor grades (a grade the grader
  could not give counts as the largest error, 1);
* ROLLOUT: the mean reward of the policy's candidates under the fixed grader.

A prompt is structured (:class:`Prompt`: instruction, few-shot examples, output rules) so
that the offline :class:`RulesProposer` mutates it deterministically, as the paper's
rule-based mutations do: reword the instruction, add an anchor example as a few-shot
example, drop one, add an output-format rule, drop one. An LLM proposer (paraphrases) fits
the same ``propose`` signature.
"""

from __future__ import annotations

import hashlib
import random
import re
from dataclasses import dataclass, replace
from typing import Callable, Sequence

TRACKS: tuple[str, ...] = ("extract", "grader", "rollout")
MUTATIONS: tuple[str, ...] = ("seed", "reword", "add_example", "drop_example", "add_rule", "drop_rule", "kept")


@dataclass(frozen=True)
class Prompt:
    """A prompt as parts: ``instruction``, few-shot ``examples`` ((input, output) pairs) and
    output ``rules``. :meth:`render` is the text a model reads."""

    instruction: str
    examples: tuple[tuple[str, str], ...] = ()
    rules: tuple[str, ...] = ()

    def render(self) -> str:
        parts = [self.instruction]
        for number, (given, expected) in enumerate(self.examples, start=1):
            parts.append(f"[Example {number}]\n{given}\n[Expected Output]\n{expected}")
        if self.rules:
            parts.append("[Output Rules]\n" + "\n".join(f"- {rule}" for rule in self.rules))
        return "\n\n".join(parts)

    @property
    def prompt_id(self) -> str:
        return hashlib.sha256(self.render().encode("utf-8")).hexdigest()[:16]


@dataclass(frozen=True)
class Candidate:
    """One scored prompt: ``iteration`` (0 for the seed), its ``parent_id`` and the
    ``mutation`` that made it, and whether it was the best after its iteration."""

    track: str
    iteration: int
    prompt: Prompt
    parent_id: str | None
    mutation: str
    score: float
    selected: bool = False

    @property
    def prompt_id(self) -> str:
        return self.prompt.prompt_id


# --- Scores ------------------------------------------------------------------------------------

_SPACE = re.compile(r"\s+")


def _norm(text: str) -> str:
    return _SPACE.sub(" ", text.strip().lower())


def extraction_f1(predicted: Sequence[Sequence[tuple[str, str]] | None], anchors: Sequence[Sequence[tuple[str, str]]]) -> float:
    """Micro F1 of extracted items against the anchors', sample by sample. An item matches
    by its value (case and spacing aside): fields are named freely by an LLM ("fever" vs
    "has fever"), the value is what was collected. A failed extraction (None) extracted nothing.

    >>> extraction_f1([[("fever", "absent"), ("cough", "dry")]], [[("has fever", "Absent")]])
    0.6666666666666666
    >>> extraction_f1([None, []], [[("a", "b")], []])
    0.0
    """
    if len(predicted) != len(anchors):
        raise ValueError(f"{len(predicted)} extractions for {len(anchors)} anchors")
    hits = n_predicted = n_anchor = 0
    for got, want in zip(predicted, anchors):
        got_values = {_norm(v) for _, v in got or ()}
        want_values = {_norm(v) for _, v in want}
        hits += len(got_values & want_values)
        n_predicted += len(got_values)
        n_anchor += len(want_values)
    if n_predicted == 0 and n_anchor == 0:
        return 1.0
    return 2 * hits / (n_predicted + n_anchor) if hits else 0.0


def negative_mse(grades: Sequence[float | None], anchors: Sequence[float]) -> float:
    """Minus the mean squared error of the grades against the anchor grades; a missing grade
    counts as the largest error (1).

    >>> negative_mse([1.0, 0.5, None], [1.0, 0.0, 1.0])
    -0.4166666666666667
    """
    if len(grades) != len(anchors) or not anchors:
        raise ValueError(f"{len(grades)} grades for {len(anchors)} anchors")
    return -sum(1.0 if g is None else (g - a) ** 2 for g, a in zip(grades, anchors)) / len(anchors)


# --- The rules proposer --------------------------------------------------------------------------


class RulesProposer:
    """Deterministic mutations of a prompt (module docstring). ``rewordings``: alternative
    instructions; ``examples``: the pool of few-shot examples (anchor examples, never the
    samples being scored); ``rules``: the pool of output-format rules. ``seed`` fixes which
    mutations an iteration tries; the same inputs propose the same candidates."""

    def __init__(self, rewordings: Sequence[str], examples: Sequence[tuple[str, str]] = (),
                 rules: Sequence[str] = (), seed: int = 0):
        self.rewordings = tuple(dict.fromkeys(rewordings))
        self.examples = tuple(dict.fromkeys(examples))
        self.rules = tuple(dict.fromkeys(rules))
        self.seed = seed

    def variations(self, prompt: Prompt) -> list[tuple[str, Prompt]]:
        """Every single-step mutation of ``prompt``, in a fixed order."""
        out: list[tuple[str, Prompt]] = []
        out += [("reword", replace(prompt, instruction=r)) for r in self.rewordings if r != prompt.instruction]
        out += [("add_example", replace(prompt, examples=prompt.examples + (e,))) for e in self.examples if e not in prompt.examples]
        out += [("drop_example", replace(prompt, examples=prompt.examples[:i] + prompt.examples[i + 1 :])) for i in range(len(prompt.examples))]
        out += [("add_rule", replace(prompt, rules=prompt.rules + (r,))) for r in self.rules if r not in prompt.rules]
        out += [("drop_rule", replace(prompt, rules=prompt.rules[:i] + prompt.rules[i + 1 :])) for i in range(len(prompt.rules))]
        return out

    def propose(self, prompt: Prompt, k: int, iteration: int) -> list[tuple[str, Prompt]]:
        """``k`` distinct variations (all of them when there are fewer), drawn with a
        generator seeded by ``seed`` and ``iteration``."""
        options = self.variations(prompt)
        random.Random(f"{self.seed}:{iteration}:{prompt.prompt_id}").shuffle(options)
        return options[:k]


# --- The search ----------------------------------------------------------------------------------


def calibrate(
    track: str,
    seed: Prompt,
    propose: Callable[[Prompt, int, int], Sequence[tuple[str, Prompt]]],
    score: Callable[[Prompt], float],
    iterations: int,
    k: int,
) -> list[Candidate]:
    """Algorithm 1: every candidate scored, in order (the seed first); the last candidate
    with ``selected`` set is the calibrated prompt. ``score`` runs the track's pipeline on
    the calibration set and scores it against the anchors; a prompt already scored is not
    run again."""
    if track not in TRACKS:
        raise ValueError(f"track must be one of {list(TRACKS)}, got {track!r}")
    if iterations < 0 or k < 1:
        raise ValueError(f"iterations must be >= 0 and k >= 1, got {iterations} and {k}")
    scores: dict[str, float] = {}

    def scored(prompt: Prompt) -> float:
        if prompt.prompt_id not in scores:
            scores[prompt.prompt_id] = float(score(prompt))
        return scores[prompt.prompt_id]

    best = Candidate(track, 0, seed, None, "seed", scored(seed), selected=True)
    history = [best]
    for iteration in range(1, iterations + 1):
        round_ = [Candidate(track, iteration, p, best.prompt_id, mutation, scored(p))
                  for mutation, p in propose(best.prompt, k, iteration)]
        winner = max(round_, key=lambda c: c.score, default=None)
        if winner is not None and winner.score > best.score:
            best = winner
        history += [replace(c, selected=c is best) for c in round_]
        if best.iteration != iteration:  # the current best stays: recorded again as this round's pick
            history.append(replace(best, iteration=iteration, mutation="kept", selected=True, parent_id=best.prompt_id))
    return history


def calibrated(history: Sequence[Candidate]) -> Candidate:
    """The prompt the search ended with."""
    return [c for c in history if c.selected][-1]
