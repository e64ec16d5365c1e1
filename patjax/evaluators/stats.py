"""Host-side intervals (numpy, float64): one estimator for each figure, used by the per-run
results (`patjax.run.evaluation`) and the suite tables (`patjax.suites.aggregate`) alike.

- Accuracies of one run: Clopper-Pearson (exact binomial).
- Randomized smoothing's per-image decisions: CERTIFY's one-sided Clopper-Pearson bound on p_A,
  PREDICT's exact binomial test.
- Means over images and every ratio of them (PR over clean-correct images, means over seeds,
  paired differences between runs): the percentile bootstrap over test images of
  `ratio_interval`, every resample drawing the same images for every run (paired).
"""

from __future__ import annotations

import numpy as np
from scipy import special


def clopper_pearson(successes, trials, confidence: float = 0.95):
    """Exact binomial (Clopper-Pearson) interval: arrays (lower, upper), elementwise. The bounds
    are Beta quantiles, Beta(k, n - k + 1).ppf(alpha / 2) and Beta(k + 1, n - k).ppf(1 - alpha / 2),
    computed as scipy.special's inverse regularized incomplete beta (scipy.stats, which gives the
    same, takes 0.7 s to import in every command)."""
    k = np.asarray(successes, np.float64)
    n = np.asarray(trials, np.float64)
    alpha = 1.0 - confidence
    with np.errstate(invalid="ignore", divide="ignore"):
        upper = np.where(k < n, special.betaincinv(k + 1, n - k, 1 - alpha / 2), 1.0)
    return clopper_pearson_lower(k, n, alpha / 2), upper


def clopper_pearson_lower(successes, trials, alpha: float):
    """The one-sided (1 - alpha) Clopper-Pearson lower bound, Beta(k, n - k + 1).ppf(alpha) (0 at
    k = 0), elementwise: what statsmodels' proportion_confint(k, n, alpha=2 alpha, method="beta")[0]
    returns, CERTIFY's bound on p_A (Cohen et al.'s `Smooth._lower_confidence_bound`)."""
    k = np.asarray(successes, np.float64)
    n = np.asarray(trials, np.float64)
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(k > 0, special.betaincinv(k, n - k + 1, alpha), 0.0)


def binomial_test_half(successes, trials):
    """The two-sided exact binomial test of p = 1/2 (scipy.stats.binomtest(k, n, 0.5).pvalue),
    elementwise: by the symmetry of Binomial(n, 1/2) the outcomes at most as likely as k are the
    two tails beyond min(k, n - k), so the p-value is min(1, 2 P(X <= min(k, n - k))); 1 at n = 0."""
    k = np.asarray(successes, np.int64)
    n = np.asarray(trials, np.int64)
    return np.minimum(1.0, 2.0 * special.bdtr(np.minimum(k, n - k), n, 0.5))


def bootstrap_indices(num_items: int, num_resamples: int, seed: int) -> np.ndarray:
    """(num_resamples, num_items) indices of images drawn with replacement."""
    return np.random.default_rng(seed).integers(0, num_items, size=(num_resamples, num_items))


def ratio_interval(
    numerators: np.ndarray,
    denominators: np.ndarray,
    indices: np.ndarray,
    confidence: float,
    chunk: int = 250,
    row_weights=None,
):
    """Mean over rows (seeds) of sum(num_s) / sum(den_s), with a percentile bootstrap over columns.

    numerators, denominators: (S, n) per-image values of S runs on the same n images; every
    bootstrap resample draws the same images for every row (paired). With denominators of 1
    this is the mean over images averaged over runs; with 0/1 denominators (clean-correct
    masks) it is the mean over each run's selected images.
    row_weights: (S,) weights w_s of the rows' ratios, sum_s w_s ratio_s (default 1/S each: the
    mean); `ratio_difference` weighs two runs' rows +1/S and -1/S.
    Returns (value, (low, high)); value None when a denominator sums to 0.
    """
    num = np.atleast_2d(np.asarray(numerators, np.float64))
    den = np.atleast_2d(np.asarray(denominators, np.float64))
    weights = np.full(num.shape[0], 1.0 / num.shape[0]) if row_weights is None else np.asarray(row_weights, np.float64)
    totals = den.sum(axis=1)
    if np.any(totals == 0):
        return None, (None, None)
    value = float(weights @ (num.sum(axis=1) / totals))
    stats = []
    for start in range(0, len(indices), chunk):
        idx = indices[start : start + chunk]  # (r, n)
        with np.errstate(invalid="ignore", divide="ignore"):
            ratios = num[:, idx].sum(-1) / den[:, idx].sum(-1)  # (S, r)
        stats.append(weights @ ratios)
    stats = np.concatenate(stats)
    alpha = 1.0 - confidence
    low, high = np.nanquantile(stats, alpha / 2), np.nanquantile(stats, 1 - alpha / 2)
    return value, (float(low), float(high))


