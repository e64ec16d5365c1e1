"""PAT (Algorithm 2) and PAT(WOS), its ablation without the importance weights (Table 2).

`pat_loss` and `pat_wos_loss` are the objectives as pure functions of two forwards (a user's own
train step calls them; docs/api.md); the registered methods `pat` and `pat_wos` call them with
the forwards of patjax's networks.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from patjax.attacks.logits import LogitsFn
from patjax.methods.common import Method, SnisSettings, TrainFn, check_beta, weighted_ce
from patjax.models.networks import ModelFns
from patjax.pat import langevin as langevin_lib


def pat_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    sampler: langevin_lib.LangevinSettings = langevin_lib.LangevinSettings(),
    beta: float = SnisSettings.beta,
):
    """PAT's loss, Algorithm 2 on one batch: (loss, (state, metrics)).

    Phase 1 (lines 7-14): x_adv from Algorithm 1's sampler on `attack_fn` (x -> logits, the
    model as the inner problem sees it: patjax's loop uses BatchNorm's running statistics),
    under stop_gradient. Phase 2 (lines 15-19): one training-mode pass `train_fn(x_adv, state)`
    and sum_i w_i CE_i with w = softmax(Detach(-beta * CE)) (Eq. 2); beta = 0 is PAT(WOS).
    Differentiate the loss with respect to the parameters `train_fn` closes over (line 20).

    Args:
      train_fn: (x, state) -> (logits, state), the training-mode forward (`methods.common.TrainFn`).
      attack_fn: x -> logits for the sampler.
      key: the sampler's PRNG key (example i draws from fold_in(key, i)).
      x: clean images in [0, 1], (B, H, W, C); y: labels (B,).
      state: what `train_fn` threads (Linen's batch_stats; None for NNX).
      sampler: Algorithm 1's settings (Appendix E's by default).
      beta: the SNIS smoothing factor (Eq. 2; Sec. 5.4's 0.001 by default).
    Metrics: loss, adv_accuracy (training-mode pass on x_adv), snis_weight_mean / _max and
    langevin_steps (gradient steps per chain: T unless sampler.tolerance ends chains early).
    """
    check_beta(beta)
    x_adv, steps = langevin_lib.langevin_sample_with_steps(attack_fn, key, x, y, sampler)
    loss, (state, metrics) = weighted_ce(train_fn, x_adv, y, beta, state)
    return loss, (state, dict(metrics, langevin_steps=jnp.mean(steps.astype(jnp.float32))))


def pat_wos_loss(
    train_fn: TrainFn,
    attack_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    state=None,
    sampler: langevin_lib.LangevinSettings = langevin_lib.LangevinSettings(),
):
    """PAT(WOS) (Table 2): `pat_loss` without the importance weights, beta = 0 (the mean CE)."""
    return pat_loss(train_fn, attack_fn, key, x, y, state=state, sampler=sampler, beta=0.0)


def langevin_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s):
    """Phase 1 of Algorithm 2 with a run's model and settings: (x_adv, steps each chain took)."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.sampler.bn_mode)
    return langevin_lib.langevin_sample_with_steps(logits_fn, key, x, y, s.sampler)


def _forwards(params, model: ModelFns, batch_stats, s):
    """The two forwards of a run's model: training mode, and the sampler's BatchNorm mode."""
    return model.train_fn(params), model.attack_logits_fn(params, batch_stats, s.sampler.bn_mode)


def pat(params, model, batch_stats, x, y, key, s):
    """PAT (Algorithm 2): `pat_loss` with beta = s.snis.beta."""
    train_fn, attack_fn = _forwards(params, model, batch_stats, s)
    return pat_loss(
        train_fn, attack_fn, key, x, y, state=batch_stats, sampler=s.sampler.langevin_settings(), beta=s.snis.beta
    )


def pat_wos(params, model, batch_stats, x, y, key, s):
    """PAT(WOS), the ablation without the importance weight: `pat_wos_loss`."""
    train_fn, attack_fn = _forwards(params, model, batch_stats, s)
    return pat_wos_loss(train_fn, attack_fn, key, x, y, state=batch_stats, sampler=s.sampler.langevin_settings())


PAT = Method("pat", pat, "PAT", sampler=True, weighted=True)
PAT_WOS = Method("pat_wos", pat_wos, "PAT(WOS)", sampler=True)
