"""log10 P(violation) per image, far below PR's 1/N, by adaptive multilevel splitting
(`patjax.pat.amls`: Webb et al., ICLR 2019, "A Statistical Approach to Assessing Neural Network
Robustness", Algorithm 1).

PR with N samples reads an image with no violating sample as PR = 100 %, whether its P(violation)
is 1e-3 or 1e-12; AMLS estimates log P(violation) itself, under PR's uniform (Table-1) or
Gaussian law at each radius of `eval.rare_pr.epsilons`. Per image, radius and repetition the pass
returns the estimate, how the loop ended (`amls.OUTCOMES`) and the levels it used; per radius the
figures are the median log10 p over the clean-correct images with a bootstrap interval, the
fraction of them with p < 10^-k for each k of `decades` (Clopper-Pearson), and the outcomes'
counts. An image whose run fell below 10^-depth counts below every 10^-k (k <= depth) and is never
given a value: a median among them reads "< 1e-depth". An image whose run died out or ran out of
levels has no estimate: it is left out of the figures and counted in `outcomes`.
"""

from __future__ import annotations

import dataclasses
import warnings

import jax
import jax.numpy as jnp
import numpy as np

from patjax.core.errors import UserError, check_counts, count, linf_radius
from patjax.data import cifar
from patjax.evaluators import common, intervals, streams
from patjax.pat import amls, robustness

NAME = BLOCK = "rare_pr"


@dataclasses.dataclass(frozen=True)
class RarePRSettings:
    """AMLS's settings (config block `eval.rare_pr`); rho, particles, mh_steps and max_levels default
    to Webb et al.'s (multilevel_uniform: rho = 0.1, count_particles = 1000, count_mh_steps = 100,
    count_max_levels = 500). The radii are 8/255 (the attacks' L-inf ball) and the paper's
    Table-1 radii.

    One AMLS run holds chunk_size x particles perturbed images at once (1 x 1000 CIFAR images at the
    defaults) and costs about (levels x mh_steps + 1) x particles forward passes: 10^6 per image
    and radius at p ~ 1e-10 with the defaults."""

    distribution: str = "uniform"  # a law of eps with an MH kernel (`amls.LAWS`)
    epsilons: tuple = (8 / 255, 0.1, 0.12, 0.15, 0.2)
    rho: float = 0.1  # the fraction of particles kept at each level
    particles: int = count("eval.rare_pr.particles", 2, 1_000_000, default=1000)
    mh_steps: int = count("eval.rare_pr.mh_steps", 1, 100_000, default=100)  # per level
    max_levels: int = count("eval.rare_pr.max_levels", 1, 100_000, default=500)
    # Runs stop once their estimate is below 10^-depth and report "< 10^-depth", never a value there.
    depth: float = 30.0
    repetitions: int = count("eval.rare_pr.repetitions", 1, 1000, default=1)  # independent runs per image
    decades: tuple = (2, 5, 10, 20)  # the fractions of images with p < 10^-k reported
    chunk_size: int = count("eval.rare_pr.chunk_size", 1, 10_000, default=1)  # images run at once
    # The MH proposal's starting width in units of eps; <= 0: the law's (`amls.INITIAL_WIDTH`: Webb et
    # al.'s 1/30 for 'uniform', which needs their 100 MH steps a level; 0.3 for 'gaussian').
    initial_width: float = -1.0

    def __post_init__(self):
        check_counts(self)
        if self.distribution not in amls.LAWS:
            laws = ", ".join(amls.LAWS)
            raise UserError(f"eval.rare_pr.distribution must be one of {laws}, got {self.distribution!r}")
        if not 0 < self.rho < 1:
            raise UserError(f"eval.rare_pr.rho must lie in (0, 1), got {self.rho}")
        try:
            epsilons = tuple(float(e) for e in self.epsilons)
            decades = tuple(float(k) for k in self.decades)
        except (TypeError, ValueError):
            raise UserError("eval.rare_pr.epsilons and eval.rare_pr.decades must be numbers") from None
        if not epsilons or not all(np.isfinite(epsilons)) or min(epsilons) <= 0:
            raise UserError(f"eval.rare_pr.epsilons must be non-empty, finite and > 0, got {epsilons}")
        for e in epsilons:
            linf_radius("eval.rare_pr.epsilons", e)  # PR's laws act on [0, 1] images
        if not np.isfinite(self.depth) or self.depth <= 0:
            raise UserError(f"eval.rare_pr.depth must be > 0 (p is estimated down to 10^-depth), got {self.depth}")
        reach = amls.reachable_depth(self.rho, self.particles, self.max_levels)
        if self.depth > reach:
            raise UserError(
                f"eval.rare_pr.depth={self.depth:g} cannot be reached: {self.max_levels} levels at "
                f"rho={self.rho:g} with {self.particles} particles reach 10^-{reach:.3g} at most; "
                "raise eval.rare_pr.max_levels or lower the depth"
            )
        if not decades or min(decades) <= 0 or max(decades) > self.depth:
            raise UserError(f"eval.rare_pr.decades must lie in (0, depth={self.depth:g}], got {decades}")
        object.__setattr__(self, "epsilons", epsilons)
        object.__setattr__(self, "decades", decades)
        object.__setattr__(self, "rho", float(self.rho))
        object.__setattr__(self, "depth", float(self.depth))
        if not np.isfinite(self.initial_width):
            raise UserError(f"eval.rare_pr.initial_width must be finite, got {self.initial_width}")
        object.__setattr__(self, "initial_width", float(self.initial_width))

    @property
    def width(self):
        """The starting width handed to `amls.amls` (None: the law's)."""
        return self.initial_width if self.initial_width > 0 else None