def paired_difference(a: np.ndarray, b: np.ndarray, indices: np.ndarray, confidence: float, mask=None, per: int = 1):
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


def ratio_difference(num_a, den_a, num_b, den_b, indices: np.ndarray, confidence: float):
    """Mean over seeds of sum(num_a)/sum(den_a) - sum(num_b)/sum(den_b), with the paired
    bootstrap of `ratio_interval` (every resample draws the same images for A and B).

    The difference of two runs' Table-1 figures, each over its own clean-correct images
    (den_a, den_b: the two runs' masks): unlike `paired_difference` with a common mask, the
    two means are over different images, as in the paper's table.
    num_*, den_*: (S, n) or (n,), row s of A paired with row s of B (the same seed).
    """
    num_a, den_a, num_b, den_b = (np.atleast_2d(np.asarray(v, np.float64)) for v in (num_a, den_a, num_b, den_b))
    seeds = num_a.shape[0]
    weights = np.concatenate([np.full(seeds, 1.0 / seeds), np.full(seeds, -1.0 / seeds)])
    return ratio_interval(
        np.concatenate([num_a, num_b]), np.concatenate([den_a, den_b]), indices, confidence, row_weights=weights
    )


# The estimands of a difference between two runs' PR (`pr_difference`): each run over its own
# clean-correct images (the difference of two Table-1 figures), both runs over the images both
# classify correctly (paired image by image), and all images.
ESTIMANDS = ("clean_correct", "both_correct", "all")


def pr_difference(
    counts_a, correct_a, counts_b, correct_b, num_samples: int, indices: np.ndarray, confidence: float
) -> dict:
    """PR(A) - PR(B) under each of `ESTIMANDS`: {estimand: {value, interval, n, interval_method}}.

    counts_*: (S, n) or (n,) non-adversarial samples out of num_samples per image, on the same
    images and perturbations (common random numbers); correct_*: the runs' clean-correct masks;
    rows are seeds, row s of A paired with row s of B. n is the smallest number of images a
    mean is over.
    """
    counts_a, counts_b = (np.atleast_2d(np.asarray(c, np.float64)) for c in (counts_a, counts_b))
    correct_a, correct_b = (np.atleast_2d(np.asarray(c, bool)) for c in (correct_a, correct_b))
    both = correct_a & correct_b
    method = f"paired percentile bootstrap over images ({len(indices)} resamples)"
    figures = {
        "clean_correct": (
            ratio_difference(
                counts_a / num_samples * correct_a,
                correct_a,
                counts_b / num_samples * correct_b,
                correct_b,
                indices,
                confidence,
            ),
            int(min(correct_a.sum(axis=1).min(), correct_b.sum(axis=1).min())),
        ),
        "both_correct": (
            paired_difference(counts_a, counts_b, indices, confidence, mask=both, per=num_samples),
            int(both.sum(axis=1).min()),
        ),
        "all": (paired_difference(counts_a, counts_b, indices, confidence, per=num_samples), int(counts_a.shape[1])),
    }
    return {
        k: {"value": v, "interval": list(ci), "n": n, "interval_method": method} for k, ((v, ci), n) in figures.items()
    }


