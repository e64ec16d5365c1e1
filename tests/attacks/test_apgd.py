"""APGD and CW against independent computations: hand-written losses, the checkpoint formula of
Croce & Hein (2020), closed-form worst cases of a linear classifier (L-inf and L2), PGD-20 on a
trained MLP, and a float64 numpy transcription of fra31/auto-attack's APGD (its Linf and L2
branches) on an MLP with a hand-written gradient."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from patjax.attacks import apgd, pgd


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
    np.testing.assert_allclose(apgd.dlr_loss(jnp.asarray(z), jnp.asarray(y)), np_dlr(z, y), rtol=1e-6)
    # CW: -max(z_y - max_{j!=y} z_j + kappa, 0) by hand: rows give z_y - other = 1, -3.5, 0.
    np.testing.assert_allclose(
        pgd.cw_margin_loss(jnp.asarray(z), jnp.asarray(y), kappa=50.0), [-51.0, -46.5, -50.0], rtol=1e-6
    )
    np.testing.assert_allclose(
        pgd.cw_margin_loss(jnp.asarray(z), jnp.asarray(y), kappa=0.0), [-1.0, 0.0, 0.0], atol=1e-7
    )


def test_checkpoints_follow_the_papers_recursion():
    # p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06), checkpoints at ceil(p_j N).
    p = [0.0, 0.22]
    while p[-1] + max(p[-1] - p[-2] - 0.03, 0.06) <= 1.0:
        p.append(p[-1] + max(p[-1] - p[-2] - 0.03, 0.06))
    expected = [int(round(100 * q)) - 1 for q in p[1:]]  # 0-based index of the last iteration
    assert apgd.apgd_checkpoints(100) == expected == [21, 40, 56, 69, 79, 86, 92, 98]


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


@pytest.mark.slow
def test_apgd_and_cw_reach_the_closed_form_worst_case_of_a_linear_classifier():
    eps = 0.05
    logits_fn, x, y, w, b = linear_problem()
    robust, gap = closed_form_robust(x, y, w, b, eps)
    clear = gap > 1e-3
    assert 0 < robust.sum() < len(y)
    key = jax.random.PRNGKey(0)
    for loss in ("ce", "dlr"):
        result = apgd.apgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, steps=20, loss=loss)
        np.testing.assert_array_equal(np.asarray(result.robust)[clear], robust[clear])
        delta = np.asarray(result.x_adv) - x
        assert np.abs(delta).max() <= eps + 1e-6 and result.x_adv.min() >= 0 and result.x_adv.max() <= 1
    cw_adv = pgd.pgd(
        logits_fn,
        key,
        jnp.asarray(x),
        jnp.asarray(y),
        eps=eps,
        step_size=eps / 4,
        steps=20,
        loss_fn=pgd.cw_margin_loss,
    )
    cw_robust = np.asarray(logits_fn(cw_adv)).argmax(1) == y
    np.testing.assert_array_equal(cw_robust[clear], robust[clear])


@pytest.mark.slow
def test_apgd_succeeds_at_least_as_often_as_pgd20_on_a_small_trained_model():
    rng = np.random.default_rng(1)
    n, d, h, k = 256, 48, 32, 3
    x = rng.uniform(0, 1, size=(n, d)).astype(np.float32)
    t = (x - 0.5) @ rng.normal(size=(d, 2)) / np.sqrt(d) * 3
    y = (np.sin(2 * t[:, 0]) + t[:, 1] > 0.3).astype(np.int32) + (t[:, 1] > 0.8)
    params = {
        "w1": jnp.asarray(rng.normal(size=(d, h)) / np.sqrt(d), jnp.float32),
        "b1": jnp.zeros(h),
        "w2": jnp.asarray(rng.normal(size=(h, k)) / np.sqrt(h), jnp.float32),
        "b2": jnp.zeros(k),
    }

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
    pgd_adv = pgd.pgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, step_size=eps / 4, steps=20)
    pgd_robust = clean & (np.asarray(logits_fn(pgd_adv)).argmax(1) == y)
    assert 0 < pgd_robust.sum() < clean.sum() / 2
    robust = {}
    for loss in ("ce", "dlr"):
        result = apgd.apgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, steps=100, loss=loss)
        robust[loss] = np.asarray(result.robust)
        assert not (robust[loss] & ~clean).any()  # robust means the clean image is correct too
        # Every image counted as fooled has a misclassified point inside the ball.
        adv_pred = np.asarray(logits_fn(result.x_adv)).argmax(1)
        fooled = ~robust[loss] & clean
        assert (adv_pred[fooled] != y[fooled]).all()
        assert np.abs(np.asarray(result.x_adv) - x).max() <= eps + 1e-6
    assert robust["ce"].sum() <= pgd_robust.sum()
    assert (robust["ce"] & robust["dlr"]).sum() <= pgd_robust.sum()


# ---------------------------------------------------------------------------------------------
# APGD against a float64 numpy transcription of fra31/auto-attack autopgd_base.py (APGDAttack,
# Linf, n_restarts=1): attack_single_run line by line, and perturb's clean check and return value.
# The model is a tanh MLP whose input gradient is written out by hand, so the reference shares no
# code with patjax (not even the autodiff).


def np_mlp_logits(p, z):
    return np.tanh(z @ p["w1"] + p["b1"]) @ p["w2"] + p["b2"]


def np_mlp_input_grad(p, z, dlogits):
    """d/dz of sum_i <dlogits_i, logits(z_i)>: back through W2, tanh' = 1 - tanh^2, W1."""
    hidden = np.tanh(z @ p["w1"] + p["b1"])
    return ((dlogits @ p["w2"].T) * (1.0 - hidden**2)) @ p["w1"].T


