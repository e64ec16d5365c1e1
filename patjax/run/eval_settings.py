"""An evaluation's settings as results.json records them: the flat names records had before the
settings were nested by block (`FLAT_NAMES`) and the one reader that upgrades such a record
(`nested_settings`), a setting read by its path, and the comparisons of two records: what one
evaluation would lose replacing another (`lost_settings`), whether a saved one holds what a new
one would compute (`covers`), whether two share their images and noise (`check_comparable`).
Pure functions of dicts: the files are `patjax.run.eval_files`'."""

from __future__ import annotations

from patjax.core.errors import UserError
from patjax.pat import laws

# The names results.json's "settings" and a version-1 config's `eval` gave the evaluator settings
# before they were nested by block: {flat name: (block, field)}. Frozen: the registry may grow,
# files written then do not. Read by `_from_version_1` and by the reader of a written record
# (`eval_files.nested_settings`), and nowhere else.
FLAT_NAMES = {
    "attack_eps": ("attack", "eps"),
    "attack_step_size": ("attack", "step_size"),
    "attack_steps": ("attack", "steps"),
    "attack_norm": ("attack", "norm"),
    "cw_kappa": ("cw", "kappa"),
    "apgd_steps": ("apgd", "steps"),
    "apgd_rho": ("apgd", "rho"),
    "aa_target_classes": ("aa", "target_classes"),
    "aa_fab_steps": ("aa", "fab_steps"),
    "aa_square_queries": ("aa", "square_queries"),
    "aa_masking_eps_factors": ("aa", "masking_eps_factors"),
    "pr_distribution": ("pr", "distribution"),
    "pr_distributions": ("pr", "distributions"),
    "pr_epsilons": ("pr", "epsilons"),
    "pr_samples": ("pr", "samples"),
    "pr_chunk_size": ("pr", "chunk_size"),
    "pdis_c1": ("pr", "pdis_c1"),
    "pdis_sigma": ("pr", "pdis_sigma"),  # recorded, not a config field
    "entropic_lambda": ("pr", "entropic_lambda"),
    "prob_acc_q": ("pr", "prob_acc_q"),
    "certify_sigma": ("certify", "sigma"),
    "certify_radii": ("certify", "radii"),
    "certify_selection_samples": ("certify", "selection_samples"),
    "certify_samples": ("certify", "samples"),
    "certify_alpha": ("certify", "alpha"),
    "certify_chunk_size": ("certify", "chunk_size"),
}


# Settings recorded since evaluations could vary them, with the value every evaluation written
# before then had: a record without them reads as that value, so that an L2 evaluation does not
# silently replace or pair with an L-inf one.
IMPLICIT_BEFORE_RECORDED = {("attack", "norm"): "linf"}


def nested_settings(settings: dict) -> dict:
    """results.json's "settings" in the shape written now (`evaluators.record`): the evaluation's
    own fields and the shared settings at the top, one dict per block of `eval`. A record written
    with flat names (pr_samples) is upgraded by `FLAT_NAMES`, and the settings it predates take
    their value then (`IMPLICIT_BEFORE_RECORDED`). The one reader of a written record: every
    reader of results.json's settings gets them through `read_results_file`."""
    if not any(k in FLAT_NAMES for k in settings):
        return settings
    out: dict = {}
    for key, value in settings.items():
        if key in FLAT_NAMES:
            block, field = FLAT_NAMES[key]
            out.setdefault(block, {})[field] = value
        else:
            out[key] = value
    for (block, field), value in IMPLICIT_BEFORE_RECORDED.items():
        out.setdefault(block, {}).setdefault(field, value)
    return out


def setting(settings: dict, path: str):
    """The setting at `path` (pr.samples, seed) of nested settings, or None where it is not recorded."""
    *blocks, field = path.split(".")
    for block in blocks:
        settings = settings.get(block)
        if not isinstance(settings, dict):
            return None
    return settings.get(field)


def _paths(settings: dict, prefix: str = "") -> dict:
    """{path: value} of every setting of nested settings (pr.samples), for comparing two records
    setting by setting and naming each difference by its path."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, dict):
            out.update(_paths(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


# What an evaluation's record holds beside its settings: the model's step, which models compared
# side by side need not share.
PER_MODEL_FIELDS = ("step",)


def recorded_laws(settings: dict) -> list:
    """The PR laws an evaluation's settings (results.json's) say it computed; for a record without
    `pr.distributions`, the laws whose definitions it holds."""
    return list(setting(settings, "pr.distributions") or [d for d in laws.REGISTRY if d in settings])


def shared_definitions(a: dict, b: dict) -> list:
    """The definition keys two evaluations' settings must agree on: those of the laws both computed."""
    return [d for d in recorded_laws(a) if d in recorded_laws(b)]


