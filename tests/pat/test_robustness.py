"""PR estimators, intervals, the Theorem 2 lower bound and the entropic risk against closed forms
and independent numpy/scipy computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy import special, stats

from patjax.evaluators import stats as patjax_stats
from patjax.pat import laws, robustness
from patjax.pat.laws import pdis

SHAPE = (4, 4, 3)


def constant_logits_fn(values):
    values = jnp.asarray(values, jnp.float32)
    return lambda x: jnp.broadcast_to(values, (x.shape[0], len(values)))


@pytest.mark.parametrize("distribution", laws.names())
def test_input_independent_classifier_pr_is_one_on_strict_argmax_and_zero_elsewhere(distribution):
    logits = [0.5, 2.0, 2.0, 1.0, 3.0]  # label 4 is the strict argmax; 1 and 2 tie
    x = jnp.full((5, *SHAPE), 0.4)
    y = jnp.arange(5)
    stats_ = robustness.pr_statistics(
        constant_logits_fn(logits),
        jax.random.PRNGKey(0),
        x,
        y,
        jnp.arange(5),
        (0.1, 0.2),
        num_samples=7,
        chunk_size=3,
        distribution=distribution,
        entropic_lambda=0.4,
    )
    np.testing.assert_array_equal(np.asarray(stats_["counts"]) / 7, [[0, 0, 0, 0, 1]] * 2)
    # A tie at the top is adversarial too.
    tie = robustness.pr_statistics(
        constant_logits_fn([2.0, 2.0, 1.0]),
        jax.random.PRNGKey(0),
        x[:2],
        y[:2],
        jnp.arange(2),
        (0.1,),
        5,
        5,
        distribution,
    )
    np.testing.assert_array_equal(tie["counts"], [[0, 0]])
    # f is constant, so E f = R_lambda = f and the bound is 1 - f / log 2 (hand-computed CE).
    ce = special.logsumexp(logits) - np.asarray(logits)
    np.testing.assert_allclose(np.asarray(stats_["sum_loss"]) / 7, [ce] * 2, rtol=1e-5)
    risk = robustness.entropic_risk(stats_["lse_loss"], 7, 0.4)
    np.testing.assert_allclose(risk, [ce] * 2, rtol=1e-4)
    bound = robustness.lower_bound(np.asarray(stats_["sum_loss"]) / 7)
    assert (bound <= np.asarray(stats_["counts"]) / 7 + 1e-6).all()


def linear_binary(seed=0, d=48):
    """Two-class linear classifier whose decision boundary passes through x = 0.5."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, 2)).astype(np.float32)
    b = np.array([-0.5 * (w[:, 0] - w[:, 1]).sum(), 0.0], np.float32)
    return w, b, (lambda x: x.reshape(x.shape[0], -1) @ jnp.asarray(w) + b)


def test_linear_classifier_gaussian_pr_matches_phi_within_the_clopper_pearson_interval():
    # x = 0.5 and sigma <= 0.05: clipping at 0/1 needs a 10-sigma draw (probability ~1e-23 per pixel).
    w, b, logits_fn = linear_binary()
    d = w.shape[0]
    diff = w[:, 0] - w[:, 1]
    sigma = 0.05
    # Images at 0.5 plus a small shift along diff, so that the margins (and the true PR) vary.
    shifts = np.array([-0.02, -0.01, -0.004, 0.0, 0.003, 0.008, 0.015, 0.03])
    x = (0.5 + shifts[:, None] * diff[None] / np.abs(diff).max()).reshape(-1, *SHAPE).astype(np.float32)
    y = np.zeros(len(x), np.int32)
    n = 400
    out = robustness.pr_statistics(
        logits_fn,
        jax.random.PRNGKey(1),
        jnp.asarray(x),
        jnp.asarray(y),
        jnp.arange(len(x)),
        (sigma,),
        n,
        100,
        "gaussian",
    )
    margin = x.reshape(len(x), -1) @ diff + b[0] - b[1]
    truth = stats.norm.cdf(margin / (sigma * np.linalg.norm(diff)))
    assert truth.min() < 0.2 and truth.max() > 0.8
    lo, hi = patjax_stats.clopper_pearson(np.asarray(out["counts"][0]), n, 0.99)
    assert ((lo <= truth) & (truth <= hi)).all(), (lo, truth, hi)
    assert d == np.prod(SHAPE)


