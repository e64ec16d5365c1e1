"""PGD-20 and CW-20: accuracy under the paper's white-box L-inf attacks (Section 5, Appendix E),
or their L2 forms.

pgd20: PGD on the cross-entropy; cw20: the same PGD on the Carlini-Wagner margin loss (its own
setting, kappa: block `eval.cw`); both with a random start in the threat model's ball
(`eval.attack`: norm, eps, steps of step_size), each image attacked on its own
(`common.per_example`). Under 'linf' the start is uniform in the box and each step a signed
gradient (`pgd.pgd`); under 'l2' the start and steps are torchattacks' PGDL2's (`l2.pgd_l2`).
"""

from __future__ import annotations

import dataclasses
import functools

import jax.numpy as jnp

from patjax.attacks import l2, pgd
from patjax.evaluators import common


@dataclasses.dataclass(frozen=True)
class CWSettings:
    """cw20's own setting (config block `eval.cw`)."""

    # The margin loss's confidence: 2 as the AT-PR code's evaluate.py (cw_loss(..., margin=2)), the
    # closest public source of the Table-1 protocol; the paper does not state it.
    kappa: float = 2.0


def _pgd(loss: str, name: str, label: str, settings_type=None, block: str = "") -> common.Evaluator:
    def batch_robust(logits_fn, key, indices, x, y, s):
        threat = s[common.THREAT_BLOCK]
        loss_fn = pgd.cross_entropy_loss if loss == "ce" else functools.partial(pgd.cw_margin_loss, kappa=s["cw"].kappa)
        attack = l2.PGD_BY_NORM[threat.norm]
        x_adv = common.per_example(
            lambda k, xi, yi: attack(
                logits_fn,
                k,
                xi,
                yi,
                eps=threat.eps,
                step_size=threat.step_size,
                steps=threat.steps,
                loss_fn=loss_fn,
                random_start=True,
            ),
            key,
            indices,
            x,
            y,
        )
        return jnp.argmax(logits_fn(x_adv), -1) == y

    def settings(s) -> dict:
        threat = s[common.THREAT_BLOCK]
        kappa = {"kappa": s["cw"].kappa} if loss == "cw_margin" else {}
        return {
            "norm": threat.norm,
            "eps": threat.eps,
            "step_size": threat.step_size,
            "steps": threat.steps,
            "loss": loss,
            **kappa,
            "random_start": "uniform" if threat.norm == "linf" else "torchattacks PGDL2's",
        }

    return common.attack_evaluator(name, label, batch_robust, settings, settings_type, block, norms=l2.NORMS)


PGD20 = _pgd("ce", name="pgd20", label="PGD")
CW20 = _pgd("cw_margin", name="cw20", label="CW", settings_type=CWSettings, block="cw")
