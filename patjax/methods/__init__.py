"""Layer 5, the training objectives ("methods"), registered by name: Algorithm 2 (PAT) and the baselines.
Imports `pat`, `attacks`, `models`, `data` and `core`.

Each method's objective is a public pure function of two forwards of the model (what a user's
own train step calls; docs/api.md):

    objective(train_fn, attack_fn, key, x, y, *, state=None, <its settings>) -> (loss, (state, metrics))

with train_fn(x, state) -> (logits, state) the training-mode forward and attack_fn(x) -> logits
the inner problem's (`common.TrainFn`). The registered method is its adapter to patjax's loop,

    method(params, model, batch_stats, x, y, key, s) -> (loss, (new_batch_stats, metrics))

which builds the two forwards from `model` and calls the objective: one implementation.

differentiated with respect to `params` by the train step, so the compiled step is the same
for every method and `--config.method=NAME` selects one. `model` is a `ModelFns` pair of
pure apply functions (inference mode / training mode); `s` is the run's `MethodSettings`
(static), built once from the config (`config.method_settings`): the method's own settings
(`s.own`, a frozen dataclass of its module, one config block) and the shared blocks its
`Method` entry asks for (`s.attack`, `s.sampler`, `s.snis`), each checked by its own class.
`make_method(s)` is the loss the train step differentiates: (params, model, batch_stats, x, y, key).

Methods (docs/baselines.md), one module per family: clean, fgsm, pgd, alp, clp
(`logit_pairing`), trades, mart, atpr (the baselines of Table 1), pat, pat_wos (Algorithm 2 and
its ablation), pgd_cor, fgsm_cor (PGD / FGSM batches with the PAT weights, Table 2), and outside
the paper gaussian (Cohen et al.'s Gaussian augmentation, for randomized smoothing). Every
method returns at least the metrics 'loss', 'adv_accuracy' (accuracy of the training-mode pass
on the adversarial batch; on the clean batch for `clean`), 'snis_weight_mean' and
'snis_weight_max' (1/B for methods without importance weights).

Conventions shared by all methods:
- Inner attacks/samplers see the parameters under `stop_gradient`. BatchNorm during the
  sampler is `s.sampler.bn_mode` (inference by default, our choice where the paper is
  silent: each chain's energy then depends on its own image only; docs/design.md); during a
  baseline's attack it is `s.attack.bn_mode` (config `attack.bn_mode`, whose default 'auto'
  is the mode of that baseline's reference code, its entry's `attack_bn_mode`). An attack never
  updates the running statistics.
- The outer loss runs the model in training mode: batch statistics normalize each pass,
  and the running statistics receive one momentum update per forward pass, in the order
  the reference code makes its passes (`common.train_passes`; e.g. TRADES: x, x_adv, x).
- Reductions over the batch are over the *global* batch: the step is written on global
  arrays, so under `jax.sharding` the SNIS softmax still normalizes over every example.
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from patjax.core.errors import UserError
from patjax.methods import atpr, clean, fgsm, gaussian, logit_pairing, mart, pat, pgd, trades
from patjax.methods.common import SHARED_BLOCKS, Method, MethodSettings

# The one list of methods, in the paper's row order (Table 1, then the variants of Table 2); a
# method outside the paper comes after them.
REGISTRY: dict[str, Method] = {
    m.name: m
    for m in (
        clean.CLEAN,
        fgsm.FGSM,
        fgsm.FGSM_COR,
        pgd.PGD,
        pgd.PGD_COR,
        logit_pairing.ALP,
        logit_pairing.CLP,
        trades.TRADES,
        mart.MART,
        atpr.ATPR,
        pat.PAT_WOS,
        pat.PAT,
        gaussian.GAUSSIAN,  # outside the paper: the base classifiers randomized smoothing certifies
    )
}


def derived_names(registry: dict) -> dict:
    """What the registry's order and entries decide: METHOD_ORDER, DISPLAY_NAMES, LANGEVIN_METHODS
    (the methods whose inner maximization is Algorithm 1's sampler) and REFERENCE_ATTACK_BN_MODE
    (the methods with an inner attack and its BatchNorm mode in their reference code)."""
    return {
        "METHOD_ORDER": tuple(registry),
        "DISPLAY_NAMES": {name: m.display_name for name, m in registry.items()},
        "LANGEVIN_METHODS": tuple(name for name, m in registry.items() if m.sampler),
        "REFERENCE_ATTACK_BN_MODE": {name: m.attack_bn_mode for name, m in registry.items() if m.attack_bn_mode},
    }


_DERIVED = derived_names(REGISTRY)
METHOD_ORDER, DISPLAY_NAMES = _DERIVED["METHOD_ORDER"], _DERIVED["DISPLAY_NAMES"]
LANGEVIN_METHODS, REFERENCE_ATTACK_BN_MODE = _DERIVED["LANGEVIN_METHODS"], _DERIVED["REFERENCE_ATTACK_BN_MODE"]


def get(name: str) -> Method:
    """The registered method `name`, or a one-line UserError listing them."""
    if name not in REGISTRY:
        raise UserError(f"unknown method {name!r}; choose one of {sorted(REGISTRY)}")
    return REGISTRY[name]


def blocks() -> dict[str, type]:
    """{config block: its settings class} for every block the methods read: the shared ones, then
    each registered method's own, in the registry's order. `config.default_config` writes each
    block from its class's defaults and `config.block_settings` reads it back field by field."""
    found = dict(SHARED_BLOCKS)
    for m in REGISTRY.values():
        if m.settings is not None and found.setdefault(m.settings_block, m.settings) is not m.settings:
            raise ValueError(f"the config block {m.settings_block!r} has two settings classes; {m.name} reads it")
    return found


def make_method(s: MethodSettings) -> Callable[..., Any]:
    """The loss of method s.name with its settings: (params, model, batch_stats, x, y, key) ->
    (loss, (new_batch_stats, metrics)), what the train step differentiates."""
    return functools.partial(REGISTRY[s.name].loss, s=s)


def ordered(methods):
    """Methods in the paper's order (unknown names last, alphabetically)."""
    return sorted(methods, key=lambda m: (METHOD_ORDER.index(m) if m in METHOD_ORDER else len(METHOD_ORDER), m))
