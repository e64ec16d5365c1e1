"""The logit-pairing baselines of wellzline/AT-PR: ALP (adversarial) and CLP (clean), on the PGD
batch. `alp_loss` and `clp_loss` are the objectives as pure functions of two forwards
(docs/api.md); the registered methods call them with the forwards of patjax's networks."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn
from patjax.methods.common import AttackSettings, Method, TrainFn, accuracy, mean_ce, train_passes, uniform_weights
from patjax.methods.pgd import pgd_batch


@dataclasses.dataclass(frozen=True)
class AlpSettings:
    """ALP's own setting (config block `alp`)."""

    weight: float = 0.01  # wellzline/AT-PR ALP: CE(adv) + 0.01 mean ||z_adv - z||_2


@dataclasses.dataclass(frozen=True)
class ClpSettings:
    """CLP's own setting (config block `clp`)."""

    weight: float = 0.3  # wellzline/AT-PR CLP: CE(clean) + 0.3 mean ||z_adv - z||_2


def _safe_l2_norm(v):
    """Row-wise L2 norm whose gradient at 0 is 0 (torch.norm's backward), not NaN."""
    squared = jnp.sum(jnp.square(v), axis=-1)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def _logit_pairing(train_fn, attack_fn, key, x, y, state, attack, weight, passes):
    """CE on the first pass + weight * mean_i ||z(x_pgd_i) - z(x_i)||_2, the passes
    ("adv": x_pgd, "clean": x) in the reference's order (BatchNorm sees them in that order)."""
    x_adv = pgd_batch(attack_fn, key, x, y, attack)
    logits, state = train_passes(train_fn, state, [x_adv if p == "adv" else x for p in passes])
    adv_logits, clean_logits = logits[passes.index("adv")], logits[passes.index("clean")]
    ce = mean_ce(logits[0], y)
    pairing = jnp.mean(_safe_l2_norm(adv_logits - clean_logits))
    loss = ce + weight * pairing
    return loss, (
        state,
        {
            "loss": loss,
            "adv_accuracy": accuracy(adv_logits, y),
            "pairing_loss": pairing,
            **uniform_weights(y.shape[0]),
        },
    )


def alp_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    attack: AttackSettings = AttackSettings(),
    weight: float = AlpSettings.weight,
):
    """Adversarial logit pairing as in wellzline/AT-PR `ALP`: mean CE(z(x_pgd), y)
    + weight * mean_i ||z(x_pgd_i) - z(x_i)||_2, x_pgd `attack`'s PGD on `attack_fn`;
    training-mode passes x_pgd, x_pgd, x (the reference's order). (loss, (state, metrics))."""
    return _logit_pairing(train_fn, attack_fn, key, x, y, state, attack, weight, ("adv", "adv", "clean"))


def clp_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    attack: AttackSettings = AttackSettings(),
    weight: float = ClpSettings.weight,
):
    """Clean logit pairing as in wellzline/AT-PR `CLP`: mean CE(z(x), y)
    + weight * mean_i ||z(x_pgd_i) - z(x_i)||_2; passes x, x_pgd, x. (loss, (state, metrics))."""
    return _logit_pairing(train_fn, attack_fn, key, x, y, state, attack, weight, ("clean", "adv", "clean"))


def alp(params, model, batch_stats, x, y, key, s):
    """ALP: `alp_loss` with weight s.own.weight."""
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return alp_loss(
        model.train_fn(params), attack_fn, key, x, y, state=batch_stats, attack=s.attack, weight=s.own.weight
    )


def clp(params, model, batch_stats, x, y, key, s):
    """CLP: `clp_loss` with weight s.own.weight."""
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return clp_loss(
        model.train_fn(params), attack_fn, key, x, y, state=batch_stats, attack=s.attack, weight=s.own.weight
    )


# BatchNorm during the attack: batch statistics, as wellzline/AT-PR attack_algorithms.py runs
# ALP and CLP in model.train() (it also updates the running averages at every attack step, which
# is not reproduced here; docs/baselines.md).
ALP = Method("alp", alp, "ALP", settings=AlpSettings, attack_bn_mode="train", attack_norms=l2.NORMS)
CLP = Method("clp", clp, "CLP", settings=ClpSettings, attack_bn_mode="train", attack_norms=l2.NORMS)
