"""PAT (Algorithm 2) and PAT(WOS), its ablation without the importance weights (Table 2)."""

from __future__ import annotations

import jax.numpy as jnp

from patjax.methods.common import Method, weighted_update
from patjax.models.networks import ModelFns
from patjax.pat import langevin as langevin_lib


def langevin_adversarial_batch(params, model: ModelFns, batch_stats, x, y, key, s):
    """Phase 1 of Algorithm 2: (x_adv, steps each chain took) from the sampler, lines 7-14."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.sampler.bn_mode)
    return langevin_lib.langevin_sample_with_steps(logits_fn, key, x, y, s.sampler)


def _langevin_update(params, model, batch_stats, x, y, key, s, beta: float):
    x_adv, steps = langevin_adversarial_batch(params, model, batch_stats, x, y, key, s)
    loss, (new_batch_stats, metrics) = weighted_update(params, model, batch_stats, x_adv, y, beta)
    # Gradient steps the sampler took per example (T unless langevin.tolerance ends chains early).
    return loss, (new_batch_stats, dict(metrics, langevin_steps=jnp.mean(steps.astype(jnp.float32))))


def pat(params, model, batch_stats, x, y, key, s):
    """PAT (Algorithm 2): Langevin samples, SNIS-weighted cross-entropy with beta = s.snis.beta."""
    return _langevin_update(params, model, batch_stats, x, y, key, s, s.snis.beta)


def pat_wos(params, model, batch_stats, x, y, key, s):
    """PAT(WOS), the ablation without the importance weight: beta = 0 (mean loss)."""
    return _langevin_update(params, model, batch_stats, x, y, key, s, 0.0)


PAT = Method("pat", pat, "PAT", sampler=True, weighted=True)
PAT_WOS = Method("pat_wos", pat_wos, "PAT(WOS)", sampler=True)
