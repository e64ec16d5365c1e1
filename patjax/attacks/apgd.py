"""APGD and APGD-T in L-inf or L2 pixel space (Croce & Hein 2020, "Reliable evaluation of
adversarial robustness with an ensemble of diverse parameter-free attacks"), following
fra31/auto-attack autoattack/autopgd_base.py (APGDAttack.attack_single_run and perturb, their
norm='Linf' and norm='L2' branches), with their DLR losses.

A pure function of a `logits_fn` (x -> logits, normalization inside the model), a PRNG key and
arrays, looped with `jax.lax`; its points lie in the eps-ball (L-inf or L2, per example over every
pixel and channel) around x intersected with [0, 1]^d.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from patjax.attacks.l2 import norms
from patjax.attacks.logits import LogitsFn, check_inference_mode, margin, true_value
from patjax.attacks.pgd import cross_entropy_loss, project_linf

# autopgd_base.py's APGDAttack.normalize: x / (|x|_p + 1e-12), per example.
NORMALIZE_EPS = 1e-12
APGD_NORMS = ("linf", "l2")


def dlr_loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Difference of logits ratio: -(z_y - max_{i!=y} z_i) / (z_pi1 - z_pi3 + 1e-12).

    z_pi1 >= z_pi2 >= z_pi3 are the sorted logits (autopgd_base.py: dlr_loss); needs >= 3 classes.
    """
    sorted_logits = jnp.sort(logits, axis=-1)
    return margin(logits, y) / (sorted_logits[:, -1] - sorted_logits[:, -3] + 1e-12)


def dlr_targeted_loss(logits: jax.Array, y: jax.Array, target: jax.Array) -> jax.Array:
    """Targeted DLR of APGD-T: -(z_y - z_t) / (z_pi1 - (z_pi3 + z_pi4) / 2 + 1e-12).

    autopgd_base.py: APGDAttackTargeted.dlr_loss_targeted; needs >= 4 classes.
    """
    sorted_logits = jnp.sort(logits, axis=-1)
    return -(true_value(logits, y) - true_value(logits, target)) / (
        sorted_logits[:, -1] - 0.5 * (sorted_logits[:, -3] + sorted_logits[:, -4]) + 1e-12
    )


APGD_LOSSES = {"ce": cross_entropy_loss, "dlr": dlr_loss, "dlr_targeted": dlr_targeted_loss}


def project_l2_apgd(x_adv: jax.Array, x: jax.Array, eps: float | jax.Array) -> jax.Array:
    """The L2 projection of autopgd_base.py's L2 branch: with delta = x_adv - x,
    clamp(x + delta / (|delta|_2 + 1e-12) * min(eps, |delta|_2), 0, 1): the ball first, the box
    after, as in `l2.project_l2`, whose factor min(1, eps / |delta|_2) is the same map but for the
    1e-12 and rounding."""
    delta = x_adv - x
    norm = norms(delta)
    return jnp.clip(x + delta / (norm + NORMALIZE_EPS) * jnp.minimum(eps, norm), 0.0, 1.0)


def apgd_checkpoints(steps: int) -> list[int]:
    """Iterations after which the step size may be halved (0-based indices of `apgd`'s loop,
    which takes its schedule from here).

    autopgd_base.py: first interval n_iter_2 = max(int(0.22 N), 1) iterations, then each
    interval shrinks by size_decr = max(int(0.03 N), 1) down to n_iter_min = max(int(0.06 N), 1),
    i.e. the checkpoints p_0 = 0, p_1 = 0.22, p_{j+1} = p_j + max(p_j - p_{j-1} - 0.03, 0.06).
    """
    first, minimum, decrement = max(int(0.22 * steps), 1), max(int(0.06 * steps), 1), max(int(0.03 * steps), 1)
    points, length, at = [], first, 0
    while at + length <= steps:
        at += length
        points.append(at - 1)
        length = max(length - decrement, minimum)
    return points


class ApgdResult(NamedTuple):
    x_adv: jax.Array  # as perturb returns it: for a clean-correct image the run fooled, the last misclassified
    # point (start included); x itself for robust and clean-misclassified images
    robust: jax.Array  # (B,) bool: x and every iterate (start included) classified correctly
    best_loss: jax.Array  # (B,) the highest loss reached (start included), for every image


