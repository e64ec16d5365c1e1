"""Square Attack (L-inf) against independent facts: p_selection values copied by hand from
fra31/auto-attack square.py, the L-inf box, the margin recomputed from the returned points, query
counts on hand-written models whose outcome is known in advance, and the closed-form worst case
of a linear classifier."""

import functools

import jax
import jax.numpy as jnp
import numpy as np

from patjax.attacks import square

EPS = 8 / 255


def np_margin(logits, y):
    """z_y - max_{j != y} z_j, written directly."""
    logits = np.asarray(logits, np.float64)
    return np.array([z[t] - max(z[j] for j in range(len(z)) if j != t) for z, t in zip(logits, y)])


def linear_model(w, b):
    return lambda z: z.reshape(z.shape[0], -1) @ w + b


def test_p_selection_and_square_sides_match_the_reference():
    # square.py p_selection, p_init = 0.8, read off its if-chain: p_init / 2^k past 10, 50, 200,
    # 500, 1000, 2000, 4000, 6000, 8000 (boundaries inclusive on the left interval).
    plain = {
        0: 0.8,
        10: 0.8,
        11: 0.4,
        50: 0.4,
        51: 0.2,
        200: 0.2,
        201: 0.1,
        500: 0.1,
        501: 0.05,
        1000: 0.05,
        1001: 0.025,
        2000: 0.025,
        2001: 0.0125,
        4000: 0.0125,
        4001: 0.00625,
        4999: 0.00625,
        6001: 0.003125,
        8001: 0.0015625,
    }
    for it, p in plain.items():
        assert square.p_selection(it, 10000, 0.8, rescale_schedule=False) == p, it
        assert square.p_selection(it, 5000, 0.8, rescale_schedule=False) == p, it
    # resc_schedule with n_queries = 5000: it -> int(it / 5000 * 10000) = 2 it.
    rescaled = {
        0: 0.8,
        5: 0.8,
        6: 0.4,
        25: 0.4,
        26: 0.2,
        100: 0.2,
        101: 0.1,
        250: 0.1,
        251: 0.05,
        2000: 0.0125,
        2001: 0.00625,
        3001: 0.003125,
        4000: 0.003125,
        4001: 0.0015625,
        4999: 0.0015625,
    }
    for it, p in rescaled.items():
        assert square.p_selection(it, 5000, 0.8, rescale_schedule=True) == p, it
    # Side s = max(int(round(sqrt(p * h * w))), 1) on 32x32x3, by hand:
    # sqrt(0.8*1024)=28.6 -> 29, sqrt(409.6)=20.2 -> 20, 14.3 -> 14, 10.1 -> 10, 7.2 -> 7,
    # 5.06 -> 5, 3.58 -> 4, 2.53 -> 3, 1.79 -> 2, 1.26 -> 1.
    sides = square.square_sizes(10000, 32, 32, 3, 0.8, rescale_schedule=False)
    assert [int(sides[i]) for i in (0, 11, 51, 201, 501, 1001, 2001, 4001, 6001, 8001)] == [
        29,
        20,
        14,
        10,
        7,
        5,
        4,
        3,
        2,
        1,
    ]
    # The current reference caps s at min(h, w): on 2x32 images sqrt(0.8 * 64) = 7.2 -> 2.
    assert square.square_sizes(5, 2, 32, 3)[0] == 2


def test_stays_in_the_eps_ball_and_the_unit_box():
    rng = np.random.default_rng(0)
    w = rng.normal(size=(8 * 8 * 3, 5)).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32)
    x = rng.uniform(0, 1, (24, 8, 8, 3)).astype(np.float32)
    x[:, :2] = np.round(x[:, :2])  # pixels at 0 and 1, where [0, 1] clips the ball
    logits_fn = linear_model(w, b)
    y = np.asarray(logits_fn(x)).argmax(1)
    # eps traced; the batch-shared squares and the rescaled schedule exercised here.
    run = jax.jit(
        lambda key, x, y, eps: square.square_linf(
            logits_fn, key, x, y, eps=eps, n_queries=150, rescale_schedule=True, shared_squares=True
        )
    )
    res = run(jax.random.key(1), x, y, EPS)
    for z in (np.asarray(res.x_adv), np.asarray(res.x_best)):
        assert np.all(np.abs(z - x) <= EPS + 1e-6) and z.min() >= 0.0 and z.max() <= 1.0
        # L-inf square steps only visit box vertices: each coordinate is clip(x - eps), clip(x + eps)
        # (x itself where not attacked or not fooled).
        lo, hi = np.clip(x - EPS, 0, 1), np.clip(x + EPS, 0, 1)
        vertex = (np.abs(z - lo) < 1e-6) | (np.abs(z - hi) < 1e-6) | (z == x)
        assert vertex.all()
    fooled = np.asarray(res.fooled)
    assert 0 < fooled.sum() < len(y)  # both outcomes occur, so the checks above see both
    assert np.all(np.asarray(logits_fn(res.x_adv)).argmax(1)[fooled] != y[fooled])
    np.testing.assert_array_equal(np.asarray(res.x_adv)[~fooled], x[~fooled])


