"""Host-side intervals (numpy, float64): one estimator for each figure, used by the per-run
results (`patjax.evaluation`) and the suite tables (`patjax.suite_results`) alike.

- Accuracies of one run: Clopper-Pearson (exact binomial).
- Means over images and every ratio of them (PR over clean-correct images, means over seeds,
  paired differences between runs): the percentile bootstrap over test images of
  `ratio_interval`, every resample drawing the same images for every run (paired).
"""
from __future__ import annotations

import numpy as np


def clopper_pearson(successes, trials, confidence: float = 0.95):
    """Exact binomial (Clopper-Pearson) interval: arrays (lower, upper), elementwise."""
    from scipy import stats

    k = np.asarray(successes, np.float64)
    n = np.asarray(trials, np.float64)
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        lower = np.where(k > 0, stats.beta.ppf(alpha / 2, k, n - k + 1), 0.0)
        upper = np.where(k < n, stats.beta.ppf(1 - alpha / 2, k + 1, n - k), 1.0)
    return lower, upper


def bootstrap_indices(num_items: int, num_resamples: int, seed: int) -> np.ndarray:
    """(num_resamples, num_items) indices of images drawn with replacement."""
    return np.random.default_rng(seed).integers(0, num_items, size=(num_resamples, num_items))


def ratio_interval(numerators: np.ndarray, denominators: np.ndarray, indices: np.ndarray,
                   confidence: float, chunk: int = 250):
    """Mean over rows (seeds) of sum(num_s) / sum(den_s), with a percentile bootstrap over columns.

    numerators, denominators: (S, n) per-image values of S runs on the same n images; every
    bootstrap resample draws the same images for every row (paired). With denominators of 1
    this is the mean over images averaged over runs; with 0/1 denominators (clean-correct
    masks) it is the mean over each run's selected images.
    Returns (value, (low, high)); value None when a denominator sums to 0.
    """
    num = np.asarray(numerators, np.float64)
    den = np.asarray(denominators, np.float64)
    totals = den.sum(axis=1)
    if np.any(totals == 0):
        return None, (None, None)
    value = float(np.mean(num.sum(axis=1) / totals))
    stats = []
    for start in range(0, len(indices), chunk):
        idx = indices[start:start + chunk]                  # (r, n)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = num[:, idx].sum(-1) / den[:, idx].sum(-1)  # (S, r)
        stats.append(ratios.mean(axis=0))
    stats = np.concatenate(stats)
    alpha = 1.0 - confidence
    low, high = np.nanquantile(stats, alpha / 2), np.nanquantile(stats, 1 - alpha / 2)
    return value, (float(low), float(high))


def paired_difference(a: np.ndarray, b: np.ndarray, indices: np.ndarray, confidence: float, mask=None,
                      per: int = 1):
    """Mean over images of a - b (averaged over rows: seeds), with the paired bootstrap of
    `ratio_interval`: every resample draws the same images for A and B, so the interval covers
    the difference itself, not the spread of two independent estimates.

    a, b: (S, n) or (n,) per-image values of two runs evaluated on the same images with the
    same perturbations (common random numbers); with `per`, counts out of `per` (PR's
    non-adversarial samples out of N: the difference is taken in counts, then divided).
    mask: the images to average over (1/0, e.g. those both runs classify correctly), default
    all. Returns (value, (low, high)).
    """
    diff = np.atleast_2d(np.asarray(a, np.float64) - np.asarray(b, np.float64))
    if per != 1:
        diff = diff / per
    mask = np.ones_like(diff) if mask is None else np.broadcast_to(np.atleast_2d(mask), diff.shape).astype(np.float64)
    return ratio_interval(diff * mask, mask, indices, confidence)