def apgd(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps: float,
    steps: int = 100,
    loss: str = "ce",
    rho: float = 0.75,
    momentum: float = 0.75,
    target: jax.Array | None = None,
    norm: str = "linf",
) -> ApgdResult:
    """One run of APGD in the L-inf (norm='linf') or L2 (norm='l2') ball (autopgd_base.py:
    APGDAttack.perturb with n_restarts=1, i.e. one attack_single_run on the clean-correct images).

    - start: x + eps * t / (|t|_p + 1e-12), clipped to [0, 1], with t ~ U(-1, 1)^d and
      |t|_inf = max|t_i| under L-inf, t ~ N(0, I)^d and the L2 norm under L2 (a point on the
      sphere of radius eps before the clip);
    - step size eta = 2 eps per example (alpha = 2 for both norms); update z = P(x_k + eta d_k),
      x_{k+1} = P(x_k + a (z - x_k) + (1 - a)(x_k - x_{k-1})) with a = 1 at the first
      iteration and `momentum` (0.75) afterwards, P the projection onto the eps-ball ∩ [0, 1]^d.
      Under L-inf d_k = sign(grad) and P clips coordinates to [x - eps, x + eps] then [0, 1];
      under L2 d_k = grad / (|grad|_2 + 1e-12) and P is `project_l2_apgd`, the reference's
      x + delta / (|delta|_2 + 1e-12) * min(eps, |delta|_2) clamped to [0, 1] (autopgd_base.py,
      attack_single_run, norm == 'L2'). All that follows is the same for both norms;
    - checkpoints: the last iteration of each interval (`apgd_checkpoints`, which the loop uses
      for its schedule). At a checkpoint ending an interval of k iterations, an example's step
      size is halved, and it restarts from its best-loss point with that point's gradient, when
        (a) its loss rose (strictly, from one point to the next) in at most rho * k of the
            interval's k steps (rho = 0.75), OR
        (b) its best loss did not improve (strictly) since the previous checkpoint AND its step
            size was not halved at the previous checkpoint
      (autopgd_base.py: check_oscillation, or fl_reduce_no_impr). The start counts as a
      checkpoint at which the step was halved (reduced_last_check = 1), so only (a) can fire at
      the first checkpoint;
    - robust: the clean x and every iterate (start included) are correctly classified (perturb's
      clean check AND attack_single_run's per-example `acc`);
    - x_adv: as perturb returns it, so argmax logits_fn(x_adv) != y exactly where robust is
      False: for a clean-correct image the run fooled, the last misclassified point among the
      start and the iterates; x itself otherwise (robust images and clean-misclassified ones);
    - best_loss: attack_single_run's loss_best (highest loss over the start and every iterate),
      also for clean-misclassified images, which perturb does not attack.
    loss='dlr_targeted' with `target` (per example) is one run of APGD-T
    (APGDAttackTargeted.attack_single_run): the same iteration on the targeted DLR loss; an
    image still counts as fooled by any class other than y.
    The one departure from the reference: in the first interval, (a) compares the first
    iterate's loss with the loss at the start (Croce & Hein 2020, condition 1), whereas the
    reference's check_oscillation compares it with loss_steps[-1], a row of its loss buffer not
    yet filled (0). Every other comparison is the reference's.
    """
    if norm not in APGD_NORMS:
        raise ValueError(f"unknown APGD norm {norm!r}; choose one of {list(APGD_NORMS)}")
    if loss not in APGD_LOSSES:
        raise ValueError(f"unknown APGD loss {loss!r}; choose one of {sorted(APGD_LOSSES)}")
    if (loss == "dlr_targeted") != (target is not None):
        raise ValueError("the targeted DLR loss needs a target per example, and only it takes one")
    loss_fn = APGD_LOSSES[loss] if target is None else (lambda z, labels: dlr_targeted_loss(z, labels, target))
    batch = x.shape[0]
    bshape = (batch,) + (1,) * (x.ndim - 1)
    # interval_length[i]: the length of the interval that iteration i closes, 0 off checkpoints.
    interval_length, previous = [0] * steps, -1
    for point in apgd_checkpoints(steps):
        interval_length[point], previous = point - previous, point
    interval_length = jnp.asarray(interval_length, jnp.int32)

    def loss_and_grad(z):
        def total(z):
            logits = logits_fn(z)
            per_example = loss_fn(logits, y)
            return jnp.sum(per_example), (per_example, logits)

        (_, (per_example, logits)), grad = jax.value_and_grad(total, has_aux=True)(z)
        return per_example, jnp.argmax(logits, axis=-1) == y, grad

    if norm == "linf":
        t = jax.random.uniform(key, x.shape, x.dtype, -1.0, 1.0)
        t_norm = jnp.max(jnp.abs(t).reshape(batch, -1), axis=1).reshape(bshape)
        direction = jnp.sign

        def project(z):
            return project_linf(z, x, eps)

    else:
        t = jax.random.normal(key, x.shape, x.dtype)
        t_norm = norms(t)

        def direction(g):
            return g / (norms(g) + NORMALIZE_EPS)

        def project(z):
            return project_l2_apgd(z, x, eps)

    check_inference_mode(logits_fn)
    clean_correct = jnp.argmax(logits_fn(x), axis=-1) == y
    x_start = jnp.clip(x + eps * t / (t_norm + NORMALIZE_EPS), 0.0, 1.0)
    loss0, correct0, grad0 = loss_and_grad(x_start)

    def body(i, s):
        momentum_term = s["x_adv"] - s["x_old"]
        a = jnp.where(i > 0, momentum, 1.0)
        z = project(s["x_adv"] + s["step"].reshape(bshape) * direction(s["grad"]))
        x_new = project(s["x_adv"] + (z - s["x_adv"]) * a + momentum_term * (1 - a))
        loss_new, correct, grad = loss_and_grad(x_new)
        fooled = ~correct
        improved = loss_new > s["best_loss"]
        e = lambda mask: mask.reshape(bshape)
        n = dict(s)
        n["x_old"] = s["x_adv"]
        n["robust"] = s["robust"] & correct
        n["x_best_adv"] = jnp.where(e(fooled), x_new, s["x_best_adv"])
        n["x_best"] = jnp.where(e(improved), x_new, s["x_best"])
        n["grad_best"] = jnp.where(e(improved), grad, s["grad_best"])
        n["best_loss"] = jnp.where(improved, loss_new, s["best_loss"])
        n["increases"] = s["increases"] + (loss_new > s["prev_loss"]).astype(jnp.int32)
        n["prev_loss"] = loss_new
        length = interval_length[i]
        at_checkpoint = length > 0
        # autopgd_base.py: check_oscillation (t <= k * rho) or no improvement without a reduction.
        oscillating = n["increases"] <= length * rho
        not_improved = (~s["reduced_last"]) & (s["best_loss_last"] >= n["best_loss"])
        reduce = at_checkpoint & (oscillating | not_improved)
        n["step"] = jnp.where(reduce, s["step"] / 2.0, s["step"])
        n["x_adv"] = jnp.where(e(reduce), n["x_best"], x_new)
        n["grad"] = jnp.where(e(reduce), n["grad_best"], grad)
        n["reduced_last"] = jnp.where(at_checkpoint, reduce, s["reduced_last"])
        n["best_loss_last"] = jnp.where(at_checkpoint, n["best_loss"], s["best_loss_last"])
        n["increases"] = jnp.where(at_checkpoint, 0, n["increases"])
        return n

    state = {
        "x_adv": x_start,
        "x_old": x_start,
        "grad": grad0,
        "step": jnp.full((batch,), 2.0 * eps, x.dtype),
        "x_best": x_start,
        "grad_best": grad0,
        "best_loss": loss0,
        "x_best_adv": x_start,
        "robust": clean_correct & correct0,
        "prev_loss": loss0,
        "increases": jnp.zeros((batch,), jnp.int32),
        "reduced_last": jnp.ones((batch,), bool),
        "best_loss_last": loss0,
    }
    s = jax.lax.fori_loop(0, steps, body, state)
    # perturb: adv = x, overwritten by attack_single_run's x_best_adv where a clean-correct image was fooled.
    fooled = clean_correct & ~s["robust"]
    x_adv = jnp.where(fooled.reshape(bshape), s["x_best_adv"], x)
    return ApgdResult(jax.lax.stop_gradient(x_adv), s["robust"], jax.lax.stop_gradient(s["best_loss"]))
