"""Layer 6, the evaluators: arrays and settings in, figures out, one module each behind `common.Evaluator`,
their registry, and the host-side intervals (`stats`). Imports `methods`, `pat`, `attacks`, `models`, `data` and `core`.


REGISTRY is the only list of evaluator names; ALIASES name groups of them; an evaluator's
`worst_case` flag puts it in the worst case over attacks. Adding an evaluator: a module with
an `Evaluator` (and its own settings class, if it has settings) and one line here; its settings
become the config block `eval.<block>` (`blocks`) and results.json's `settings.<block>` (`record`).
"""

from __future__ import annotations

import dataclasses

import numpy as np

from patjax.core.errors import UserError
from patjax.evaluators import apgd, attack, autoattack, certify, clean, common, intervals, pr, rare_pr

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
        rare_pr.EVALUATOR,
        certify.EVALUATOR,
    )
}
# The worst-case columns of the paper's Tables 1-2 (PGD-20 and CW-20), which the suites compare;
# the other attacks are reported beside them.
TABLE_ATTACKS = ("pgd20", "cw20")
RUN_WHEN_NAMED = ("aa", "rare_pr", "certify")  # left out of 'all' for their cost


def derived_names(registry: dict) -> dict:
    """What the registry's order and flags decide: NAMES, ALIASES, WORST_CASE and OTHER_ATTACKS."""
    names = tuple(registry)
    worst = tuple(name for name, e in registry.items() if e.worst_case)
    return {
        "NAMES": names,
        # 'all' is every evaluator but AutoAttack, which costs about 20 APGD runs, and CERTIFY, which
        # costs n0 + n forward passes per image (100,100 at Cohen et al.'s defaults), and rare_pr, whose AMLS
        # costs about 10^6 per image and radius at Webb et al.'s defaults: each is run when named.
        "ALIASES": {"apgd": ("apgd_ce", "apgd_dlr"), "all": tuple(n for n in names if n not in RUN_WHEN_NAMED)},
        "WORST_CASE": worst,
        "OTHER_ATTACKS": tuple(name for name in worst if name not in TABLE_ATTACKS),
    }


def blocks() -> dict:
    """{block of the config's `eval`: its settings class}: the threat model every attack reads,
    then each registered evaluator's own settings, in the registry's order."""
    found = {common.THREAT_BLOCK: common.ThreatModelSettings}
    for e in REGISTRY.values():
        if e.settings is not None:
            assert found.setdefault(e.settings_block, e.settings) is e.settings, (
                f"two settings for eval.{e.settings_block}"
            )
    return found


def record(s: common.Settings) -> dict:
    """Every evaluator setting as results.json's "settings" records it: the shared ones at the top,
    then one dict per block of `eval` (`blocks`), tuples as lists; PR's also holds p_dis's sigma,
    which its c1 gives."""
    out = {}
    for f in dataclasses.fields(common.SharedSettings):
        out[f.name] = _listed(getattr(s.shared, f.name))
    for block, settings in blocks().items():
        out[block] = {f.name: _listed(getattr(s[block], f.name)) for f in dataclasses.fields(settings)}
    out[pr.BLOCK]["pdis_sigma"] = s[pr.BLOCK].pdis_sigma
    return out


def _listed(value):
    return list(value) if isinstance(value, tuple) else value


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


def labels(settings: dict) -> tuple[list, list]:
    """(name parts, descriptions) of an evaluation with these settings (results.json's): each
    evaluator that ran says its own (`Evaluator.label_name`, `label_words`), in the registry's
    order, each said once (every attack shares the threat model's). A record written before a
    setting an evaluator names existed gives no part for it."""
    ran = [REGISTRY[e] for e in NAMES if e in (settings.get("evaluators") or ())]
    parts, words = [], []
    for e in ran:
        for label, out in ((e.label_name, parts), (e.label_words, words)):
            try:
                found = label(settings)
            except (KeyError, TypeError):
                found = ""
            if found and found not in out:
                out.append(found)
    return parts, words


def worst_case(per_image: dict, names, s) -> dict | None:
    """Robust accuracy under the worst of the worst-case attacks run (and correct when clean)."""
    ran = [a for a in WORST_CASE if a in names]
    if not ran:
        return None
    worst = np.logical_and.reduce([per_image[a]["robust"] for a in ran])
    if "clean" in per_image:
        worst = worst & per_image["clean"]["correct"]
    return dict(intervals.proportion(worst, s.shared.confidence), attacks=ran)
