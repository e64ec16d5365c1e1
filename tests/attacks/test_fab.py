"""FAB-T against independent computations: the L-inf projection against scipy's linprog, the L2
projection against its KKT conditions solved by bisection on the multiplier and against scipy's
SLSQP, the closed-form minimal perturbation of affine models, and a float64 numpy transcription of
fra31/auto-attack's FABAttack (fab_base.py attack_single_run + perturb with targeted=True, norm
'Linf' or 'L2'; the L2 projection there is the KKT solution, not the reference's) on an MLP with a
hand-written gradient."""

import functools
import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from scipy.optimize import linprog, minimize

from patjax.attacks import fab

SHAPE = (4, 4, 3)
D = math.prod(SHAPE)


def linprog_projection(x, w, b):
    """min t s.t. |z_i - x_i| <= t, w.z = b, 0 <= z <= 1 (variables z, t); None when infeasible."""
    n = len(x)
    eye = np.eye(n)
    a_ub = np.block([[eye, -np.ones((n, 1))], [-eye, -np.ones((n, 1))]])
    b_ub = np.concatenate([x, -x])
    out = linprog(
        np.r_[np.zeros(n), 1.0],
        A_ub=a_ub,
        b_ub=b_ub,
        A_eq=np.r_[w, 0.0][None],
        b_eq=[b],
        bounds=[(0.0, 1.0)] * n + [(0.0, None)],
        method="highs",
    )
    return out.fun if out.status == 0 else None


def kkt_projection_l2(x, w, b):
    """Per row, the d of least |d|_2 with w.(x + d) = b and x + d in [0, 1], and whether the plane
    meets the box. KKT: d = d(lam) = clip(-lam w, -x, 1 - x) (0 where w_i = 0), and w.d(lam) + c,
    c = w.x - b, is non-increasing in lam: a bisection on lam finds which coordinates sit on a face,
    then the linear equation for the others gives lam. Where the plane misses the box, the full
    move towards it, d(+-inf)."""
    c = (w * x).sum(1) - b
    move = lambda lam: np.where(w != 0, np.clip(-lam[:, None] * w, -x, 1 - x), 0.0)
    gap = lambda lam: (w * move(lam)).sum(1) + c
    # every coordinate is on its face once |lam| >= 1 / |w_i|
    lo, hi = np.zeros(len(x)), np.sign(c) * np.where(w != 0, 1 / np.where(w != 0, np.abs(w), 1), 0).max(1)
    reachable = np.sign(c) * gap(hi) <= 0
    for _ in range(200):
        mid = (lo + hi) / 2
        above = np.sign(c) * gap(mid) > 0
        lo, hi = np.where(above, mid, lo), np.where(above, hi, mid)
    lam = (lo + hi) / 2
    d = move(lam)
    free = (w != 0) & (d > -x) & (d < 1 - x)
    weight = np.sum(np.where(free, w * w, 0), 1)
    exact = (c + np.sum(np.where(free, 0, w * d), 1)) / np.where(weight > 0, weight, 1)
    lam = np.where(reachable & (weight > 0), exact, lam)
    return move(lam), reachable


def slsqp_projection_l2(x, w, b):
    """min |d|_2^2 s.t. w.(x + d) = b, 0 <= x + d <= 1, by scipy's SLSQP from d = 0: |d|_2."""
    out = minimize(
        lambda d: d @ d,
        np.zeros_like(x),
        jac=lambda d: 2 * d,
        method="SLSQP",
        bounds=list(zip(-x, 1 - x)),
        constraints=[{"type": "eq", "fun": lambda d: w @ (x + d) - b, "jac": lambda d: w}],
        options={"ftol": 1e-15, "maxiter": 500},
    )
    assert out.success, out.message
    return np.sqrt(out.fun)