def np_ce_and_dlogits(z, y):
    """nn.CrossEntropyLoss(reduction='none') and its gradient softmax(z) - onehot(y)."""
    shifted = z - z.max(1, keepdims=True)
    log_p = shifted - np.log(np.exp(shifted).sum(1, keepdims=True))
    return -log_p[np.arange(len(y)), y], np.exp(log_p) - np.eye(z.shape[1])[y]


def np_dlr_and_dlogits(z, y):
    """APGDAttack.dlr_loss, -(z_y - z_other) / (z_pi1 - z_pi3 + 1e-12) with z_other the largest
    logit if it is not z_y and the second largest if it is, and its gradient in the logits."""
    u = np.arange(len(y))
    order = np.argsort(z, axis=1)
    top_is_y = order[:, -1] == y
    other = np.where(top_is_y, order[:, -2], order[:, -1])
    num = z[u, y] - z[u, other]
    den = z[u, order[:, -1]] - z[u, order[:, -3]] + 1e-12
    g = np.zeros_like(z)
    np.add.at(g, (u, y), -1.0 / den)
    np.add.at(g, (u, other), 1.0 / den)
    np.add.at(g, (u, order[:, -1]), num / den**2)
    np.add.at(g, (u, order[:, -3]), -num / den**2)
    return -num / den, g


def np_l2_norm(v):
    """other_utils.py L2_norm(v, keepdim=True)."""
    return np.sqrt((v**2).reshape(len(v), -1).sum(-1)).reshape((len(v),) + (1,) * (v.ndim - 1))


def np_normalize(v, norm):
    """APGDAttack.normalize: v / (|v|_p + 1e-12) per example."""
    if norm == "linf":
        return v / (np.abs(v).reshape(len(v), -1).max(1).reshape((len(v),) + (1,) * (v.ndim - 1)) + 1e-12)
    return v / (np_l2_norm(v) + 1e-12)


def np_l2_step(x, x_adv, x_adv_old, grad, step_size, eps, a):
    """attack_single_run's gradient step, norm == 'L2' branch, line by line."""
    grad2 = x_adv - x_adv_old
    x_adv_1 = x_adv + step_size * np_normalize(grad, "l2")
    x_adv_1 = np.clip(x + np_normalize(x_adv_1 - x, "l2") * np.minimum(eps, np_l2_norm(x_adv_1 - x)), 0.0, 1.0)
    x_adv_1 = x_adv + (x_adv_1 - x_adv) * a + grad2 * (1 - a)
    return np.clip(x + np_normalize(x_adv_1 - x, "l2") * np.minimum(eps, np_l2_norm(x_adv_1 - x)), 0.0, 1.0)


