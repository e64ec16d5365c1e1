"""Targeted FAB attack (FAB-T), L-inf or L2, as run by standard AutoAttack.

Croce & Hein, "Minimally distorted adversarial examples with a fast adaptive boundary attack"
(ICML 2020), following fra31/auto-attack autoattack/fab_base.py (FABAttack.attack_single_run,
FABAttack.perturb with targeted=True), fab_pt.py (get_diff_logits_grads_batch_targeted) and
fab_projections.py (projection_linf, projection_l2), with AutoAttack's 'standard' settings:
n_restarts=1, n_iter=100, n_target_classes=9, alpha_max=0.1, eta=1.05, beta=0.9.

One run against target t (`fab_targeted`), from x^(0) = x (or a random start), for n_iter steps,
written for L-inf (|.| = |.|_inf):
  1. linearize f_t - f_y at x^(i):  pi_i = {z : w.z = b},  w = grad(f_t - f_y)(x^(i)),
     b = w.x^(i) - (f_t - f_y)(x^(i));
  2. d1 = P(x^(i)) - x^(i), d2 = P(x) - x, P the minimal-L-inf projection onto pi_i ∩ [0,1]^d
     (`projection_linf`);
  3. alpha = min(max(a1 / (a1 + a2), 0), alpha_max), a1 = max(|d1|_inf, 1e-8), a2 = max(|d2|_inf, 1e-8);
  4. x^(i+1) = clip((x^(i) + eta d1)(1 - alpha) + (x + eta d2) alpha, 0, 1)   (biased step, extrapolated);
  5. if argmax f(x^(i+1)) != y: keep x^(i+1) if |x^(i+1) - x|_inf is the smallest so far, then
     x^(i+1) <- x + beta (x^(i+1) - x)   (backward step).
norm="l2" (the reference's norm='L2' branches of attack_single_run and perturb) replaces every
|.|_inf by |.|_2: P is the minimal-L2 projection (`projection_l2`), a1, a2 in step 3 are
|d1|_2, |d2|_2, step 5 keeps the iterate of smallest |x^(i+1) - x|_2, the success test is
|x_adv - x|_2 <= eps, and the random start is x + 0.5 eps t / |t|_2 with t ~ N(0, I)
(torch.randn). The linearization, the step and the targets do not change.
The attack succeeds on misclassification (any class other than y, as the reference's `is_adv`),
not only on reaching t. A run returns its smallest adversarial whatever its norm; it fooled the
model within eps when argmax f(x_adv) != y and |x_adv - x|_inf <= eps (perturb's acc_curr).

`fab_t` is perturb(targeted=True): for k = 2, ..., n_target_classes + 1 the target is
argsort(f(x))[-k], the k-th highest logit at the clean point (for a correctly classified point,
the (k-1)-th highest logit other than y), and each run attacks only the points still robust,
so every image keeps its first success within eps (x itself if none). With n_restarts = 1 the
run starts at x: the random start of the reference (x + 0.5 eps t / |t|_inf, t ~ U(-1, 1)^d,
clipped; for L2 as above) is used only for restarts 2, 3, ... (`use_rand_start=(counter > 0)`),
so eps matters only through that radius and the success test. AutoAttack's FAB has no final
search between x and the adversarial found (the original fra31/fab-attack code has an optional
one, `linear_approximation_search`, off by default); neither has this module.

Differences from the reference:
  - compiled loops: every run iterates over the whole batch and its results are masked, rather
    than re-indexing the points left to attack: images misclassified at x are run but returned
    as x (norm 0, fooled); in `fab_t`, images already fooled are run with later targets and
    their results discarded; the loop over targets stops once no image is left robust. The aa
    evaluator instead runs `fab_t_run` run by run on the images still robust, as the reference;
  - RNG: jax.random keys (one per (target, restart) run, split from `key`, used only by random
    starts) instead of torch.manual_seed(seed); with n_restarts = 1 no randomness is used;
  - `norm`: the reference's res2 (1e10 where none) is reported as inf where no adversarial
    was found; `fab_t` also reports, for images left robust, the smallest norm of the
    adversarials found beyond eps (the reference discards them and returns x);
  - sorting: jnp.argsort is stable, torch.sort/argsort are not; only ties (equal logits at x,
    equal box distances or breakpoints in the projections) can be ordered differently;
  - `projection_l2` computes g at the breakpoints with cumulative sums from both ends rather than
    the reference's differences of one running sum, and moves a coordinate that reaches its face
    exactly onto it: the same projection, rounded differently (in float32, closer to the float64
    projection). Where rounding leaves the piece found with no free coordinate, it keeps
    that piece's breakpoint as lambda; the reference takes lambda = 0 there;
  - float32 unless x is float64 (the reference casts x to float32).
"""

