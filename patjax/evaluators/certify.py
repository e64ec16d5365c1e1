"""Certified L2 radii of the Gaussian-smoothed classifier (Cohen, Rosenfeld & Kolter 2019,
"Certified Adversarial Robustness via Randomized Smoothing"; their code: locuslab/smoothing).

The smoothed classifier is g(x) = argmax_c P(f(x + sigma z) = c), z ~ N(0, I), f the model. One
compiled pass counts f's classes over n0 selection samples and n estimation samples per image
(`robustness.class_counts`: unclipped noise on the [0, 1] image, common random numbers keyed by
image and sample); the host then runs, per image, CERTIFY (the class guessed from the n0
samples, the one-sided Clopper-Pearson lower bound p_A of its share of the n samples at level
alpha, the radius sigma * Phi^-1(p_A), or an abstention when p_A < 1/2) and PREDICT (the exact
two-sided binomial test between the top two counts of the n samples, an abstention when its
p-value exceeds alpha). Certified accuracy at radius r: the fraction of images whose certified
class is the label with radius >= r (their analyze.py's ApproximateAccuracy).

This is not PR's Gaussian law (`pr`, 'gaussian'): PR is the probability that the model f itself
stays correct under clipped noise of scale eps; the certificate is a statement about g, which
with probability at least 1 - alpha over the sampling returns the same class everywhere within
the radius (docs/evaluation.md).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np
from scipy import special

from patjax.core.errors import UserError, check_counts, count
from patjax.data import cifar
from patjax.evaluators import common, intervals, stats, streams
from patjax.pat import robustness

BLOCK = "certify"
NAME = "certify"
COUNTS_PASS = "certify_counts"  # the compiled pass; `combine` puts the certificates under NAME
ABSTAIN = -1  # the class of an abstention, as Cohen et al.'s Smooth.ABSTAIN


@dataclasses.dataclass(frozen=True)
class CertifySettings:
    """CERTIFY's settings (config block `eval.certify`); the defaults are Cohen et al.'s
    (code/certify.py: N0 = 100, N = 100,000, alpha = 0.001; sigma = 0.25 is one of the four
    noise levels of their CIFAR-10 table, analysis/markdown/vary_noise_cifar10: 0.12, 0.25, 0.50,
    1.00).

    Sample indices run to n0 + n + chunk_size in int32 (`robustness.class_counts`); one forward
    pass takes batch x chunk_size images (500 x 20 = 10,000 at the defaults, as PR's pass)."""

    sigma: float = 0.25  # the smoothing noise's standard deviation, in [0, 1] pixel units
    # Radii at which certified accuracy is reported (their CIFAR-10 table: 0.25 to 1.5 by 0.25).
    radii: tuple = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5)
    selection_samples: int = count("eval.certify.selection_samples", 1, 10_000_000, default=100)  # n0
    samples: int = count("eval.certify.samples", 1, 100_000_000, default=100_000)  # n
    alpha: float = 0.001  # the failure probability of each image's certificate and prediction
    chunk_size: int = count("eval.certify.chunk_size", 1, 10_000, default=20)  # samples per image at once

    def __post_init__(self):
        check_counts(self)
        if not self.sigma > 0:
            raise UserError(f"eval.certify.sigma must be > 0, got {self.sigma}")
        if not 0 < self.alpha < 1:
            raise UserError(f"eval.certify.alpha must lie in (0, 1), got {self.alpha}")
        try:
            radii = tuple(float(r) for r in self.radii)
        except (TypeError, ValueError):
            raise UserError(f"eval.certify.radii must be numbers, got {self.radii!r}") from None
        if not radii or min(radii) < 0 or not all(np.isfinite(radii)):
            raise UserError(f"eval.certify.radii must be non-empty, finite and >= 0, got {radii}")
        object.__setattr__(self, "radii", radii)
        object.__setattr__(self, "sigma", float(self.sigma))
        object.__setattr__(self, "alpha", float(self.alpha))


def largest_radius(sigma: float, samples: int, alpha: float) -> float:
    """The largest radius CERTIFY can return with n samples at level alpha: sigma Phi^-1 of the
    lower bound when all n samples are the guessed class, alpha^(1/n) (0.616 at sigma 0.25,
    n = 1,000, alpha 0.001); certified accuracy beyond it is 0 whatever the model."""
    return float(sigma * special.ndtri(alpha ** (1.0 / samples)))


def _own(settings) -> dict:
    return settings[BLOCK]


def name_part(settings) -> str:
    """CERTIFY's part of an evaluation's name: certify-sigma0.25-N100000."""
    own = _own(settings)
    return f"certify-sigma{float(own['sigma']):g}-N{own['samples']}"


