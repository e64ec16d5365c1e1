"""Layer 5, the training objectives ("methods"), registered by name: Algorithm 2 (PAT) and the baselines.
Imports `pat`, `attacks`, `models`, `data` and `core`.

A method is a pure function

    method(params, model, batch_stats, x, y, key, s) -> (loss, (new_batch_stats, metrics))

differentiated with respect to `params` by the train step, so the compiled step is the same
for every method and `--config.method=NAME` selects one. `model` is a `ModelFns` pair of
pure apply functions (inference mode / training mode); `s` is the run's `MethodSettings`
(static), built once from the config (`config.method_settings`); it checks every field.
`make_method(s)` is the loss the train step differentiates: (params, model, batch_stats, x, y, key).

Methods (docs/baselines.md): clean, fgsm, pgd, alp, clp, trades, mart, atpr (the
baselines of Table 1), pat, pat_wos (Algorithm 2 and its ablation), pgd_cor, fgsm_cor (PGD /
FGSM batches with the PAT weights, Table 2). Every method returns at least the metrics
'loss', 'adv_accuracy' (accuracy of the training-mode pass on the adversarial batch; on the
clean batch for `clean`), 'snis_weight_mean' and 'snis_weight_max' (1/B for methods
without importance weights).

Conventions shared by all methods:
- Inner attacks/samplers see the parameters under `stop_gradient`. BatchNorm during the
  sampler is `s.langevin_bn_mode` (inference by default, our choice where the paper is
  silent: each chain's energy then depends on its own image only; docs/design.md); during a
  baseline's attack it is `s.attack_bn_mode` (config `attack.bn_mode`, whose default 'auto'
  is the mode of that baseline's reference code, `REFERENCE_ATTACK_BN_MODE`). An attack never
  updates the running statistics.
- The outer loss runs the model in training mode: batch statistics normalize each pass,
  and the running statistics receive one momentum update per forward pass, in the order
  the reference code makes its passes (`train_passes`; e.g. TRADES: x, x_adv, x).
- Reductions over the batch are over the *global* batch: the step is written on global
  arrays, so under `jax.sharding` the SNIS softmax still normalizes over every example.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

from patjax.attacks import inner
from patjax.attacks import pgd as pgd_lib
from patjax.attacks.logits import log_or_zero, other_values, true_value
from patjax.core.errors import UserError, check_counts, count
from patjax.models.networks import BN_MODES, ModelFns
from patjax.pat import langevin as langevin_lib


@dataclasses.dataclass(frozen=True)
class MethodSettings:
    """A method and every setting it reads, typed and checked once.

    attack_*: the baselines' inner attack (config `attack`), attack_bn_mode already resolved
    for this method ('auto' is its reference code's mode); mart_beta resolved likewise."""

    name: str
    beta: float  # pat.beta, the SNIS smoothing of Eq. 2 (PAT, PGD-COR, FGSM-COR); 0 is PAT(WOS)
    langevin: langevin_lib.LangevinSettings  # Algorithm 1
    langevin_bn_mode: str
    attack_eps: float
    attack_step_size: float
    attack_steps: int = count("attack.steps", 0, 100_000)
    attack_bn_mode: str
    fgsm_random_start: bool
    trades_beta: float
    trades_step_size: float
    trades_init_noise: float
    mart_beta: float
    mart_step_size: float
    mart_init_noise: float
    alp_weight: float
    clp_weight: float
    atpr: inner.AtprSettings

    def __post_init__(self):
        """The one check of the methods' settings, wherever they come from."""
        if self.name not in METHODS:
            raise UserError(f"unknown method {self.name!r}; choose one of {sorted(METHODS)}")
        if self.beta < 0:
            raise UserError(f"pat.beta must be >= 0 (0 is PAT(WOS)), got {self.beta}")
        if self.langevin_bn_mode not in BN_MODES:
            raise UserError(f"langevin.bn_mode must be 'inference' or 'train', got {self.langevin_bn_mode!r}")
        if self.attack_bn_mode not in ("auto",) + BN_MODES:
            raise UserError(f"attack.bn_mode must be 'auto', 'inference' or 'train', got {self.attack_bn_mode!r}")
        check_counts(self)
        if self.attack_eps < 0 or self.attack_step_size < 0:
            raise UserError("attack.epsilon and attack.step_size must be >= 0")
        if self.trades_step_size < 0 or self.mart_step_size < 0:
            raise UserError("trades.step_size and mart.step_size must be >= 0")
        if self.trades_beta < 0:
            raise UserError(f"trades.beta must be >= 0, got {self.trades_beta}")


def make_method(s: MethodSettings) -> Callable[..., Any]:
    """The loss of method s.name with its settings: (params, model, batch_stats, x, y, key) ->
    (loss, (new_batch_stats, metrics)), what the train step differentiates."""
    return functools.partial(METHODS[s.name], s=s)


def snis_weights(losses: jax.Array, beta: float) -> jax.Array:
    """Self-normalized importance weights over the batch (Algorithm 2, lines 17-18; Eq. 2).

    w = softmax(Detach(-beta * l)): beta = 0 gives uniform weights (PAT(WOS)).
    """
    return jax.nn.softmax(jax.lax.stop_gradient(-beta * losses), axis=0)


def weighted_loss(losses: jax.Array, beta: float):
    """(sum_i w_i l_i, w) with the SNIS weights (Algorithm 2, line 19)."""
    weights = snis_weights(losses, beta)
    return jnp.sum(weights * losses), weights


def _accuracy(logits, y):
    return jnp.mean(jnp.argmax(logits, axis=-1) == y)


def _weighted_update(params, model: ModelFns, batch_stats, x_adv, y, beta):
    """Phase 2 of Algorithm 2 on a given adversarial batch."""
    logits, new_batch_stats = model.train(params, batch_stats, x_adv)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)  # line 16
    loss, weights = weighted_loss(losses, beta)
    metrics = {
        "loss": loss,
        "adv_accuracy": _accuracy(logits, y),
        "snis_weight_mean": jnp.mean(weights),
        "snis_weight_max": jnp.max(weights),
    }
    return loss, (new_batch_stats, metrics)


