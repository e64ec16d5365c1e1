"""FGSM adversarial training and FGSM-COR (Table 2: the FGSM batch with the PAT weights)."""

from __future__ import annotations

import dataclasses

from patjax.attacks import pgd as pgd_lib
from patjax.methods.common import Method, weighted_update
from patjax.models.networks import ModelFns


@dataclasses.dataclass(frozen=True)
class FgsmSettings:
    """The FGSM step's own setting (config block `fgsm`), read by fgsm and fgsm_cor."""

    random_start: bool = False  # True: gradient at x + U(-eps, eps) as AT-PR's fgsm_loss


def fgsm_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s):
    """FGSM (Goodfellow et al. 2015) from x; s.own.random_start: gradient at a uniform point
    of the ball, as AT-PR's fgsm_loss."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    if s.own.random_start:
        return pgd_lib.fgsm_random_point(logits_fn, key, x, y, s.attack.epsilon)
    return pgd_lib.fgsm(logits_fn, x, y, s.attack.epsilon)


def fgsm(params, model, batch_stats, x, y, key, s):
    """FGSM adversarial training: mean CE(f(x_fgsm), y)."""
    x_adv = fgsm_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return weighted_update(params, model, batch_stats, x_adv, y, 0.0)


def fgsm_cor(params, model, batch_stats, x, y, key, s):
    """FGSM-COR (Table 2): the FGSM batch with the PAT weights, beta = s.snis.beta."""
    x_adv = fgsm_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return weighted_update(params, model, batch_stats, x_adv, y, s.snis.beta)


# BatchNorm during the attack: batch statistics, as wellzline/AT-PR attack_algorithms.py runs
# fgsm_loss in model.train() (it also updates the running averages at every attack step, which
# is not reproduced here; docs/baselines.md).
FGSM = Method("fgsm", fgsm, "FGSM", settings=FgsmSettings, attack_bn_mode="train")
FGSM_COR = Method(
    "fgsm_cor", fgsm_cor, "FGSM-COR", settings=FgsmSettings, block="fgsm", attack_bn_mode="train", weighted=True
)
