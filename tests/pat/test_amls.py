"""AMLS (`patjax.pat.amls`) checked three ways: (a) closed forms on linear classifiers, from 1e-2 down
to 1e-20, under the uniform law (Irwin-Hall, the pixels away from the box's edges) and the Gaussian
law (Phi); (b) PR's own plain Monte-Carlo estimator where p >= 1e-2; (c) a transcription of the
authors' `multilevel_uniform` (tests/webb_reference.py) on the same small model and image, by a
two-sample test on repeated runs.

AMLS's p-hat is unbiased for p, its log is not: E[log10 p-hat] ~ log10 p - ln(10) sd^2 / 2 to first
order (the delta method, sd the standard deviation of log10 p-hat), so the closed-form checks
compare the mean log10 estimate over R runs with log10 p shifted by that bias, within
3 sd / sqrt(R) (sd and the bias from the runs' own spread)."""

import math
from fractions import Fraction

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
import webb_reference
from scipy import optimize, stats

from patjax.evaluators import stats as interval_stats
from patjax.pat import amls, robustness

K = 8  # pixels the linear margin reads: a 2 x 2 x 2 image, every pixel at 0.5
X = jnp.full((2, 2, 2), 0.5)
DECADES = (2, 5, 10, 20)
RUNS = 6


def irwin_hall_sf(k: int, s: Fraction) -> Fraction:
    """P(U_1 + ... + U_k >= s), U_i ~ U[0, 1], exactly: the Irwin-Hall CDF at k - s by symmetry,
    sum_{j <= k - s} (-1)^j C(k, j) (k - s - j)^k / k!, in rational arithmetic (the alternating sum
    cancels to 20 digits and more in the tail)."""
    t = k - s
    return sum((-1) ** j * math.comb(k, j) * (t - j) ** k for j in range(math.floor(t) + 1)) / math.factorial(k)


def linear_logits(threshold, scale):
    """Two classes, label 0: the margin is sum_i (x'_i - 0.5) / scale - threshold."""

    def logits_fn(x):
        m = jnp.sum(x.reshape(x.shape[0], -1) - 0.5, -1) / scale - threshold
        return jnp.stack([jnp.zeros_like(m), m], -1)

    return logits_fn


def run_amls(law, eps, thresholds, scale, runs, *, particles=300, mh_steps=20, width=0.3, seed=0):
    """log10 p-hat and outcomes, (thresholds, runs), in one compiled call; the proposal starts at
    0.3 eps, where 20 MH steps a level mix (Webb et al.'s eps / 30 needs their 100: `amls`)."""

    def one(t, key):
        return amls.amls(
            linear_logits(t, scale), key, X, 0, eps, law, rho=0.1, particles=particles,
            mh_steps=mh_steps, max_levels=500, depth=30, initial_width=width,
        )  # fmt: skip

    keys = jax.random.split(jax.random.PRNGKey(seed), runs)
    f = jax.jit(jax.vmap(jax.vmap(one, (None, 0)), (0, None)))
    e = f(jnp.asarray(thresholds, jnp.float32), keys)
    return np.asarray(e.log10_p, np.float64), np.asarray(e.outcome)


def within_stated_spread(estimates, exact):
    """The closed-form check of the module's docstring; returns (mean, shifted exact, tolerance)."""
    sd = np.std(estimates, ddof=1)
    shifted = exact - math.log(10) * sd**2 / 2
    return float(np.mean(estimates)), shifted, 3 * sd / math.sqrt(len(estimates))


@pytest.mark.slow
def test_uniform_law_matches_irwin_hall_from_1e_2_to_1e_20():
    # Pixels at 0.5 and eps = 0.1: the box [0.4, 0.6] is inside [0, 1], so (x'_i - x_i) / eps ~ U[-1, 1]
    # and the margin sum_i (x'_i - x_i) / eps - t = 2 S - K - t with S Irwin-Hall(K): p = P(S >= (t + K) / 2).
    eps, sums = 0.1, []
    for target in (10.0**-k for k in DECADES):
        s = optimize.brentq(lambda s: math.log(irwin_hall_sf(K, Fraction(s))) - math.log(target), K / 2, K - 1e-9)
        sums.append(Fraction(s).limit_denominator(2**30))
    thresholds = [float(2 * s - K) for s in sums]
    log10_p, outcome = run_amls("uniform", eps, thresholds, eps, RUNS)
    assert np.all(outcome == amls.REACHED)
    for s, estimates in zip(sums, log10_p):
        exact = math.log10(irwin_hall_sf(K, s))
        mean, shifted, tol = within_stated_spread(estimates, exact)
        assert abs(mean - shifted) <= tol + 0.05, (exact, estimates)


@pytest.mark.slow
def test_gaussian_law_matches_phi_from_1e_2_to_1e_20():
    # x' = clip(0.5 + sigma z): the margin sum_i sigma z_i - m crosses 0 with probability
    # Phi(-m / (sigma sqrt(K))); sigma = 0.04 puts the violating z_i near 9.3 / sqrt(8) = 3.3, 0.13 from
    # the pixel, so the clip at 0 and 1 (12.5 standard deviations away) changes nothing measurable.
    sigma = 0.04
    margins = [stats.norm.isf(10.0**-k) * sigma * math.sqrt(K) for k in DECADES]
    log10_p, outcome = run_amls("gaussian", sigma, margins, 1.0, RUNS)
    assert np.all(outcome == amls.REACHED)
    for k, estimates in zip(DECADES, log10_p):
        mean, shifted, tol = within_stated_spread(estimates, -k)
        assert abs(mean - shifted) <= tol + 0.05, (k, estimates)


