"""Bootstrap statistics shared by every method's report: seeded goal resamples, the ratio of
two per-unit sums under them, training-seed draws, percentile intervals and Holm's adjustment.

The bottom floor of the library (numpy only): evaluation, the Clarifier, PIR and JOSH all
draw their intervals here, so they resample the same way.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def resample_indices(n_goals: int, resamples: int, seed: int) -> np.ndarray:
    """``resamples`` x ``n_goals`` goal indices drawn with replacement (seeded)."""
    return np.random.default_rng(seed).integers(0, n_goals, size=(resamples, n_goals))


def seed_draws(k: int, resamples: int, seed: int) -> np.ndarray | None:
    """``resamples`` x ``k`` training-seed indices drawn with replacement (None for one seed),
    from a generator of their own: the goal resamples stay those of one seed (issue 28:
    intervals that resample the training seeds, then the goals).

    >>> seed_draws(1, 5, 0) is None, seed_draws(3, 4, 0).shape
    (True, (4, 3))
    """
    return None if k == 1 else np.random.default_rng([seed, k]).integers(0, k, size=(resamples, k))


def resampled_ratios(num: np.ndarray, den: np.ndarray, indices: np.ndarray) -> np.ndarray:
    """One ratio per resample (NaN where the resample has a zero denominator)."""
    nums, dens = num[indices].sum(axis=1), den[indices].sum(axis=1)
    out = np.full(len(indices), np.nan)
    np.divide(nums, dens, out=out, where=dens > 0)
    return out


#: The intervals' coverage (the ``ci95`` keys).
LEVEL = 0.95


def interval(values: np.ndarray) -> list[float] | None:
    """The percentile interval of the resampled values (NaNs, empty resamples, left out)."""
    values = values[~np.isnan(values)]
    if not len(values):
        return None
    tail = (1.0 - LEVEL) / 2.0
    lo, hi = np.quantile(values, [tail, 1.0 - tail])
    return [round(float(lo), 6), round(float(hi), 6)]


def bounds(ci: list[float] | None) -> dict[str, float | None]:
    """The interval as flat keys beside ``mean`` and ``std``: numbers that ``dvc metrics
    show`` and ``diff`` list (they skip lists)."""
    low, high = ci if ci else (None, None)
    return {"ci95_low": low, "ci95_high": high}


def holm(pvalues: Sequence[float]) -> list[float]:
    """Holm's step-down adjustment (family-wise error over the comparisons given)."""
    order = sorted(range(len(pvalues)), key=lambda i: pvalues[i])
    adjusted = [1.0] * len(pvalues)
    running = 0.0
    for rank, i in enumerate(order):
        running = max(running, min(1.0, (len(pvalues) - rank) * pvalues[i]))
        adjusted[i] = running
    return adjusted


__all__ = ["LEVEL", "bounds", "holm", "interval", "resample_indices", "resampled_ratios", "seed_draws"]
