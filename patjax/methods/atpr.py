"""AT-PR (wellzline/AT-PR `PR`): training on the candidate of a randomized PGD search that its
refinement moves farthest. The search (attack_algorithms.py `PR` and `pick_best_ae`) is AT-PR's
alone, so it lives here with its settings; the signed ascent it runs is `attacks.inner`'s."""

from __future__ import annotations

import dataclasses
from typing import NamedTuple

import jax
import jax.numpy as jnp

from patjax.attacks.inner import sign_ascent
from patjax.attacks.logits import LogitsFn
from patjax.attacks.pgd import cross_entropy_loss, project_linf
from patjax.core.errors import UserError, check_counts, count
from patjax.methods.common import Method, Resolution, TrainFn, weighted_ce


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

    @classmethod
    def resolve(cls, fields: dict, r: Resolution) -> AtprSettings:
        """The search around the baselines' standard PGD: eps, alpha and steps of the `attack`
        block, as AT-PR's run.sh hands `PR` the PGD it trains the other baselines with."""
        a = r.blocks["attack"]
        return AtprSettings(eps=a.epsilon, step_size=a.step_size, steps=a.steps, **fields)


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


def atpr_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    search: AtprSettings = AtprSettings(),
):
    """AT-PR (wellzline/AT-PR `PR`): mean CE(f(x_sel), y), x_sel from `atpr_search` on
    `attack_fn` (the reference runs it in model.train(): batch statistics) around the standard
    PGD of `search` (eps, step_size, steps). (loss, (state, metrics)) with atpr_pgd_fraction (how
    often the standard PGD was kept) and atpr_refine_iters."""
    result = atpr_search(attack_fn, key, x, y, search)
    loss, (state, metrics) = weighted_ce(train_fn, result.x_adv, y, 0.0, state)
    metrics = dict(
        metrics,
        atpr_pgd_fraction=jnp.mean(result.choice == 0),
        atpr_refine_iters=jnp.mean(result.refine_iters.astype(jnp.float32)),
    )
    return loss, (state, metrics)


def atpr(params, model, batch_stats, x, y, key, s):
    """AT-PR: `atpr_loss` with s.own, the config block `atpr` completed with the standard PGD of
    the `attack` block (`AtprSettings`, `AtprSearchSettings.resolve`)."""
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return atpr_loss(model.train_fn(params), attack_fn, key, x, y, state=batch_stats, search=s.own)


# BatchNorm during the attack: batch statistics, as wellzline/AT-PR attack_algorithms.py runs PR
# in model.train() (it also updates the running averages at every attack step, which is not
# reproduced here; docs/baselines.md).
ATPR = Method("atpr", atpr, "AT-PR", settings=AtprSearchSettings, attack_bn_mode="train")
