"""APGD-CE and APGD-DLR (Croce & Hein, 2020): step-size-free PGD, one restart each, at the threat
model's eps and norm (L-inf or L2, `apgd.apgd`); their own settings (block `eval.apgd`) are
AutoAttack's too."""

from __future__ import annotations

import dataclasses

from patjax.attacks import apgd, l2
from patjax.core.errors import UserError, check_counts, count
from patjax.evaluators import attack, common, streams

# apgd.apgd's one documented departure from fra31/auto-attack's attack_single_run, recorded
# with every APGD figure (docs/evaluation.md).
DEPARTURE = (
    "first interval: the first iterate's loss is compared with the starting loss, "
    "where auto-attack compares it with an unfilled (zero) entry of its loss buffer"
)


@dataclasses.dataclass(frozen=True)
class ApgdSettings:
    """APGD's settings (config block `eval.apgd`), shared by apgd_ce, apgd_dlr and AutoAttack's
    APGD-CE and APGD-T: the reference's 100 iterations and rho = 0.75."""

    steps: int = count("eval.apgd.steps", 1, 100_000, default=100)
    rho: float = 0.75

    def __post_init__(self):
        check_counts(self)
        if not 0 < self.rho <= 1:
            raise UserError(f"eval.apgd.rho must be in (0, 1], got {self.rho}")


BLOCK = "apgd"


def _apgd(loss: str, name: str, label: str) -> common.Evaluator:
    def batch_robust(logits_fn, key, indices, x, y, s):
        own, threat = s.own, s.threat
        return streams.per_example(
            lambda k, xi, yi: apgd.apgd(
                logits_fn, k, xi, yi, eps=threat.eps, steps=own.steps, loss=loss, rho=own.rho, norm=threat.norm
            ),
            key,
            indices,
            x,
            y,
        ).robust

    def settings(s) -> dict:
        return {
            "eps": s.threat.eps,
            "norm": s.threat.norm,
            "steps": s.own.steps,
            "rho": s.own.rho,
            "loss": loss,
            "restarts": 1,
            "departure": DEPARTURE,
        }

    return attack.attack_evaluator(name, label, batch_robust, settings, ApgdSettings, BLOCK, norms=l2.NORMS)


APGD_CE = _apgd("ce", name="apgd_ce", label="APGD-CE")
APGD_DLR = _apgd("dlr", name="apgd_dlr", label="APGD-DLR")
