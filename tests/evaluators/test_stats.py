"""Differences between two runs' PR: the three estimands and the comparison at matched clean
accuracy, against hand computations (numpy loops over the same bootstrap resamples)."""

import numpy as np
import pytest

from patjax.evaluators import stats


def two_runs(rng, n=300, samples=20):
    correct_a, correct_b = rng.random(n) < 0.55, rng.random(n) < 0.4
    counts_a = np.where(correct_a, rng.integers(10, samples + 1, n), rng.integers(0, 5, n))
    counts_b = np.where(correct_b, rng.integers(14, samples + 1, n), rng.integers(0, 5, n))
    return correct_a, counts_a, correct_b, counts_b


def test_pr_difference_estimands_against_a_loop_over_resamples():
    rng = np.random.default_rng(1)
    samples, conf = 20, 0.9
    correct_a, counts_a, correct_b, counts_b = two_runs(rng, samples=samples)
    idx = stats.bootstrap_indices(len(correct_a), 400, 7)
    got = stats.pr_difference(counts_a, correct_a, counts_b, correct_b, samples, idx, conf)
    pr_a, pr_b = counts_a / samples, counts_b / samples
    both = correct_a & correct_b

    def estimands(i):
        ca, cb, pa, pb = correct_a[i], correct_b[i], pr_a[i], pr_b[i]
        return {
            "clean_correct": pa[ca].mean() - pb[cb].mean(),  # two Table-1 figures, own images each
            "both_correct": (pa - pb)[ca & cb].mean(),
            "all": (pa - pb).mean(),
        }

    full = estimands(np.arange(len(correct_a)))
    boot = [estimands(i) for i in idx]
    for name in stats.ESTIMANDS:
        values = np.array([b[name] for b in boot])
        lo, hi = np.quantile(values, [(1 - conf) / 2, (1 + conf) / 2])
        assert got[name]["value"] == pytest.approx(full[name], abs=1e-12)
        np.testing.assert_allclose(got[name]["interval"], [lo, hi], atol=1e-12)
    assert got["both_correct"]["n"] == both.sum()
    assert got["clean_correct"]["n"] == min(correct_a.sum(), correct_b.sum())
    # The estimands are not the same number here (A classifies more images correctly).
    assert abs(full["clean_correct"] - full["both_correct"]) > 0.005


def test_matched_difference_interpolates_a_curve_at_the_partner_accuracy():
    rng = np.random.default_rng(2)
    n, conf = 400, 0.95
    # A's learning curve: three models, clean accuracy rising, PR over correct images falling;
    # its points are given out of order (the estimator sorts them by clean accuracy).
    curve = []
    for acc, level in ((0.5, 0.7), (0.25, 0.95), (0.4, 0.85)):
        c = rng.random(n) < acc
        pr = np.stack(
            [
                np.where(c, rng.uniform(level - 0.05, level + 0.05, n), 0.0),
                np.where(c, rng.uniform(level - 0.2, level, n), 0.0),
            ],
            axis=1,
        )
        curve.append((c, pr))
    correct_b = rng.random(n) < 0.33
    pr_b = np.stack([np.where(correct_b, 0.9, 0.05), np.where(correct_b, 0.8, 0.0)], axis=1)
    idx = stats.bootstrap_indices(n, 300, 0)
    got = stats.matched_difference([curve], [(correct_b, pr_b)], idx, conf)

    def by_hand(i):
        accs = np.array([c[i].mean() for c, _ in curve])
        prs = np.array([[p[i][c[i], level].mean() for level in range(2)] for c, p in curve])
        target = correct_b[i].mean()
        if not accs.min() <= target <= accs.max():
            return None
        order = np.argsort(accs)
        at = [np.interp(target, accs[order], prs[order, level]) for level in range(2)]
        return np.array(at) - pr_b[i][correct_b[i]].mean(axis=0)

    full = by_hand(np.arange(n))
    np.testing.assert_allclose(got["value"], full, atol=1e-12)
    boot = [by_hand(i) for i in idx]
    kept = np.array([b for b in boot if b is not None])
    assert got["resamples_matched"] == pytest.approx(len(kept) / len(boot))
    np.testing.assert_allclose(got["interval"][0], np.quantile(kept, (1 - conf) / 2, axis=0), atol=1e-12)
    np.testing.assert_allclose(got["interval"][1], np.quantile(kept, (1 + conf) / 2, axis=0), atol=1e-12)
    assert got["matched_accuracy"] == pytest.approx(correct_b.mean())
    # A partner more accurate than any point of the curve has no match: no number, not an extrapolation.
    far = stats.matched_difference([curve], [(np.ones(n, bool), pr_b)], idx, conf)
    assert far["value"] is None and far["interval"] == [None, None]