def passes(s) -> tuple:
    return (NAME,)


def estimate_batch(logits_fn, key, x, labels, indices, own: RarePRSettings) -> dict:
    """AMLS per image, radius and repetition: {log10_p, outcome, levels} of shape (batch, radii,
    repetitions). Run r at radius j of image i draws from fold_in(fold_in(fold_in(key, i), j), r),
    so batch and chunk sizes change no estimate and every model sees the same streams."""
    eps = jnp.asarray(own.epsilons, jnp.float32)
    radius_ids, rep_ids = jnp.arange(len(own.epsilons)), jnp.arange(own.repetitions)

    def one(i, xi, yi, j, r):
        k = jax.random.fold_in(jax.random.fold_in(jax.random.fold_in(key, i), j), r)
        e = amls.amls(
            logits_fn,
            k,
            xi,
            yi,
            eps[j],
            own.distribution,
            rho=own.rho,
            particles=own.particles,
            mh_steps=own.mh_steps,
            max_levels=own.max_levels,
            depth=own.depth,
            initial_width=own.width,
        )
        return {"log10_p": e.log10_p, "outcome": e.outcome, "levels": e.levels}

    over_reps = jax.vmap(one, (None, None, None, None, 0))
    over_radii = jax.vmap(over_reps, (None, None, None, 0, None))

    def image(args):
        i, xi, yi = args
        return over_radii(i, xi, yi, radius_ids, rep_ids)

    return jax.lax.map(image, (indices, x, labels), batch_size=own.chunk_size)


def make_batch_fn(model_fns, s, pass_name):
    key = streams.attack_key(s.shared.seed, NAME)  # a stream of its own, as an attack's

    def fn(params, batch_stats, images, labels, indices):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        return estimate_batch(logits_fn, key, cifar.to_float(images), labels, indices, s.own)

    return jax.jit(fn)


def pooled(log10_p, outcome) -> tuple:
    """Per image (and radius): log10 of the mean of the repetitions' p-hat (p-hat is unbiased, its
    log is not) and whether that is an estimate: every repetition reached L = 0. A repetition
    censored below the depth, not reached, or whose particles died out (Webb et al.'s stall rule
    sets a level that did not move to 0, and no particle was there: p-hat = 0, the mark of MH
    moves that did not mix, not of a small p) leaves the image without a value."""
    log10_p, outcome = np.asarray(log10_p, np.float64), np.asarray(outcome)
    estimated = np.all(outcome == amls.REACHED, axis=-1)
    with np.errstate(divide="ignore"):
        value = np.log10(np.mean(np.where(outcome == amls.REACHED, 10.0**log10_p, 0.0), axis=-1))
    return value, estimated


def spread(log10_p, outcome) -> np.ndarray:
    """Per image: the standard deviation of log10 p-hat over the repetitions that reached (nan with fewer than two)."""
    x = np.where(np.asarray(outcome) == amls.REACHED, np.asarray(log10_p, np.float64), np.nan)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # an image with fewer than two reached runs
        return np.nanstd(x, axis=-1, ddof=1)


def ordered(value, estimated, outcome, depth) -> np.ndarray:
    """Values to order images by: the pooled estimate, -inf where a run fell below 10^-depth and
    every other reached or fell below too (below any estimate above the depth), nan where a run
    did not reach or died out (no estimate: left out of the figures, and counted)."""
    unknown = np.any((outcome == amls.NOT_REACHED) | (outcome == amls.DIED_OUT), axis=-1)
    below = np.any(outcome == amls.CENSORED, axis=-1)
    out = np.where(estimated, value, np.where(below, -np.inf, np.nan))
    # A pooled estimate below the depth is one no run could stop at: keep it as below.
    out = np.where(out < -depth, -np.inf, out)
    return np.where(unknown, np.nan, out)


