"""FGSM adversarial training and FGSM-COR (Table 2: the FGSM batch with the PAT weights).

`fgsm_at_loss` is the objective as a pure function of two forwards (docs/api.md)."""

from __future__ import annotations

import dataclasses

import jax

from patjax.attacks import pgd as pgd_lib
from patjax.attacks.logits import LogitsFn
from patjax.methods.common import Method, TrainFn, check_beta, weighted_ce


@dataclasses.dataclass(frozen=True)
class FgsmSettings:
    """The FGSM step's own setting (config block `fgsm`), read by fgsm and fgsm_cor."""

    random_start: bool = False  # True: gradient at x + U(-eps, eps) as AT-PR's fgsm_loss


def fgsm_at_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    epsilon: float = 8 / 255,
    random_start: bool = False,
    beta: float = 0.0,
):
    """FGSM adversarial training: mean CE(f(x_fgsm), y), x_fgsm = x + epsilon sign(grad CE)
    (Goodfellow et al. 2015) on `attack_fn`; random_start: the gradient taken at a uniform point
    of the ball, as AT-PR's fgsm_loss (`key` is read only then). beta > 0 is FGSM-COR (Table 2),
    the PAT weights. (loss, (state, metrics))."""
    check_beta(beta)
    if random_start:
        x_adv = pgd_lib.fgsm_random_point(attack_fn, key, x, y, epsilon)
    else:
        x_adv = pgd_lib.fgsm(attack_fn, x, y, epsilon)
    return weighted_ce(train_fn, x_adv, y, beta, state)


def _fgsm(params, model, batch_stats, x, y, key, s, beta):
    return fgsm_at_loss(
        model.train_fn(params),
        model.attack_logits_fn(params, batch_stats, s.attack.bn_mode),
        key,
        x,
        y,
        state=batch_stats,
        epsilon=s.attack.epsilon,
        random_start=s.own.random_start,
        beta=beta,
    )


def fgsm(params, model, batch_stats, x, y, key, s):
    """FGSM adversarial training: `fgsm_at_loss`, mean CE(f(x_fgsm), y)."""
    return _fgsm(params, model, batch_stats, x, y, key, s, 0.0)


def fgsm_cor(params, model, batch_stats, x, y, key, s):
    """FGSM-COR (Table 2): the FGSM batch with the PAT weights, beta = s.snis.beta."""
    return _fgsm(params, model, batch_stats, x, y, key, s, s.snis.beta)


# BatchNorm during the attack: batch statistics, as wellzline/AT-PR attack_algorithms.py runs
# fgsm_loss in model.train() (it also updates the running averages at every attack step, which
# is not reproduced here; docs/baselines.md).
FGSM = Method("fgsm", fgsm, "FGSM", settings=FgsmSettings, attack_bn_mode="train")
FGSM_COR = Method(
    "fgsm_cor", fgsm_cor, "FGSM-COR", settings=FgsmSettings, block="fgsm", attack_bn_mode="train", weighted=True
)
