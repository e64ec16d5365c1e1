"""The evaluators' interface: what an evaluator is (`Evaluator`), the settings each is handed
(`View`: the shared settings, the threat model and its own block, made from the evaluation's
`Settings` in one place, `Settings.view`) and the settings every evaluator reads, the shared ones
and the threat model.

An evaluator (one module each: `clean`, `attack`, `apgd`, `autoattack`, `pr`, `certify`, each
declaring its own settings) is an `Evaluator`: one or more
passes over the test images, each a jitted per-batch function

    fn(params, batch_stats, images uint8, labels, image indices) -> {name: (batch, ...) array}

and a figures function from the per-image outputs of its passes to figures with intervals
(`intervals`). Randomness is keyed by the image's index in the test split (and the sample's
index for PR; `streams`): batch size, chunk size and device count change no figure (`batches`,
the loop every pass runs in), and two models evaluated with the same seed see the same
perturbations (common random numbers).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping

from patjax.attacks import l2
from patjax.core.errors import UserError, check_counts, count, linf_radius, small_l2_radius

SEED_LIMIT = 2**32  # PRNGKey keeps 32 bits without x64: seeds 0 and 2**32 would alias


def headline_first(headline: str, laws) -> tuple:
    """The PR perturbation laws in the order every figure and table lists them: the headline
    law first (eval.pr.distribution; the Table-1 protocol's is 'uniform'), then the others of
    `laws` in their order."""
    return (headline, *(d for d in laws if d != headline))


@dataclasses.dataclass(frozen=True)
class SharedSettings:
    """What every evaluator reads (the top of the config's `eval` block): the root seed of every
    key, and the confidence and bootstrap of every interval.

    The bootstrap draws resamples x images int32 indices (20,000 x 10,000 test images: 800 MB)."""

    seed: int = count("eval.seed", 0, SEED_LIMIT - 1, default=0)
    confidence: float = 0.95
    bootstrap_resamples: int = count("eval.bootstrap_resamples", 100, 20_000, default=2000)

    def __post_init__(self):
        check_counts(self)
        if not 0 < self.confidence < 1:
            raise UserError(f"eval.confidence must be in (0, 1), got {self.confidence}")


NORMS = l2.NORMS  # the threat models: the L-inf ball (the paper's) and the L2 ball


@dataclasses.dataclass(frozen=True)
class ThreatModelSettings:
    """The ball every worst-case attack evaluator searches (config block `eval.attack`): Appendix
    E's L-inf eps = 8/255; PGD-20's and CW-20's step size 2/255 and 20 steps (APGD, AutoAttack
    and their masking checks take eps only, and their own steps). Under norm 'l2' eps is the L2
    ball's radius and step_size the length of each normalized-gradient step (RobustBench's L2
    radius is 0.5); each evaluator says which norms it attacks under (`Evaluator.norms`). A norm
    chosen without a radius takes its own (`l2.RADII`, `l2.with_norm_radii`); an L-inf radius
    above 1 is refused as one written in pixel levels, an L2 one below 0.05 said to be the size
    of an L-inf one."""

    eps: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = count("eval.attack.steps", 0, 100_000, default=20)
    norm: str = "linf"

    def __post_init__(self):
        check_counts(self)
        if self.eps < 0 or self.step_size < 0:
            raise UserError("eval.attack.eps and eval.attack.step_size must be >= 0")
        if self.norm not in NORMS:
            raise UserError(f"eval.attack.norm must be one of {', '.join(NORMS)}, got {self.norm!r}")
        if self.norm == "linf":
            linf_radius("eval.attack.eps", self.eps)
            linf_radius("eval.attack.step_size", self.step_size)
        else:
            small_l2_radius("eval.attack.eps", self.eps, l2.RADII["l2"][0])


THREAT_BLOCK = "attack"  # the threat model's block of `eval`, which every attack evaluator reads

NORM_SYMBOLS = {"linf": "L∞", "l2": "L2"}


def radius(eps, norm: str = "linf") -> str:
    """A radius as it is published: a number that four digits write exactly as itself (0.2, 0.5,
    1), an L-inf one that is not but is k/255 as k/255 (8/255), else the number (0.0314159)."""
    eps = float(eps)
    levels = eps * 255
    if norm == "linf" and float(f"{eps:.4g}") != eps and 0 < levels and abs(levels - round(levels)) < 1e-6:
        return f"{round(levels)}/255"
    return f"{eps:g}"


def threat_model(settings) -> str:
    """'L∞, ε = 8/255' of a results.json settings record (`eval_settings.nested_settings`'s shape);
    '' for one without the attacks' radius."""
    attack = settings.get(THREAT_BLOCK) or {}
    if "eps" not in attack:
        return ""
    norm = attack["norm"]
    return f"{NORM_SYMBOLS.get(norm, norm)}, ε = {radius(attack['eps'], norm)}"


def threat_name(settings) -> str:
    """The threat model as a part of an evaluation's name: linf-8_255, l2-0.5."""
    attack = settings.get(THREAT_BLOCK) or {}
    if "eps" not in attack:
        return ""
    return f"{attack['norm']}-{radius(attack['eps'], attack['norm']).replace('/', '_')}"


@dataclasses.dataclass(frozen=True)
class Settings:
    """Every block of the config's `eval` and the shared settings (`s["pr"]`, `s["attack"]`, ...:
    each evaluator's own, declared beside its code and named by its registry entry, and the
    threat model). Every block is read and checked whichever evaluators run, so that a bad field
    fails before any evaluation (`config.evaluation_settings`). An evaluator is not handed this
    but its `View` (`Settings.view`)."""

    shared: SharedSettings
    blocks: Mapping[str, Any]

    def __getitem__(self, block: str):
        return self.blocks[block]

    def view(self, evaluator: Evaluator) -> View:
        """What `evaluator` is handed: the shared settings, the threat model, its own block and
        the other blocks its registry entry declares (`Evaluator.reads`), nothing else."""
        own = self.blocks[evaluator.settings_block] if evaluator.settings is not None else None
        return View(
            self.shared,
            self.blocks[THREAT_BLOCK],
            own,
            evaluator.name,
            {block: self.blocks[block] for block in evaluator.reads},
        )


@dataclasses.dataclass(frozen=True)
class View:
    """An evaluator's settings: `shared`, `threat` (the `eval.attack` block), `own` (its block's
    settings, or None) and, by `view[block]`, only the blocks its entry declares in `reads`
    (AutoAttack runs APGD at `eval.apgd`'s settings). Reading any other block raises, so that
    what an evaluator depends on is in its registry entry, as big_vision's evaluators take their
    config block's keys and nothing else."""

    shared: SharedSettings
    threat: ThreatModelSettings
    own: Any
    evaluator: str
    declared: Mapping[str, Any]

    def __getitem__(self, block: str):
        if block not in self.declared:
            raise LookupError(
                f"evaluator {self.evaluator!r} reads eval.{block}, a block its registry entry does not "
                f"declare (Evaluator.reads: {', '.join(self.declared) or 'none'})"
            )
        return self.declared[block]


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """One evaluator behind the registry (`patjax.evaluators.REGISTRY`). Each function below is
    handed its `View` `s` (`Settings.view`): `s.shared`, `s.threat`, its own block `s.own`, and
    `s[block]` for a block in `reads`.

    passes: settings -> names of its passes (one compiled function and one per-image output
      each; PR has one per perturbation distribution).
    make_batch_fn: (model_fns, settings, pass name) -> the jitted per-batch function.
    figures: (per-image outputs of every pass run, settings) -> {figure name: figure}.
    settings: its own frozen settings dataclass (each field a field of the config block
      `eval.<block>`, its default the config's), or None; evaluators that share a block (APGD-CE
      and APGD-DLR) name the same class.
    block: the block its settings are read from (default: its name).
    reads: the other evaluators' blocks it reads (AutoAttack: `apgd`, the settings of its APGD-CE
      and APGD-T); any block not named here or as its own raises when read.
    norms: the threat models (`eval.attack.norm`) it attacks under; None: it reads no threat
      model (clean accuracy, PR). An evaluation under a norm it lacks is refused before it runs.
    worst_case: whether its per-image outcome joins the worst case over attacks.
    label: its column's name in tables.
    subset: (pass name, per-image outputs of the passes before it) -> the indices of the images
      the pass runs on, or None for all of them (AutoAttack attacks only the points still
      robust); a pass on a subset returns zeros elsewhere and an `attacked` mask.
    combine: (per-image outputs of its passes, settings) -> its own per-image outputs (under its
      name), e.g. the outcome of several passes.
    make_rounds: (model_fns, settings, pass name) -> the pass's further rounds (`batches.Rounds`: the
      images still to attack leave the others between them), or None for a pass of one round.
    needs_clean: whether its figures need the clean pass (PR over clean-correct images).
    name_part: (results.json's settings) -> its part of an evaluation's derived name, from the
      settings it reads ('' for none); default: an attack's threat model (linf-8_255), else ''.
    describe: (results.json's settings) -> what it measured, in words, for `--list` and the
      announcement of a run; default: an attack's threat model, else ''.
    recorded: the entries at the top of results.json's settings beside its blocks that its
      figures depend on (PR: each law's definition); with its blocks they are what a saved
      evaluation must share for its per-image outcomes to be reused (`view_paths`).
    An evaluation is named and listed by the parts of the evaluators that ran (`labels`), so that
    a new evaluator labels its evaluations by declaring these two, nothing else.
    """

    name: str
    passes: Callable[[dict], tuple]
    make_batch_fn: Callable
    figures: Callable[[dict, dict], dict]
    worst_case: bool = False
    needs_clean: bool = False
    label: str = ""
    subset: Callable | None = None
    combine: Callable | None = None
    make_rounds: Callable | None = None
    settings: type | None = None
    block: str = ""
    norms: tuple | None = None
    reads: tuple = ()
    name_part: Callable[[dict], str] | None = None
    describe: Callable[[dict], str] | None = None
    recorded: tuple = ()

    def view_paths(self) -> tuple:
        """The entries of results.json's settings its `View` is made of (the shared settings, the
        threat model if it attacks, its own block, the blocks it reads) and those it `recorded`:
        two evaluations of the same images and weights agreeing on these have its outcomes alike."""
        blocks = (THREAT_BLOCK,) if self.norms is not None else ()
        blocks += (self.settings_block,) if self.settings is not None else ()
        shared = tuple(f.name for f in dataclasses.fields(SharedSettings))
        return shared + blocks + tuple(self.reads) + tuple(self.recorded)

    def label_name(self, settings: dict) -> str:
        """Its part of the name of an evaluation with these settings (results.json's)."""
        if self.name_part is not None:
            return self.name_part(settings)
        return threat_name(settings) if self.norms is not None else ""

    def label_words(self, settings: dict) -> str:
        """What it measured in an evaluation with these settings (results.json's), in words."""
        if self.describe is not None:
            return self.describe(settings)
        return f"attacks {threat_model(settings)}" if self.norms is not None and threat_model(settings) else ""

    @property
    def settings_block(self) -> str:
        return self.block or self.name
