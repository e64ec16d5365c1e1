"""PGD-20 and CW-20: accuracy under the paper's white-box L-inf attacks (Section 5, Appendix E),
or their L2 forms.

pgd20: PGD on the cross-entropy; cw20: the same PGD on the Carlini-Wagner margin loss (its own
setting, kappa: block `eval.cw`); both with a random start in the threat model's ball
(`eval.attack`: norm, eps, steps of step_size), each image attacked on its own
(`streams.per_example`). Under 'linf' the start is uniform in the box and each step a signed
gradient (`pgd.pgd`); under 'l2' the start and steps are torchattacks' PGDL2's (`l2.pgd_l2`).

`attack_evaluator` makes a worst-case attack an evaluator: these two, and APGD's (`apgd`).
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable

import jax
import jax.numpy as jnp

from patjax.attacks import l2, pgd
from patjax.data import cifar
from patjax.evaluators import common, intervals, streams


def attack_evaluator(
    name: str,
    label: str,
    batch_robust: Callable,
    settings: Callable,
    settings_type: type | None = None,
    block: str = "",
    norms: tuple = ("linf",),
) -> common.Evaluator:
    """A worst-case attack as an evaluator: one pass whose per-image output is `robust`.

    batch_robust(logits_fn, key, indices, x, y, s) -> (batch,) bool: whether each image is still
    classified correctly after the attack (keys per image: `streams.per_example`, from the
    attack's own stream, `streams.attack_key(seed, name)`); settings(s) -> the attack's settings
    recorded with its figure; settings_type, block, norms: its own settings, their block, the
    norms it attacks under (`common.Evaluator`).
    """

    def passes(s) -> tuple:
        return (name,)

    def make_batch_fn(model_fns, s, pass_name):
        key = streams.attack_key(s.shared.seed, name)

        def fn(params, batch_stats, images, labels, indices):
            logits_fn = model_fns.attack_logits_fn(params, batch_stats)
            return {"robust": batch_robust(logits_fn, key, indices, cifar.to_float(images), labels, s)}

        return jax.jit(fn)

    def figures(per_image, s) -> dict:
        return {name: dict(intervals.proportion(per_image[name]["robust"], s.shared.confidence), settings=settings(s))}

    return common.Evaluator(
        name,
        passes,
        make_batch_fn,
        figures,
        worst_case=True,
        label=label,
        settings=settings_type,
        block=block,
        norms=norms,
    )


@dataclasses.dataclass(frozen=True)
class CWSettings:
    """cw20's own setting (config block `eval.cw`)."""

    # The margin loss's confidence: 2 as the AT-PR code's evaluate.py (cw_loss(..., margin=2)), the
    # closest public source of the Table-1 protocol; the paper does not state it.
    kappa: float = 2.0


def _pgd(loss: str, name: str, label: str, settings_type=None, block: str = "") -> common.Evaluator:
    def batch_robust(logits_fn, key, indices, x, y, s):
        threat = s.threat
        loss_fn = pgd.cross_entropy_loss if loss == "ce" else functools.partial(pgd.cw_margin_loss, kappa=s.own.kappa)
        attack = l2.PGD_BY_NORM[threat.norm]
        x_adv = streams.per_example(
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
        threat = s.threat
        kappa = {"kappa": s.own.kappa} if loss == "cw_margin" else {}
        return {
            "norm": threat.norm,
            "eps": threat.eps,
            "step_size": threat.step_size,
            "steps": threat.steps,
            "loss": loss,
            **kappa,
            "random_start": "uniform" if threat.norm == "linf" else "torchattacks PGDL2's",
        }

    return attack_evaluator(name, label, batch_robust, settings, settings_type, block, norms=l2.NORMS)


PGD20 = _pgd("ce", name="pgd20", label="PGD")
CW20 = _pgd("cw_margin", name="cw20", label="CW", settings_type=CWSettings, block="cw")
