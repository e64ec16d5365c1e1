"""APGD and CW against independent computations: hand-written losses, the checkpoint formula of
Croce & Hein (2020), closed-form worst cases of a linear classifier, and PGD-20 on a trained MLP."""
import jax
import jax.numpy as jnp
import numpy as np
import optax

from patjax import attacks


def np_dlr(z, y):
    """DLR of Croce & Hein (2020), Eq. (5), written directly from the paper."""
    out = []
    for zi, yi in zip(z, y):
        s = np.sort(zi)[::-1]
        other = max(zi[j] for j in range(len(zi)) if j != yi)
        out.append(-(zi[yi] - other) / (s[0] - s[2] + 1e-12))
    return np.array(out)


def test_dlr_and_cw_losses_equal_hand_computations():
    z = np.array([[3.0, 1.0, 2.0, -1.0], [0.5, 4.0, 1.5, 1.0], [2.0, 2.0, 0.0, -3.0]], np.float32)
    y = np.array([0, 0, 1])
    np.testing.assert_allclose(attacks.dlr_loss(jnp.asarray(z), jnp.asarray(y)), np_dlr(z, y), rtol=1e-6)
    # CW: -max(z_y - max_{j!=y} z_j + kappa, 0) by hand: rows give z_y - other = 1, -3.5, 0.
    np.testing.assert_allclose(attacks.cw_margin_loss(jnp.asarray(z), jnp.asarray(y), kappa=50.0),
                               [-51.0, -46.5, -50.0], rtol=1e-6)
    np.testing.assert_allclose(attacks.cw_margin_loss(jnp.asarray(z), jnp.asarray(y), kappa=0.0),
                               [-1.0, 0.0, 0.0], atol=1e-7)


def test_checkpoints_follow_the_papers_recursion():
    # p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06), checkpoints at ceil(p_j N).
    p = [0.0, 0.22]
    while p[-1] + max(p[-1] - p[-2] - 0.03, 0.06) <= 1.0:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    expected = [int(round(100 * q)) - 1 for q in p[1:]]  # 0-based index of the last iteration
    assert attacks.apgd_checkpoints(100) == expected == [21, 40, 56, 69, 79, 86, 92, 98]


def linear_problem(seed=0, n=64, d=12):
    """Effectively binary 3-class linear classifier (class 2 has a huge negative bias), x in the interior."""
    rng = np.random.default_rng(seed)
    w = rng.normal(size=(d, 3)).astype(np.float32)
    b = np.array([0.0, 0.0, -1e3], np.float32)
    x = rng.uniform(0.3, 0.7, size=(n, d)).astype(np.float32)
    y = (x @ w + b).argmax(1)
    logits_fn = lambda z: z.reshape(z.shape[0], -1) @ w + b
    return logits_fn, x, y, w, b


def closed_form_robust(x, y, w, b, eps):
    """Robust iff the margin to the other live class exceeds eps ||w_y - w_o||_1 (no clipping: x in [0.3,0.7])."""
    other = 1 - y
    margin = (x @ w + b)[np.arange(len(y)), y] - (x @ w + b)[np.arange(len(y)), other]
    l1 = np.abs(w[:, y] - w[:, other]).sum(0)
    return margin > eps * l1, np.abs(margin - eps * l1)


def test_apgd_and_cw_reach_the_closed_form_worst_case_of_a_linear_classifier():
    eps = 0.05
    logits_fn, x, y, w, b = linear_problem()
    robust, gap = closed_form_robust(x, y, w, b, eps)
    clear = gap > 1e-3
    assert 0 < robust.sum() < len(y)
    key = jax.random.PRNGKey(0)
    for loss in ("ce", "dlr"):
        result = attacks.apgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, steps=20, loss=loss)
        np.testing.assert_array_equal(np.asarray(result.robust)[clear], robust[clear])
        delta = np.asarray(result.x_adv) - x
        assert np.abs(delta).max() <= eps + 1e-6 and result.x_adv.min() >= 0 and result.x_adv.max() <= 1
    cw_adv = attacks.pgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, step_size=eps / 4, steps=20,
                         loss_fn=attacks.cw_margin_loss)
    cw_robust = np.asarray(logits_fn(cw_adv)).argmax(1) == y
    np.testing.assert_array_equal(cw_robust[clear], robust[clear])