def langevin_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s: MethodSettings):
    """Phase 1 of Algorithm 2: (x_adv, steps each chain took) from the sampler, lines 7-14."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.langevin_bn_mode)
    return langevin_lib.langevin_sample_with_steps(logits_fn, key, x, y, s.langevin)


def _langevin_update(params, model, batch_stats, x, y, key, s, beta: float):
    x_adv, steps = langevin_adversarial_batch(params, model, batch_stats, x, y, key, s)
    loss, (new_batch_stats, metrics) = _weighted_update(params, model, batch_stats, x_adv, y, beta)
    # Gradient steps the sampler took per example (T unless langevin.tolerance ends chains early).
    return loss, (new_batch_stats, dict(metrics, langevin_steps=jnp.mean(steps.astype(jnp.float32))))


def pat(params, model, batch_stats, x, y, key, s):
    """PAT (Algorithm 2): Langevin samples, SNIS-weighted cross-entropy with beta = s.beta."""
    return _langevin_update(params, model, batch_stats, x, y, key, s, s.beta)


def pat_wos(params, model, batch_stats, x, y, key, s):
    """PAT(WOS), the ablation without the importance weight: beta = 0 (mean loss)."""
    return _langevin_update(params, model, batch_stats, x, y, key, s, 0.0)


# The methods whose inner maximization is Algorithm 1's sampler (BatchNorm there:
# `langevin_bn_mode`); those with an inner attack are the keys of `REFERENCE_ATTACK_BN_MODE`.
LANGEVIN_METHODS = ("pat", "pat_wos")


# ---------------------------------------------------------------------------------------
# Baselines (docs/baselines.md). Shared settings: s.attack_*; per method: s.fgsm_*, s.trades_*,
# s.mart_*, s.alp_weight, s.clp_weight, s.atpr.

# BatchNorm during the inner attack in each baseline's reference code:
# - 'train' (batch statistics): MadryLab/cifar10_challenge builds the attack on the
#   Model(mode='train') graph, and wellzline/AT-PR attack_algorithms.py runs pgd_loss,
#   fgsm_loss, ALP, CLP and PR in model.train(); both also update the running averages at
#   every attack step, which is not reproduced here (see docs/baselines.md).
# - 'inference': yaodongyu/TRADES trades.py and YisenWang/MART mart.py call model.eval()
#   before the attack and model.train() after it.
REFERENCE_ATTACK_BN_MODE = {
    "fgsm": "train",
    "fgsm_cor": "train",
    "pgd": "train",
    "pgd_cor": "train",
    "alp": "train",
    "clp": "train",
    "atpr": "train",
    "trades": "inference",
    "mart": "inference",
}


def train_passes(model: ModelFns, params, batch_stats, inputs):
    """Training-mode forward passes on `inputs` in order, as consecutive PyTorch calls under
    model.train(): each pass is normalized by its own batch statistics and makes one
    momentum update of the running statistics. Returns ([logits per input], new_batch_stats).
    Repeated inputs give identical logits; they are repeated for the statistics only."""
    all_logits = []
    for x in inputs:
        logits, batch_stats = model.train(params, batch_stats, x)
        all_logits.append(logits)
    return all_logits, batch_stats


def _mean_ce(logits, y):
    return jnp.mean(pgd_lib.cross_entropy_loss(logits, y))


def _uniform_weights(batch: int) -> dict:
    return {"snis_weight_mean": jnp.float32(1.0 / batch), "snis_weight_max": jnp.float32(1.0 / batch)}


def _safe_l2_norm(v):
    """Row-wise L2 norm whose gradient at 0 is 0 (torch.norm's backward), not NaN."""
    squared = jnp.sum(jnp.square(v), axis=-1)
    positive = squared > 0
    return jnp.where(positive, jnp.sqrt(jnp.where(positive, squared, 1.0)), 0.0)


def fgsm_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s: MethodSettings):
    """FGSM (Goodfellow et al. 2015) from x; s.fgsm_random_start: gradient at a uniform point
    of the ball, as AT-PR's fgsm_loss."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack_bn_mode)
    if s.fgsm_random_start:
        return pgd_lib.fgsm_random_point(logits_fn, key, x, y, s.attack_eps)
    return pgd_lib.fgsm(logits_fn, x, y, s.attack_eps)


def pgd_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s: MethodSettings):
    """L-inf PGD with a uniform random start (Madry et al.; MadryLab/cifar10_challenge)."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack_bn_mode)
    return pgd_lib.pgd(logits_fn, key, x, y, eps=s.attack_eps, step_size=s.attack_step_size, steps=s.attack_steps)