def matched_difference(curves_a, finals_b, indices: np.ndarray, confidence: float) -> dict:
    """PR of A's learning curve at B's clean accuracy, minus B's PR: the difference at matched
    clean accuracy, with a paired percentile bootstrap over images.

    curves_a: per seed, a list of (correct (n,), pr (n, L)) of A's models along its training
      (learning-curve points, any order); finals_b: per seed, (correct, pr) of B's model. pr is
      the per-image PR_i at L levels; every model is evaluated on the same images and noise.
    Per seed and resample: every model's clean accuracy and PR over its own clean-correct
    images (the Table-1 figure) are computed on the resampled images; A's PR is linearly
    interpolated in clean accuracy between A's points (sorted by clean accuracy) at B's clean
    accuracy, and B's PR subtracted. Outside A's range of clean accuracy there is no match
    (value None for that seed and resample; a resample without a match for a seed is dropped).
    Returns {"value": (L,) list or None, "interval": [(L,), (L,)], "matched_accuracy": mean over
    seeds of B's clean accuracy, "accuracy_range_a": per seed [min, max] of A's clean accuracy,
    "resamples_matched": the fraction of resamples with a match for every seed}.
    """

    def figures(correct, pr, idx):
        # (models, R) clean accuracy and (models, R, L) PR over each model's clean-correct images
        c = correct[:, idx]  # (M, R, n)
        acc = c.mean(axis=-1)
        with np.errstate(invalid="ignore", divide="ignore"):
            prs = np.einsum("mrn,mrnl->mrl", c, pr[:, idx]) / c.sum(axis=-1)[..., None]
        return acc, prs

    def interpolate(acc_a, pr_a, target):
        # acc_a (M,), pr_a (M, L) -> (L,) at target, or NaN outside [min, max] of acc_a
        order = np.argsort(acc_a, kind="stable")
        xs, ys = acc_a[order], pr_a[order]
        if not xs[0] <= target <= xs[-1] or np.isnan(ys).any():
            return np.full(ys.shape[1], np.nan)
        return np.array([np.interp(target, xs, ys[:, level]) for level in range(ys.shape[1])])

    full = np.arange(len(finals_b[0][0]))[None]
    per_seed_value, per_seed_boot, ranges, targets = [], [], [], []
    for curve, (correct_b, pr_b) in zip(curves_a, finals_b):
        correct_a = np.stack([np.asarray(c, np.float64) for c, _ in curve])
        pr_a = np.stack([np.asarray(p, np.float64) for _, p in curve])
        cb, pb = np.asarray(correct_b, np.float64)[None], np.asarray(pr_b, np.float64)[None]
        outs = []
        for idx in [full] + [indices[i : i + 250] for i in range(0, len(indices), 250)]:  # bounded memory
            acc_a, prs_a = figures(correct_a, pr_a, idx)
            acc_b, prs_b = figures(cb, pb, idx)
            outs.append(
                np.stack(
                    [interpolate(acc_a[:, r], prs_a[:, r], acc_b[0, r]) - prs_b[0, r] for r in range(idx.shape[0])]
                )
            )
        per_seed_value.append(outs[0][0])
        per_seed_boot.append(np.concatenate(outs[1:]))
        acc_full, _ = figures(correct_a, pr_a, full)
        ranges.append([float(acc_full.min()), float(acc_full.max())])
        targets.append(float(cb.mean()))
    value = np.mean(per_seed_value, axis=0)
    boot = np.mean(per_seed_boot, axis=0)  # (R, L); NaN where a seed had no match
    matched = ~np.isnan(boot).any(axis=1)
    alpha = 1.0 - confidence
    if np.isnan(value).any() or not matched.any():
        interval = [None, None]
    else:
        interval = [
            np.quantile(boot[matched], alpha / 2, axis=0).tolist(),
            np.quantile(boot[matched], 1 - alpha / 2, axis=0).tolist(),
        ]
    return {
        "value": None if np.isnan(value).any() else value.tolist(),
        "interval": interval,
        "matched_accuracy": float(np.mean(targets)),
        "accuracy_range_a": ranges,
        "resamples_matched": float(matched.mean()),
    }