@pytest.mark.slow
def test_statistics_equal_an_independent_numpy_computation():
    """Counts, summed CE and log-sum-exp of lambda*CE from the documented noise (fold_in(fold_in(key, i), j))."""
    rng = np.random.default_rng(2)
    w = rng.normal(size=(np.prod(SHAPE), 3)).astype(np.float32) * 0.5
    logits_fn = lambda x: x.reshape(x.shape[0], -1) @ jnp.asarray(w)
    x = rng.uniform(0, 1, size=(3, *SHAPE)).astype(np.float32)
    y = np.array([0, 1, 2], np.int32)
    idx = np.array([5, 9, 11], np.int32)
    key = jax.random.PRNGKey(4)
    eps, n, lam = (0.1, 0.3), 10, 0.7
    for distribution in ("gaussian", "uniform", "uniform_l2"):
        out = robustness.pr_statistics(
            logits_fn, key, jnp.asarray(x), jnp.asarray(y), jnp.asarray(idx), eps, n, 4, distribution, lam
        )
        for e_i, e in enumerate(eps):
            for b in range(3):
                losses, robust = [], 0
                for j in range(n):
                    k = jax.random.fold_in(jax.random.fold_in(key, int(idx[b])), j)
                    if distribution == "gaussian":  # clip(x + eps z, 0, 1), z ~ N(0, I)
                        sample = np.clip(x[b] + e * np.asarray(jax.random.normal(k, SHAPE)), 0, 1)
                    elif distribution == "uniform_l2":  # clip(x + eps g[:d] / |g|, 0, 1), g ~ N(0, I_{d+2})
                        g = np.asarray(jax.random.normal(k, (x[b].size + 2,)), np.float64)
                        sample = np.clip(x[b] + e * (g[:-2] / np.linalg.norm(g)).reshape(SHAPE), 0, 1)
                    else:  # U[max(x - eps, 0), min(x + eps, 1)] per pixel, from u ~ U[0, 1)
                        u = np.asarray(jax.random.uniform(k, SHAPE), np.float64)
                        low, high = np.maximum(x[b] - e, 0.0), np.minimum(x[b] + e, 1.0)
                        sample = low + (high - low) * u
                    logits = sample.reshape(-1) @ w
                    robust += logits[y[b]] > np.delete(logits, y[b]).max()
                    losses.append(special.logsumexp(logits) - logits[y[b]])
                assert out["counts"][e_i, b] == robust
                np.testing.assert_allclose(out["sum_loss"][e_i, b], np.sum(losses), rtol=1e-4)
                np.testing.assert_allclose(
                    out["lse_loss"][e_i, b], special.logsumexp(lam * np.array(losses)), rtol=1e-4
                )


@pytest.mark.slow
def test_lower_bound_never_exceeds_pr_from_the_same_samples_and_entropic_risk_is_stable():
    rng = np.random.default_rng(3)
    w = rng.normal(size=(np.prod(SHAPE), 10)).astype(np.float32)
    x = rng.uniform(0, 1, size=(16, *SHAPE)).astype(np.float32)
    y = rng.integers(0, 10, size=16).astype(np.int32)
    for scale in (0.2, 3.0, 300.0):  # 300: losses of ~1e3-1e4, exp(lambda f) overflows float32
        logits_fn = lambda z: scale * (z.reshape(z.shape[0], -1) @ jnp.asarray(w))
        for distribution in laws.names():
            levels = (1.29,) if distribution == "pdis" else (0.1, 0.2)
            out = robustness.pr_statistics(
                logits_fn,
                jax.random.PRNGKey(5),
                jnp.asarray(x),
                jnp.asarray(y),
                jnp.arange(16),
                levels,
                20,
                7,
                distribution,
                0.419,
            )
            pr = np.asarray(out["counts"]) / 20
            mean_loss = np.asarray(out["sum_loss"], np.float64) / 20
            bound = robustness.lower_bound(mean_loss)
            assert (bound <= pr + 1e-6).all()
            risk = robustness.entropic_risk(out["lse_loss"], 20, 0.419)
            assert np.isfinite(risk).all()
            # Jensen: mean f <= R_lambda, and R_lambda <= max f <= N * mean f (f >= 0).
            assert (mean_loss <= risk * (1 + 1e-5) + 1e-6).all()
            assert (risk <= 20 * mean_loss * (1 + 1e-5) + 1e-6).all()
            assert (robustness.lower_bound(risk) <= bound + 1e-6).all()


