"""Inner attacks of the baselines against closed forms and independent numpy re-computations."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import linear_batch, np_softmax

from patjax.attacks import inner, pgd
from patjax.methods import atpr

EPS = 0.1


def assert_in_ball_and_box(x_adv, x, eps):
    x_adv, x = np.asarray(x_adv), np.asarray(x)
    assert np.all(np.abs(x_adv - x) <= eps + 1e-6)
    assert np.all((x_adv >= 0.0) & (x_adv <= 1.0))


@pytest.mark.slow
def test_every_attack_stays_in_the_eps_ball_and_the_box_and_moves():
    logits_fn, x, y, _, _ = linear_batch()
    key = jax.random.PRNGKey(5)
    settings = atpr.AtprSettings(
        eps=EPS, step_size=0.03, steps=3, num_candidates=3, eps_spread=0.05, steps_above=2, refine_max_iters=5
    )

    @jax.jit
    def run_all(x, y, key):
        return {
            "fgsm": pgd.fgsm(logits_fn, x, y, EPS),
            "fgsm_random_point": pgd.fgsm_random_point(logits_fn, key, x, y, EPS),
            "pgd": pgd.pgd(logits_fn, key, x, y, eps=EPS, step_size=0.03, steps=5),
            "trades": inner.trades_kl_attack(logits_fn, key, x, eps=EPS, step_size=0.03, steps=5),
            "mart": inner.mart_attack(logits_fn, key, x, y, eps=EPS, step_size=0.03, steps=5),
        }, atpr.atpr_search(logits_fn, key, x, y, settings)

    results, search = run_all(x, y, key)
    results["atpr"] = search.x_adv
    for c in range(3):
        results[f"atpr candidate {c}"] = search.candidates[c]
    for name, x_adv in results.items():
        assert_in_ball_and_box(x_adv, x, EPS)
        assert np.max(np.abs(np.asarray(x_adv) - np.asarray(x))) > EPS / 2, name


@pytest.mark.parametrize("label", [0, 1])
def test_pgd_on_a_binary_linear_model_reaches_the_closed_form_worst_case(label):
    # CE of a 2-class linear model decreases in the margin (w_y - w_j).x + b_y - b_j, so its
    # L-inf worst case is x - eps * sign(w_y - w_j); x is interior, so the box clip is inactive.
    logits_fn, x, _, W, _ = linear_batch(batch=4, k=2, interior=True)
    y = jnp.full((4,), label)
    x_adv = pgd.pgd(logits_fn, jax.random.PRNGKey(3), x, y, eps=EPS, step_size=0.05, steps=6)
    direction = np.sign(W[:, label] - W[:, 1 - label]).reshape(x.shape[1:])
    expected = np.asarray(x) - EPS * direction
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)


def test_pgd_with_a_margin_loss_reaches_the_closed_form_worst_case_for_four_classes():
    # For the margin to a fixed class j, -(z_y - z_j), the worst case is x - eps * sign(w_y - w_j).
    logits_fn, x, y, W, _ = linear_batch(batch=4, k=4, interior=True, seed=2)
    j = (np.asarray(y) + 1) % 4
    margin_loss = lambda z, t: (
        -(jnp.take_along_axis(z, t[:, None], -1)[:, 0] - jnp.take_along_axis(z, jnp.asarray(j)[:, None], -1)[:, 0])
    )
    x_adv = pgd.pgd(logits_fn, jax.random.PRNGKey(4), x, y, eps=EPS, step_size=0.05, steps=6, loss_fn=margin_loss)
    direction = np.stack([np.sign(W[:, int(t)] - W[:, jj]) for t, jj in zip(np.asarray(y), j)])
    expected = np.asarray(x) - EPS * direction.reshape(x.shape)
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)


def np_sign_ascent(x_start, x, grad_fn, eps, step_size, steps):
    z = x_start.copy()
    for _ in range(steps):
        z = np.clip(np.clip(z + step_size * np.sign(grad_fn(z)), x - eps, x + eps), 0, 1)
    return np.clip(np.clip(z, x - eps, x + eps), 0, 1)


def np_ce_grad(W, b, y):
    """d/dx CE(softmax(flatten(x) W + b), y) = (q - onehot(y)) W^T, reshaped like x."""
    k = W.shape[1]
    return lambda z: ((np_softmax(z.reshape(len(z), -1) @ W + b) - np.eye(k)[y]) @ W.T).reshape(z.shape)


def test_pgd_starts_from_the_uniform_draw_of_its_key():
    # The start is clip(x + U(-eps, eps)^d) with U = jax.random.uniform(key, x.shape, x.dtype,
    # -eps, eps), the documented key usage, recomputed here; rows 0 and 3 of each image lie on the
    # box faces (the [0, 1] clip of the start binds), rows 1-2 inside. 3 classes: the CE
    # gradient's sign depends on the point.
    logits_fn, x, y, W, b = linear_batch(batch=6, k=3, shape=(4, 3), seed=5)
    key = jax.random.PRNGKey(12)
    xn = np.asarray(x, np.float64)
    start = np.clip(xn + np.asarray(jax.random.uniform(key, x.shape, x.dtype, -EPS, EPS), np.float64), 0, 1)
    assert (start == 0).any() and (start == 1).any()
    grad = np_ce_grad(W, b, np.asarray(y))
    np.testing.assert_allclose(pgd.pgd(logits_fn, key, x, y, eps=EPS, step_size=0.03, steps=0), start, atol=1e-6)
    x_adv = np.asarray(pgd.pgd(logits_fn, key, x, y, eps=EPS, step_size=0.03, steps=3))
    np.testing.assert_allclose(x_adv, np_sign_ascent(start, xn, grad, EPS, 0.03, 3), atol=1e-5)
    from_x = np.asarray(pgd.pgd(logits_fn, key, x, y, eps=EPS, step_size=0.03, steps=3, random_start=False))
    np.testing.assert_allclose(from_x, np_sign_ascent(xn, xn, grad, EPS, 0.03, 3), atol=1e-5)
    assert np.abs(x_adv - from_x).max() > 0.05  # the start is visible in the result


def test_fgsm_random_point_takes_the_gradient_at_a_uniform_point_and_steps_from_x():
    # AT-PR fgsm_loss: grad at clip(x + U(-eps, eps), 0, 1) with U drawn from the key as
    # jax.random.uniform(key, x.shape, x.dtype, -eps, eps); the step eps * sign(grad) from x.
    eps = 0.3
    logits_fn, x, y, W, b = linear_batch(batch=8, k=3, shape=(4, 3), seed=6)
    key = jax.random.PRNGKey(13)
    xn = np.asarray(x, np.float64)
    x_random = np.clip(xn + np.asarray(jax.random.uniform(key, x.shape, x.dtype, -eps, eps), np.float64), 0, 1)
    grad = np_ce_grad(W, b, np.asarray(y))
    step_from_x = lambda g: np.clip(np.clip(xn + eps * np.sign(g), xn - eps, xn + eps), 0, 1)
    expected = step_from_x(grad(x_random))
    x_adv = np.asarray(pgd.fgsm_random_point(logits_fn, key, x, y, eps))
    np.testing.assert_allclose(x_adv, expected, atol=1e-6)
    # Discriminates: the gradient's sign at x differs from the one at x_random in places.
    assert np.abs(step_from_x(grad(xn)) - expected).max() > eps + 0.01
    np.testing.assert_allclose(pgd.fgsm(logits_fn, x, y, eps), step_from_x(grad(xn)), atol=1e-6)


def test_trades_and_mart_attacks_equal_a_numpy_recomputation_on_a_linear_model():
    # 4 steps of 0.02 < EPS: only the [0, 1] clip binds here (the eps-ball: the MLP test below).
    logits_fn, x, y, W, b = linear_batch(batch=5, k=3)
    key = jax.random.PRNGKey(11)
    xn, yn = np.asarray(x, np.float64), np.asarray(y)
    flat = lambda z: z.reshape(len(z), -1)
    noise = 0.001 * np.asarray(jax.random.normal(key, x.shape), np.float64)  # the attacks' start
    p_clean = np_softmax(flat(xn) @ W + b)

    def kl_grad(z):  # d/dx KL(p || softmax(xW + b)) = (q - p) W^T
        return ((np_softmax(flat(z) @ W + b) - p_clean) @ W.T).reshape(z.shape)

    trades = inner.trades_kl_attack(logits_fn, key, x, eps=EPS, step_size=0.02, steps=4)
    np.testing.assert_allclose(trades, np_sign_ascent(xn + noise, xn, kl_grad, EPS, 0.02, 4), atol=1e-5)
    mart = inner.mart_attack(logits_fn, key, x, y, eps=EPS, step_size=0.02, steps=4)
    np.testing.assert_allclose(mart, np_sign_ascent(xn + noise, xn, np_ce_grad(W, b, yn), EPS, 0.02, 4), atol=1e-5)
    # The KL ascent increases the divergence it ascends.
    kl = lambda z: np.sum(p_clean * (np.log(p_clean) - np.log(np_softmax(flat(z) @ W + b))), axis=1)
    assert np.all(kl(np.asarray(trades, np.float64)) > kl(xn + noise))


def test_trades_and_mart_attacks_project_onto_the_eps_ball_at_every_step():
    # The TRADES / MART settings (eps 8/255, 10 steps of 0.007: the ball binds) on a tanh MLP, whose
    # gradient signs change along the path, so that projecting only at the end (or clipping to
    # [0, 1] only) ends elsewhere; the numpy recomputation uses the MLP's gradient by hand.
    # Moderate weights: with saturated units, float32 rounds q - p (q ~ p at the TRADES start)
    # and its signs stop matching exact arithmetic.
    eps, step_size, steps = 8 / 255, 0.007, 10
    rng = np.random.default_rng(1)
    d, h, k, n = 12, 8, 3, 6
    W1 = rng.normal(size=(d, h)) / np.sqrt(d) * 6.0
    b1 = rng.normal(size=h)
    W2 = rng.normal(size=(h, k)) / np.sqrt(h) * 6.0
    W1, b1, W2 = (np.float64(np.float32(a)) for a in (W1, b1, W2))  # what the float32 model holds
    xn = np.float64(rng.uniform(size=(n, d)).astype(np.float32))
    yn = np.arange(n) % k
    W1j, b1j, W2j = (jnp.asarray(a, jnp.float32) for a in (W1, b1, W2))
    logits_fn = lambda z: jnp.tanh(z @ W1j + b1j) @ W2j
    hidden = lambda z: np.tanh(z @ W1 + b1)
    probs = lambda z: np_softmax(hidden(z) @ W2)
    backward = lambda z, dlogits: ((dlogits @ W2.T) * (1.0 - hidden(z) ** 2)) @ W1.T
    p_clean = probs(xn)
    kl_grad = lambda z: backward(z, probs(z) - p_clean)
    ce_grad = lambda z: backward(z, probs(z) - np.eye(k)[yn])
    key = jax.random.PRNGKey(11)
    x, y = jnp.asarray(xn, jnp.float32), jnp.asarray(yn)
    start = xn + 0.001 * np.asarray(jax.random.normal(key, x.shape), np.float64)
    trades = np.asarray(inner.trades_kl_attack(logits_fn, key, x, eps=eps, step_size=step_size, steps=steps))
    mart = np.asarray(inner.mart_attack(logits_fn, key, x, y, eps=eps, step_size=step_size, steps=steps))
    for got, grad in ((trades, kl_grad), (mart, ce_grad)):
        expected = np_sign_ascent(start, xn, grad, eps, step_size, steps)
        np.testing.assert_allclose(got, expected, atol=1e-5)
        assert (np.abs(np.abs(expected - xn) - eps) < 1e-9).any()  # on the ball's surface
        project_at_the_end = np.clip(
            np.clip(np_sign_ascent(start, xn, grad, np.inf, step_size, steps), xn - eps, xn + eps), 0, 1
        )
        assert np.abs(project_at_the_end - expected).max() > step_size / 2