def median_with_interval(values, mask, s: common.SharedSettings, depth: float) -> dict:
    """The median of `values` (log10 p, -inf below the depth) over the images of `mask`, with its
    percentile bootstrap interval over images; an end below the depth reads None, with `below`
    saying so."""
    values = np.asarray(values, np.float64)
    mask = np.asarray(mask, bool) & ~np.isnan(values)
    if not mask.any():
        return {"value": None, "interval": [None, None], "n": 0}
    idx = intervals.bootstrap_indices(int(values.size), s.bootstrap_resamples, int(s.seed))
    masked = np.where(mask, values, np.nan)
    median = float(np.median(values[mask]))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # a resample without an image of the mask
        boot = np.nanmedian(masked[idx], axis=1)
    alpha = 1 - s.confidence
    boot = boot[~np.isnan(boot)]
    lo, hi = np.quantile(boot, [alpha / 2, 1 - alpha / 2], method="lower") if boot.size else (np.nan, np.nan)
    finite = lambda v: float(v) if np.isfinite(v) else None
    return {
        "value": finite(median),
        "interval": [finite(lo), finite(hi)],
        "below": f"1e-{depth:g}",
        "n": int(mask.sum()),
        "interval_method": f"percentile bootstrap over images ({s.bootstrap_resamples} resamples)",
    }


def combine(per_image, s) -> dict:
    """Per image and radius: the pooled log10 p (`pooled`), whether it is an estimate, the values
    the figures order (`ordered`), the spread over repetitions and the outcomes."""
    r = per_image[NAME]
    value, estimated = pooled(r["log10_p"], r["outcome"])
    return {
        "log10_p": np.where(estimated, value, np.nan),
        "ordered": ordered(value, estimated, np.asarray(r["outcome"]), s.own.depth),
        "spread": spread(r["log10_p"], r["outcome"]),
        "outcome": np.asarray(r["outcome"]),
        "levels": np.asarray(r["levels"]),
        "runs_log10_p": np.asarray(r["log10_p"]),
    }


def figures(per_image, s) -> dict:
    own, shared, r = s.own, s.shared, per_image[NAME]
    correct = np.asarray(per_image["clean"]["correct"], bool)
    out = {}
    some = correct.any()
    for j, eps in enumerate(own.epsilons):
        values, outcome = r["ordered"][:, j], r["outcome"][:, j]
        known = correct & ~np.isnan(values)
        out[robustness.level_key(eps)] = {
            "median_log10_p": median_with_interval(values, correct, shared, own.depth),
            "below": {f"1e-{k:g}": intervals.proportion(values[known] < -k, shared.confidence) for k in own.decades},
            # images with at least one run that ended so, per way a run ends
            "outcomes": {n: int(np.sum(np.any(outcome[correct] == code, -1))) for code, n in enumerate(amls.OUTCOMES)},
            "mean_levels": float(np.mean(r["levels"][:, j][correct])) if some else None,
            "median_spread": float(np.nanmedian(r["spread"][:, j][correct])) if own.repetitions > 1 and some else None,
        }
    return {NAME: {"by_radius": out, "settings": dataclasses.asdict(own)}}


def paired_median_difference(a, b, mask, s: common.SharedSettings) -> dict:
    """Log10 p(a) - log10 p(b) over the images of `mask` (the same images and streams, `ordered`
    values: -inf below the depth, nan without an estimate): the median over the images where both
    are estimates, with a percentile bootstrap interval over images; and, counted apart, the
    images whose sign alone is known (one side below 10^-depth, the other an estimate above it:
    `a_lower`, `b_lower`), those where both are below the depth, and those where either has no
    estimate (`no_value`)."""
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    mask = np.asarray(mask, bool)
    usable = mask & np.isfinite(a) & np.isfinite(b)
    with np.errstate(invalid="ignore"):
        fig = median_with_interval(np.where(usable, a - b, np.nan), usable, s, np.inf)
    fig.pop("below", None)
    a_below, b_below = mask & (a == -np.inf), mask & (b == -np.inf)
    return dict(
        fig,
        a_lower=int(np.sum(a_below & np.isfinite(b))),
        b_lower=int(np.sum(b_below & np.isfinite(a))),
        both_below=int(np.sum(a_below & b_below)),
        no_value=int(np.sum(mask & (np.isnan(a) | np.isnan(b)))),
    )


def name_part(settings) -> str:
    """rare_pr's part of an evaluation's name: its law, radii and particles,
    amls-uniform-0.0314-0.1-P1000."""
    own = settings[BLOCK]
    radii = "-".join(f"{float(e):.3g}" for e in own.get("epsilons") or ())
    return f"amls-{own['distribution']}-{radii}-P{own['particles']}"


def describe(settings) -> str:
    """What rare_pr measured: log10 P(violation) by AMLS, its law, radii and budget."""
    own = settings[BLOCK]
    at = ", ".join(f"{float(e):.4g}" for e in own.get("epsilons") or ())
    return (
        f"log10 P(violation) by AMLS, {own['distribution']} law at ε = {at}, {own['particles']} particles, "
        f"{own['mh_steps']} MH steps a level, depth 1e-{float(own['depth']):g}"
    )


EVALUATOR = common.Evaluator(
    NAME,
    passes,
    make_batch_fn,
    figures,
    needs_clean=True,
    label="log10 P(violation)",
    combine=combine,
    settings=RarePRSettings,
    name_part=name_part,
    describe=describe,
    # AMLS draws in the base noise of PR's own laws: their recorded definitions are part of its view
    recorded=amls.LAWS,
)