def test_apgd_succeeds_at_least_as_often_as_pgd20_on_a_small_trained_model():
    rng = np.random.default_rng(1)
    n, d, h, k = 256, 48, 32, 3
    x = rng.uniform(0, 1, size=(n, d)).astype(np.float32)
    t = (x - 0.5) @ rng.normal(size=(d, 2)) / np.sqrt(d) * 3
    y = (np.sin(2 * t[:, 0]) + t[:, 1] > 0.3).astype(np.int32) + (t[:, 1] > 0.8)
    params = {"w1": jnp.asarray(rng.normal(size=(d, h)) / np.sqrt(d), jnp.float32), "b1": jnp.zeros(h),
              "w2": jnp.asarray(rng.normal(size=(h, k)) / np.sqrt(h), jnp.float32), "b2": jnp.zeros(k)}

    def apply(p, z):
        return jnp.tanh(z.reshape(z.shape[0], -1) @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]

    tx = optax.adam(0.03)

    @jax.jit
    def train(p):
        def step(_, carry):
            p, s = carry
            g = jax.grad(lambda p: optax.softmax_cross_entropy_with_integer_labels(apply(p, x), y).mean())(p)
            u, s = tx.update(g, s)
            return optax.apply_updates(p, u), s
        return jax.lax.fori_loop(0, 300, step, (p, tx.init(p)))[0]

    params = train(params)
    logits_fn = lambda z: apply(params, z)
    clean = np.asarray(logits_fn(jnp.asarray(x))).argmax(1) == y
    assert clean.mean() > 0.9
    eps = 0.05
    key = jax.random.PRNGKey(3)
    pgd_adv = attacks.pgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, step_size=eps / 4, steps=20)
    pgd_robust = clean & (np.asarray(logits_fn(pgd_adv)).argmax(1) == y)
    assert 0 < pgd_robust.sum() < clean.sum() / 2
    robust = {}
    for loss in ("ce", "dlr"):
        result = attacks.apgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, steps=100, loss=loss)
        robust[loss] = np.asarray(result.robust)
        assert not (robust[loss] & ~clean).any()  # robust means the clean image is correct too
        # Every image counted as fooled has a misclassified point inside the ball.
        adv_pred = np.asarray(logits_fn(result.x_adv)).argmax(1)
        fooled = ~robust[loss] & clean
        assert (adv_pred[fooled] != y[fooled]).all()
        assert np.abs(np.asarray(result.x_adv) - x).max() <= eps + 1e-6
    assert robust["ce"].sum() <= pgd_robust.sum()
    assert (robust["ce"] & robust["dlr"]).sum() <= pgd_robust.sum()


def test_apgd_x_adv_is_what_perturb_returns_and_misclassified_exactly_where_not_robust():
    # Effectively binary linear model: robust and fooled images (closed form). Four robust images
    # are made clean-misclassified by a bump in the logits that only the clean image itself sees:
    # not robust, yet the start and every iterate are classified correctly. perturb returns x there
    # (it attacks only clean-correct images) and for robust images; the start is neither.
    eps = 0.05
    base_fn, x, y, w, b = linear_problem()
    robust_cf, gap = closed_form_robust(x, y, w, b, eps)
    bumped = np.zeros(len(y), bool)
    bumped[np.flatnonzero(robust_cf & (gap > 1e-3))[:4]] = True
    assert bumped.sum() == 4 and (~robust_cf & (gap > 1e-3)).sum() >= 4
    wrong = jax.nn.one_hot((y + 1) % 2, 3) * 100.0 * bumped[:, None]
    x_clean = jnp.asarray(x)

    def logits_fn(z):
        at_clean = jnp.max(jnp.abs(z - x_clean), axis=1, keepdims=True) < 1e-6
        return base_fn(z) + jnp.where(at_clean, wrong, 0.0)

    clean_pred = np.asarray(logits_fn(x_clean)).argmax(1)
    assert ((clean_pred != y) == bumped).all()
    for loss in ("ce", "dlr"):
        result = attacks.apgd(logits_fn, jax.random.PRNGKey(1), x_clean, jnp.asarray(y), eps=eps, steps=10, loss=loss)
        robust, x_adv = np.asarray(result.robust), np.asarray(result.x_adv)
        assert not robust[bumped].any()
        keep_x = robust | bumped
        assert keep_x.sum() > bumped.sum() and (~keep_x).sum() >= 4
        np.testing.assert_array_equal(x_adv[keep_x], x[keep_x])
        fooled = ~keep_x
        assert (np.abs(x_adv[fooled] - x[fooled]).max(axis=1) > eps / 2).all()
        assert np.abs(x_adv - x).max() <= eps + 1e-6
        np.testing.assert_array_equal(np.asarray(logits_fn(result.x_adv)).argmax(1) != y, ~robust)