# Settings that change no figure (randomness is keyed by image and sample, `evaluators.common`,
# so batch, chunk and device counts only reorder float sums) or that are outcomes: an evaluation
# differing from the previous one only in these reproduces its figures.
INCIDENTAL_FIELDS = ("num_clean_correct", "batch_size", "pr.chunk_size", "certify.chunk_size", "devices")


# Lists an evaluation may extend: every figure of the previous one is made again, with more beside it.
EXTENSIBLE_FIELDS = ("evaluators", "pr.distributions")


def _listed(values) -> str:
    return ",".join(map(str, values)) or "none"


def lost_settings(previous: dict, planned: dict) -> list[str]:
    """How an evaluation with `planned` settings (results.json's "settings" as it would write them)
    departs from the `previous` one's (as `nested_settings` reads it): a changed setting, or an
    evaluator or law it drops, each named by its path. Settings `previous` does not record (files
    written before they existed) are not compared."""
    differing = []
    previous = _paths(previous)
    for key, new in _paths(planned).items():
        if key in INCIDENTAL_FIELDS or key not in previous:
            continue
        old = previous[key]
        if key in EXTENSIBLE_FIELDS:
            dropped = [v for v in old or () if v not in new]
            if dropped:
                differing.append(f"{key} {_listed(old)} there, {_listed(new)} now, dropping {_listed(dropped)}")
        elif old != new:
            differing.append(f"{key} {old!r} there, {new!r} now")
    return differing


def compared_settings(a: dict, b: dict) -> list[str]:
    """The settings two evaluations (results.json's `settings`) must share for their figures to be
    set side by side and their per-image outcomes paired on common random numbers: every setting
    both record (each evaluator block's, the shared ones, the images, the dataset) by its path,
    but those that change no figure (`INCIDENTAL_FIELDS`), the model's own (`PER_MODEL_FIELDS`),
    the lists one may extend (`EXTENSIBLE_FIELDS`) and the definitions of laws not both computed
    (`shared_definitions`). A setting one of them does not record (a file written before it
    existed) is not compared, as `lost_settings` does. A comparison hands every model the first
    one's settings whole (`settings.handed_on`), so that these are the same; this list checks it."""
    definitions = [d for d in laws.REGISTRY if d in a or d in b]
    shared = shared_definitions(a, b)
    skipped = (*INCIDENTAL_FIELDS, *PER_MODEL_FIELDS, *EXTENSIBLE_FIELDS)
    pa, pb = _paths(a), _paths(b)
    recorded = [k for k in pa if k in pb]
    return [k for k in recorded if k not in skipped and (k not in definitions or k in shared)]


def check_comparable(a: dict, b: dict, name_a: str, name_b: str, aside=()) -> None:
    """Raises UserError unless two evaluations' settings (results.json's `settings`) agree on
    every setting a figure depends on (`compared_settings`): the same images, perturbations,
    distribution definitions and evaluator settings. `aside`: paths of settings the caller
    handles itself (a learning curve's attack block, whose column it drops)."""
    differing = [
        k
        for k in compared_settings(a, b)
        if k.split(".")[0] not in aside and k not in aside and setting(a, k) != setting(b, k)
    ]
    if differing:
        raise UserError(
            f"{name_a!r} and {name_b!r} were evaluated with different settings "
            f"({', '.join(differing)}): not comparable on common random numbers"
        )


def covers(saved: dict, planned: dict) -> bool:
    """Whether an evaluation with `saved` settings (results.json's) holds every figure one with
    `planned` settings would compute, made the same way: every setting equal but those that
    change no figure, and its evaluators and laws the planned ones or more. A setting `saved` does
    not record (a file written before it existed) is a difference."""
    held_paths = _paths(saved)
    for key, wanted in _paths(planned).items():
        if key in INCIDENTAL_FIELDS:
            continue
        held = held_paths.get(key, KeyError)
        if key in EXTENSIBLE_FIELDS:
            if not isinstance(held, list) or any(v not in held for v in wanted or ()):
                return False
        elif held != wanted:
            return False
    return True


# What tells the images an evaluation ran on apart: the same entries, the same images.
IMAGE_FIELDS = ("num_examples", "dataset", "split")


def same_view(saved: dict, planned: dict, entries) -> bool:
    """Whether two evaluations' settings (results.json's) agree on the images and on every
    setting under `entries` (an evaluator's `view_paths`), but those that change no figure
    (`INCIDENTAL_FIELDS`): one's per-image outcomes of that evaluator are the other's. A setting
    one records and the other does not is a difference."""
    wanted = (*IMAGE_FIELDS, *entries)
    pick = lambda settings: {
        k: v for k, v in _paths(settings).items() if k.split(".")[0] in wanted and k not in INCIDENTAL_FIELDS
    }
    return pick(saved) == pick(planned)