def np_attack_single_run(x, y, t, eps, n_iter, loss_logits_grad, rho=0.75, literal=False, norm="linf"):
    """APGDAttack.attack_single_run, norm 'Linf' (t the uniform draw in [-1, 1)) or 'L2' (t the
    Gaussian draw). Returns (x_best, acc, loss_best, x_best_adv) as the reference does, and per
    checkpoint (i, rule a, rule b) masks.

    literal=False makes the one change patjax documents: check_oscillation's comparison of
    loss_steps[0] with loss_steps[-1] (a row not yet filled, 0) compares with the start's loss."""
    n = len(y)
    bshape = (n,) + (1,) * (x.ndim - 1)
    n_iter_2, n_iter_min, size_decr = max(int(0.22 * n_iter), 1), max(int(0.06 * n_iter), 1), max(int(0.03 * n_iter), 1)
    x_adv = x + eps * np.ones_like(x) * np_normalize(t, norm)
    x_adv = np.clip(x_adv, 0.0, 1.0)
    x_best, x_best_adv = x_adv.copy(), x_adv.copy()
    loss_steps = np.zeros((n_iter, n))
    loss_indiv, logits, grad = loss_logits_grad(x_adv, y)
    loss_start = loss_indiv.copy()
    grad_best = grad.copy()
    acc = logits.argmax(1) == y
    loss_best = loss_indiv.copy()
    step_size = 2.0 * eps * np.ones(bshape)
    x_adv_old = x_adv.copy()
    k = n_iter_2
    counter3 = 0
    loss_best_last_check = loss_best.copy()
    reduced_last_check = np.ones(n)
    decisions = []
    for i in range(n_iter):
        grad2 = x_adv - x_adv_old
        a = 0.75 if i > 0 else 1.0
        if norm == "l2":
            x_adv_1 = np_l2_step(x, x_adv, x_adv_old, grad, step_size, eps, a)
        else:
            x_adv_1 = x_adv + step_size * np.sign(grad)
            x_adv_1 = np.clip(np.minimum(np.maximum(x_adv_1, x - eps), x + eps), 0.0, 1.0)
            x_adv_1 = np.clip(
                np.minimum(np.maximum(x_adv + (x_adv_1 - x_adv) * a + grad2 * (1 - a), x - eps), x + eps), 0.0, 1.0
            )
        x_adv_old = x_adv.copy()
        x_adv = x_adv_1 + 0.0
        loss_indiv, logits, grad = loss_logits_grad(x_adv, y)
        pred = logits.argmax(1) == y
        acc = np.minimum(acc, pred)
        x_best_adv[~pred] = x_adv[~pred]
        y1 = loss_indiv.copy()
        loss_steps[i] = y1
        ind = y1 > loss_best
        x_best[ind] = x_adv[ind]
        grad_best[ind] = grad[ind]
        loss_best[ind] = y1[ind]
        counter3 += 1
        if counter3 == k:
            increases = np.zeros(n)  # check_oscillation
            for counter5 in range(k):
                before = loss_steps[i - counter5 - 1]  # index -1: the last row, as in torch
                if i - counter5 - 1 < 0 and not literal:
                    before = loss_start
                increases += loss_steps[i - counter5] > before
            fl_oscillation = (increases <= k * rho).astype(float)
            fl_reduce_no_impr = (1.0 - reduced_last_check) * (loss_best_last_check >= loss_best)
            decisions.append((i, fl_oscillation > 0, fl_reduce_no_impr > 0))
            fl_oscillation = np.maximum(fl_oscillation, fl_reduce_no_impr)
            reduced_last_check = fl_oscillation.copy()
            loss_best_last_check = loss_best.copy()
            ind_fl_osc = fl_oscillation > 0
            step_size[ind_fl_osc] /= 2.0
            x_adv[ind_fl_osc] = x_best[ind_fl_osc]
            grad[ind_fl_osc] = grad_best[ind_fl_osc]
            k = max(k - size_decr, n_iter_min)
            counter3 = 0
    return x_best, acc, loss_best, x_best_adv, decisions


def np_perturb(x, y, t, eps, n_iter, loss_logits_grad, predict, norm="linf"):
    """APGDAttack.perturb (best_loss=False, n_restarts=1): attack the clean-correct images only;
    adv = x, replaced by x_best_adv where the run fooled the image. Returns (adv, robust)."""
    acc = predict(x).argmax(1) == y
    adv = x.copy()
    ind_to_fool = np.nonzero(acc)[0]
    _, acc_curr, _, adv_curr, _ = np_attack_single_run(
        x[ind_to_fool], y[ind_to_fool], t[ind_to_fool], eps, n_iter, loss_logits_grad, norm=norm
    )
    ind_curr = ~acc_curr
    acc[ind_to_fool[ind_curr]] = False
    adv[ind_to_fool[ind_curr]] = adv_curr[ind_curr]
    return adv, acc


