"""The training baselines' inner maximizations shared by their methods: TRADES's KL ascent and
MART's CE ascent (in L-inf pixel space, or in L2 through `attacks.l2`), and the signed ascent and
Gaussian start they share with AT-PR's search (`methods.atpr`).

Each is a pure function of a `logits_fn` (x -> logits, normalization inside the model), a PRNG
key and arrays, and returns points in the eps-ball around x intersected with [0, 1]^d, under
`stop_gradient`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn, log_or_zero
from patjax.attacks.pgd import cross_entropy_loss, input_gradient, project_linf


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
    norm: str = "linf",
) -> jax.Array:
    """The TRADES inner maximization (yaodongyu/TRADES trades.py): from x + init_noise * N(0, 1),
    ascent on KL(p(x) || p(x_adv)) with p(x) held fixed; distance='l_inf' (norm 'linf'): sign
    steps of step_size; distance='l_2' (norm 'l2'): `l2.trades_l2_ascent`, whose step the
    reference sets to 2 eps / steps (step_size is not read)."""
    clean_probs = jax.lax.stop_gradient(jax.nn.softmax(logits_fn(x), axis=-1))
    if norm == "l2":
        start = gaussian_start(key, x, init_noise)
        return l2.trades_l2_ascent(logits_fn, start, x, clean_probs, eps=eps, steps=steps, loss_fn=kl_from_clean_loss)
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
    norm: str = "linf",
) -> jax.Array:
    """The MART inner maximization (YisenWang/MART mart.py): CE ascent from x + init_noise * N(0, 1);
    norm 'linf': sign steps of step_size, the reference's only form. norm 'l2': the reference has
    none; mart.py is TRADES' trades.py with the loss changed, so its L2 form here is trades.py's
    distance='l_2' branch on the CE loss (`l2.trades_l2_ascent`: steps of 2 eps / steps, step_size
    not read), our inference from that lineage."""
    start = gaussian_start(key, x, init_noise)
    if norm == "l2":
        return l2.trades_l2_ascent(logits_fn, start, x, y, eps=eps, steps=steps, loss_fn=cross_entropy_loss)
    return sign_ascent(logits_fn, start, x, y, eps=eps, step_size=step_size, steps=steps)
