"""AT-PR (wellzline/AT-PR `PR`): training on the candidate of a randomized PGD search that its
refinement moves farthest."""

from __future__ import annotations

import jax.numpy as jnp

from patjax.attacks import inner
from patjax.methods.common import Method, weighted_update


def atpr(params, model, batch_stats, x, y, key, s):
    """AT-PR (wellzline/AT-PR `PR`): mean CE(f(x_sel), y), x_sel from `inner.atpr_search`.
    s.own is the config block `atpr` completed with the standard PGD of the `attack` block
    (`inner.AtprSettings`, `config.block_settings`)."""
    logits_fn = model.attack_logits_fn(params, batch_stats, s.attack.bn_mode)
    result = inner.atpr_search(logits_fn, key, x, y, s.own)
    loss, (new_batch_stats, metrics) = weighted_update(params, model, batch_stats, result.x_adv, y, 0.0)
    metrics = dict(
        metrics,
        atpr_pgd_fraction=jnp.mean(result.choice == 0),
        atpr_refine_iters=jnp.mean(result.refine_iters.astype(jnp.float32)),
    )
    return loss, (new_batch_stats, metrics)


# BatchNorm during the attack: batch statistics, as wellzline/AT-PR attack_algorithms.py runs PR
# in model.train() (it also updates the running averages at every attack step, which is not
# reproduced here; docs/baselines.md).
ATPR = Method("atpr", atpr, "AT-PR", settings=inner.AtprSearchSettings, attack_bn_mode="train")
