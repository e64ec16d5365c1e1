"""APGD-CE and APGD-DLR (Croce & Hein, 2020): step-size-free PGD, one restart each."""

from __future__ import annotations

from patjax.attacks import apgd
from patjax.evaluators import common

# apgd.apgd's one documented departure from fra31/auto-attack's attack_single_run, recorded
# with every APGD figure (docs/evaluation.md).
DEPARTURE = (
    "first interval: the first iterate's loss is compared with the starting loss, "
    "where auto-attack compares it with an unfilled (zero) entry of its loss buffer"
)


def _apgd(loss: str, name: str, label: str) -> common.Evaluator:
    def batch_robust(logits_fn, key, indices, x, y, s):
        return common.per_example(
            lambda k, xi, yi: apgd.apgd(
                logits_fn, k, xi, yi, eps=s.attack_eps, steps=s.apgd_steps, loss=loss, rho=s.apgd_rho
            ),
            key,
            indices,
            x,
            y,
        ).robust

    def settings(s) -> dict:
        return {
            "eps": s.attack_eps,
            "steps": s.apgd_steps,
            "rho": s.apgd_rho,
            "loss": loss,
            "restarts": 1,
            "departure": DEPARTURE,
        }

    return common.attack_evaluator(name, label, batch_robust, settings)


APGD_CE = _apgd("ce", name="apgd_ce", label="APGD-CE")
APGD_DLR = _apgd("dlr", name="apgd_dlr", label="APGD-DLR")
