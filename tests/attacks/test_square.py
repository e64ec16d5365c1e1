"""Square Attack against independent facts: p_selection values and square sides copied by hand
from fra31/auto-attack square.py, the L-inf box and the L2 ball, the margin recomputed from the
returned points, query counts on hand-written models whose outcome is known in advance, the
closed-form worst case of linear classifiers, and, for L2, a NumPy transcription of the reference's
start and iterations (NCHW, slices as square.py writes them) run on the same random draws."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from patjax.attacks import square, square_l2

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


# --- L2 -------------------------------------------------------------------------------------------

EPS_L2 = 0.5


def ref_eta_rectangles(x, y):
    """square.py eta_rectangles, norm='L2', transcribed in float64."""
    delta = np.zeros((x, y))
    x_c, y_c = x // 2 + 1, y // 2 + 1
    counter2 = [x_c - 1, y_c - 1]
    for counter in range(max(x_c, y_c)):
        delta[
            max(counter2[0], 0) : min(counter2[0] + (2 * counter + 1), x),
            max(0, counter2[1]) : min(counter2[1] + (2 * counter + 1), y),
        ] += 1.0 / (counter + 1) ** 2
        counter2[0] -= 1
        counter2[1] -= 1
    return delta / np.sqrt((delta**2).sum()) if x else delta


def ref_eta(s, transpose):
    """square.py eta, norm='L2', with its coin (torch.rand([1]) > 0.5) given."""
    delta = np.zeros((s, s))
    delta[: s // 2] = ref_eta_rectangles(s // 2, s)
    delta[s // 2 :] = -1.0 * ref_eta_rectangles(s - s // 2, s)
    delta /= np.sqrt((delta**2).sum())
    return delta.T if transpose else delta


def ref_normalize(d):
    return d / (np.sqrt((d**2).reshape(d.shape[0], -1).sum(-1))[:, None, None, None] + 1e-12)


def ref_l2_start(x, eps, signs, flips):
    """attack_single_run's L2 start on NCHW x; block (i, j) draws flips[i, j] (eta's coin, shared by
    the batch) and signs[:, i, j, :] (random_choice([B, c, 1, 1]))."""
    c, h, w = x.shape[1:]
    delta_init = np.zeros_like(x)
    s = h // 5
    sp_init = (h - s * 5) // 2
    vh = sp_init + 0
    for i in range(h // s):
        vw = sp_init + 0
        for j in range(w // s):
            delta_init[:, :, vh : vh + s, vw : vw + s] += (
                ref_eta(s, flips[i, j]).reshape(1, 1, s, s) * signs[:, i, j, :, None, None]
            )
            vw += s
        vh += s
    return np.clip(x + ref_normalize(delta_init) * eps, 0.0, 1.0)


def ref_l2_search(model, x, y, eps, sizes, x_best, draws):
    """attack_single_run's L2 loop on NCHW x from x_best; draws(i) = (vh, vw, vh2, vw2, coin,
    signs (B, c)) for the whole batch, as the reference shares them; signs are read at the images
    still unfooled. Returns x_best, margin_min after each iteration (frozen once none is left),
    queries."""
    c = x.shape[1]
    x_best = x_best.copy()
    margin_min = np_margin(model(x_best), y)
    n_queries = np.ones(len(x), int)
    trace = [margin_min.copy()]
    for i_iter, s in enumerate(sizes):
        if not np.any(margin_min > 0.0):  # the reference's early return and its break
            trace.append(margin_min.copy())
            continue
        idx_to_fool = np.nonzero(margin_min > 0.0)[0]
        x_curr, x_best_curr = x[idx_to_fool], x_best[idx_to_fool]
        delta_curr = x_best_curr - x_curr
        vh, vw, vh2, vw2, coin, signs = draws(i_iter)
        norms_window_1 = np.sqrt((delta_curr[:, :, vh : vh + s, vw : vw + s] ** 2).sum((-2, -1), keepdims=True))
        mask_image = np.zeros_like(x_curr)
        mask_image[:, :, vh : vh + s, vw : vw + s] = 1.0
        mask_image[:, :, vh2 : vh2 + s, vw2 : vw2 + s] = 1.0
        norms_image = np.sqrt((delta_curr**2).reshape(len(idx_to_fool), -1).sum(-1))[:, None, None, None]
        norms_windows = np.sqrt(((delta_curr * mask_image) ** 2).sum((-2, -1), keepdims=True))
        new_deltas = ref_eta(s, coin).reshape(1, 1, s, s) * signs[idx_to_fool][:, :, None, None]
        new_deltas = new_deltas + delta_curr[:, :, vh : vh + s, vw : vw + s] / (1e-12 + norms_window_1)
        new_deltas = (
            new_deltas
            / (1e-12 + np.sqrt((new_deltas**2).sum((-2, -1), keepdims=True)))
            * np.sqrt(np.maximum(eps**2 - norms_image**2, 0.0) / c + norms_windows**2)
        )
        delta_curr[:, :, vh2 : vh2 + s, vw2 : vw2 + s] = 0.0
        delta_curr[:, :, vh : vh + s, vw : vw + s] = new_deltas
        x_new = np.clip(x_curr + ref_normalize(delta_curr) * eps, 0.0, 1.0)
        margin = np_margin(model(x_new), y[idx_to_fool])
        improved = (margin < margin_min[idx_to_fool]) | (margin <= 0.0)
        margin_min[idx_to_fool] = np.where(improved, margin, margin_min[idx_to_fool])
        x_best[idx_to_fool[improved]] = x_new[improved]
        n_queries[idx_to_fool] += 1
        trace.append(margin_min.copy())
    return x_best, np.array(trace), n_queries


def nhwc(a):
    return np.transpose(a, (0, 2, 3, 1))


def nchw(a):
    return np.transpose(a, (0, 3, 1, 2))


def test_l2_square_sides_match_the_reference():
    # square.py L2: s = max(int(round(sqrt(p * h * w))), 3), +1 if even, then min(s, min(h, w)).
    # 32x32: 28.6 -> 29, 20.2 -> 20 -> 21, 14.3 -> 15, 10.1 -> 11, 7.2 -> 7, 5.06 -> 5,
    # 3.58 -> 4 -> 5, 2.53 -> 3, 1.79 -> 3, 1.26 -> 3.
    sides = square.square_sizes(10000, 32, 32, 3, 0.8, norm="L2")
    assert [int(sides[i]) for i in (0, 11, 51, 201, 501, 1001, 2001, 4001, 6001, 8001)] == [
        29,
        21,
        15,
        11,
        7,
        5,
        5,
        3,
        3,
        3,
    ]
    # The cap comes after the odd step: on 6x32, sqrt(0.8 * 192) = 12.4 -> 13 -> 6.
    assert square.square_sizes(1, 6, 32, 3, norm="L2")[0] == 6
    # eta(3) by hand: top row eta_rectangles(1, 3) = [1/4, 5/4, 1/4] / |.|, bottom rows
    # eta_rectangles(2, 3) = [[1/4] * 3, [1/4, 5/4, 1/4]] / |.|, the two halves each of unit norm.
    top = np.array([[0.25, 1.25, 0.25]]) / np.sqrt(1.6875)
    bottom = np.array([[0.25, 0.25, 0.25], [0.25, 1.25, 0.25]]) / np.sqrt(1.875)
    np.testing.assert_allclose(ref_eta(3, False), np.concatenate([top, -bottom]) / np.sqrt(2), rtol=1e-12)
    with pytest.raises(ValueError):
        square_l2.square_l2(
            lambda z: z[:, 0, 0], jax.random.key(0), jnp.zeros((1, 4, 8, 3)), jnp.zeros(1, int), eps=0.5
        )


@pytest.mark.parametrize("height, width, shared", [(32, 32, False), (16, 20, True), (8, 8, False)])
def test_l2_start_matches_the_reference(height, width, shared):
    """The start against the transcription given the same coins and signs; per-image coins are
    the transcription run on each image alone. On 8x8 (blocks of side 1 from row 1) the last block
    row and column fall outside the image: the reference's empty slices skip them."""
    rng = np.random.default_rng(height)
    batch = 3
    x = rng.uniform(0, 1, (batch, height, width, 3)).astype(np.float32)
    x[:, :3] = np.round(x[:, :3])
    _, _, rows, cols = square_l2.l2_start_grid(height, width)
    signs = rng.choice([-1.0, 1.0], (batch, rows, cols, 3)).astype(np.float32)
    flips = rng.uniform(size=(1 if shared else batch, rows, cols)) > 0.5
    res = square_l2.square_l2_run(
        lambda z: jnp.zeros((z.shape[0], 2)),  # margin 0 at every point: attacked, never searched
        x,
        np.zeros(batch, np.int32),
        eps=EPS_L2,
        sizes=np.zeros(0, np.int32),
        start_signs=signs,
        start_transposed=flips,
        draw=lambda i, s: (*jnp.zeros((4, 1), jnp.int32), jnp.zeros(1, bool), jnp.ones((batch, 1, 1, 3))),
    )
    x64 = nchw(x).astype(np.float64)
    expected = [ref_l2_start(x64[b : b + 1], EPS_L2, signs[b : b + 1], flips[0 if shared else b]) for b in range(batch)]
    np.testing.assert_allclose(np.asarray(res.x_best), nhwc(np.concatenate(expected)), atol=2e-6)
    assert np.asarray(res.queries).tolist() == [1] * batch