def test_the_idealized_spread_and_bias_of_the_log():
    # n = 20 levels of rho = 0.1 with N = 1000: relative variance 20 * 0.9 / 100 = 0.18.
    assert amls.log_sd(0.1, 1000, -20) == pytest.approx(math.sqrt(0.18) / math.log(10))
    assert amls.log_bias(0.1, 1000, -20) == pytest.approx(-0.09 / math.log(10))
    assert amls.reachable_depth(0.1, 1000, 30) == pytest.approx(30)


def mlp_params(seed=0, d=12, hidden=16, classes=3):
    rng = np.random.default_rng(seed)
    return [rng.normal(0, 1, (d, hidden)) / math.sqrt(d), rng.normal(0, 1, hidden), rng.normal(0, 1, (hidden, classes))]


def jax_margin_model(params, label):
    w1, b1, w2 = (jnp.asarray(p, jnp.float32) for p in params)
    return lambda x: jnp.tanh(x.reshape(x.shape[0], -1) @ w1 + b1) @ w2


def torch_property(params, label):
    w1, b1, w2 = (torch.tensor(p, dtype=torch.float32) for p in params)

    def prop(x):
        z = torch.tanh(x @ w1 + b1) @ w2
        others = torch.cat([z[:, :label], z[:, label + 1 :]], -1)
        return (others.max(-1).values - z[:, label]).unsqueeze(-1)

    return prop


@pytest.mark.slow
def test_agrees_with_plain_monte_carlo_where_p_is_at_least_1e_2():
    # PR's estimator (robustness.pr_statistics: the counts of samples still classified as the label)
    # with 40,000 samples, against AMLS's mean p-hat over runs: each within the other's interval.
    params = mlp_params()
    x = jnp.asarray(np.random.default_rng(1).uniform(0.3, 0.7, (2, 2, 3)), jnp.float32)
    logits_fn = jax_margin_model(params, 0)
    label = int(np.argmax(np.asarray(logits_fn(x[None]))[0]))
    for law, eps in (("uniform", 0.7), ("gaussian", 0.4)):  # p near 0.03 each
        n = 40_000
        st = robustness.pr_statistics(
            logits_fn, jax.random.PRNGKey(3), x[None], jnp.asarray([label]), jnp.arange(1),
            (eps,), n, 2000, law, 0.0,
        )  # fmt: skip
        violations = n - int(st["counts"][0, 0])
        lo, hi = interval_stats.clopper_pearson(violations, n, 0.99)
        p_mc = violations / n
        assert p_mc >= 1e-2
        keys = jax.random.split(jax.random.PRNGKey(4), 8)
        run = jax.jit(
            jax.vmap(lambda k: amls.amls(logits_fn, k, x, label, eps, law, rho=0.1, particles=1000,
                                         mh_steps=30, max_levels=100, depth=10))
        )  # fmt: skip
        p_hat = 10.0 ** np.asarray(run(keys).log10_p, np.float64)
        mean, se = p_hat.mean(), p_hat.std(ddof=1) / math.sqrt(len(p_hat))
        assert lo - 3 * se <= mean <= hi + 3 * se, (law, p_mc, (lo, hi), p_hat)


@pytest.mark.slow
def test_agrees_with_the_authors_multilevel_uniform():
    # The same model (a small tanh MLP on a 2 x 2 x 3 image), image, radius, rho, particles and MH
    # steps; 12 runs each. The two samples of log10 p-hat have the same law if the algorithms are
    # the same: the Mann-Whitney and Kolmogorov-Smirnov tests do not reject at the 1 % level.
    params = mlp_params()
    x = np.random.default_rng(1).uniform(0.3, 0.7, (2, 2, 3)).astype(np.float32)
    logits_fn = jax_margin_model(params, 0)
    label = int(np.argmax(np.asarray(logits_fn(jnp.asarray(x)[None]))[0]))
    eps, particles, mh_steps, runs = 0.3, 200, 10, 12  # p near 1e-7
    keys = jax.random.split(jax.random.PRNGKey(0), runs)
    run = jax.jit(
        jax.vmap(lambda k: amls.amls(logits_fn, k, jnp.asarray(x), label, eps, "uniform", rho=0.1,
                                     particles=particles, mh_steps=mh_steps, max_levels=500, depth=30))
    )  # fmt: skip
    e = run(keys)
    ours = np.asarray(e.log10_p, np.float64)
    assert np.all(np.asarray(e.outcome) == amls.REACHED)
    torch.manual_seed(0)
    prop = torch_property(params, label)
    theirs = np.array(
        [
            webb_reference.multilevel_uniform(
                prop, torch.tensor(x.reshape(-1)), sigma=eps, rho=0.1, count_particles=particles,
                count_mh_steps=mh_steps,
            )[0] / math.log(10)
            for _ in range(runs)
        ]
    )  # fmt: skip
    mw, ks = stats.mannwhitneyu(ours, theirs).pvalue, stats.ks_2samp(ours, theirs).pvalue
    print(
        f"log10 p-hat: ours median {np.median(ours):.2f}, theirs {np.median(theirs):.2f}; "
        f"p-values MW {mw:.3f} KS {ks:.3f}"
    )
    assert -12 < np.median(theirs) < -3  # a rare event, deep enough for several levels
    assert mw > 0.01 and ks > 0.01, (ours, theirs)
