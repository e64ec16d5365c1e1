"""PGD adversarial training (Madry et al. 2018) and PGD-COR (Table 2: the PGD batch with the
PAT weights). The PGD batch is also the inner maximization of the logit-pairing baselines.

`pgd_at_loss` is the objective as a pure function of two forwards (docs/api.md); the registered
methods call it with the forwards of patjax's networks."""

from __future__ import annotations

import jax

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn
from patjax.methods.common import AttackSettings, Method, TrainFn, check_beta, weighted_ce
from patjax.models.networks import ModelFns


def pgd_batch(attack_fn: LogitsFn, key: jax.Array, x: jax.Array, y: jax.Array, attack: AttackSettings) -> jax.Array:
    """PGD with a random start in the threat model's ball: L-inf, uniform (Madry et al.;
    MadryLab/cifar10_challenge), or L2 as torchattacks' PGDL2 (`attack.norm`)."""
    pgd = l2.PGD_BY_NORM[attack.norm]
    return pgd(attack_fn, key, x, y, eps=attack.epsilon, step_size=attack.step_size, steps=attack.steps)


def pgd_at_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    attack: AttackSettings = AttackSettings(),
    beta: float = 0.0,
):
    """PGD adversarial training (Madry et al. 2018): mean CE(f(x_pgd), y), x_pgd the PGD of
    `attack` (Appendix E: 10 steps of 2/255 in the L-inf ball of 8/255) on `attack_fn`.
    beta > 0 is PGD-COR (Table 2): sum_i w_i CE_i with PAT's SNIS weights (Eq. 2).
    (loss, (state, metrics)); `attack.bn_mode` is how patjax's loop builds `attack_fn` (batch
    statistics for PGD, as MadryLab/cifar10_challenge) and is not read here."""
    check_beta(beta)
    x_adv = pgd_batch(attack_fn, key, x, y, attack)
    return weighted_ce(train_fn, x_adv, y, beta, state)


def pgd_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s):
    """`pgd_batch` with a run's model and settings (BatchNorm as s.attack.bn_mode)."""
    return pgd_batch(model.attack_logits_fn(params, batch_stats, s.attack.bn_mode), key, x, y, s.attack)


def _pgd(params, model, batch_stats, x, y, key, s, beta):
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return pgd_at_loss(model.train_fn(params), attack_fn, key, x, y, state=batch_stats, attack=s.attack, beta=beta)


def pgd(params, model, batch_stats, x, y, key, s):
    """PGD adversarial training (Madry et al. 2018): `pgd_at_loss`, mean CE(f(x_pgd), y)."""
    return _pgd(params, model, batch_stats, x, y, key, s, 0.0)


def pgd_cor(params, model, batch_stats, x, y, key, s):
    """PGD-COR (Table 2): the PGD batch with the PAT weights, sum_i w_i CE_i, beta = s.snis.beta."""
    return _pgd(params, model, batch_stats, x, y, key, s, s.snis.beta)


# BatchNorm during the attack: batch statistics, as MadryLab/cifar10_challenge builds the attack
# on the Model(mode='train') graph and wellzline/AT-PR runs pgd_loss in model.train(); both also
# update the running averages at every attack step, which is not reproduced here (see
# docs/baselines.md).
PGD = Method("pgd", pgd, "PGD", attack_bn_mode="train", attack_norms=l2.NORMS)
PGD_COR = Method("pgd_cor", pgd_cor, "PGD-COR", attack_bn_mode="train", attack_norms=l2.NORMS, weighted=True)
