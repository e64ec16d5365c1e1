"""PGD adversarial training (Madry et al. 2018) and PGD-COR (Table 2: the PGD batch with the
PAT weights). The PGD batch is also the inner maximization of the logit-pairing baselines."""

from __future__ import annotations

from patjax.attacks import l2
from patjax.methods.common import Method, weighted_update
from patjax.models.networks import ModelFns


def pgd_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s):
    """PGD with a random start in the threat model's ball: L-inf, uniform (Madry et al.;
    MadryLab/cifar10_challenge), or L2 as torchattacks' PGDL2 (`attack.norm`)."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    attack = l2.PGD_BY_NORM[s.attack.norm]
    return attack(logits_fn, key, x, y, eps=s.attack.epsilon, step_size=s.attack.step_size, steps=s.attack.steps)


def pgd(params, model, batch_stats, x, y, key, s):
    """PGD adversarial training (Madry et al. 2018): mean CE(f(x_pgd), y)."""
    x_adv = pgd_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return weighted_update(params, model, batch_stats, x_adv, y, 0.0)


def pgd_cor(params, model, batch_stats, x, y, key, s):
    """PGD-COR (Table 2): the PGD batch with the PAT weights, sum_i w_i CE_i, beta = s.snis.beta."""
    x_adv = pgd_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return weighted_update(params, model, batch_stats, x_adv, y, s.snis.beta)


# BatchNorm during the attack: batch statistics, as MadryLab/cifar10_challenge builds the attack
# on the Model(mode='train') graph and wellzline/AT-PR runs pgd_loss in model.train(); both also
# update the running averages at every attack step, which is not reproduced here (see
# docs/baselines.md).
PGD = Method("pgd", pgd, "PGD", attack_bn_mode="train", attack_norms=l2.NORMS)
PGD_COR = Method("pgd_cor", pgd_cor, "PGD-COR", attack_bn_mode="train", attack_norms=l2.NORMS, weighted=True)
