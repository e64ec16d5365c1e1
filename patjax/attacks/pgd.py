"""Worst-case attacks in L-inf pixel space, shared by training methods and evaluation.

Every attack is a pure function of a `logits_fn` (x -> logits, normalization inside the
model), a PRNG key and arrays, loops with `jax.lax`, and returns its result under
`stop_gradient`. Adversarial examples always lie in the eps-ball around x intersected
with [0, 1]^d.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp
import optax

from patjax.attacks.logits import LogitsFn, log_or_zero, margin, true_value
from patjax.core.errors import UserError, check_counts, count


def project_linf(x_adv: jax.Array, x: jax.Array, eps: float | jax.Array) -> jax.Array:
    """Projection onto {|x_adv - x|_inf <= eps} intersected with [0, 1]^d."""
    return jnp.clip(jnp.clip(x_adv, x - eps, x + eps), 0.0, 1.0)


def cross_entropy_loss(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Per-example cross-entropy (the loss PGD ascends)."""
    return optax.softmax_cross_entropy_with_integer_labels(logits, y)


def cw_margin_loss(logits: jax.Array, y: jax.Array, kappa: float = 50.0) -> jax.Array:
    """Per-example CW loss as in the common CW-inf evaluation: -max(z_y - max_{j!=y} z_j + kappa, 0)."""
    return -jnp.maximum(kappa - margin(logits, y), 0.0)


def input_gradient(logits_fn: LogitsFn, loss_fn, x_adv: jax.Array, y: jax.Array) -> jax.Array:
    """Gradient of the summed per-example loss w.r.t. the input (per-example gradients)."""
    return jax.grad(lambda z: jnp.sum(loss_fn(logits_fn(z), y)))(x_adv)


def fgsm(logits_fn: LogitsFn, x: jax.Array, y: jax.Array, eps: float) -> jax.Array:
    """FGSM (Goodfellow et al. 2015): x + eps * sign(grad CE), no random start, clipped to [0,1]."""
    grad = input_gradient(logits_fn, cross_entropy_loss, x, y)
    return jax.lax.stop_gradient(project_linf(x + eps * jnp.sign(grad), x, eps))


def pgd(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps: float,
    step_size: float,
    steps: int,
    loss_fn=cross_entropy_loss,
    random_start: bool = True,
) -> jax.Array:
    """L-inf PGD (Madry et al. 2018): sign-gradient ascent on loss_fn, projected every step.

    random_start: x + U(-eps, eps)^d (MadryLab/cifar10_challenge), else start at x.
    """
    x_adv = x
    if random_start:
        x_adv = project_linf(x + jax.random.uniform(key, x.shape, x.dtype, -eps, eps), x, eps)

    def step(_, x_adv):
        grad = input_gradient(logits_fn, loss_fn, x_adv, y)
        return project_linf(x_adv + step_size * jnp.sign(grad), x, eps)

    return jax.lax.stop_gradient(jax.lax.fori_loop(0, steps, step, x_adv))


# ---------------------------------------------------------------------------------------
# Inner maximizations of the training baselines (TRADES, MART, AT-PR; FGSM with a random
# gradient point as in AT-PR's code). Each returns points in the eps-ball around x
# intersected with [0, 1]^d, under stop_gradient.


def fgsm_random_point(logits_fn: LogitsFn, key: jax.Array, x: jax.Array, y: jax.Array, eps: float) -> jax.Array:
    """FGSM as in wellzline/AT-PR attack_algorithms.py `fgsm_loss`: the CE gradient is taken at
    clip(x + U(-eps, eps)^d, 0, 1), the step eps * sign(grad) starts from x itself."""
    x_random = jnp.clip(x + jax.random.uniform(key, x.shape, x.dtype, -eps, eps), 0.0, 1.0)
    grad = input_gradient(logits_fn, cross_entropy_loss, x_random, y)
    return jax.lax.stop_gradient(project_linf(x + eps * jnp.sign(grad), x, eps))


def gaussian_start(key: jax.Array, x: jax.Array, scale: float) -> jax.Array:
    """x + scale * N(0, 1)^d, not clipped: the start of the TRADES and MART attacks
    (`x_natural + 0.001 * torch.randn(...)`; the first gradient is taken there)."""
    return x + scale * jax.random.normal(key, x.shape, x.dtype)


def sign_ascent(
    logits_fn: LogitsFn, x_start: jax.Array, x: jax.Array, target, *, eps, step_size, steps, loss_fn=cross_entropy_loss
) -> jax.Array:
    """`steps` projected sign-gradient ascent steps on sum_i loss_fn(logits_i, target_i) from
    x_start: x <- P(x + step_size * sign(grad)), P the projection onto the eps-ball ∩ [0,1]^d.

    `steps` may be a traced integer (a while loop then runs exactly that many steps); the
    result is projected once more, so steps = 0 returns P(x_start).
    """

    def step(_, x_adv):
        grad = input_gradient(logits_fn, loss_fn, x_adv, target)
        return project_linf(x_adv + step_size * jnp.sign(grad), x, eps)

    return jax.lax.stop_gradient(project_linf(jax.lax.fori_loop(0, steps, step, x_start), x, eps))


