"""MART (Wang et al. 2020; YisenWang/MART mart.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from patjax.attacks import inner, l2
from patjax.attacks.logits import LogitsFn, log_or_zero, other_values, true_value
from patjax.core.errors import UserError
from patjax.methods.common import (
    AttackSettings,
    Method,
    Resolution,
    TrainFn,
    accuracy,
    mean_ce,
    train_passes,
    uniform_weights,
)


@dataclasses.dataclass(frozen=True)
class MartSettings:
    """MART's own settings (config block `mart`); its attack's budget, steps and threat model are
    attack.epsilon, attack.steps and attack.norm (step_size is the L-inf step; under L2 the step
    is 2 eps / steps, `inner.mart_attack`)."""

    # < 0: the reference's for the run's model (`resolve`); a method is handed it resolved.
    beta: float = -1.0
    step_size: float = 0.007  # YisenWang/MART train_*.py (AT-PR's reimplementation: 2/255)
    init_noise: float = 0.001

    def __post_init__(self):
        if self.step_size < 0:
            raise UserError(f"mart.step_size must be >= 0, got {self.step_size}")

    @classmethod
    def resolve(cls, fields: dict, r: Resolution) -> MartSettings:
        """beta < 0: 5 for ResNet-18 (MART train_resnet.py, AT-PR's mart_loss), 6 otherwise (MART
        train_wideresnet.py, mart.py's default)."""
        if fields["beta"] < 0:
            fields = dict(fields, beta=5.0 if r.model == "resnet18" else 6.0)
        return cls(**fields)


def mart_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    attack: AttackSettings = AttackSettings(),
    mart: MartSettings = MartSettings(beta=6.0),
):
    """MART (YisenWang/MART mart.py), training-mode passes x, x_adv:
    mean_i [CE(z(x_adv_i), y_i) - log(1.0001 - p_{k_i}(x_adv_i) + 1e-12)]
      + beta * mean_i KL(p(x_i) || p(x_adv_i)) (1.0000001 - p_{y_i}(x_i)),
    k_i = argmax_{k != y_i} p_k(x_adv_i); log p(x_adv) is log(p + 1e-12) inside the KL, and the
    weight (1 - p_y(x)) is not detached, as in the reference. x_adv from `inner.mart_attack` on
    `attack_fn`; beta = mart.beta (6, mart.py's default; the reference's ResNet-18 uses 5).
    (loss, (state, metrics))."""
    if mart.beta < 0:
        raise UserError(f"mart.beta must be >= 0 here (5 for ResNet-18, 6 otherwise in the reference), got {mart.beta}")
    x_adv = inner.mart_attack(
        attack_fn,
        key,
        x,
        y,
        eps=attack.epsilon,
        step_size=mart.step_size,
        steps=attack.steps,
        init_noise=mart.init_noise,
        norm=attack.norm,
    )
    (clean_logits, adv_logits), state = train_passes(train_fn, state, [x, x_adv])
    adv_probs = jax.nn.softmax(adv_logits, axis=-1)
    runner_up_prob = true_value(adv_probs, jnp.argmax(other_values(adv_probs, y), axis=-1))
    boosted_ce = mean_ce(adv_logits, y) + jnp.mean(-jnp.log(1.0001 - runner_up_prob + 1e-12))
    clean_probs = jax.nn.softmax(clean_logits, axis=-1)
    true_prob = true_value(clean_probs, y)
    kl = jnp.sum(clean_probs * (log_or_zero(clean_probs) - jnp.log(adv_probs + 1e-12)), axis=-1)
    robust = jnp.mean(kl * (1.0000001 - true_prob))
    loss = boosted_ce + mart.beta * robust
    return loss, (
        state,
        {
            "loss": loss,
            "adv_accuracy": accuracy(adv_logits, y),
            "boosted_ce": boosted_ce,
            "robust_loss": robust,
            **uniform_weights(y.shape[0]),
        },
    )


def mart_method(params, model, batch_stats, x, y, key, s):
    """MART: `mart_loss` with s.own (beta resolved for the run's model), the attack's BatchNorm
    s.attack.bn_mode."""
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return mart_loss(model.train_fn(params), attack_fn, key, x, y, state=batch_stats, attack=s.attack, mart=s.own)


# BatchNorm during the attack: running statistics, as YisenWang/MART mart.py calls model.eval()
# before the attack and model.train() after it.
MART = Method("mart", mart_method, "MART", settings=MartSettings, attack_bn_mode="inference", attack_norms=l2.NORMS)
