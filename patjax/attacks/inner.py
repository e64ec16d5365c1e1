"""The training baselines' inner maximizations: TRADES's KL ascent and MART's CE ascent (in L-inf
pixel space, or in L2 through `attacks.l2`), and AT-PR's L-inf search over randomized PGDs with
its refinement.

Each is a pure function of a `logits_fn` (x -> logits, normalization inside the model), a PRNG
key and arrays, and returns points in the eps-ball around x intersected with [0, 1]^d, under
`stop_gradient`.
"""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn, log_or_zero
from patjax.attacks.pgd import cross_entropy_loss, input_gradient, project_linf
from patjax.core.errors import UserError, check_counts, count


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


@dataclasses.dataclass(frozen=True)
class AtprSearchSettings:
    """How the AT-PR search draws and picks its candidates (wellzline/AT-PR attack_algorithms.py
    `PR` and `pick_best_ae`; the config block `atpr`), checked once.

    The search keeps every candidate's batch (`AtprResult.candidates`): 1,000 candidates are 100
    times the reference's and 3 GB at batch 256 on CIFAR; the step counts' bound is 10,000 times
    the reference's."""

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


@dataclasses.dataclass(frozen=True)
class AtprSettings(AtprSearchSettings):
    """The AT-PR search around its standard PGD (eps, alpha, steps; the baselines' `attack` block
    in training), checked once."""

    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = count("attack.steps", 0, 100_000, default=10)

    def __post_init__(self):
        super().__post_init__()
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