from __future__ import annotations

import functools
import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn
from patjax.core.errors import UserError

NORMS = ("linf", "l2")


class FabResult(NamedTuple):
    x_adv: jax.Array  # (B, ...) see fab_targeted / fab_t; x itself where nothing is returned
    norm: jax.Array  # (B,) |x_adv - x| (attack's norm) of the smallest adversarial; inf if none; 0 if x misclassified
    fooled: jax.Array  # (B,) bool: argmax f(x_adv) != y and |x_adv - x| <= eps


def projection_linf(points: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """d minimizing |d|_inf s.t. w.(points + d) = b and points + d in [0, 1]^n, per row.

    points, w: (B, n); b: (B,). Exact (fab_projections.py: projection_linf). Orient the plane so
    that c = w.t - b >= 0; moving each coordinate towards the face decreasing w.z (to 0 where
    w_i > 0, to 1 where w_i < 0) by at most lambda gives
        g(lambda) = w.delta(lambda) = -sum_i |w_i| min(lambda, p_i),  p_i the distance to that face,
    decreasing and piecewise linear; the answer is the smallest lambda with g(lambda) = -c. With
    the p_i sorted, a bisection over the breakpoints finds the linear piece, solved in closed
    form. If even the full move (every coordinate at its face) does not reach the plane, that
    full move is returned (the box point closest to the plane's side). Coordinates with
    w_i = 0 do not move.
    """
    t = points
    n = t.shape[1]
    sign = jnp.where(jnp.sum(w * t, axis=1) - b >= 0, 1.0, -1.0).astype(t.dtype)
    w = w * sign[:, None]
    b = b * sign
    nonzero = (w != 0).astype(t.dtype)
    a = (w < 0).astype(t.dtype)  # face per coordinate: 1 where w_i < 0, else 0
    d = (a - t) * nonzero  # the full move to those faces
    p = a - t * (2 * a - 1)  # p_i = |a_i - t_i|
    order = jnp.argsort(p, axis=1)  # ascending p
    descending = order[:, ::-1]
    b = b - jnp.sum(w * t, axis=1)  # target value of w.d: -c <= 0
    b0 = jnp.sum(w * d, axis=1)  # g(max p): the full move
    ws = jnp.take_along_axis(w, descending, axis=1)
    s = jnp.cumsum(jnp.abs(ws), axis=1)  # s_j = sum of |w| over the j+1 largest p
    sb = jnp.cumsum(-ws * jnp.take_along_axis(d, descending, axis=1), axis=1) + b0[:, None]
    p_desc = jnp.take_along_axis(p, descending, axis=1)
    # g at lambda = p_(j) (the j-th largest p) is sb_j - s_j p_(j).
    b2 = sb[:, -1] - s[:, -1] * p_desc[:, -1]
    small = b - b2 > 0  # lambda <= min p: no coordinate reaches its face
    middle = (b - b0 > 0) & ~small  # lambda between two breakpoints

    def bisect(_, bounds):
        lb, ub = bounds
        mid = jnp.floor((lb + ub) / 2)
        j = mid.astype(jnp.int32)[:, None]
        g = (
            jnp.take_along_axis(sb, j, axis=1)
            - jnp.take_along_axis(s, j, axis=1) * jnp.take_along_axis(p_desc, j, axis=1)
        )[:, 0]
        c = b - g > 0
        return jnp.where(c, mid, lb), jnp.where(c, ub, mid)

    lb0 = jnp.zeros(b.shape, t.dtype)
    lb, _ = jax.lax.fori_loop(
        0, math.ceil(math.log2(n)) if n > 1 else 0, bisect, (lb0, jnp.full(b.shape, n - 1, t.dtype))
    )
    lb = lb.astype(jnp.int32)[:, None]

    lambda_small = jnp.maximum((b - sb[:, -1]) / (-s[:, -1]), 0.0)[:, None]
    d_small = (2 * a - 1) * lambda_small
    lambda_mid = jnp.maximum(
        (b[:, None] - jnp.take_along_axis(sb, lb, axis=1)) / (-jnp.take_along_axis(s, lb, axis=1)), 0.0
    )
    d_mid = jnp.minimum(lambda_mid, d) * a + jnp.maximum(-lambda_mid, d) * (1 - a)
    d = jnp.where(small[:, None], d_small, jnp.where(middle[:, None], d_mid, d))
    return d * nonzero


def projection_l2(points: jax.Array, w: jax.Array, b: jax.Array) -> jax.Array:
    """d minimizing |d|_2 s.t. w.(points + d) = b and points + d in [0, 1]^n, per row.

    points in [0, 1]^n, w: (B, n); b: (B,). Exact (fab_projections.py: projection_l2). Orient the
    plane so that c = w.t - b >= 0. By the KKT conditions d = d(lambda) = clip(-lambda w, -t, 1 - t)
    for a multiplier lambda >= 0; coordinate i reaches its face at r_i = max(t_i / w_i, (t_i - 1) / w_i),
    so g(lambda) = w.d(lambda) = -sum_i w_i^2 min(lambda, r_i) is decreasing and piecewise linear
    with breakpoints r_i, and lambda solves g(lambda) = -c. Below the smallest r_i no face is
    reached: lambda = c / |w|_2^2, the projection onto the plane alone. Otherwise, with the r_i
    sorted, a bisection over the breakpoints finds the linear piece, solved in closed form. If even
    the full move (every coordinate at its face) does not reach the plane, that full move is
    returned, as in `projection_linf`. Coordinates with |w_i| <= 1e-8 do not move (the reference's
    threshold: the breakpoint t_i / w_i of a vanishing w_i is meaningless).
    """
    t = points
    n = t.shape[1]
    c = jnp.sum(w * t, axis=1) - b
    sign = jnp.where(c >= 0, 1.0, -1.0).astype(t.dtype)
    w = w * sign[:, None]
    c = c * sign
    active = jnp.abs(w) > 1e-8
    safe_w = jnp.where(active, w, 1.0)
    r = jnp.where(active, jnp.maximum(t / safe_w, (t - 1) / safe_w), 0.0)
    # an inactive coordinate has no weight in g: placed at the largest breakpoint, it leaves g as is
    r = jnp.where(active, r, jnp.max(r, axis=1, keepdims=True))
    w2 = jnp.where(active, w * w, 0.0)
    order = jnp.argsort(r, axis=1)
    rs = jnp.take_along_axis(r, order, axis=1)
    w2s = jnp.take_along_axis(w2, order, axis=1)
    zero = jnp.zeros((t.shape[0], 1), t.dtype)
    # sums from each end, so that no sum is a difference of two large ones
    at_or_after = jnp.cumsum(w2s[:, ::-1], axis=1)[:, ::-1]  # sum of w^2 over breakpoints >= the j-th
    free = jnp.concatenate([at_or_after[:, 1:], zero], axis=1)  # slope of -g after the j-th breakpoint
    faced = jnp.concatenate([zero, jnp.cumsum(w2s * rs, axis=1)[:, :-1]], axis=1)
    g = -faced - rs * at_or_after  # g at the j-th breakpoint

    full = jnp.where(active, (w < 0).astype(t.dtype) - t, 0.0)  # every coordinate at its face
    small = g[:, 0] + c < 0  # lambda below the smallest breakpoint
    unreachable = jnp.sum(w * full, axis=1) + c > 0

    def bisect(_, bounds):
        lb, ub = bounds
        mid = jnp.floor((lb + ub) / 2)
        above = jnp.take_along_axis(g, mid.astype(jnp.int32)[:, None], axis=1)[:, 0] + c > 0
        return jnp.where(above, mid, lb), jnp.where(above, ub, mid)

    lb0 = jnp.zeros(c.shape, t.dtype)
    lb, _ = jax.lax.fori_loop(
        0, math.ceil(math.log2(n)) if n > 1 else 0, bisect, (lb0, jnp.full(c.shape, n - 1, t.dtype))
    )
    j = lb.astype(jnp.int32)[:, None]
    slope = jnp.take_along_axis(free, j, axis=1)[:, 0]
    g_j = jnp.take_along_axis(g, j, axis=1)[:, 0]
    lambda_mid = jnp.take_along_axis(rs, j, axis=1)[:, 0] + jnp.where(
        slope > 0, (g_j + c) / jnp.where(slope > 0, slope, 1.0), 0.0
    )
    norm2 = jnp.sum(w2, axis=1)
    lambda_small = c / jnp.where(small, norm2, 1.0)
    lam = jnp.where(small, lambda_small, lambda_mid)[:, None]
    d = jnp.where(unreachable[:, None] & ~small[:, None], full, jnp.clip(-lam * w, -t, 1 - t))
    return jnp.where(active, d, 0.0)


def _check_norm(norm: str) -> None:
    if norm not in NORMS:
        raise UserError(f"FAB's norm must be one of {', '.join(map(repr, NORMS))}, got {norm!r}")


def _linf(z: jax.Array) -> jax.Array:
    return jnp.max(jnp.abs(z.reshape(z.shape[0], -1)), axis=1)


def fab_targeted(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    target: jax.Array,
    *,
    eps: float,
    n_iter: int = 100,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    random_start: bool | jax.Array = False,
    norm: str = "linf",
) -> FabResult:
    """One targeted FAB run (attack_single_run(is_targeted=True)) on images x in [0, 1]^(NHWC).

    target: (B,) the class whose boundary with y is linearized. norm: "linf" or "l2", the norm
    minimized (|.| below). random_start (may be traced): start at clip(x + 0.5 eps t / |t|),
    t ~ U(-1, 1)^d for L-inf, N(0, I) for L2, from `key`, else at x.
    Returns x_adv: the adversarial of smallest norm among the iterates (any norm; x where
    none was found or x is misclassified); norm: its norm (inf if none, 0 if x misclassified);
    fooled: argmax f(x_adv) != y and norm <= eps.
    """
    _check_norm(norm)
    l2_size = functools.partial(l2.norms, keepdims=False)
    size, project = (_linf, projection_linf) if norm == "linf" else (l2_size, projection_l2)
    batch = x.shape[0]
    bshape = (batch,) + (1,) * (x.ndim - 1)
    flat = lambda z: z.reshape(batch, -1)
    correct = jnp.argmax(logits_fn(x), axis=-1) == y

    if norm == "linf":
        r = jax.random.uniform(key, x.shape, x.dtype, -1.0, 1.0)
    else:
        r = jax.random.normal(key, x.shape, x.dtype)
    start = jnp.clip(x + eps * r / size(r).reshape(bshape) * 0.5, 0.0, 1.0)
    x1 = jnp.where(random_start, start, x)

    def diff_and_grad(z):
        """f_t - f_y and its input gradient (gradient of the sum over the batch)."""

        def total(z):
            logits = logits_fn(z)
            diff = (
                jnp.take_along_axis(logits, target[:, None], axis=-1) - jnp.take_along_axis(logits, y[:, None], axis=-1)
            )[:, 0]
            return jnp.sum(diff), diff

        grad, diff = jax.grad(total, has_aux=True)(z)
        return diff, grad

    def body(_, state):
        x1, adv, res = state
        df, dg = diff_and_grad(x1)
        w = flat(dg)
        b = -df + jnp.sum(w * flat(x1), axis=1)
        # The two projections (from x1 and from x) side by side on a new leading axis, not
        # concatenated along the batch: the batch axis is the one split over devices, and a
        # concatenation and slicing along it made XLA exchange the halves between devices
        # (all-to-all, collective-permute) every iteration, most of FAB's time on 2 CPU devices.
        d3 = jax.vmap(project)(jnp.stack([flat(x1), flat(x)]), jnp.stack([w, w]), jnp.stack([b, b]))
        d1, d2 = d3[0].reshape(x.shape), d3[1].reshape(x.shape)
        a1, a2 = jnp.maximum(jax.vmap(size)(d3), 1e-8)
        alpha = jnp.minimum(jnp.maximum(a1 / (a1 + a2), 0.0), alpha_max).reshape(bshape)
        x1 = jnp.clip((x1 + eta * d1) * (1 - alpha) + (x + eta * d2) * alpha, 0.0, 1.0)
        is_adv = jnp.argmax(logits_fn(x1), axis=-1) != y
        t = size(x1 - x)
        better = is_adv & (t < res)
        adv = jnp.where(better.reshape(bshape), x1, adv)
        res = jnp.where(better, t, res)
        x1 = jnp.where(is_adv.reshape(bshape), x + (x1 - x) * beta, x1)
        return x1, adv, res

    res0 = jnp.full((batch,), jnp.inf, x.dtype)
    _, adv, res = jax.lax.fori_loop(0, n_iter, body, (x1, x, res0))
    x_adv = jnp.where((correct & jnp.isfinite(res)).reshape(bshape), adv, x)
    dist = jnp.where(correct, res, 0.0)
    fooled = (jnp.argmax(logits_fn(x_adv), axis=-1) != y) & (size(x_adv - x) <= eps)
    return FabResult(jax.lax.stop_gradient(x_adv), jax.lax.stop_gradient(dist), fooled)


def fab_target_classes(logits: jax.Array, n_target_classes: int = 9) -> jax.Array:
    """(n_target_classes, B): row k - 2 is argsort(logits)[:, -k], k = 2, ..., n_target_classes + 1
    (fab_base.py: output.sort(dim=-1)[1][:, -self.target_class])."""
    if n_target_classes + 1 > logits.shape[-1]:  # raised while tracing: before any image is attacked
        raise UserError(
            f"AutoAttack's targeted attacks with {n_target_classes} target classes (eval.aa.target_classes) need "
            f"at least {n_target_classes + 1} classes; the model has {logits.shape[-1]}"
        )
    order = jnp.argsort(logits, axis=-1)
    return order[:, ::-1][:, 1 : n_target_classes + 1].T


class FabState(NamedTuple):
    """Where `fab_t` stands between its runs, per image."""

    robust: jax.Array  # (B,) bool: correct at x and no run so far fooled it within eps
    adv: jax.Array  # (B, ...) its first success within eps; x where none
    dist: jax.Array  # (B,) that success's norm; for a robust image the smallest norm found beyond eps


def fab_t_start(logits_fn: LogitsFn, x: jax.Array, y: jax.Array) -> FabState:
    """`fab_t` before its first run: robust where x is classified correctly, dist 0 for the others."""
    robust = jnp.argmax(logits_fn(x), axis=-1) == y
    return FabState(robust, x, jnp.where(robust, jnp.inf, 0.0).astype(x.dtype))


def fab_t_run(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    targets: jax.Array,
    i: jax.Array,
    state: FabState,
    *,
    eps: float,
    n_restarts: int = 1,
    n_iter: int = 100,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    norm: str = "linf",
) -> FabState:
    """Run i (may be traced) of `fab_t`: target row i // n_restarts of `targets`
    (`fab_target_classes`), restart i % n_restarts (a random start for restarts after the first,
    from split(key, runs)[i]), on the images `state` leaves robust; each image keeps its first
    success within eps. An image's result depends on no other image of the batch, so the images
    already fooled may leave the batch between runs."""
    _check_norm(norm)
    bshape = (x.shape[0],) + (1,) * (x.ndim - 1)
    run = fab_targeted(
        logits_fn,
        jax.random.split(key, targets.shape[0] * n_restarts)[i],
        x,
        y,
        targets[i // n_restarts],
        eps=eps,
        n_iter=n_iter,
        alpha_max=alpha_max,
        eta=eta,
        beta=beta,
        random_start=i % n_restarts > 0,
        norm=norm,
    )
    robust, adv, dist = state
    newly = robust & run.fooled
    adv = jnp.where(newly.reshape(bshape), run.x_adv, adv)
    dist = jnp.where(newly, run.norm, jnp.where(robust, jnp.minimum(dist, run.norm), dist))
    return FabState(robust & ~run.fooled, adv, dist)


def fab_t(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps: float,
    n_target_classes: int = 9,
    n_restarts: int = 1,
    n_iter: int = 100,
    alpha_max: float = 0.1,
    eta: float = 1.05,
    beta: float = 0.9,
    norm: str = "linf",
) -> FabResult:
    """AutoAttack's FAB-T (FABAttack.perturb with targeted=True; 'standard': n_restarts = 1).

    norm: "linf" or "l2" (the reference's 'Linf', 'L2'), the norm minimized and bounded by eps.
    For each target rank k = 2, ..., n_target_classes + 1 and restart r (random start for r > 0),
    one `fab_targeted` run on the images still robust (`fab_t_run`); an image's first success
    within eps is kept. Returns x_adv: that success, x for robust images and images misclassified
    at x; norm: |x_adv - x| where fooled (0 if x is misclassified), else the smallest norm of an
    adversarial found beyond eps (inf if none); fooled: not robust (clean errors included).
    """
    _check_norm(norm)
    targets = fab_target_classes(logits_fn(x), n_target_classes)
    n_runs = n_target_classes * n_restarts
    settings = dict(eps=eps, n_restarts=n_restarts, n_iter=n_iter, alpha_max=alpha_max, eta=eta, beta=beta, norm=norm)

    def cond(carry):
        i, state = carry
        return (i < n_runs) & jnp.any(state.robust)

    def body(carry):
        i, state = carry
        return i + 1, fab_t_run(logits_fn, key, x, y, targets, i, state, **settings)

    _, (robust, adv, dist) = jax.lax.while_loop(cond, body, (jnp.zeros((), jnp.int32), fab_t_start(logits_fn, x, y)))
    return FabResult(jax.lax.stop_gradient(adv), jax.lax.stop_gradient(dist), ~robust)
