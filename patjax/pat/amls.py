"""log P(violation) far below 1/N by adaptive multilevel splitting (AMLS), as Webb, Rainforth, Teh
and Kumar define it ("A Statistical Approach to Assessing Neural Network Robustness", ICLR 2019,
Algorithm 1; their code: oval-group/statistical-robustness, `multilevel_uniform`).

The property is the paper's margin s(x') = max_{j != y} z_j(x') - z_y(x') (Sec. 2.3), a violation
being s >= 0, and x' is drawn from one of PR's laws of eps (`patjax.pat.laws`) through its own
sampler: x' = law.perturb(x, eps, v) with v the law's base noise. AMLS runs in the space of v,
where the prior is the base noise's (U[0,1]^d for 'uniform', N(0, I) for 'gaussian'), so the
estimate is of exactly the probability PR estimates by sampling, clipping included.

Per level (Webb et al.'s loop): the level L_k is the (1 - rho) quantile of the particles' s,
capped at 0 (and set to 0 where it did not move, their stall rule); log p accumulates
log(#{s >= L_k} / N); the particles below the level are replaced by copies of uniformly chosen
survivors; then every particle takes `mh_steps` Metropolis-Hastings steps that keep the prior
invariant and reject a move below L_k, and each chain's proposal width is adapted to its
acceptance rate (x1.02 above, x0.5 below 0.124, their constants). The loop ends when L_k = 0
(the estimate), when no particle survives (p-hat = 0), when the running estimate falls below
10^-depth (censored: P(violation) <= P(s >= L_k), estimated below the depth), or after
`max_levels` levels (not reached: no estimate).

The uniform law's kernel is Webb et al.'s: a uniform proposal of half-width w (in pixel units,
starting at eps / 30) around each coordinate, truncated to the law's support, with its Hastings
correction. The Gaussian law's is the preconditioned Crank-Nicolson move v' = sqrt(1 - b^2) v + b xi,
reversible for N(0, I) (Cotter et al. 2013; its acceptance is the level's check alone), with
b = min(w / eps, 1) starting at 0.3 and adapted by the same rule: Webb et al. treat the uniform law
only, and b = 1/30 (their start) leaves the chains unmixed (tests/pat/test_amls.py measured 1e-27
for a 1e-20 event with 20 MH steps a level, 1e-20 from b = 0.3). Webb et al.'s eps / 30 needs
their 100 MH steps a level: with 20 the uniform kernel too reads a 1e-20 event as 1e-24 there, and
starting at 0.3 eps as 1e-20 (`initial_width`).

Everything is one `lax.while_loop` over levels with a `lax.fori_loop` of MH steps inside, pure in
(key, x, label), vmapped over images by the caller.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import jax
import jax.numpy as jnp

from patjax.attacks.logits import LogitsFn, margin
from patjax.pat.laws import gaussian, uniform

LAWS = ("uniform", "gaussian")  # the laws of eps with an MH kernel here

# Webb et al.'s constants (multilevel_uniform): the proposal starts at eps / 30 (the uniform law's
# kernel; the Gaussian's starts at 0.3 eps, see the module's docstring), and after each
# level a chain whose acceptance rate over its MH steps exceeds 0.124 widens by 1.02, one below
# it halves. (Their target_acc_ratio = 0.9, max_width_proposal and min_width_proposal are
# defined there but unused; so here.)
INITIAL_WIDTH = {"uniform": 1 / 30, "gaussian": 0.3}  # in units of eps
ACCEPTANCE_TARGET = 0.124
WIDEN, NARROW = 1.02, 0.5

# How each image's loop ended.
REACHED = 0  # the level reached 0: log_p is the AMLS estimate
DIED_OUT = 1  # no particle at or above the level: p-hat = 0, log_p = -inf
CENSORED = 2  # the running estimate fell below 10^-depth: P(violation) < 10^-depth, not estimated
NOT_REACHED = 3  # max_levels levels ran out first: no estimate (log_p is the last running value)
OUTCOMES = ("reached", "died_out", "censored", "not_reached")


def reachable_depth(rho: float, particles: int, max_levels: int) -> float:
    """The largest -log10 p that `max_levels` levels can reach: each level keeps at least
    N - floor((1 - rho) N) particles, so the estimate falls by at most log10 of N over that
    per level."""
    kept = particles - math.floor((1 - rho) * particles)
    return max_levels * math.log10(particles / kept)


def log_bias(rho: float, particles: int, log10_p: float) -> float:
    """E[log10 p-hat] - log10 p to first order, for the idealized AMLS (independent particles at each
    level): its relative variance is n (1 - rho) / (rho N) with n = ln p / ln rho levels
    (Cerou and Guyader 2007), and E[ln p-hat] ~ ln p - var / 2. Negative: p-hat is unbiased, its log is not."""
    levels = log10_p / math.log10(rho)
    return -levels * (1 - rho) / (rho * particles) / 2 / math.log(10)


def log_sd(rho: float, particles: int, log10_p: float) -> float:
    """The idealized AMLS's standard deviation of log10 p-hat (`log_bias`'s variance, first order)."""
    levels = log10_p / math.log10(rho)
    return math.sqrt(levels * (1 - rho) / (rho * particles)) / math.log(10)


class _Kernel(NamedTuple):
    prior: callable  # (key, (N, *shape)) -> base noise
    perturb: callable  # (x, eps, v) -> x'
    propose: callable  # (key, v, w, x, eps) -> (v', log Hastings ratio)


def _uniform_propose(key, v, w, x, eps):
    # Webb et al.'s proposal: U[x' - w, x' + w] intersected with the law's box [lo, hi] per pixel,
    # in pixel units; in u = (x' - lo) / (hi - lo) that is a half-width w / (hi - lo) within [0, 1].
    # The prior is flat on the box, so the acceptance ratio is the two truncated proposals'
    # density ratio: prod of the forward interval's length over the reverse one's.
    lo, hi = jnp.maximum(x - eps, 0.0), jnp.minimum(x + eps, 1.0)
    half = w.reshape((-1,) + (1,) * (v.ndim - 1)) / (hi - lo)
    a, b = jnp.maximum(v - half, 0.0), jnp.minimum(v + half, 1.0)
    proposal = a + (b - a) * jax.random.uniform(key, v.shape)
    a2, b2 = jnp.maximum(proposal - half, 0.0), jnp.minimum(proposal + half, 1.0)
    log_ratio = jnp.sum((jnp.log(b - a) - jnp.log(b2 - a2)).reshape(v.shape[0], -1), axis=-1)
    return proposal, log_ratio


def _gaussian_propose(key, v, w, x, eps):
    # pCN: reversible with respect to N(0, I), so the Hastings ratio is 1.
    beta = jnp.minimum(w / eps, 1.0).reshape((-1,) + (1,) * (v.ndim - 1))
    return jnp.sqrt(1 - beta**2) * v + beta * jax.random.normal(key, v.shape), jnp.zeros(v.shape[0])


KERNELS = {
    "uniform": _Kernel(lambda k, shape: uniform.noise(k, shape), uniform.perturb, _uniform_propose),
    "gaussian": _Kernel(lambda k, shape: gaussian.noise(k, shape), gaussian.perturb, _gaussian_propose),
}


class Estimate(NamedTuple):
    log10_p: jax.Array  # the estimate of log10 P(violation); see `outcome`
    outcome: jax.Array  # REACHED, DIED_OUT, CENSORED or NOT_REACHED
    levels: jax.Array  # levels used (the last one is L = 0 when REACHED)
    acceptance: jax.Array  # the mean MH acceptance rate over chains and levels


def amls(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    label: jax.Array,
    eps,
    law: str,
    *,
    rho: float,
    particles: int,
    mh_steps: int,
    max_levels: int,
    depth: float,
    initial_width: float | None = None,
) -> Estimate:
    """AMLS's estimate of log10 P(s(x') >= 0) for one image x (H, W, C) in [0, 1] with its label,
    x' from the law `law` at radius eps; `logits_fn` maps (N, H, W, C) to (N, classes).
    initial_width: the proposal's starting width in units of eps (None: `INITIAL_WIDTH[law]`)."""
    kernel = KERNELS[law]
    n = particles
    quantile = math.floor((1 - rho) * n)  # Webb et al.'s index into the sorted property
    floor_ln = -depth * math.log(10)
    labels = jnp.full((n,), label)

    def prop(v):
        return margin(logits_fn(kernel.perturb(x[None], eps, v)), labels)

    key, k0 = jax.random.split(key)
    v0 = kernel.prior(k0, (n, *x.shape))
    init = dict(
        level=jnp.int32(0),
        v=v0,
        s=prop(v0),
        w=jnp.full((n,), (initial_width or INITIAL_WIDTH[law]) * eps, jnp.float32),
        log_p=jnp.float32(0.0),
        previous=jnp.float32(-jnp.inf),
        outcome=jnp.int32(NOT_REACHED),
        done=jnp.bool_(False),
        accepted=jnp.float32(0.0),
        key=key,
    )

    def body(c):
        level = jnp.minimum(jnp.sort(c["s"])[quantile], 0.0)
        level = jnp.where(level == c["previous"], 0.0, level)  # Webb et al.'s stall rule
        keep = c["s"] >= level
        kept = jnp.sum(keep)
        log_p = c["log_p"] + jnp.log(kept.astype(jnp.float32)) - math.log(n)
        outcome = jnp.select(
            [kept == 0, level >= 0, log_p < floor_ln], [DIED_OUT, REACHED, CENSORED], c["outcome"]
        ).astype(jnp.int32)
        done = outcome != NOT_REACHED

        # Resample: each killed particle becomes a copy of a survivor chosen uniformly.
        key, k_pick, k_mh = jax.random.split(c["key"], 3)
        survivors = jnp.argsort(~keep, stable=True)  # survivors' indices first
        pick = survivors[jax.random.randint(k_pick, (n,), 0, jnp.maximum(kept, 1))]
        source = jnp.where(keep, jnp.arange(n), pick)
        v, s, w = c["v"][source], c["s"][source], c["w"][source]

        def mh(i, state):
            v, s, hits = state
            k_prop, k_acc = jax.random.split(jax.random.fold_in(k_mh, i))
            proposal, log_ratio = kernel.propose(k_prop, v, w, x, eps)
            s_new = prop(proposal)
            accept = (jnp.log(jax.random.uniform(k_acc, (n,))) <= jnp.minimum(log_ratio, 0.0)) & (s_new >= level)
            v = jnp.where(accept.reshape((-1,) + (1,) * x.ndim), proposal, v)
            return v, jnp.where(accept, s_new, s), hits + accept

        v, s, hits = jax.lax.fori_loop(0, mh_steps, mh, (v, s, jnp.zeros((n,), jnp.float32)))
        rate = hits / mh_steps
        w = jnp.where(rate > ACCEPTANCE_TARGET, w * WIDEN, jnp.where(rate < ACCEPTANCE_TARGET, w * NARROW, w))
        moved = dict(v=v, s=s, w=w, previous=level, accepted=c["accepted"] + jnp.mean(rate))
        stay = {k: c[k] for k in moved}
        new = jax.tree.map(lambda a, b: jnp.where(done, a, b), stay, moved)
        return dict(new, level=c["level"] + 1, log_p=log_p, outcome=outcome, done=done, key=key)

    out = jax.lax.while_loop(lambda c: ~c["done"] & (c["level"] < max_levels), body, init)
    log10_p = jnp.where(out["outcome"] == DIED_OUT, -jnp.inf, out["log_p"] / math.log(10))
    mh_levels = jnp.maximum(out["level"] - jnp.where(out["done"], 1, 0), 1)
    return Estimate(log10_p, out["outcome"], out["level"], out["accepted"] / mh_levels)