def mlp_problem(seed=2, n=48, d=8, h=8, k=4, scale=6.0):
    """A random tanh MLP with saturating units (so losses climb steadily for some examples and
    oscillate for others) and a batch with every fifth label wrong."""
    rng = np.random.default_rng(seed)
    p = {
        "w1": rng.normal(size=(d, h)) / np.sqrt(d) * scale,
        "b1": rng.normal(size=h),
        "w2": rng.normal(size=(h, k)) / np.sqrt(h) * scale,
        "b2": 0.1 * rng.normal(size=k),
    }
    x = rng.uniform(0.0, 1.0, size=(n, d))
    y = np_mlp_logits(p, x).argmax(1)
    y[::5] = (y[::5] + 1) % k
    return p, x, y


APGD_EPS = 0.3


@pytest.mark.slow
def test_apgd_equals_a_float64_transcription_of_auto_attack_halving_and_restarts_included():
    p, x, y = mlp_problem()
    key = jax.random.PRNGKey(7)
    clean = np_mlp_logits(p, x).argmax(1) == y
    runs = {}
    # float64 on both sides, so every loss comparison is decided the same way (float32 vs float64
    # flips near-ties of the unbounded 4-class DLR); the context restores float32 afterwards.
    with jax.enable_x64(True):
        pj = {name: jnp.asarray(v) for name, v in p.items()}
        logits_fn = lambda z: jnp.tanh(z @ pj["w1"] + pj["b1"]) @ pj["w2"] + pj["b2"]
        t = np.asarray(jax.random.uniform(key, x.shape, jnp.float64, -1.0, 1.0))  # apgd's draw
        for steps in (100, 10):
            for loss, np_loss in (("ce", np_ce_and_dlogits), ("dlr", np_dlr_and_dlogits)):
                result = apgd.apgd(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=APGD_EPS, steps=steps, loss=loss)
                result = jax.tree.map(np.asarray, result)
                assert result.x_adv.dtype == np.float64

                def loss_logits_grad(z, labels):
                    logits = np_mlp_logits(p, z)
                    value, dlogits = np_loss(logits, labels)
                    return value, logits, np_mlp_input_grad(p, z, dlogits)

                run = functools.partial(np_attack_single_run, x, y, t, APGD_EPS, steps, loss_logits_grad)
                adv, robust = np_perturb(x, y, t, APGD_EPS, steps, loss_logits_grad, lambda z: np_mlp_logits(p, z))
                _, _, loss_best, _, decisions = run()
                what = f"{loss}, {steps} steps"
                np.testing.assert_array_equal(result.robust, robust, err_msg=what)
                np.testing.assert_allclose(result.x_adv, adv, rtol=0, atol=1e-12, err_msg=what)
                np.testing.assert_allclose(result.best_loss, loss_best, rtol=1e-9, atol=1e-12, err_msg=what)
                assert [i for i, _, _ in decisions] == apgd.apgd_checkpoints(steps)
                runs[loss, steps] = robust, decisions, np.abs(run(literal=True)[2] - loss_best).max()
    # The comparison discriminates: robust and fooled clean-correct images, and checkpoints at which
    # some examples halve their step and others do not, by rule (a) and by rule (b) alone.
    for loss in ("ce", "dlr"):
        robust, decisions, _ = runs[loss, 100]
        assert 0 < robust.sum() < clean.sum(), loss
        assert sum(0 < (a | b).sum() < len(y) for _, a, b in decisions) >= 3, loss
    assert any((b & ~a).any() for _, a, b in runs["dlr", 100][1])
    # The documented departure shows (DLR, 10 steps: first interval of 2) and apgd is on its side.
    assert runs["dlr", 10][2] > 1e-3


@pytest.mark.slow
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
        result = apgd.apgd(logits_fn, jax.random.PRNGKey(1), x_clean, jnp.asarray(y), eps=eps, steps=10, loss=loss)
        robust, x_adv = np.asarray(result.robust), np.asarray(result.x_adv)
        assert not robust[bumped].any()
        keep_x = robust | bumped
        assert keep_x.sum() > bumped.sum() and (~keep_x).sum() >= 4
        np.testing.assert_array_equal(x_adv[keep_x], x[keep_x])
        fooled = ~keep_x
        assert (np.abs(x_adv[fooled] - x[fooled]).max(axis=1) > eps / 2).all()
        assert np.abs(x_adv - x).max() <= eps + 1e-6
        np.testing.assert_array_equal(np.asarray(logits_fn(result.x_adv)).argmax(1) != y, ~robust)


# ---------------------------------------------------------------------------------------------
# APGD under the L2 threat model (norm='l2'): the reference's L2 branch of attack_single_run.