def describe(settings) -> str:
    """What CERTIFY measured: its sigma, n0, n, alpha and the largest radius they can certify."""
    own = _own(settings)
    top = largest_radius(own["sigma"], own["samples"], own["alpha"])
    return (
        f"certified accuracy (randomized smoothing) sigma = {float(own['sigma']):g}, n0 = {own['selection_samples']}, "
        f"n = {own['samples']}, alpha = {float(own['alpha']):g}: radii up to {top:.3f} certifiable"
    )


def certify(selection_counts, estimation_counts, alpha: float, sigma: float) -> dict:
    """Cohen et al.'s CERTIFY per image from its two independent draws' class counts (images, classes):
    the class cA with the most selection samples (the lowest on ties, as numpy's argmax), the
    lower bound p_A of its share of the estimation samples (one-sided Clopper-Pearson at level
    alpha) and the radius sigma * Phi^-1(p_A); class ABSTAIN and radius 0 where p_A < 1/2."""
    estimation = np.asarray(estimation_counts, np.int64)
    guess = np.argmax(np.asarray(selection_counts), axis=-1)
    hits = np.take_along_axis(estimation, guess[:, None], axis=-1)[:, 0]
    p_lower = stats.clopper_pearson_lower(hits, estimation.sum(-1), alpha)
    certified = p_lower >= 0.5
    with np.errstate(divide="ignore"):
        radius = np.where(certified, sigma * special.ndtri(p_lower), 0.0)
    return {"class": np.where(certified, guess, ABSTAIN), "radius": radius, "p_a_lower": p_lower}


def predict(counts, alpha: float) -> np.ndarray:
    """Cohen et al.'s PREDICT per image from one draw's class counts (images, classes): the top
    class, or ABSTAIN where the two-sided binomial test of the top two counts has p > alpha
    (a tie at the top has p = 1, so the class returned is always the unique argmax)."""
    counts = np.asarray(counts, np.int64)
    top2 = -np.sort(-counts, axis=-1)[:, :2]
    p_value = stats.binomial_test_half(top2[:, 0], top2.sum(-1))
    return np.where(p_value > alpha, ABSTAIN, np.argmax(counts, axis=-1))


def certified_at(classes, labels, radii, levels) -> np.ndarray:
    """(levels, images) bool: the image's certified class is its label with a radius of at least
    the level (an abstention or a wrong class is never certified)."""
    correct = np.asarray(classes) == np.asarray(labels)
    return correct[None] & (np.asarray(radii, np.float64)[None] >= np.asarray(levels, np.float64)[:, None])


def passes(s) -> tuple:
    return (COUNTS_PASS,)


def make_batch_fn(model_fns, s, pass_name):
    own = s.own
    # A stream of its own, derived from the name as an attack's random start is, so the selection
    # and estimation noise is the same for every model evaluated with the same seed.
    key = streams.attack_key(s.shared.seed, NAME)

    def fn(params, batch_stats, images, labels, indices):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        x = cifar.to_float(images)

        def counts(first, num):
            chunk = min(own.chunk_size, num)
            return robustness.class_counts(logits_fn, key, x, indices, first, num, chunk, own.sigma)

        # Samples 0 .. n0-1 select the class, n0 .. n0+n-1 estimate p_A: independent draws, as
        # CERTIFY needs (its guarantee assumes the guess does not depend on the estimation samples).
        return {
            "selection": counts(0, own.selection_samples),
            "estimation": counts(own.selection_samples, own.samples),
            "label": labels,
        }

    return jax.jit(fn)


def combine(per_image, s) -> dict:
    """Per image: CERTIFY's class, radius and p_A lower bound, PREDICT's class (on the estimation
    samples) and the label."""
    own, counts = s.own, per_image[COUNTS_PASS]
    out = certify(counts["selection"], counts["estimation"], own.alpha, own.sigma)
    out["predict"] = predict(counts["estimation"], own.alpha)
    out["label"] = counts["label"]
    return out


def figures(per_image, s) -> dict:
    own, c, confidence = s.own, per_image[NAME], s.shared.confidence
    certified = certified_at(c["class"], c["label"], c["radius"], own.radii)
    return {
        NAME: {
            "certified_accuracy": {
                robustness.level_key(r): intervals.proportion(hits, confidence) for r, hits in zip(own.radii, certified)
            },
            "abstained": intervals.proportion(c["class"] == ABSTAIN, confidence),
            "smoothed_accuracy": intervals.proportion(c["predict"] == c["label"], confidence),
            "predict_abstained": intervals.proportion(c["predict"] == ABSTAIN, confidence),
            "settings": dataclasses.asdict(own),
        }
    }


EVALUATOR = common.Evaluator(
    NAME,
    passes,
    make_batch_fn,
    figures,
    label="Certified",
    combine=combine,
    settings=CertifySettings,
    name_part=name_part,
    describe=describe,
)
