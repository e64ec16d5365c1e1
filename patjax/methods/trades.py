"""TRADES (Zhang et al. 2019; yaodongyu/TRADES trades.py)."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from patjax.attacks import inner, l2
from patjax.attacks.logits import LogitsFn
from patjax.core.errors import UserError
from patjax.methods.common import AttackSettings, Method, TrainFn, accuracy, mean_ce, train_passes, uniform_weights


@dataclasses.dataclass(frozen=True)
class TradesSettings:
    """TRADES's own settings (config block `trades`); its attack's budget and steps are
    attack.epsilon and attack.steps, and under attack.norm 'l2' its step is the reference's
    2 eps / steps (step_size is the L-inf step)."""

    beta: float = 6.0  # yaodongyu/TRADES train_trades_cifar10.py
    step_size: float = 0.007  # ditto (AT-PR's reimplementation uses 2/255)
    init_noise: float = 0.001  # start x + 0.001 * N(0, 1)

    def __post_init__(self):
        if self.step_size < 0:
            raise UserError(f"trades.step_size must be >= 0, got {self.step_size}")
        if self.beta < 0:
            raise UserError(f"trades.beta must be >= 0, got {self.beta}")


def trades_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    attack: AttackSettings = AttackSettings(),
    trades: TradesSettings = TradesSettings(),
):
    """TRADES (yaodongyu/TRADES trades.py): mean CE(z(x), y) + beta * mean_i KL(p(x_i) || p(x_adv_i)),
    x_adv from `inner.trades_kl_attack` on `attack_fn` (the reference's model.eval(): running
    statistics), budget and steps attack.epsilon and attack.steps, its own step size and beta in
    `trades`; training-mode passes x, x_adv, x. The gradient flows through both arguments of the
    KL, as in the reference (its target softmax(model(x)) is not detached). (loss, (state, metrics))."""
    x_adv = inner.trades_kl_attack(
        attack_fn,
        key,
        x,
        eps=attack.epsilon,
        step_size=trades.step_size,
        steps=attack.steps,
        init_noise=trades.init_noise,
        norm=attack.norm,
    )
    (clean_logits, adv_logits, _), state = train_passes(train_fn, state, [x, x_adv, x])
    natural = mean_ce(clean_logits, y)
    robust = jnp.mean(inner.kl_from_clean_loss(adv_logits, jax.nn.softmax(clean_logits, axis=-1)))
    loss = natural + trades.beta * robust
    return loss, (
        state,
        {
            "loss": loss,
            "adv_accuracy": accuracy(adv_logits, y),
            "natural_loss": natural,
            "robust_loss": robust,
            **uniform_weights(y.shape[0]),
        },
    )


def trades_method(params, model, batch_stats, x, y, key, s):
    """TRADES: `trades_loss` with s.own, the attack's BatchNorm s.attack.bn_mode."""
    attack_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    return trades_loss(model.train_fn(params), attack_fn, key, x, y, state=batch_stats, attack=s.attack, trades=s.own)


# BatchNorm during the attack: running statistics, as yaodongyu/TRADES trades.py calls
# model.eval() before the attack and model.train() after it.
TRADES = Method(
    "trades", trades_method, "TRADES", settings=TradesSettings, attack_bn_mode="inference", attack_norms=l2.NORMS
)
