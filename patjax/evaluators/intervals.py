"""Figures with intervals, as results.json records them (value, interval, its method, n): a
proportion with its Clopper-Pearson interval and a mean with its percentile bootstrap over
images (host side, float64; the intervals themselves are `stats`')."""

from __future__ import annotations

import functools

import numpy as np

from patjax.evaluators import stats
from patjax.evaluators.common import SharedSettings


def proportion(hits, confidence) -> dict:
    """Fraction of hits with its Clopper-Pearson interval."""
    hits = np.asarray(hits, bool)
    lo, hi = stats.clopper_pearson(hits.sum(), hits.size, confidence)
    return {
        "value": float(hits.mean()) if hits.size else None,
        "interval": [float(lo), float(hi)],
        "interval_method": "clopper-pearson",
        "n": int(hits.size),
    }


@functools.lru_cache(maxsize=1)
def bootstrap_indices(num_items: int, num_resamples: int, seed: int) -> np.ndarray:
    """stats.bootstrap_indices over all evaluated images, drawn once per (images, resamples,
    seed): every figure resamples the same images (read-only; 80 MB at 2,000 x 10,000 as int32;
    `bootstrap_indices.cache_clear()` once an evaluation's figures are computed)."""
    idx = stats.bootstrap_indices(num_items, num_resamples, seed).astype(np.int32)
    idx.setflags(write=False)
    return idx


def mean_with_interval(values, s: SharedSettings, mask=None) -> dict:
    """Mean of per-image `values` over the images in `mask` (default: all), with the interval of
    `stats.ratio_interval`: resampling all images, so a subset such as the clean-correct images
    is drawn anew in every resample, exactly as the suite tables do."""
    values = np.asarray(values, np.float64)
    mask = np.ones(values.shape) if mask is None else np.asarray(mask, np.float64)
    if mask.sum() == 0:
        return {"value": None, "interval": [None, None], "n": 0}
    idx = bootstrap_indices(int(values.size), s.bootstrap_resamples, int(s.seed))
    value, (lo, hi) = stats.ratio_interval((values * mask)[None], mask[None], idx, s.confidence)
    return {
        "value": value,
        "interval": [lo, hi],
        "n": int(mask.sum()),
        "interval_method": f"percentile bootstrap over images ({s.bootstrap_resamples} resamples)",
    }