def test_apgd_refuses_an_unknown_norm():
    x, y = jnp.full((2, 4), 0.5), jnp.zeros(2, jnp.int32)
    with pytest.raises(ValueError, match="norm"):
        apgd.apgd(lambda z: jnp.zeros((z.shape[0], 3)), jax.random.PRNGKey(0), x, y, eps=0.1, norm="L2")


@pytest.mark.slow
def test_apgd_l2_evaluates_only_points_in_the_l2_ball_and_the_box():
    # Every point the model sees (clean x, start, each iterate), recorded from inside the loop:
    # L2 distance to x at most eps and pixels in [0, 1]. x spans the whole box and eps is large,
    # so both the sphere and the faces of the box are reached.
    rng = np.random.default_rng(4)
    n, shape, steps, eps = 16, (3, 4, 4), 20, 0.5
    x = jnp.asarray(rng.uniform(0, 1, size=(n, *shape)), jnp.float32)
    w1 = jnp.asarray(rng.normal(size=(48, 16)) * 2, jnp.float32)
    w2 = jnp.asarray(rng.normal(size=(16, 5)), jnp.float32)
    y = jnp.asarray(rng.integers(0, 5, size=n))
    seen = []

    def logits_fn(z):
        jax.debug.callback(lambda v: seen.append(np.asarray(v)), z)
        return jnp.tanh(z.reshape(z.shape[0], -1) @ w1) @ w2

    apgd.apgd(logits_fn, jax.random.PRNGKey(2), x, y, eps=eps, steps=steps, norm="l2")
    jax.effects_barrier()
    assert len(seen) == steps + 2
    points = np.stack(seen)
    dist = np.sqrt(((points - np.asarray(x)) ** 2).reshape(steps + 2, n, -1).sum(-1))
    assert dist.max() <= eps * (1 + 1e-5)
    assert points.min() >= 0.0 and points.max() <= 1.0
    assert (dist[1:] > 0.999 * eps).mean() > 0.1  # on the sphere
    assert ((points[1:] == 0.0) | (points[1:] == 1.0)).any(axis=(2, 3, 4)).mean() > 0.3  # on a face


def test_apgd_l2_reaches_the_closed_form_worst_case_of_a_linear_classifier():
    # Binary linear model (class 2 is dead), x in [0.3, 0.7]^d and eps <= 0.3: the box is never
    # active, the L2 distance to the boundary is margin / |w_y - w_o|_2, and CE, increasing in
    # -margin, peaks at x - eps (w_y - w_o) / |w_y - w_o|_2.
    eps = 0.08
    logits_fn, x, y, w, b = linear_problem()
    w64, b64, x64 = w.astype(np.float64), b.astype(np.float64), x.astype(np.float64)
    u = np.arange(len(y))
    dw = (w64[:, y] - w64[:, 1 - y]).T  # (n, d)
    dw_norm = np.linalg.norm(dw, axis=1)
    margin = (x64 @ w64 + b64)[u, y] - (x64 @ w64 + b64)[u, 1 - y]
    robust = margin > eps * dw_norm
    clear = np.abs(margin - eps * dw_norm) > 1e-3
    assert 5 < robust.sum() < len(y) - 5
    z_opt = (x64 - eps * dw / dw_norm[:, None]) @ w64 + b64
    ce_opt = np.log(np.exp(z_opt - z_opt.max(1, keepdims=True)).sum(1)) + z_opt.max(1) - z_opt[u, y]
    for loss in ("ce", "dlr"):
        result = apgd.apgd(
            logits_fn, jax.random.PRNGKey(5), jnp.asarray(x), jnp.asarray(y), eps=eps, steps=50, loss=loss, norm="l2"
        )
        np.testing.assert_array_equal(np.asarray(result.robust)[clear], robust[clear], err_msg=loss)
        x_adv = np.asarray(result.x_adv)
        assert np.sqrt(((x_adv - x) ** 2).sum(1)).max() <= eps * (1 + 1e-5)
        if loss == "ce":
            np.testing.assert_allclose(np.asarray(result.best_loss), ce_opt, rtol=1e-4, atol=1e-6)