def test_margin_never_increases_and_queries_count_the_unfooled_iterations():
    rng = np.random.default_rng(1)
    w = (0.3 * rng.normal(size=(8 * 8 * 3, 4))).astype(np.float32)
    x = rng.uniform(0, 1, (32, 8, 8, 3)).astype(np.float32)
    logits_fn = linear_model(w, np.zeros(4, np.float32))
    y = np.asarray(logits_fn(x)).argmax(1)
    key = jax.random.key(3)
    run = functools.partial(square.square_linf, logits_fn, key, x, y, eps=4 / 255)
    long = jax.jit(functools.partial(run, n_queries=200, return_trace=True))()
    short = jax.jit(functools.partial(run, n_queries=40))()
    trace = np.asarray(long.margin_trace)
    assert trace.shape == (201, 32)
    assert np.all(np.diff(trace, axis=0) <= 0)
    # The margin recomputed at the returned points: the last row of the trace, and the run of
    # 40 queries (same key, schedule independent of n_queries) is the trace's prefix.
    m_long, m_short = np_margin(logits_fn(long.x_best), y), np_margin(logits_fn(short.x_best), y)
    np.testing.assert_allclose(trace[-1], m_long, atol=1e-4)
    np.testing.assert_allclose(trace[40], m_short, atol=1e-4)
    assert np.all(m_long <= m_short + 1e-5)
    # Iteration t runs while margin_min > 0 after t iterations; plus 1 for the start.
    np.testing.assert_array_equal(np.asarray(long.queries), 1 + (trace[:200] > 0).sum(0))
    assert 0 < np.asarray(long.fooled).sum() < 32
    # The reference's corners lie in {0 .. w - s - 1}: no square reaches the last column, which
    # keeps the vertical stripe of the start (x in (0, 1), so no clipping there).
    last_column = np.sign(np.asarray(long.x_best)[:, :, -1] - x[:, :, -1])
    assert np.all(last_column == last_column[:, :1]) and np.all(last_column != 0)


def test_query_budget_and_images_fooled_before_the_search():
    rng = np.random.default_rng(2)
    x = rng.uniform(0.2, 0.8, (3, 8, 8, 3)).astype(np.float32)
    # Hand-written binary model: z_0 = c_i - sum |z - x_i|, z_1 = 0. Every start point (all 192
    # coordinates moved by eps) costs 192 eps ~ 6 of margin.
    c = np.array([1.0, 0.5, 1e3], np.float32)

    def logits_fn(z):
        z0 = c - jnp.sum(jnp.abs(z - x), axis=(1, 2, 3))
        return jnp.stack([z0, jnp.zeros_like(z0)], axis=1)

    # 0: label 1 while class 0 wins at x (clean-misclassified: not attacked);
    # 1: clean margin 0.5, fooled by the stripes start; 2: margin > 0 on the whole ball.
    y = np.array([1, 0, 0])
    res = jax.jit(functools.partial(square.square_linf, logits_fn, eps=EPS, n_queries=37))(jax.random.key(0), x, y)
    np.testing.assert_array_equal(np.asarray(res.queries), [0, 1, 38])
    np.testing.assert_array_equal(np.asarray(res.fooled), [True, True, False])
    x_adv = np.asarray(res.x_adv)
    np.testing.assert_array_equal(x_adv[[0, 2]], x[[0, 2]])
    # Image 1 is its start: every pixel at x ± eps, constant along each column (vertical stripes).
    np.testing.assert_allclose(np.abs(x_adv[1] - x[1]), EPS, rtol=1e-4)
    signs = np.sign(x_adv[1] - x[1])
    assert np.all(signs == signs[:1])
    assert np.asarray(res.margin)[2] > 0


def test_linear_model_matches_the_closed_form_worst_case():
    """Binary linear model z = (a . x, 0), y = 0: over the box B = [x - eps, x + eps] ∩ [0, 1]^d
    the smallest margin is sum_k min(a_k lo_k, a_k hi_k). No point of B (hence no black-box
    attack) fools an image where it is positive; Square, given 5000 queries, must fool those
    where it is negative. a is 0 on the last row and column: the reference's corners
    {0 .. h - s - 1} never put a square there, so only the random start sets those pixels."""
    rng = np.random.default_rng(4)
    a = rng.normal(size=(8, 8, 3))
    a[-1], a[:, -1] = 0.0, 0.0
    l1 = np.abs(a).sum()
    ratio = np.array([0.1, 0.3, 0.5, 0.7, 0.8, 0.85, 0.95, 1.05, 1.2, 1.5, 2.0, 3.0, 0.6])
    z = rng.uniform(0.4, 0.6, (len(ratio), 8, 8, 3))
    # Shift along a so that the clean margin a . x is ratio * eps * ||a||_1.
    x = z + ((ratio * EPS * l1 - (z * a).sum((1, 2, 3))) / (a * a).sum())[:, None, None, None] * a
    assert x.min() > EPS and x.max() < 1 - EPS
    x = x.astype(np.float32)
    w = np.stack([a.reshape(-1), np.zeros(a.size)], axis=1).astype(np.float32)
    logits_fn = linear_model(w, np.zeros(2, np.float32))
    y = np.zeros(len(ratio), np.int32)
    lo, hi = np.clip(x - EPS, 0, 1).astype(np.float64), np.clip(x + EPS, 0, 1).astype(np.float64)
    worst = np.minimum(a * lo, a * hi).sum((1, 2, 3))
    assert np.all(np.abs(worst) > 0.1)  # no borderline case
    res = jax.jit(functools.partial(square.square_linf, logits_fn, eps=EPS))(jax.random.key(5), x, y)
    fooled = np.asarray(res.fooled)
    np.testing.assert_array_equal(fooled, worst < 0)
    margins = np_margin(logits_fn(res.x_best), y)
    assert np.all(margins >= worst - 1e-4)
    np.testing.assert_array_equal(np.asarray(res.queries)[worst > 0], 5001)
    assert np.all(np.asarray(res.queries)[worst < 0] < 5001)