def clean(params, model, batch_stats, x, y, key, s):
    """Standard training: mean CE(f(x), y); adv_accuracy is the accuracy on the clean batch."""
    (logits,), new_batch_stats = train_passes(model, params, batch_stats, [x])
    loss = _mean_ce(logits, y)
    return loss, (new_batch_stats, {"loss": loss, "adv_accuracy": _accuracy(logits, y), **_uniform_weights(y.shape[0])})


def fgsm(params, model, batch_stats, x, y, key, s):
    """FGSM adversarial training: mean CE(f(x_fgsm), y)."""
    x_adv = fgsm_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return _weighted_update(params, model, batch_stats, x_adv, y, 0.0)


def pgd(params, model, batch_stats, x, y, key, s):
    """PGD adversarial training (Madry et al. 2018): mean CE(f(x_pgd), y)."""
    x_adv = pgd_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return _weighted_update(params, model, batch_stats, x_adv, y, 0.0)


def pgd_cor(params, model, batch_stats, x, y, key, s):
    """PGD-COR (Table 2): the PGD batch with the PAT weights, sum_i w_i CE_i, beta = s.beta."""
    x_adv = pgd_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return _weighted_update(params, model, batch_stats, x_adv, y, s.beta)


def fgsm_cor(params, model, batch_stats, x, y, key, s):
    """FGSM-COR (Table 2): the FGSM batch with the PAT weights, beta = s.beta."""
    x_adv = fgsm_adversarial_batch(params, model, batch_stats, x, y, key, s)
    return _weighted_update(params, model, batch_stats, x_adv, y, s.beta)