def kl_from_clean_loss(adv_logits: jax.Array, clean_probs: jax.Array) -> jax.Array:
    """Per-example KL(p_clean || softmax(adv_logits)) = sum_k p_k (log p_k - log_softmax_k);
    torch's KLDivLoss(log_softmax(model(x_adv)), softmax(model(x))) summed over classes, with
    0 log 0 = 0."""
    log_q = jax.nn.log_softmax(adv_logits, axis=-1)
    return jnp.sum(clean_probs * (log_or_zero(clean_probs) - log_q), axis=-1)


def trades_kl_attack(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    *,
    eps: float,
    step_size: float,
    steps: int,
    init_noise: float = 0.001,
) -> jax.Array:
    """The TRADES inner maximization (yaodongyu/TRADES trades.py, distance='l_inf'): from
    x + init_noise * N(0, 1), sign ascent on KL(p(x) || p(x_adv)) with p(x) held fixed."""
    clean_probs = jax.lax.stop_gradient(jax.nn.softmax(logits_fn(x), axis=-1))
    return sign_ascent(
        logits_fn,
        gaussian_start(key, x, init_noise),
        x,
        clean_probs,
        eps=eps,
        step_size=step_size,
        steps=steps,
        loss_fn=kl_from_clean_loss,
    )


def mart_attack(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps: float,
    step_size: float,
    steps: int,
    init_noise: float = 0.001,
) -> jax.Array:
    """The MART inner maximization (YisenWang/MART mart.py): CE sign ascent from
    x + init_noise * N(0, 1)."""
    return sign_ascent(logits_fn, gaussian_start(key, x, init_noise), x, y, eps=eps, step_size=step_size, steps=steps)


@dataclasses.dataclass(frozen=True)
class AtprSettings:
    """The AT-PR search (wellzline/AT-PR attack_algorithms.py `PR` and `pick_best_ae`), checked once.

    The search keeps every candidate's batch (`AtprResult.candidates`): 1,000 candidates are 100
    times the reference's and 3 GB at batch 256 on CIFAR; the step counts' bound is 10,000 times
    the reference's."""

    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = count("attack.steps", 0, 100_000, default=10)
    # the standard PGD plus num_candidates - 1 randomized ones
    num_candidates: int = count("atpr.num_candidates", 1, 1_000, default=10)
    eps_spread: float = 0.02  # eps' ~ U(eps - eps_spread, eps)
    step_size_spread: float = 0.003  # alpha' ~ U(alpha - spread, alpha + spread)
    # steps' ~ randint(steps - below, steps + above), inclusive
    steps_below: int = count("atpr.steps_below", 0, 100_000, default=2)
    steps_above: int = count("atpr.steps_above", 0, 100_000, default=10)
    refine_max_iters: int = count("atpr.refine_max_iters", 0, 100_000, default=40)  # pick_best_ae's loop cap
    refine_stop_fraction: float = 0.1  # refine while more than this fraction of the batch is misclassified

    def __post_init__(self):
        check_counts(self)
        if not 0.0 <= self.refine_stop_fraction <= 1.0:
            raise UserError(f"atpr.refine_stop_fraction must be in [0, 1], got {self.refine_stop_fraction}")
        if self.step_size_spread > self.step_size:
            raise UserError("atpr.step_size_spread must not exceed attack.step_size (negative step sizes)")


class AtprResult(NamedTuple):
    x_adv: jax.Array  # (B, ...) the selected point per example
    choice: jax.Array  # (B,) index of the selected candidate (0 = the standard PGD)
    candidates: jax.Array  # (C, B, ...) every candidate
    distances: jax.Array  # (C, B) L-inf distance from each candidate to its refined point
    refine_iters: jax.Array  # (C,) refinement iterations run per candidate


def atpr_candidate_settings(key: jax.Array, s: AtprSettings):
    """(eps', alpha', steps') per candidate, shapes (C,): candidate 0 is the standard PGD."""
    k_eps, k_alpha, k_steps = jax.random.split(key, 3)
    n = s.num_candidates - 1
    eps = jax.random.uniform(k_eps, (n,), jnp.float32, max(s.eps - s.eps_spread, 0.0), s.eps)
    alpha = jax.random.uniform(
        k_alpha, (n,), jnp.float32, s.step_size - s.step_size_spread, s.step_size + s.step_size_spread
    )
    steps = jax.random.randint(k_steps, (n,), max(s.steps - s.steps_below, 0), s.steps + s.steps_above + 1)
    return (
        jnp.concatenate([jnp.array([s.eps], jnp.float32), eps]),
        jnp.concatenate([jnp.array([s.step_size], jnp.float32), alpha]),
        jnp.concatenate([jnp.array([s.steps], jnp.int32), steps.astype(jnp.int32)]),
    )