def projection_instances(seed, rows, n):
    """Random (x, w, b): x partly on the box faces, some w_i = 0, the plane at a distance that
    ranges from inside every coordinate's slack to beyond the box (infeasible)."""
    rng = np.random.default_rng(seed)
    x = rng.uniform(0, 1, (rows, n))
    x[:, : n // 4] = rng.integers(0, 2, (rows, n // 4))  # pixels on the faces
    w = rng.normal(size=(rows, n)) * (rng.uniform(size=(rows, n)) > 0.2)
    # the full move to the faces reaches about 0.5 |w|_1; past it the plane misses the box
    reach = rng.uniform(0.0, 0.7, rows) * np.abs(w).sum(1) * rng.choice([-1, 1], rows)
    return x, w, np.sum(w * x, 1) + reach


@pytest.mark.slow
def test_projection_linf_is_the_exact_minimum_of_the_linear_program():
    binding = infeasible = 0
    with jax.enable_x64(True):
        for seed, n in [(0, 2), (1, 3), (2, 8), (3, 20), (4, 48), (5, 300)]:
            x, w, b = projection_instances(seed, 40, n)
            d = np.asarray(jax.jit(fab.projection_linf)(x, w, b))
            for xi, wi, bi, di in zip(x, w, b, d):
                best = linprog_projection(xi, wi, bi)
                assert np.all(xi + di >= -1e-12) and np.all(xi + di <= 1 + 1e-12)
                assert np.all(di[wi == 0] == 0)
                if best is None:  # the plane misses the box: the full move towards it
                    infeasible += 1
                    side = np.sign(wi @ xi - bi)
                    face = (side * wi < 0).astype(float)
                    np.testing.assert_allclose(di, (face - xi) * (wi != 0), atol=1e-12)
                    continue
                np.testing.assert_allclose(wi @ (xi + di), bi, atol=1e-9 * (1 + abs(bi)))
                np.testing.assert_allclose(np.abs(di).max(), best, rtol=1e-7, atol=1e-10)
                # the box binds where the unconstrained step |c| / |w|_1 leaves [0, 1]
                lam = abs(wi @ xi - bi) / max(np.abs(wi).sum(), 1e-300)
                free = xi - lam * np.sign(wi) * np.sign(wi @ xi - bi)
                binding += bool(np.any((free < 0) | (free > 1)))
    assert binding >= 60 and infeasible >= 10, (binding, infeasible)


@pytest.mark.slow
def test_projection_l2_is_the_kkt_minimum():
    free = binding = infeasible = 0
    with jax.enable_x64(True):
        for seed, n in [(0, 2), (1, 3), (2, 8), (3, 20), (4, 48), (5, 300)]:
            x, w, b = projection_instances(seed, 60, n)
            # a third of the rows inside the box and near the plane: no face is reached
            x[::3] = np.random.default_rng(seed).uniform(0.2, 0.8, x[::3].shape)
            b[::3] = np.sum(w[::3] * x[::3], 1) + (b[::3] - np.sum(w[::3] * x[::3], 1)) * 0.02
            d = np.asarray(jax.jit(fab.projection_l2)(x, w, b))
            kkt, reachable = kkt_projection_l2(x, w, b)
            assert np.all(x + d >= -1e-12) and np.all(x + d <= 1 + 1e-12)
            assert np.all(d[w == 0] == 0)
            # where the plane misses the box: every coordinate at the face towards it (what the reference's
            # projection_l2 returns there, as its projection_linf does)
            side = np.sign(np.sum(w * x, 1) - b)[:, None]
            face = (side * w < 0).astype(float)
            np.testing.assert_allclose(d[~reachable], ((face - x) * (w != 0))[~reachable], atol=1e-12)
            infeasible += np.sum(~reachable)
            np.testing.assert_allclose(d, kkt, atol=1e-10)
            np.testing.assert_allclose(
                np.sum(w * (x + d), 1)[reachable], b[reachable], atol=1e-9 * (1 + np.abs(b).max())
            )
            some = reachable & np.any(w != 0, 1)  # w = 0: nothing moves, nothing to solve
            if n <= 8:  # the KKT point is the minimum: a general solver finds no shorter d
                for xi, wi, bi, di in zip(x[some], w[some], b[some], d[some]):
                    np.testing.assert_allclose(
                        np.linalg.norm(di), slsqp_projection_l2(xi, wi, bi), rtol=1e-6, atol=1e-9
                    )
            x, w, b = x[some], w[some], b[some]
            unconstrained = x - ((np.sum(w * x, 1) - b) / np.sum(w * w, 1))[:, None] * w
            inside = np.all((unconstrained >= 0) & (unconstrained <= 1), 1)
            free += np.sum(inside)
            binding += np.sum(~inside)
    assert free >= 40 and binding >= 60 and infeasible >= 10, (free, binding, infeasible)


def affine_problem(seed, batch=16, classes=3, lo=0.3, hi=0.7, scale=1.0):
    """logits = flatten(x) W + c with every class past the first two pushed 1e3 below (so only the
    y-vs-t boundary matters); y = the clean prediction except the last image's label."""
    rng = np.random.default_rng(seed)
    W = rng.normal(size=(D, classes)).astype(np.float32) * scale
    c = np.zeros(classes, np.float32)
    c[2:] = -1e3
    x = rng.uniform(lo, hi, (batch, *SHAPE)).astype(np.float32)
    flat = x.reshape(batch, -1)
    c[:2] = -np.mean(flat @ W[:, :2], 0)  # roughly balanced classes 0 and 1
    y = (flat @ W + c).argmax(1)
    y[-1] = 1 - y[-1]  # misclassified at x
    logits_fn = lambda z: z.reshape(z.shape[0], -1) @ jnp.asarray(W) + jnp.asarray(c)
    return logits_fn, x, y, W, c


def size(z, norm):
    """|z|_inf or |z|_2 per row, in float64."""
    z = np.asarray(z, np.float64).reshape(len(z), -1)
    return np.abs(z).max(1) if norm == "linf" else np.linalg.norm(z, axis=1)


def dual_size(w, norm):
    """The dual norm (L1 for L-inf, L2 for L2): the smallest |d| with w.d = m is |m| / dual_size(w)."""
    return np.abs(w).sum(1) if norm == "linf" else np.linalg.norm(w, axis=1)


def check_result(result, logits_fn, x, y, eps, norm="linf"):
    x_adv, reported, fooled = (np.asarray(v) for v in result)
    assert np.all((x_adv >= 0) & (x_adv <= 1))
    dist = size(x_adv - x, norm)
    pred = np.asarray(logits_fn(jnp.asarray(x_adv))).argmax(1)
    assert np.all(dist[fooled] <= eps + 1e-7)
    assert np.all(pred[fooled] != y[fooled])
    assert not np.any(fooled & ((pred == y) | (dist > eps)))
    return x_adv, reported, fooled, dist


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_targeted_reaches_the_closed_form_minimum_of_an_affine_model(norm):
    logits_fn, x, y, W, c = affine_problem(0)
    target = 1 - y
    flat = x.reshape(len(x), -1).astype(np.float64)
    dw = W[:, target].T - W[:, y].T
    closed = np.abs(np.sum(flat * dw, 1) + c[target] - c[y]) / dual_size(dw, norm)
    assert closed[:-1].max() < 0.25  # the box [0.3, 0.7] +- 0.25 does not bind (|d|_inf <= |d|_2)
    eps = float(np.median(closed[:-1]))
    run = jax.jit(functools.partial(fab.fab_targeted, logits_fn, eps=eps, norm=norm))
    result = run(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(y), jnp.asarray(target))
    x_adv, norm_, fooled, dist = check_result(result, logits_fn, x, y, eps, norm)
    ok = slice(0, -1)
    assert np.all(norm_[ok] >= closed[ok] * (1 - 1e-5))
    assert np.all(norm_[ok] <= closed[ok] * 1.01), norm_[ok] / closed[ok]
    np.testing.assert_allclose(dist[ok], norm_[ok], rtol=1e-6)
    assert np.all(fooled[ok][closed[ok] * 1.01 < eps]) and not np.any(fooled[ok][closed[ok] > eps])
    assert 0 < fooled[ok].sum() < len(x) - 1
    # misclassified at x: returned as x, norm 0, fooled
    assert fooled[-1] and norm_[-1] == 0 and np.all(x_adv[-1] == x[-1])


@pytest.mark.parametrize("norm", ["linf", "l2"])
def test_fab_targeted_on_an_affine_model_where_the_box_binds(norm):
    # x near the faces and a steep-enough margin: the minimum with the box (linprog for L-inf, the
    # KKT solution for L2) is the target.
    logits_fn, x, y, W, c = affine_problem(1, lo=0.0, hi=1.0, scale=0.3)
    x[:, :2] = np.round(x[:, :2])
    x = x[:-1]
    y = (x.reshape(len(x), -1) @ W + c).argmax(1)
    target = 1 - y
    flat = x.reshape(len(x), -1).astype(np.float64)
    dw = (W[:, target].T - W[:, y].T).astype(np.float64)
    # boundary: dw.z + (c_t - c_y) = 0
    if norm == "linf":
        exact = np.array([linprog_projection(f, w, -(c[t] - c[yy])) for f, w, t, yy in zip(flat, dw, target, y)])
    else:
        d, reachable = kkt_projection_l2(flat, dw, -(c[target] - c[y]).astype(np.float64))
        assert reachable.all()
        exact = np.linalg.norm(d, axis=1)
    free = np.abs(np.sum(flat * dw, 1) + c[target] - c[y]) / dual_size(dw, norm)
    assert np.sum(exact > free * 1.01) >= 4  # the box binds for several images
    run = jax.jit(functools.partial(fab.fab_targeted, logits_fn, eps=0.0, norm=norm))
    result = run(jax.random.PRNGKey(0), jnp.asarray(x), jnp.asarray(y), jnp.asarray(target))
    _, norm_, fooled, _ = check_result(result, logits_fn, x, y, 0.0, norm)
    assert not fooled.any()
    assert np.all(norm_ >= exact * (1 - 1e-5)) and np.all(norm_ <= exact * 1.01), norm_ / exact


# ---------------------------------------------------------------------------------------
# FAB-T against a float64 numpy transcription of fra31/auto-attack (fab_base.py, fab_pt.py,
# fab_projections.py), which re-indexes the points still to attack as the reference does. For L2
# the projection is `kkt_projection_l2`, not a transcription of the reference's.


def np_projection_linf(points, w, b):
    t, w, b = points, w.copy(), b.copy()
    sign = 2 * ((w * t).sum(1) - b >= 0) - 1
    w *= sign[:, None]
    b *= sign
    a = (w < 0).astype(float)
    d = (a - t) * (w != 0)
    p = a - t * (2 * a - 1)
    indp = np.argsort(p, axis=1, kind="stable")
    b = b - (w * t).sum(1)
    b0 = (w * d).sum(1)
    indp2 = indp[:, ::-1]
    ws = np.take_along_axis(w, indp2, 1)
    bs2 = -ws * np.take_along_axis(d, indp2, 1)
    s = np.cumsum(np.abs(ws), 1)
    sb = np.cumsum(bs2, 1) + b0[:, None]
    b2 = sb[:, -1] - s[:, -1] * np.take_along_axis(p, indp[:, 0:1], 1)[:, 0]
    c_l = b - b2 > 0
    c2 = (b - b0 > 0) & ~c_l
    lb = np.zeros(c2.sum())
    ub = np.full(c2.sum(), w.shape[1] - 1.0)
    indp_, sb_, s_, p_, b_ = indp[c2], sb[c2], s[c2], p[c2], b[c2]
    for _ in range(math.ceil(math.log2(w.shape[1]))):
        counter4 = np.floor((lb + ub) / 2)
        counter2 = counter4.astype(int)[:, None]
        indcurr = np.take_along_axis(indp_, indp_.shape[1] - 1 - counter2, 1)
        b2 = (
            np.take_along_axis(sb_, counter2, 1)
            - np.take_along_axis(s_, counter2, 1) * np.take_along_axis(p_, indcurr, 1)
        )[:, 0]
        c = b_ - b2 > 0
        lb = np.where(c, counter4, lb)
        ub = np.where(c, ub, counter4)
    lb = lb.astype(int)
    if c_l.any():
        lmbd = np.maximum((b[c_l] - sb[c_l, -1]) / (-s[c_l, -1]), 0)[:, None]
        d[c_l] = (2 * a[c_l] - 1) * lmbd
    lmbd = np.maximum((b[c2] - sb[c2, lb]) / (-s[c2, lb]), 0)[:, None]
    d[c2] = np.minimum(lmbd, d[c2]) * a[c2] + np.maximum(-lmbd, d[c2]) * (1 - a[c2])
    return d * (w != 0)


def np_mlp(p, z):
    h = np.tanh(z @ p["w1"] + p["b1"])
    return h @ p["w2"] + p["b2"], h


def np_diff_grad(p, z, la, la_target):
    """get_diff_logits_grads_batch_targeted: f_t - f_y and its input gradient, by hand."""
    logits, h = np_mlp(p, z)
    u = np.arange(len(z))
    dw2 = (p["w2"][:, la_target] - p["w2"][:, la]).T
    return logits[u, la_target] - logits[u, la], (dw2 * (1 - h**2)) @ p["w1"].T


def np_attack_single_run(p, x, y, target_class, rand, eps, n_iter, norm="linf", alpha_max=0.1, eta=1.05, beta=0.9):
    project = np_projection_linf if norm == "linf" else lambda t, w, b: kkt_projection_l2(t, w, b)[0]
    predict = lambda z: np_mlp(p, z)[0].argmax(1)
    pred = np.nonzero(predict(x) == y)[0]
    if len(pred) == 0:
        return x, np.zeros(len(x))
    la_target2 = np.argsort(np_mlp(p, x)[0], -1, kind="stable")[:, -target_class][pred]
    im2, la2 = x[pred].copy(), y[pred].copy()
    bs = len(pred)
    adv, adv_c = im2.copy(), x.copy()
    res2 = 1e10 * np.ones(bs)
    x1, x0 = im2.copy(), im2.copy()
    if rand is not None:
        t = rand[pred]
        x1 = im2 + np.minimum(res2, eps)[:, None] * t / size(t, norm)[:, None] * 0.5
        x1 = x1.clip(0.0, 1.0)
    for _ in range(n_iter):
        df, g = np_diff_grad(p, x1, la2, la_target2)
        b = -df + (g * x1).sum(-1)
        d3 = project(np.concatenate((x1, x0)), np.concatenate((g, g)), np.concatenate((b, b)))
        d1, d2 = d3[:bs], d3[-bs:]
        a0 = np.maximum(size(d3, norm), 1e-8)[:, None]
        a1, a2 = a0[:bs], a0[-bs:]
        alpha = np.minimum(np.maximum(a1 / (a1 + a2), 0), alpha_max)
        x1 = ((x1 + eta * d1) * (1 - alpha) + (im2 + d2 * eta) * alpha).clip(0.0, 1.0)
        ind_adv = np.nonzero(predict(x1) != la2)[0]
        if len(ind_adv):
            t = size(x1[ind_adv] - im2[ind_adv], norm)
            better = (t < res2[ind_adv])[:, None]
            adv[ind_adv] = x1[ind_adv] * better + adv[ind_adv] * ~better
            res2[ind_adv] = np.where(better[:, 0], t, res2[ind_adv])
            x1[ind_adv] = im2[ind_adv] + (x1[ind_adv] - im2[ind_adv]) * beta
    ind_succ = np.nonzero(res2 < 1e10)[0]
    adv_c[pred[ind_succ]] = adv[ind_succ]
    res_c = np.zeros(len(x))  # res_c of earlier versions of fab_base.py, inf where none found
    res_c[pred] = np.where(res2 < 1e10, res2, np.inf)
    return adv_c, res_c


def np_perturb_targeted(p, x, y, eps, n_target_classes, n_restarts, n_iter, draws, norm="linf"):
    """perturb(targeted=True); draws[run] is the full-batch draw (U(-1, 1) for L-inf, N(0, 1) for
    L2) of run (target_class - 2) * n_restarts + counter. Also returns the norm fab_t reports (not in the
    reference): the successful run's res_c, else the smallest res_c over the runs."""
    adv = x.copy()
    acc = np_mlp(p, x)[0].argmax(1) == y
    dist = np.where(acc, np.inf, 0.0)
    for target_class in range(2, n_target_classes + 2):
        for counter in range(n_restarts):
            ind_to_fool = np.nonzero(acc)[0]
            if len(ind_to_fool) == 0:
                continue
            rand = draws[(target_class - 2) * n_restarts + counter][ind_to_fool] if counter > 0 else None
            adv_curr, res_c = np_attack_single_run(
                p, x[ind_to_fool], y[ind_to_fool], target_class, rand, eps, n_iter, norm
            )
            acc_curr = np_mlp(p, adv_curr)[0].argmax(1) == y[ind_to_fool]
            res = size(x[ind_to_fool] - adv_curr, norm)
            acc_curr = np.maximum(acc_curr, res > eps)
            ind_curr = np.nonzero(~acc_curr)[0]
            dist[ind_to_fool] = np.minimum(dist[ind_to_fool], res_c)
            dist[ind_to_fool[ind_curr]] = res_c[ind_curr]
            acc[ind_to_fool[ind_curr]] = False
            adv[ind_to_fool[ind_curr]] = adv_curr[ind_curr]
    return adv, acc, dist


def mlp_problem(seed=3, n=24, h=16, k=10):
    rng = np.random.default_rng(seed)
    p = {
        "w1": rng.normal(size=(D, h)) * 0.6,
        "b1": rng.normal(size=h) * 0.5,
        "w2": rng.normal(size=(h, k)),
        "b2": rng.normal(size=k) * 0.3,
    }
    x = rng.uniform(0, 1, (n, *SHAPE))
    x[:, 0, 0] = 1.0
    y = np_mlp(p, x.reshape(n, -1))[0].argmax(1)
    y[:2] = (y[:2] + 1) % k  # misclassified at x
    return p, x, y


@pytest.mark.slow
@pytest.mark.parametrize("norm, eps", [("linf", 0.03), ("l2", 0.15)])
def test_fab_t_equals_a_float64_transcription_of_auto_attack(norm, eps):
    p, x, y = mlp_problem()
    n = len(x)
    n_iter = 30
    with jax.enable_x64(True):
        pj = jax.tree.map(jnp.asarray, p)
        logits_fn = lambda z: jnp.tanh(z.reshape(z.shape[0], -1) @ pj["w1"] + pj["b1"]) @ pj["w2"] + pj["b2"]
        key = jax.random.PRNGKey(7)
        for n_targets, n_restarts in [(9, 1), (2, 3)]:
            run = jax.jit(
                functools.partial(
                    fab.fab_t,
                    logits_fn,
                    eps=eps,
                    n_target_classes=n_targets,
                    n_restarts=n_restarts,
                    n_iter=n_iter,
                    norm=norm,
                )
            )
            result = run(key, jnp.asarray(x), jnp.asarray(y))
            assert result.x_adv.dtype == np.float64
            # fab_targeted draws its start from keys[run] over the whole batch
            draw = (
                (lambda k: jax.random.uniform(k, x.shape, jnp.float64, -1.0, 1.0))
                if norm == "linf"
                else (lambda k: jax.random.normal(k, x.shape, jnp.float64))
            )
            draws = [np.asarray(draw(k)).reshape(n, -1) for k in jax.random.split(key, n_targets * n_restarts)]
            adv, acc, norm_ref = np_perturb_targeted(
                p, x.reshape(n, -1), y, eps, n_targets, n_restarts, n_iter, draws, norm
            )
            what = f"{norm}, {n_targets} targets, {n_restarts} restarts"
            np.testing.assert_allclose(np.asarray(result.x_adv).reshape(n, -1), adv, rtol=0, atol=1e-10, err_msg=what)
            np.testing.assert_array_equal(np.asarray(result.fooled), ~acc, err_msg=what)
            np.testing.assert_allclose(np.asarray(result.norm), norm_ref, rtol=1e-12, err_msg=what)
            _, norm_, fooled, dist = check_result(result, logits_fn, x, y, eps, norm)
            np.testing.assert_allclose(norm_[fooled], dist[fooled], rtol=1e-12)
            assert np.all(norm_[:2] == 0) and fooled[:2].all()
            assert np.all(norm_[~fooled] > eps)
            assert 4 <= fooled[2:].sum() <= n - 6, (what, fooled)
            if n_restarts > 1:
                # one run from a random start: every image's smallest adversarial, whatever its norm
                target = fab.fab_target_classes(logits_fn(jnp.asarray(x)), 2)[1]
                single = jax.jit(
                    functools.partial(fab.fab_targeted, logits_fn, eps=eps, n_iter=n_iter, random_start=True, norm=norm)
                )
                out = single(jax.random.split(key, n_targets * n_restarts)[0], jnp.asarray(x), jnp.asarray(y), target)
                ref_adv, ref_norm = np_attack_single_run(p, x.reshape(n, -1), y, 3, draws[0], eps, n_iter, norm)
                np.testing.assert_allclose(np.asarray(out.x_adv).reshape(n, -1), ref_adv, rtol=0, atol=1e-10)
                np.testing.assert_allclose(np.asarray(out.norm), ref_norm, rtol=1e-12)
                assert np.isfinite(ref_norm).sum() >= n // 2
            if n_targets == 9:
                # some images are first fooled only with a later target than the first
                first = fooled
                one = jax.jit(
                    functools.partial(fab.fab_t, logits_fn, eps=eps, n_target_classes=1, n_iter=n_iter, norm=norm)
                )
                assert np.sum(first & ~np.asarray(one(key, jnp.asarray(x), jnp.asarray(y)).fooled)) >= 1


@pytest.mark.slow
def test_only_random_restarts_leave_a_critical_point_of_the_margin():
    # f_1 - f_0 = (sum(x - 1/2))^2 - 1/4, class 2 out of reach: at x = 1/2 the gradient is 0, so
    # FAB from x never moves; from a random start it reaches the boundary |sum(delta)| = 1/2,
    # whose smallest L-inf point is delta_i = 1 / (2 D) for all i.
    def logits_fn(z):
        s = jnp.sum(z.reshape(z.shape[0], -1) - 0.5, axis=1)
        return jnp.stack([jnp.zeros_like(s), s**2 - 0.25, jnp.full_like(s, -1e3)], axis=1)

    x = jnp.full((2, *SHAPE), 0.5)
    y = jnp.zeros(2, jnp.int32)
    eps = 2.0 / D
    run = jax.jit(functools.partial(fab.fab_t, logits_fn, eps=eps, n_target_classes=1, n_restarts=2))
    result = run(jax.random.PRNGKey(0), x, y)
    _, norm, fooled, _ = check_result(result, logits_fn, np.asarray(x), np.asarray(y), eps)
    assert fooled.all()
    # the random start's component off the optimal direction fades only through the bias to x
    # (alpha <= alpha_max), so 100 iterations end slightly above the minimum
    assert np.all(norm * 2 * D >= 1 - 1e-5) and np.all(norm * 2 * D <= 1.03), norm * 2 * D
    once = fab.fab_t(logits_fn, jax.random.PRNGKey(0), x, y, eps=eps, n_target_classes=1, n_iter=20)
    assert not np.asarray(once.fooled).any() and np.all(np.isinf(once.norm)) and np.all(once.x_adv == x)


def test_targets_are_the_ranked_logits_and_need_enough_classes():
    logits = jnp.array([[0.0, 5.0, 3.0, 4.0, 1.0], [2.0, 1.0, 0.0, -1.0, 3.0]])
    np.testing.assert_array_equal(fab.fab_target_classes(logits, 3), [[3, 0], [2, 1], [4, 2]])
    with pytest.raises(ValueError, match="at least 6 classes"):
        fab.fab_target_classes(logits, 5)


def test_an_unknown_norm_is_refused():
    logits_fn, x, y, _, _ = affine_problem(0, batch=2)
    key = jax.random.PRNGKey(0)
    with pytest.raises(ValueError, match="'linf', 'l2', got 'l1'"):
        fab.fab_t(logits_fn, key, jnp.asarray(x), jnp.asarray(y), eps=0.1, n_target_classes=2, norm="l1")
    with pytest.raises(ValueError, match="got 'Linf'"):
        fab.fab_targeted(logits_fn, key, jnp.asarray(x), jnp.asarray(y), jnp.asarray(1 - y), eps=0.1, norm="Linf")