@pytest.mark.slow
@pytest.mark.parametrize("shared", [True, False])
def test_l2_iterations_match_the_reference(shared):
    """40 iterations (sides 15 then 11 on 16x16) of square_l2_run against the transcription on the
    same draws: shared windows and coins for the whole batch as the reference draws them, or per
    image (the transcription run on each image alone)."""
    rng = np.random.default_rng(7)
    size, n_iter = 16, 40
    x = rng.uniform(0, 1, (400, size, size, 3)).astype(np.float32)
    w = (0.05 * rng.normal(size=(size * size * 3, 10))).astype(np.float32)
    logits_fn = linear_model(w, np.zeros(10, np.float32))
    # Images near the boundary (clean margins 0.015 to 0.17, where the start moves the margin by
    # about 0.96 at most), so that some are fooled within 40 iterations and some are not.
    x = x[np.argsort(np_margin(logits_fn(x), np.asarray(logits_fn(x)).argmax(1)))[[3, 10, 16, 24, 40, 60, 100]]]
    y = np.asarray(logits_fn(x)).argmax(1)
    batch = len(x)
    _, _, rows, cols = square_l2.l2_start_grid(size, size)
    start_signs = rng.choice([-1.0, 1.0], (batch, rows, cols, 3)).astype(np.float32)
    start_flips = rng.uniform(size=(1, rows, cols)) > 0.5
    sizes = square.square_sizes(n_iter, size, size, 3, norm="L2")
    assert sorted(set(sizes.tolist())) == [11, 15]
    n = 1 if shared else batch
    corners = rng.integers(0, size - sizes[:, None, None], (n_iter, 4, n)).astype(np.int32)
    coins = rng.uniform(size=(n_iter, n)) > 0.5
    signs = rng.choice([-1.0, 1.0], (n_iter, batch, 3)).astype(np.float32)
    res = square_l2.square_l2_run(
        logits_fn,
        x,
        y,
        eps=EPS_L2,
        sizes=sizes,
        start_signs=start_signs,
        start_transposed=start_flips,
        draw=lambda i, s: (*jnp.asarray(corners)[i], jnp.asarray(coins)[i], jnp.asarray(signs)[i][:, None, None, :]),
        return_trace=True,
    )

    def model(z):
        return nhwc(z).reshape(len(z), -1) @ w.astype(np.float64)

    x64 = nchw(x).astype(np.float64)
    x_start = ref_l2_start(x64, EPS_L2, start_signs, start_flips[0])
    if shared:
        draws = lambda i: (*corners[i, :, 0], coins[i, 0], signs[i])
        x_best, trace, queries = ref_l2_search(model, x64, y, EPS_L2, sizes, x_start, draws)
    else:
        runs = [
            ref_l2_search(
                model,
                x64[b : b + 1],
                y[b : b + 1],
                EPS_L2,
                sizes,
                x_start[b : b + 1],
                lambda i, b=b: (*corners[i, :, b], coins[i, b], signs[i, b : b + 1]),
            )
            for b in range(batch)
        ]
        x_best = np.concatenate([r[0] for r in runs])
        trace = np.concatenate([r[1] for r in runs], axis=1)
        queries = np.concatenate([r[2] for r in runs])
    np.testing.assert_array_equal(np.asarray(res.queries), queries)
    np.testing.assert_allclose(np.asarray(res.margin_trace), trace, atol=2e-5)
    np.testing.assert_allclose(np.asarray(res.x_best), nhwc(x_best), atol=2e-5)
    # Images fooled during the search and images left robust, accepted and rejected steps all
    # occur, so the comparison sees each case.
    assert np.any((queries > 1) & (queries <= n_iter)) and np.any(queries == n_iter + 1)
    assert np.any(np.diff(trace, axis=0) < 0) and np.any(np.diff(trace[: n_iter // 2], axis=0) == 0)


def test_l2_stays_in_the_ball_and_the_unit_box_and_counts_queries():
    rng = np.random.default_rng(8)
    w = rng.normal(size=(10 * 10 * 3, 5)).astype(np.float32)
    b = rng.normal(size=5).astype(np.float32)
    x = rng.uniform(0, 1, (24, 10, 10, 3)).astype(np.float32)
    x[:, :3] = np.round(x[:, :3])  # pixels at 0 and 1, where [0, 1] clips the ball
    logits_fn = linear_model(w, b)
    y = np.asarray(logits_fn(x)).argmax(1)
    y[0] = (y[0] + 1) % 5  # clean-misclassified: not attacked
    # eps traced; the batch-shared squares and the rescaled schedule exercised here.
    run = jax.jit(
        lambda key, x, y, eps: square_l2.square_l2(
            logits_fn, key, x, y, eps=eps, n_queries=150, rescale_schedule=True, shared_squares=True, return_trace=True
        )
    )
    res = run(jax.random.key(1), x, y, EPS_L2)
    for z in (np.asarray(res.x_adv), np.asarray(res.x_best)):
        assert np.all(np.sqrt(((z - x) ** 2).sum((1, 2, 3))) <= EPS_L2 * (1 + 1e-5))
        assert z.min() >= 0.0 and z.max() <= 1.0
    fooled, queries = np.asarray(res.fooled), np.asarray(res.queries)
    assert 1 < fooled.sum() < len(y)  # both outcomes occur among the attacked images
    broken = np.nonzero(fooled[1:])[0] + 1
    assert np.all(np.asarray(logits_fn(res.x_adv)).argmax(1)[broken] != y[broken])
    np.testing.assert_array_equal(np.asarray(res.x_adv)[~fooled], x[~fooled])
    assert fooled[0] and queries[0] == 0 and np.array_equal(np.asarray(res.x_adv)[0], x[0])
    trace = np.asarray(res.margin_trace)
    assert np.all(np.diff(trace, axis=0) <= 0)
    np.testing.assert_array_equal(queries[1:], 1 + (trace[:150, 1:] > 0).sum(0))
    np.testing.assert_allclose(trace[-1, 1:], np_margin(logits_fn(res.x_best), y)[1:], atol=1e-4)


@pytest.mark.slow
def test_l2_linear_model_fools_inside_and_never_beyond():
    """Binary linear model z = (a . x, 0), y = 0: on the L2 ball of radius eps the smallest margin
    is a . x - eps |a|_2, so no point of the ball fools an image whose clean margin is above
    eps |a|_2; those well inside (at most 0.3 of it) Square fools in 2000 queries."""
    rng = np.random.default_rng(4)
    a = rng.normal(size=(10, 10, 3))
    l2 = np.sqrt((a * a).sum())
    ratio = np.array([0.1, 0.2, 0.3, 0.6, 1.05, 1.2, 2.0])
    z = rng.uniform(0.4, 0.6, (len(ratio), 10, 10, 3))
    # Shift along a so that the clean margin a . x is ratio * eps * |a|_2.
    x = z + ((ratio * EPS_L2 * l2 - (z * a).sum((1, 2, 3))) / (a * a).sum())[:, None, None, None] * a
    assert x.min() > 0 and x.max() < 1
    x = x.astype(np.float32)
    w = np.stack([a.reshape(-1), np.zeros(a.size)], axis=1).astype(np.float32)
    logits_fn = linear_model(w, np.zeros(2, np.float32))
    y = np.zeros(len(ratio), np.int32)
    attack = jax.jit(functools.partial(square_l2.square_l2, logits_fn, eps=EPS_L2, n_queries=2000))
    res = attack(jax.random.key(5), x, y)
    fooled = np.asarray(res.fooled)
    np.testing.assert_array_equal(fooled[ratio <= 0.3], True)
    np.testing.assert_array_equal(fooled[ratio > 1], False)
    best = (x.astype(np.float64) * a).sum((1, 2, 3)) - EPS_L2 * l2
    assert np.all(np_margin(logits_fn(res.x_best), y) >= best - 1e-4)
    np.testing.assert_array_equal(np.asarray(res.queries)[ratio > 1], 2001)
