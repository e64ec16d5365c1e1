"""PGD-20 and CW-20: accuracy under the paper's white-box L-inf attacks (Section 5, Appendix E).

pgd20: PGD on the cross-entropy; cw20: the same PGD on the Carlini-Wagner margin loss (kappa);
both with a uniform random start in the eps ball, `eval.attack_steps` steps of
`eval.attack_step_size`, each image attacked on its own (`common.per_example`).
"""

from __future__ import annotations

import functools

import jax.numpy as jnp

from patjax.attacks import pgd
from patjax.evaluators import common


def _pgd(loss: str, name: str, label: str) -> common.Evaluator:
    def batch_robust(logits_fn, key, indices, x, y, s):
        loss_fn = pgd.cross_entropy_loss if loss == "ce" else functools.partial(pgd.cw_margin_loss, kappa=s.cw_kappa)
        x_adv = common.per_example(
            lambda k, xi, yi: pgd.pgd(
                logits_fn,
                k,
                xi,
                yi,
                eps=s.attack_eps,
                step_size=s.attack_step_size,
                steps=s.attack_steps,
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
        kappa = {"kappa": s.cw_kappa} if loss == "cw_margin" else {}
        return {
            "eps": s.attack_eps,
            "step_size": s.attack_step_size,
            "steps": s.attack_steps,
            "loss": loss,
            **kappa,
            "random_start": "uniform",
        }

    return common.attack_evaluator(name, label, batch_robust, settings)


PGD20 = _pgd("ce", name="pgd20", label="PGD")
CW20 = _pgd("cw_margin", name="cw20", label="CW")