def _logit_pairing(params, model, batch_stats, x, y, key, s, weight, passes):
    """CE on the first pass + weight * mean_i ||z(x_pgd_i) - z(x_i)||_2, the passes
    ("adv": x_pgd, "clean": x) in the reference's order (BatchNorm sees them in that order)."""
    x_adv = pgd_adversarial_batch(params, model, batch_stats, x, y, key, s)
    logits, new_batch_stats = train_passes(model, params, batch_stats, [x_adv if p == "adv" else x for p in passes])
    adv_logits, clean_logits = logits[passes.index("adv")], logits[passes.index("clean")]
    ce = _mean_ce(logits[0], y)
    pairing = jnp.mean(_safe_l2_norm(adv_logits - clean_logits))
    loss = ce + weight * pairing
    return loss, (
        new_batch_stats,
        {
            "loss": loss,
            "adv_accuracy": _accuracy(adv_logits, y),
            "pairing_loss": pairing,
            **_uniform_weights(y.shape[0]),
        },
    )


def alp(params, model, batch_stats, x, y, key, s):
    """Adversarial logit pairing as in wellzline/AT-PR `ALP`:
    mean CE(z(x_pgd), y) + s.alp_weight * mean_i ||z(x_pgd_i) - z(x_i)||_2 (passes x_pgd, x_pgd, x)."""
    return _logit_pairing(params, model, batch_stats, x, y, key, s, s.alp_weight, ("adv", "adv", "clean"))


def clp(params, model, batch_stats, x, y, key, s):
    """Clean logit pairing as in wellzline/AT-PR `CLP`:
    mean CE(z(x), y) + s.clp_weight * mean_i ||z(x_pgd_i) - z(x_i)||_2 (passes x, x_pgd, x)."""
    return _logit_pairing(params, model, batch_stats, x, y, key, s, s.clp_weight, ("clean", "adv", "clean"))