def test_uniform_is_uniform_on_the_linf_ball_intersected_with_the_unit_cube():
    """Pixel 0.02, eps 0.1: U[0, 0.12] with no atom at 0 (clipping x + eps U[-1, 1] would put
    40 % of the mass on 0); pixel 0.5: U[0.4, 0.6]; pixel 0.97: U[0.87, 1] with no atom at 1."""
    x = jnp.asarray(np.stack([np.full(SHAPE, v) for v in (0.02, 0.5, 0.97)]).astype(np.float32))
    num = 1000
    samples = np.asarray(
        laws.perturbed_samples(
            jax.random.PRNGKey(3), x, jnp.arange(3), jnp.arange(num), jnp.asarray([0.1, 0.2], jnp.float32), "uniform"
        ),
        np.float64,
    )  # (levels, images, samples, H, W, C)
    for b, (low, high) in enumerate(((0.0, 0.12), (0.4, 0.6), (0.87, 1.0))):
        values = samples[0, b].reshape(-1)
        assert values.min() >= low - 1e-6 and values.max() <= high + 1e-6
        assert np.mean(values <= low + 1e-7) < 1e-3 and np.mean(values >= high - 1e-7) < 1e-3  # no atoms
        # One pixel per sample (pixels of one sample are independent too, but keep it i.i.d.).
        law = stats.uniform(loc=low, scale=high - low)
        assert stats.kstest(samples[0, b, :, 0, 0, 0], law.cdf).pvalue > 1e-3, (low, high)
        assert stats.kstest(values[::5], law.cdf).pvalue > 1e-3, (low, high)
    # The clipped law (atoms at 0 and 1) is rejected by the same test, so the test tells the two apart.
    u = np.random.default_rng(0).uniform(-1, 1, num)
    assert stats.kstest(np.clip(0.02 + 0.1 * u, 0, 1), stats.uniform(0, 0.12).cdf).pvalue < 1e-6
    # Common random numbers: eps = 0.2 maps the same u onto its own interval [lo, hi].
    x_np = np.asarray(x, np.float64)[:, None]
    u01 = (samples[0] - np.maximum(x_np - 0.1, 0)) / (np.minimum(x_np + 0.1, 1) - np.maximum(x_np - 0.1, 0))
    u02 = (samples[1] - np.maximum(x_np - 0.2, 0)) / (np.minimum(x_np + 0.2, 1) - np.maximum(x_np - 0.2, 0))
    np.testing.assert_allclose(u01, u02, atol=1e-4)
    # ... and it is the documented draw: u = uniform(fold_in(fold_in(key, i), j)).
    k = jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(3), 1), 7)
    np.testing.assert_allclose(u01[1, 7], np.asarray(jax.random.uniform(k, SHAPE)), atol=1e-4)


