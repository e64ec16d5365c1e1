"""aa: standard AutoAttack (Croce & Hein 2020) at the threat model's eps and norm (eval.attack.eps,
eval.attack.norm: the reference's norm='Linf' or norm='L2' version), with gradient-masking checks;
its own settings are the block `eval.aa`, its APGD's `eval.apgd`.

The reference's 'standard' version (autoattack.py): APGD-CE (1 restart), APGD-T (the 9 classes
with the highest clean logits after the top one, 1 restart each), FAB-T (the same 9 targets) and
Square (5,000 queries, 1 restart), in that order, each run only on the images still robust after
the ones before it (the cost stays near one attack's); an image is robust if it is classified
correctly at x and no attack fools it. Within an attack too the images fooled leave, as in the
reference: APGD-T and FAB-T run one target rank per round, Square one span of its queries per
round (`square_span_ends`; the reference drops them after every query), each round on the images
still robust, packed into batches of a few fixed widths (`batches.Rounds`, `batches.pack`).
Every attack is compiled and batch-sharded like the other evaluators: APGD (`apgd.apgd`, whose
one departure is its docstring's), FAB-T (`patjax.attacks.fab`) and Square (`patjax.attacks.square`, its L2 branch
`patjax.attacks.square_l2`) each list how they differ from the reference, under either norm. The
L2 version is the same sequence with each attack's L2 branch (autoattack.py's _set_version
'standard' treats 'Linf' and 'L2' alike). The
reference seeds one torch generator per attack; here each image's randomness is keyed by its
index (`streams.per_example`), so a figure does not depend on the batch size or which images
an earlier attack or round left.

Gradient-masking checks (Athalye et al. 2018; Carlini et al. 2019), reported with every run:
  - the reference's own: Square, after the gradient-based attacks, lowers robust accuracy by
    more than 0.2 pp;
  - Square alone, a black-box attack that reads no gradient, on every clean-correct image,
    against APGD-CE alone: a black-box attack significantly stronger than the white-box one
    (one-sided exact sign test on the images only one of them fools, p < 1 - eval.confidence)
    is a sign that the gradients mislead;
  - APGD-CE at growing eps (eval.aa.masking_eps_factors x eps): robust accuracy must fall to 0;
    a model still robust at L-inf eps = 0.5 (a ball that holds the grey image) is not robust, its
    gradients are. Under L2 the largest default radius, 16 x 0.5 = 8, is short of the sqrt(d) / 2
    (27.7 on CIFAR) that reaches the grey image from any image, so a figure above 0 there is a
    sign to look into, not a proof.
Neither check proves the absence of masking; a failed one is reported in `masking_signs`.
No model in patjax is randomized at test time (BatchNorm runs in inference mode, no input
noise), so the randomized-defence version (EOT) is not needed and not offered.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
from scipy import special

from patjax.attacks import apgd, fab, l2, square, square_l2
from patjax.core.errors import UserError, check_counts, count
from patjax.data import cifar
from patjax.evaluators import apgd as apgd_evaluators
from patjax.evaluators import batches, common, intervals, streams


@dataclasses.dataclass(frozen=True)
class AutoAttackSettings:
    """AutoAttack's own settings (config block `eval.aa`): the reference's 9 target classes,
    FAB-T's 100 iterations and Square's 5,000 queries; the gradient-masking check runs APGD-CE
    again at these multiples of the threat model's eps. At most CIFAR-100's 99 other classes are
    targets (an evaluation checks them against the model's, `fab.fab_target_classes`)."""

    target_classes: int = count("eval.aa.target_classes", 1, 99, default=9)
    fab_steps: int = count("eval.aa.fab_steps", 1, 100_000, default=100)
    square_queries: int = count("eval.aa.square_queries", 1, 1_000_000, default=5000)
    masking_eps_factors: tuple = (2.0, 4.0, 8.0, 16.0)

    def __post_init__(self):
        check_counts(self)
        object.__setattr__(self, "masking_eps_factors", tuple(float(f) for f in self.masking_eps_factors))
        if any(not f > 1 for f in self.masking_eps_factors):
            raise UserError(f"eval.aa.masking_eps_factors must be > 1, got {self.masking_eps_factors}")


BLOCK = "aa"
STAGES = ("apgd_ce", "apgd_t", "fab_t", "square")  # the reference's order
SQUARE_GAIN_TOLERANCE = 0.002  # checks.py: check_square_sr's alpha
LABELS = {"apgd_ce": "APGD-CE", "apgd_t": "APGD-T", "fab_t": "FAB-T", "square": "Square"}
# Keys: AutoAttack's own are fold_in(PRNGKey(seed), STREAM_BASE + k), the streams the committed
# AutoAttack results were drawn with: past the kept streams of `streams.attack_key` and below its
# streams derived from names, so never one of theirs.
STREAM_BASE = 100
assert max(streams.KEPT_STREAMS.values()) < STREAM_BASE and STREAM_BASE + 4 < streams.NAME_STREAMS_FROM


def sign_test_p_value(wins: int, losses: int) -> float:
    """The one-sided exact sign test's p-value, P(X >= wins) for X ~ Bin(wins + losses, 1/2): the
    binomial tail from scipy.special (scipy.stats.binomtest gives the same and takes 0.7 s to
    import in every command)."""
    return float(special.bdtrc(wins - 1, wins + losses, 0.5)) if wins else 1.0


# Square under each threat model (`eval.attack.norm`): the L-inf and L2 branches of square.py.
SQUARE_BY_NORM = {"linf": square.square_linf, "l2": square_l2.square_l2}
assert tuple(SQUARE_BY_NORM) == l2.NORMS


def _key(seed: int, stream: int):
    return jax.random.fold_in(jax.random.PRNGKey(seed), STREAM_BASE + stream)


def _masking_passes(s) -> tuple:
    return ("aa_square_alone",) + tuple(f"aa_apgd_ce_x{f:g}" for f in s.own.masking_eps_factors)


def passes(s) -> tuple:
    return tuple(f"aa_{stage}" for stage in STAGES) + _masking_passes(s)


# Square's queries are cut into spans, after each of which the images it fooled leave the batch
# (the reference drops them after every query): short spans first, where most images fall.
SQUARE_SPAN_ENDS = (10, 20, 30, 50, 75, 100, 150, 200, 250, 300, 400, 500, 600, 800, 1000, 1250, 1500, 1750, 2000)
SQUARE_SPAN_STEP = 500  # past the last end above


def square_span_ends(n_queries: int) -> tuple:
    """The query after which each round of Square's pass ends (the last: n_queries)."""
    ends = [e for e in SQUARE_SPAN_ENDS if e < n_queries]
    ends += range(SQUARE_SPAN_ENDS[-1] + SQUARE_SPAN_STEP, n_queries, SQUARE_SPAN_STEP)
    return (*ends, n_queries)


def _stage(s, pass_name):
    """(stage, its key, its eps) of an aa pass."""
    name = pass_name[len("aa_") :]
    stream = {"apgd_ce": 0, "apgd_t": 1, "fab_t": 2, "square": 3, "square_alone": 3}.get(name, 4)
    factor = float(name.split("_x")[1]) if "_x" in name else 1.0  # the masking check's larger balls
    return name, _key(s.shared.seed, stream), s.threat.eps * factor


def _apgd_robust(logits_fn, key, x, y, s, eps, loss, target=None):
    """Whether APGD (one run, `eval.apgd`'s settings) leaves the image (x: (1, ...)) robust."""
    own = s[apgd_evaluators.BLOCK]
    norm = s.threat.norm
    return apgd.apgd(
        logits_fn, key, x, y, eps=eps, steps=own.steps, loss=loss, rho=own.rho, target=target, norm=norm
    ).robust


def _square_outputs(out) -> dict:
    # Still to attack: unfooled with a positive margin (random_search's loop condition).
    return {
        "robust": ~out.fooled,
        "queries": out.queries,
        "_x_best": out.x_best,
        "_margin": out.margin,
        batches.ACTIVE: ~out.fooled & (out.margin > 0),
    }


def make_batch_fn(model_fns, s, pass_name):
    """The pass's batch function; for APGD-T, FAB-T and Square (alone too) its first round, which
    classifies x (and takes Square's start), and `make_rounds` the rest: one per target class, one
    per span of Square's queries, each on the images still robust."""
    own = s.own
    name, key, eps = _stage(s, pass_name)
    square_attack = SQUARE_BY_NORM[s.threat.norm]

    def fn(params, batch_stats, images, labels, indices):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        x = cifar.to_float(images)
        if name.startswith("apgd_ce"):
            robust = streams.per_example(
                lambda k, xi, yi: _apgd_robust(logits_fn, k, xi, yi, s, eps, "ce"), key, indices, x, labels
            )
            return {"robust": robust, "clean_correct": jnp.argmax(logits_fn(x), axis=-1) == labels}
        if name == "apgd_t":
            clean = jnp.argmax(logits_fn(x), axis=-1) == labels
            return {"robust": clean, batches.ACTIVE: clean}
        if name == "fab_t":
            state = fab.fab_t_start(logits_fn, x, labels)
            return {"robust": state.robust, "norm": state.dist, batches.ACTIVE: state.robust}
        out = streams.per_example(
            lambda k, xi, yi: square_attack(logits_fn, k, xi, yi, eps=eps, n_queries=own.square_queries, span=(0, 0)),
            key,
            indices,
            x,
            labels,
        )
        return _square_outputs(out)

    return jax.jit(fn)


def make_rounds(model_fns, s, pass_name):
    """APGD-T's and FAB-T's runs, one round per target rank (the reference's loop over target
    classes, each on the images still robust), and Square's spans of queries; None for APGD-CE."""
    own = s.own
    name, key, eps = _stage(s, pass_name)
    norm = s.threat.norm
    square_attack = SQUARE_BY_NORM[norm]
    if name.startswith("apgd_ce"):
        return None

    def apgd_t(logits_fn, x, labels, indices, rank, carried):
        def one(k, xi, yi):  # the rank's target: fab_target_classes' row, as the reference's
            target = fab.fab_target_classes(logits_fn(xi), own.target_classes)[rank]
            return _apgd_robust(logits_fn, jax.random.fold_in(k, rank), xi, yi, s, eps, "dlr_targeted", target)

        robust = streams.per_example(one, key, indices, x, labels)
        return {"robust": robust, batches.ACTIVE: robust}

    def fab_t(logits_fn, x, labels, indices, run, carried):  # no randomness with one restart
        state = fab.fab_t_run(
            logits_fn,
            key,
            x,
            labels,
            fab.fab_target_classes(logits_fn(x), own.target_classes),
            run,
            fab.FabState(carried["robust"], x, carried["norm"]),
            eps=eps,
            n_iter=own.fab_steps,
            norm=norm,
        )
        return {"robust": state.robust, "norm": state.dist, batches.ACTIVE: state.robust}

    ends = square_span_ends(own.square_queries)
    firsts, stops = jnp.asarray((0,) + ends[:-1], jnp.int32), jnp.asarray(ends, jnp.int32)

    def square_span(logits_fn, x, labels, indices, span, carried):
        def one(k, xi, yi, c):
            resume = square.SquareResult(xi, None, c["queries"], c["_margin"], c["_x_best"], None)
            return square_attack(
                logits_fn,
                k,
                xi,
                yi,
                eps=eps,
                n_queries=own.square_queries,
                resume=resume,
                span=(firsts[span], stops[span]),
            )

        return _square_outputs(streams.per_example(one, key, indices, x, labels, carried))

    attack, count = {
        "apgd_t": (apgd_t, own.target_classes),
        "fab_t": (fab_t, own.target_classes),
    }.get(name, (square_span, len(ends)))

    def fn(params, batch_stats, images, labels, indices, round_index, carried):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        return attack(logits_fn, cifar.to_float(images), labels, indices, round_index - 1, carried)

    return batches.Rounds(count + 1, jax.jit(fn))


def subset(pass_name, per_image):
    """Each attack after the first runs on the images still robust; Square alone on every
    clean-correct image; APGD-CE at the larger eps on every image."""
    name = pass_name[len("aa_") :]
    if name in STAGES[1:]:
        before = per_image[f"aa_{STAGES[STAGES.index(name) - 1]}"]["robust"]
        return np.flatnonzero(before)
    if name == "square_alone":
        return np.flatnonzero(per_image["aa_apgd_ce"]["clean_correct"])
    return None


def combine(per_image, s) -> dict:
    """robust: no attack fooled the image (and it is correct at x); broken_by: 0 misclassified
    at x, k = 1..4 fooled first by STAGES[k - 1], -1 robust."""
    clean = per_image["aa_apgd_ce"]["clean_correct"]
    broken_by = np.where(clean, -1, 0).astype(np.int8)
    robust = clean.copy()
    for k, stage in enumerate(STAGES, start=1):
        after = per_image[f"aa_{stage}"]["robust"]
        broken_by[robust & ~after] = k
        robust &= after
    return {"robust": robust, "broken_by": broken_by}


def figures(per_image, s) -> dict:
    eps, own, apgd_settings = s.threat.eps, s.own, s[apgd_evaluators.BLOCK]
    confidence = s.shared.confidence
    out = per_image["aa"]
    n = len(out["robust"])
    clean = per_image["aa_apgd_ce"]["clean_correct"]
    fig = dict(intervals.proportion(out["robust"], confidence))
    # Its own clean accuracy (APGD-CE's first pass classifies every image), so that an `aa`
    # evaluation without the clean evaluator still reports the figure its robust ones are read against.
    fig["clean_accuracy"] = intervals.proportion(clean, confidence)
    fig["after"] = {}  # robust accuracy after each attack of the sequence (the reference's log)
    robust = clean.copy()
    for stage in STAGES:
        robust = robust & per_image[f"aa_{stage}"]["robust"]
        fig["after"][stage] = intervals.proportion(robust, confidence)
    fig["broken_by"] = {
        "misclassified": int(np.sum(out["broken_by"] == 0)),
        **{stage: int(np.sum(out["broken_by"] == k)) for k, stage in enumerate(STAGES, start=1)},
        "robust": int(np.sum(out["broken_by"] == -1)),
    }
    square_alone = per_image["aa_square_alone"]["robust"]  # False where not attacked (clean errors)
    apgd_alone = per_image["aa_apgd_ce"]["robust"]
    by_eps = {f"{eps:.6g}": intervals.proportion(apgd_alone, confidence)}
    for f in own.masking_eps_factors:
        by_eps[f"{eps * f:.6g}"] = intervals.proportion(per_image[f"aa_apgd_ce_x{f:g}"]["robust"], confidence)
    signs = []
    # The reference's own check (checks.py: check_square_sr): Square, run after the gradient-based
    # attacks, should find (almost) nothing they missed.
    square_gain = fig["after"]["fab_t"]["value"] - fig["after"]["square"]["value"]
    if square_gain > SQUARE_GAIN_TOLERANCE:
        signs.append(f"Square lowers robust accuracy by {square_gain:.2%} after the gradient-based attacks")
    # Square alone against APGD-CE alone, paired on the same images: a one-sided exact sign test on
    # the images only one of them fools (McNemar), so one image of chance is not a sign.
    square_only = int(np.sum(apgd_alone & ~square_alone & clean))  # fooled by Square, not by APGD-CE
    apgd_only = int(np.sum(~apgd_alone & square_alone & clean))
    p_value = sign_test_p_value(square_only, apgd_only)
    if p_value < 1 - confidence:
        signs.append(
            f"Square alone fools {square_only} images APGD-CE alone does not, APGD-CE {apgd_only} that Square "
            f"does not (sign test p = {p_value:.2g})"
        )
    largest = by_eps[f"{eps * max(own.masking_eps_factors):.6g}"] if own.masking_eps_factors else None
    if largest is not None and largest["value"] > 0:
        signs.append(
            f"robust accuracy {largest['value']:.2%} at eps {eps * max(own.masking_eps_factors):.4g} (it should be 0)"
        )
    fig["masking"] = {
        "square_alone": intervals.proportion(square_alone, confidence),
        "apgd_ce_alone": intervals.proportion(apgd_alone, confidence),
        "fooled_by_square_not_apgd_ce": square_only,
        "fooled_by_apgd_ce_not_square": apgd_only,
        "square_stronger_p_value": p_value,
        "apgd_ce_by_eps": by_eps,
        "masking_signs": signs,
    }
    fig["settings"] = {
        "eps": eps,
        "norm": s.threat.norm,
        "version": "standard",
        "attacks": list(STAGES),
        "apgd_steps": apgd_settings.steps,
        "apgd_rho": apgd_settings.rho,
        "restarts": 1,
        "target_classes": own.target_classes,
        "fab_steps": own.fab_steps,
        "square_queries": own.square_queries,
        "square_p_init": 0.8,
        "masking_eps_factors": list(own.masking_eps_factors),
        "num_examples": n,
    }
    return {"aa": fig}


EVALUATOR = common.Evaluator(
    "aa",
    passes,
    make_batch_fn,
    figures,
    worst_case=True,
    label="AutoAttack",
    subset=subset,
    combine=combine,
    make_rounds=make_rounds,
    settings=AutoAttackSettings,
    norms=l2.NORMS,
    # Its APGD-CE and APGD-T run at eval.apgd's settings, as the reference's AutoAttack runs its
    # APGD with the standalone attack's defaults (apgd.ApgdSettings).
    reads=(apgd_evaluators.BLOCK,),
)