def trades(params, model, batch_stats, x, y, key, s):
    """TRADES (yaodongyu/TRADES trades.py): mean CE(z(x), y) + beta * mean_i KL(p(x_i) || p(x_adv_i)),
    x_adv from `inner.trades_kl_attack`; passes x, x_adv, x. The gradient flows through both
    arguments of the KL, as in the reference (its target softmax(model(x)) is not detached)."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack_bn_mode)
    x_adv = inner.trades_kl_attack(
        logits_fn,
        key,
        x,
        eps=s.attack_eps,
        step_size=s.trades_step_size,
        steps=s.attack_steps,
        init_noise=s.trades_init_noise,
    )
    (clean_logits, adv_logits, _), new_batch_stats = train_passes(model, params, batch_stats, [x, x_adv, x])
    natural = _mean_ce(clean_logits, y)
    robust = jnp.mean(inner.kl_from_clean_loss(adv_logits, jax.nn.softmax(clean_logits, axis=-1)))
    loss = natural + s.trades_beta * robust
    return loss, (
        new_batch_stats,
        {
            "loss": loss,
            "adv_accuracy": _accuracy(adv_logits, y),
            "natural_loss": natural,
            "robust_loss": robust,
            **_uniform_weights(y.shape[0]),
        },
    )


def mart(params, model, batch_stats, x, y, key, s):
    """MART (YisenWang/MART mart.py), passes x, x_adv:
    mean_i [CE(z(x_adv_i), y_i) - log(1.0001 - p_{k_i}(x_adv_i) + 1e-12)]
      + beta * mean_i KL(p(x_i) || p(x_adv_i)) (1.0000001 - p_{y_i}(x_i)),
    k_i = argmax_{k != y_i} p_k(x_adv_i); log p(x_adv) is log(p + 1e-12) inside the KL, and the
    weight (1 - p_y(x)) is not detached, as in the reference. beta = s.mart_beta."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack_bn_mode)
    x_adv = inner.mart_attack(
        logits_fn,
        key,
        x,
        y,
        eps=s.attack_eps,
        step_size=s.mart_step_size,
        steps=s.attack_steps,
        init_noise=s.mart_init_noise,
    )
    (clean_logits, adv_logits), new_batch_stats = train_passes(model, params, batch_stats, [x, x_adv])
    adv_probs = jax.nn.softmax(adv_logits, axis=-1)
    runner_up_prob = true_value(adv_probs, jnp.argmax(other_values(adv_probs, y), axis=-1))
    boosted_ce = _mean_ce(adv_logits, y) + jnp.mean(-jnp.log(1.0001 - runner_up_prob + 1e-12))
    clean_probs = jax.nn.softmax(clean_logits, axis=-1)
    true_prob = true_value(clean_probs, y)
    kl = jnp.sum(clean_probs * (log_or_zero(clean_probs) - jnp.log(adv_probs + 1e-12)), axis=-1)
    robust = jnp.mean(kl * (1.0000001 - true_prob))
    loss = boosted_ce + s.mart_beta * robust
    return loss, (
        new_batch_stats,
        {
            "loss": loss,
            "adv_accuracy": _accuracy(adv_logits, y),
            "boosted_ce": boosted_ce,
            "robust_loss": robust,
            **_uniform_weights(y.shape[0]),
        },
    )


def atpr(params, model, batch_stats, x, y, key, s):
    """AT-PR (wellzline/AT-PR `PR`): mean CE(f(x_sel), y), x_sel from `inner.atpr_search`."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack_bn_mode)
    result = inner.atpr_search(logits_fn, key, x, y, s.atpr)
    loss, (new_batch_stats, metrics) = _weighted_update(params, model, batch_stats, result.x_adv, y, 0.0)
    metrics = dict(
        metrics,
        atpr_pgd_fraction=jnp.mean(result.choice == 0),
        atpr_refine_iters=jnp.mean(result.refine_iters.astype(jnp.float32)),
    )
    return loss, (new_batch_stats, metrics)


METHODS: dict[str, Callable[..., Any]] = {
    "clean": clean,
    "fgsm": fgsm,
    "pgd": pgd,
    "alp": alp,
    "clp": clp,
    "trades": trades,
    "mart": mart,
    "atpr": atpr,
    "pat": pat,
    "pat_wos": pat_wos,
    "pgd_cor": pgd_cor,
    "fgsm_cor": fgsm_cor,
}


# The paper's row order (Table 1, then the ablation variants of Table 2) and names.
METHOD_ORDER = ("clean", "fgsm", "fgsm_cor", "pgd", "pgd_cor", "alp", "clp", "trades", "mart", "atpr", "pat_wos", "pat")
DISPLAY_NAMES = {
    "clean": "Clean",
    "fgsm": "FGSM",
    "fgsm_cor": "FGSM-COR",
    "pgd": "PGD",
    "pgd_cor": "PGD-COR",
    "alp": "ALP",
    "clp": "CLP",
    "trades": "TRADES",
    "mart": "MART",
    "atpr": "AT-PR",
    "pat_wos": "PAT(WOS)",
    "pat": "PAT",
}


def ordered(methods):
    """Methods in the paper's order (unknown names last, alphabetically)."""
    return sorted(methods, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