def atpr_refine(
    logits_fn: LogitsFn, x_adv: jax.Array, y: jax.Array, *, step_size: float, max_iters: int, stop_fraction: float
):
    """`pick_best_ae`'s refinement of one candidate: while more than stop_fraction of the batch is
    misclassified (and at most max_iters times), move every misclassified example one signed
    step *down* the CE gradient, clipped to [0, 1] only. Returns (refined x, iterations)."""

    def value_and_grad(z):
        def total(z):
            logits = logits_fn(z)
            return jnp.sum(cross_entropy_loss(logits, y)), logits

        (_, logits), grad = jax.value_and_grad(total, has_aux=True)(z)
        return jnp.argmax(logits, axis=-1) != y, grad

    bshape = (-1,) + (1,) * (x_adv.ndim - 1)
    limit = stop_fraction * y.shape[0]

    def cond(s):
        _, fooled, _, count = s
        return (jnp.sum(fooled) > limit) & (count < max_iters)

    def body(s):
        z, fooled, grad, count = s
        z = jnp.where(fooled.reshape(bshape), jnp.clip(z - step_size * jnp.sign(grad), 0.0, 1.0), z)
        fooled, grad = value_and_grad(z)
        return z, fooled, grad, count + 1

    fooled, grad = value_and_grad(x_adv)
    z, _, _, count = jax.lax.while_loop(cond, body, (x_adv, fooled, grad, jnp.zeros((), jnp.int32)))
    return jax.lax.stop_gradient(z), count


def atpr_search(
    logits_fn: LogitsFn, key: jax.Array, x: jax.Array, y: jax.Array, s: AtprSettings = AtprSettings()
) -> AtprResult:
    """AT-PR's inner maximization (`PR` + `pick_best_ae`), compiled.

    Candidates: the standard PGD (eps, alpha, steps, uniform random start) and
    num_candidates - 1 PGDs with (eps', alpha', steps') drawn per candidate (the same for the
    whole batch, as Python's `random` draws them per call). Each candidate is refined by
    `atpr_refine` (capped); per example the candidate farthest in L-inf from its refined point
    is kept, the first one on ties, and the standard PGD point where every distance is 0
    (the reference's strict `distance > max_distance` from max_distance = 0).
    Candidates run one after another (`lax.map`), each loop for exactly its own step count.
    """
    settings_key, start_key = jax.random.split(key)
    eps, alpha, steps = atpr_candidate_settings(settings_key, s)
    start_keys = jax.random.split(start_key, s.num_candidates)

    def one_candidate(args):
        k, e, a, n = args
        e, a = e.astype(x.dtype), a.astype(x.dtype)
        start = project_linf(x + jax.random.uniform(k, x.shape, x.dtype, -e, e), x, e)
        x_adv = sign_ascent(logits_fn, start, x, y, eps=e, step_size=a, steps=n)
        refined, count = atpr_refine(
            logits_fn,
            x_adv,
            y,
            step_size=s.step_size,
            max_iters=s.refine_max_iters,
            stop_fraction=s.refine_stop_fraction,
        )
        distance = jnp.max(jnp.abs(x_adv - refined).reshape(x.shape[0], -1), axis=1)
        return x_adv, distance, count

    candidates, distances, counts = jax.lax.map(one_candidate, (start_keys, eps, alpha, steps))
    choice = jnp.argmax(distances, axis=0)  # first maximum; all zero -> 0, the standard PGD
    x_sel = jnp.take_along_axis(candidates, choice.reshape((1, -1) + (1,) * (x.ndim - 1)), axis=0)[0]
    return AtprResult(jax.lax.stop_gradient(x_sel), choice, candidates, distances, counts)


# ---------------------------------------------------------------------------------------
# APGD (Croce & Hein 2020, "Reliable evaluation of adversarial robustness with an ensemble
# of diverse parameter-free attacks"), L-inf, following fra31/auto-attack
# autoattack/autopgd_base.py (APGDAttack.attack_single_run and perturb).


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
) -> ApgdResult:
    """One run of L-inf APGD (autopgd_base.py: APGDAttack.perturb with n_restarts=1, i.e. one
    attack_single_run on the clean-correct images).

    - start: x + eps * t / max|t|, t ~ U(-1, 1)^d, clipped to [0, 1];
    - step size eta = 2 eps per example; update z = P(x_k + eta sign(grad)),
      x_{k+1} = P(x_k + a (z - x_k) + (1 - a)(x_k - x_{k-1})) with a = 1 at the first
      iteration and `momentum` (0.75) afterwards, P the projection onto the eps-ball ∩ [0, 1]^d;
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

    clean_correct = jnp.argmax(logits_fn(x), axis=-1) == y
    t = jax.random.uniform(key, x.shape, x.dtype, -1.0, 1.0)
    t_max = jnp.max(jnp.abs(t).reshape(batch, -1), axis=1).reshape(bshape)
    x_start = jnp.clip(x + eps * t / (t_max + 1e-12), 0.0, 1.0)
    loss0, correct0, grad0 = loss_and_grad(x_start)

    def project(z):
        return project_linf(z, x, eps)

    def body(i, s):
        momentum_term = s["x_adv"] - s["x_old"]
        a = jnp.where(i > 0, momentum, 1.0)
        z = project(s["x_adv"] + s["step"].reshape(bshape) * jnp.sign(s["grad"]))
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
