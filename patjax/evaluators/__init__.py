"""Layer 6, the evaluators: arrays and settings in, figures out, one module each behind `common.Evaluator`,
their registry, and the host-side intervals (`stats`). Imports `methods`, `pat`, `attacks`, `models`, `data` and `core`.


REGISTRY is the only list of evaluator names; ALIASES name groups of them; an evaluator's
`worst_case` flag puts it in the worst case over attacks. Adding an evaluator: a module with
an `Evaluator` and one line here.
"""

from __future__ import annotations

import numpy as np

from patjax.core.errors import UserError
from patjax.evaluators import apgd, attack, autoattack, clean, common, pr

# Canonical order: the order of the passes and of results.json's figures.
REGISTRY: dict[str, common.Evaluator] = {
    e.name: e
    for e in (
        clean.EVALUATOR,
        attack.PGD20,
        attack.CW20,
        apgd.APGD_CE,
        apgd.APGD_DLR,
        autoattack.EVALUATOR,
        pr.EVALUATOR,
    )
}
# The worst-case columns of the paper's Tables 1-2 (PGD-20 and CW-20), which the suites compare;
# the other attacks are reported beside them.
TABLE_ATTACKS = ("pgd20", "cw20")


def derived_names(registry: dict) -> dict:
    """What the registry's order and flags decide: NAMES, ALIASES, WORST_CASE and OTHER_ATTACKS."""
    names = tuple(registry)
    worst = tuple(name for name, e in registry.items() if e.worst_case)
    return {
        "NAMES": names,
        # 'all' is every evaluator but AutoAttack, which costs about 20 APGD runs and is run when named.
        "ALIASES": {"apgd": ("apgd_ce", "apgd_dlr"), "all": tuple(n for n in names if n != "aa")},
        "WORST_CASE": worst,
        "OTHER_ATTACKS": tuple(name for name in worst if name not in TABLE_ATTACKS),
    }


_DERIVED = derived_names(REGISTRY)
NAMES, ALIASES = _DERIVED["NAMES"], _DERIVED["ALIASES"]
WORST_CASE, OTHER_ATTACKS = _DERIVED["WORST_CASE"], _DERIVED["OTHER_ATTACKS"]


def parse(spec) -> tuple:
    """'clean,pgd20,apgd' or a sequence -> the evaluators' names in canonical order."""
    names = [s.strip() for s in spec.split(",")] if isinstance(spec, str) else list(spec)
    chosen = set()
    for name in names:
        if not name:
            continue
        if name in ALIASES:
            chosen.update(ALIASES[name])
        elif name in REGISTRY:
            chosen.add(name)
        else:
            raise UserError(f"unknown evaluator {name!r}; choose from {', '.join(NAMES + tuple(ALIASES))}")
    if not chosen:
        raise UserError("no evaluator chosen")
    return tuple(e for e in NAMES if e in chosen)


def worst_case(per_image: dict, names, s) -> dict | None:
    """Robust accuracy under the worst of the worst-case attacks run (and correct when clean)."""
    ran = [a for a in WORST_CASE if a in names]
    if not ran:
        return None
    worst = np.logical_and.reduce([per_image[a]["robust"] for a in ran])
    if "clean" in per_image:
        worst = worst & per_image["clean"]["correct"]
    return dict(common.proportion(worst, s.confidence), attacks=ran)