@pytest.mark.slow
def test_apgd_l2_first_step_equals_the_reference_formulas():
    # One step from the Gaussian start, on a model misclassifying every point but the clean x
    # (a +50 logit for y at x, for another class elsewhere, constant, so the gradient is the
    # MLP's): x_adv is then the first iterate, compared with attack_single_run's L2 formulas in
    # float64 with the MLP's gradient written out by hand.
    p, x, y = mlp_problem(n=32)
    eps = 0.8
    k = p["w2"].shape[1]
    key = jax.random.PRNGKey(11)
    with jax.enable_x64(True):
        pj = {name: jnp.asarray(v) for name, v in p.items()}
        x_clean = jnp.asarray(x)
        bump_y, bump_other = np.eye(k)[y] * 50.0, np.eye(k)[(y + 1) % k] * 50.0

        def logits_fn(z):
            at_clean = jnp.max(jnp.abs(z - x_clean), axis=1, keepdims=True) < 1e-9
            return jnp.tanh(z @ pj["w1"] + pj["b1"]) @ pj["w2"] + pj["b2"] + jnp.where(at_clean, bump_y, bump_other)

        result = apgd.apgd(logits_fn, key, x_clean, jnp.asarray(y), eps=eps, steps=1, norm="l2")
        t = np.asarray(jax.random.normal(key, x.shape, jnp.float64))  # apgd's draw
    assert not np.asarray(result.robust).any()
    x0 = np.clip(x + eps * np.ones_like(x) * np_normalize(t, "l2"), 0.0, 1.0)
    _, dlogits = np_ce_and_dlogits(np_mlp_logits(p, x0) + bump_other, y)
    grad = np_mlp_input_grad(p, x0, dlogits)
    x1 = np_l2_step(x, x0, x0, grad, 2.0 * eps, eps, 1.0)
    np.testing.assert_allclose(np.asarray(result.x_adv), x1, rtol=0, atol=1e-12)
    # The check discriminates: the step moved every point, and the box clipped some pixels.
    assert (np_l2_norm(x1 - x0).ravel() > 0.1 * eps).all()
    assert ((x1 < 1e-9) | (x1 > 1 - 1e-9)).any()


@pytest.mark.slow
def test_apgd_l2_equals_a_float64_transcription_of_auto_attack_halving_and_restarts_included():
    # CE: every output to float64 rounding. DLR: the robust flags, and the best loss of the robust
    # images. A fooled image can reach points where y ranks third, where DLR is -(z_y - z_pi1) /
    # (z_pi1 - z_y) = 1 and its gradient is 0 up to rounding (|g| ~ 1e-12); the L2 step
    # g / (|g| + 1e-12) turns that rounding into a step of size ~eps, so no two implementations
    # follow the same path from there (the reference's check_zero_gradients warns of it).
    # While an image is classified correctly, y ranks first and the gradient is well defined.
    p, x, y = mlp_problem()
    eps, steps = 0.8, 40
    key = jax.random.PRNGKey(7)
    clean = np_mlp_logits(p, x).argmax(1) == y
    with jax.enable_x64(True):
        pj = {name: jnp.asarray(v) for name, v in p.items()}
        logits_fn = lambda z: jnp.tanh(z @ pj["w1"] + pj["b1"]) @ pj["w2"] + pj["b2"]
        t = np.asarray(jax.random.normal(key, x.shape, jnp.float64))  # apgd's draw
        for loss, np_loss in (("ce", np_ce_and_dlogits), ("dlr", np_dlr_and_dlogits)):
            result = apgd.apgd(
                logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=eps, steps=steps, loss=loss, norm="l2"
            )
            result = jax.tree.map(np.asarray, result)

            def loss_logits_grad(z, labels):
                logits = np_mlp_logits(p, z)
                value, dlogits = np_loss(logits, labels)
                return value, logits, np_mlp_input_grad(p, z, dlogits)

            predict = lambda z: np_mlp_logits(p, z)
            adv, robust = np_perturb(x, y, t, eps, steps, loss_logits_grad, predict, norm="l2")
            _, _, loss_best, _, decisions = np_attack_single_run(x, y, t, eps, steps, loss_logits_grad, norm="l2")
            np.testing.assert_array_equal(result.robust, robust, err_msg=loss)
            compared = np.ones(len(y), bool) if loss == "ce" else robust
            np.testing.assert_allclose(result.x_adv[compared], adv[compared], rtol=0, atol=1e-12, err_msg=loss)
            np.testing.assert_allclose(
                result.best_loss[compared], loss_best[compared], rtol=1e-9, atol=1e-12, err_msg=loss
            )
            # Discriminating: robust and fooled images, and checkpoints that halve some steps only.
            assert 0 < robust.sum() < clean.sum(), loss
            assert sum(0 < (a | b).sum() < len(y) for _, a, b in decisions) >= 2, loss