def test_uniform_l2_is_uniform_in_the_l2_ball_then_clipped_to_the_unit_cube():
    """Inside the box (x = 0.5, eps <= 0.2 < 0.5, so no clip) delta = x' - x is uniform in the L2
    ball of radius eps in d = 48 dimensions: |delta| / eps has the CDF r^d and each coordinate
    of delta / |delta| is that of a uniform point of the sphere, u_1^2 ~ Beta(1/2, (d - 1)/2).
    Near a face the clip keeps every sample in the ball and the box."""
    d, num = int(np.prod(SHAPE)), 2000
    x = jnp.asarray(np.stack([np.full(SHAPE, 0.5), np.full(SHAPE, 0.02)]).astype(np.float32))
    levels = jnp.asarray([0.1, 0.2, 0.5], jnp.float32)
    samples = np.asarray(
        laws.perturbed_samples(jax.random.PRNGKey(5), x, jnp.arange(2), jnp.arange(num), levels, "uniform_l2"),
        np.float64,
    )  # (levels, images, samples, H, W, C)
    delta = (samples[0, 0] - 0.5).reshape(num, d)
    radius = np.linalg.norm(delta, axis=1) / 0.1
    assert radius.max() <= 1 + 1e-5
    assert stats.kstest(radius**d, stats.uniform().cdf).pvalue > 1e-3
    direction = delta / np.linalg.norm(delta, axis=1, keepdims=True)
    assert stats.kstest(direction[:, 0] ** 2, stats.beta(0.5, (d - 1) / 2).cdf).pvalue > 1e-3
    assert abs(np.mean(direction[:, 5])) < 4 / np.sqrt(d * num)  # symmetric: sd of the mean 1/sqrt(d num)
    # A radius uniform in [0, 1] (torchattacks' L2 random start) is rejected by the same test.
    assert stats.kstest(np.random.default_rng(0).uniform(0, 1, num) ** d, stats.uniform().cdf).pvalue < 1e-6
    # Common random numbers: eps 0.2 scales the same point of the unit ball.
    np.testing.assert_allclose((samples[1, 0] - 0.5) / 0.2, (samples[0, 0] - 0.5) / 0.1, atol=1e-5)
    # Near the face at 0 (x = 0.02, eps = 0.5 > 0.02): in the box, in the ball, and clipped mass on 0.
    near = samples[2, 1].reshape(num, d)
    assert near.min() >= 0.0 and near.max() <= 1.0
    assert np.linalg.norm(near - 0.02, axis=1).max() <= 0.5 + 1e-5
    assert 0.2 < np.mean(near == 0.0) < 0.5  # P(v_i < -0.02 / 0.5) for a ball coordinate of sd ~ 1/sqrt(d)
    # ... and it is the documented draw: g ~ normal(fold_in(fold_in(key, i), j), d + 2), x + eps g[:d] / |g|.
    g = np.asarray(jax.random.normal(jax.random.fold_in(jax.random.fold_in(jax.random.PRNGKey(5), 1), 7), (d + 2,)))
    np.testing.assert_allclose(near[7], np.clip(0.02 + 0.5 * g[:d] / np.linalg.norm(g), 0, 1), atol=1e-5)


def test_pdis_is_the_truncated_gaussian_on_the_unit_cube():
    c1 = 0.3
    sigma = pdis.sigma(c1)
    np.testing.assert_allclose(sigma, 1 / np.sqrt(2 * c1))
    x = jnp.asarray(np.stack([np.full(SHAPE, 0.2), np.full(SHAPE, 0.9)]).astype(np.float32))
    samples = np.asarray(
        laws.perturbed_samples(jax.random.PRNGKey(0), x, jnp.arange(2), jnp.arange(2000), jnp.asarray([sigma]), "pdis")
    )[0]
    assert samples.min() >= 0 and samples.max() <= 1
    for b, center in enumerate((0.2, 0.9)):
        law = stats.truncnorm((0 - center) / sigma, (1 - center) / sigma, loc=center, scale=sigma)
        values = samples[b].reshape(-1)
        assert stats.kstest(values[::7], law.cdf).pvalue > 1e-3
        np.testing.assert_allclose(values.mean(), law.mean(), atol=0.01)


def test_intervals_cover_the_truth_in_at_least_90_of_100_seeded_repeats():
    # Per image: Clopper-Pearson at 95% for PR = 0.9 with N = 100.
    covered = 0
    for seed in range(100):
        k = np.random.default_rng(seed).binomial(100, 0.9)
        lo, hi = patjax_stats.clopper_pearson(k, 100)
        covered += lo <= 0.9 <= hi
    assert covered >= 90
    # Data set: images with true PR_i ~ Beta(4, 1) (mean 0.8), N = 100 samples each; the
    # bootstrap interval of the mean PR must cover the population mean 0.8.
    covered = 0
    for seed in range(100):
        rng = np.random.default_rng(seed)
        p = rng.beta(4, 1, size=200)
        estimates = rng.binomial(100, p) / 100
        idx = patjax_stats.bootstrap_indices(200, 1000, seed + 1)
        _, (lo, hi) = patjax_stats.ratio_interval(estimates[None], np.ones((1, 200)), idx, 0.95)
        covered += lo <= 0.8 <= hi
    assert covered >= 90


def test_clopper_pearson_equals_scipy_exact_binomial_interval():
    for k, n in ((0, 10), (3, 10), (10, 10), (37, 100)):
        lo, hi = patjax_stats.clopper_pearson(k, n)
        ref = stats.binomtest(k, n).proportion_ci(0.95, method="exact")
        np.testing.assert_allclose([lo, hi], [ref.low, ref.high], rtol=1e-7, atol=1e-12)
