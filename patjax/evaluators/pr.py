"""Probabilistic robustness PR(x, eps) (Section 2.3), with the Theorem 2 lower bound and the
entropic risk, from one pass of N perturbations per image and level.

One pass per perturbation distribution (`eval.pr.distributions`: gaussian, uniform at every
eps of `eval.pr.epsilons`; pdis at its sigma = 1/sqrt(2 c1)). Per image and level the pass
returns the counts of non-adversarial samples and the loss statistics of
`robustness.pr_statistics`; the figures are means over images with bootstrap intervals, over
all images and over the clean-correct ones (the paper's convention, AT-PR's Prob.Acc).
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from patjax.core.errors import UserError, check_counts, count, linf_radius
from patjax.data import cifar
from patjax.evaluators import common, intervals, stats
from patjax.methods.common import Resolution
from patjax.pat import laws, robustness
from patjax.pat.laws import pdis

BLOCK = "pr"

# Named headline-PR settings, one flag each (`python -m patjax.evaluate --pr_preset=NAME`), by
# their paths in the config's `eval` block: the same estimand as the Table-1 protocol (uniform
# noise, N = 100 per image, the mean over clean-correct images, a margin >= 0 counting as
# adversarial) at the radii of a published table.
PRESETS = {
    # The paper's Table 1: PR at eps 0.1, 0.12, 0.15, 0.2 (docs/evaluation.md).
    "table1": {"pr.distribution": "uniform", "pr.epsilons": (0.1, 0.12, 0.15, 0.2), "pr.samples": 100},
    # PRBench's leaderboard: its evaluate.py (wellzline/PRBenchmark, evaluate_PR) takes
    # radius = [round(8/255, 2), 0.08, 0.1, 0.12], so its first radius is 0.03, not 8/255.
    # Its law alone: the Gaussian and p_dis laws beside it are not PRBench's and would double the time.
    "prbench": {
        "pr.distribution": "uniform",
        "pr.distributions": ("uniform",),
        "pr.epsilons": (0.03, 0.08, 0.1, 0.12),
        "pr.samples": 100,
    },
    # The same estimand under the L2 law `uniform_l2` alone (no published table: the radii are
    # patjax's choice, docs/evaluation.md): from AutoAttack's L2 radius on CIFAR-10, 0.5, to past
    # the noise energy of Table 1's uniform law (its RMS L2 norm is eps sqrt(d / 3), 3.2 to 6.4
    # on CIFAR's d = 3072 at eps 0.1 to 0.2).
    "l2": {
        "pr.distribution": "uniform_l2",
        "pr.distributions": ("uniform_l2",),
        "pr.epsilons": (0.5, 1.0, 2.0, 4.0, 8.0),
        "pr.samples": 100,
    },
}


# The presets by what they are, in the words every table, plot and results.json uses.
PRESET_NAMES = {"table1": "the Table-1 protocol", "prbench": "PRBench's protocol", "l2": "patjax's L2 radii"}


def preset_of(distribution: str, epsilons, samples=None) -> str:
    """The preset (`PRESETS`' key) whose headline law and radii these are (and N, where `samples`
    is given: a caption that names a published protocol holds its N too), or ''."""
    for name, preset in PRESETS.items():
        if (
            distribution == preset["pr.distribution"]
            and tuple(float(e) for e in epsilons) == preset["pr.epsilons"]
            and (samples is None or int(samples) == preset["pr.samples"])
        ):
            return name
    return ""


def protocol_name(distribution: str, epsilons, samples=None) -> str:
    """The published protocol a headline law, its radii (and N) are (`PRESET_NAMES`), or ''."""
    preset = preset_of(distribution, epsilons, samples)
    return PRESET_NAMES[preset] if preset else ""


def law_words(settings) -> str:
    """'uniform law at ε = 0.1, 0.12, 0.15, 0.2 (the Table-1 protocol), N = 100 per image': the
    headline PR's law, radii and samples of a results.json settings record."""
    own = settings[BLOCK]
    dist, radii, samples = own["distribution"], own.get("epsilons", ()), own["samples"]
    name = protocol_name(dist, radii, samples)
    at = ", ".join(f"{float(e):g}" for e in radii)
    return f"{dist} law at ε = {at}{f' ({name})' if name else ''}, N = {samples} per image"


# The N of every preset, the paper's: a name says N only where it is another.
STANDARD_SAMPLES = 100


def name_part(settings) -> str:
    """PR's part of an evaluation's name: its preset (table1, prbench, l2) or its law and radii
    (uniform-0.1-0.3), with -N and its samples where they are not the presets' 100."""
    own = settings[BLOCK]
    law, radii, samples = own["distribution"], own.get("epsilons") or (), own.get("samples", STANDARD_SAMPLES)
    part = preset_of(law, radii) or "-".join([law, *(f"{float(e):g}" for e in radii)])
    return part if samples == STANDARD_SAMPLES else f"{part}-N{samples}"


@dataclasses.dataclass(frozen=True)
class PRSettings:
    """PR's own settings (config block `eval.pr`), checked here before any evaluator runs.

    The counts' upper bounds keep every sample index inside int32 and every allocation a machine
    can hold, at 10,000 times the paper's N = 100: a sample's index is chunk * chunk_size + i in
    int32; one forward pass takes len(epsilons) x batch x chunk images (500 x 4 x 10,000 is 20
    million CIFAR images)."""

    # The law of the headline PR (results.json's `pr`, over clean-correct images), a law of eps of
    # `laws.REGISTRY`: 'uniform' (the Table-1 protocol, docs/evaluation.md), 'gaussian', 'uniform_l2'.
    distribution: str = "uniform"
    # PR is computed for every law listed ('pdis' = the paper's p_dis with c1 below; each law's
    # definition is its module's in patjax/pat/laws/) and always for `distribution`, which is
    # listed first whatever the order given.
    distributions: tuple = ("uniform", "gaussian", "pdis")
    epsilons: tuple = (0.1, 0.12, 0.15, 0.2)
    samples: int = count("eval.pr.samples", 1, 1_000_000, default=100)  # N perturbations per image
    # Perturbations per image evaluated at once: one forward pass takes len(epsilons) x batch x
    # chunk images (4 x 500 x 5 = 10,000 at the defaults), which bounds the pass's memory
    # (docs/evaluation.md); the counts do not depend on it. Capped at `samples`.
    chunk_size: int = count("eval.pr.chunk_size", 1, 10_000, default=5)
    # p_dis ~ exp(-c1 ||x'-x||^2) truncated to [0,1]^d; <= 0: the run's sampler's langevin.c1 (`resolve`).
    pdis_c1: float = -1.0
    entropic_lambda: float = -1.0  # < 0: langevin.c2 - pat.beta (Proposition 10), `resolve`
    prob_acc_q: tuple = (0.2, 0.1, 0.05, 0.01)  # ProbAcc_q: the fraction of images with PR_i > 1 - q

    def __post_init__(self):
        for d in self.distributions:
            if d not in laws.REGISTRY:
                raise UserError(f"unknown PR distribution {d!r}; choose from {', '.join(laws.names())}")
        if self.distribution not in laws.of_eps():
            raise UserError(f"eval.pr.distribution must be one of {laws.of_eps()}")
        ordered = common.headline_first(self.distribution, self.distributions)
        object.__setattr__(self, "distributions", tuple(str(d) for d in ordered))
        object.__setattr__(self, "epsilons", tuple(float(e) for e in self.epsilons))
        object.__setattr__(self, "prob_acc_q", tuple(float(q) for q in self.prob_acc_q))
        check_counts(self)
        # A chunk beyond N evaluates samples that are then masked out: the counts are the same,
        # the work and memory chunk / N times more.
        object.__setattr__(self, "chunk_size", min(self.chunk_size, self.samples))
        if any(not 0 < q < 1 for q in self.prob_acc_q):
            raise UserError(f"eval.pr.prob_acc_q must lie in (0, 1), got {self.prob_acc_q}")
        if not self.epsilons or min(self.epsilons) < 0:
            raise UserError("eval.pr.epsilons must be non-empty and non-negative")
        per_pixel = [d for d in self.distributions if laws.get(d).per_pixel]
        if per_pixel:  # uniform_l2's radii are L2 norms, above 1 as often as not
            units = f"the {' and '.join(per_pixel)} laws' radii are per pixel, in [0, 1]"
            other = [d for d in self.distributions if d in laws.of_eps() and d not in per_pixel]
            if other:  # a law of eps in other units among them (uniform_l2): its radii go alone
                units += f"; {other[0]}'s radii: with eval.pr.distributions={other[0]} alone"
            linf_radius("eval.pr.epsilons", self.epsilons, units)
        for d in self.distributions:
            levels(self, d)  # a law with levels of its own checks the settings it reads (p_dis: c1 > 0)
        if self.entropic_lambda < 0:
            raise UserError(f"the entropic risk's lambda must be >= 0, got {self.entropic_lambda}")

    @classmethod
    def resolve(cls, fields: dict, r: Resolution) -> PRSettings:
        """The defaults read off the run: p_dis's c1 is its sampler's (langevin.c1), the entropic
        risk's lambda is langevin.c2 - pat.beta, floored at 0 (Proposition 10)."""
        sampler, snis = r.blocks["langevin"], r.blocks["pat"]
        if fields["pdis_c1"] <= 0:
            fields = dict(fields, pdis_c1=float(sampler.c1))
        if fields["entropic_lambda"] < 0:
            fields = dict(fields, entropic_lambda=max(float(sampler.c2) - float(snis.beta), 0.0))
        return cls(**fields)

    @property
    def pdis_sigma(self) -> float:
        """p_dis's scale, 1 / sqrt(2 c1) (nan without a c1)."""
        return pdis.sigma(self.pdis_c1) if self.pdis_c1 > 0 else float("nan")


def levels(s: PRSettings, distribution):
    """(perturbation levels, their result keys): the eps of `epsilons` for a law of eps, else the
    law's own (p_dis: its sigma, keyed by c1)."""
    own = laws.get(distribution).levels
    if own is not None:
        return own(s)
    return s.epsilons, [robustness.level_key(e) for e in s.epsilons]


def passes(s) -> tuple:
    return tuple(f"pr_{d}" for d in s.own.distributions)


def make_batch_fn(model_fns, s, pass_name):
    distribution, own = pass_name[len("pr_") :], s.own
    level_values, _ = levels(own, distribution)
    root = jax.random.PRNGKey(s.shared.seed)

    def fn(params, batch_stats, images, labels, indices):
        logits_fn = model_fns.attack_logits_fn(params, batch_stats)
        pr_stats = robustness.pr_statistics(
            logits_fn,
            root,
            cifar.to_float(images),
            labels,
            indices,
            level_values,
            own.samples,
            own.chunk_size,
            distribution,
            own.entropic_lambda,
        )
        return {k: v.T for k, v in pr_stats.items()}  # (batch, levels)

    return jax.jit(fn)


def level_figures(counts, sum_loss, lse_loss, correct, s) -> dict:
    """Figures of one perturbation level from per-image statistics (arrays over images)."""
    own, shared = s.own, s.shared
    n_samples = own.samples
    per_image = np.asarray(counts, np.float64) / n_samples
    lam = own.entropic_lambda
    mean_loss = np.asarray(sum_loss, np.float64) / n_samples
    risk = robustness.entropic_risk(lse_loss, n_samples, lam, sum_loss)
    cp_lo, cp_hi = stats.clopper_pearson(counts, n_samples, shared.confidence)
    out = {}
    clean_correct = np.asarray(correct, bool)
    for subset, mask in (("all", np.ones_like(clean_correct)), ("clean_correct", clean_correct)):
        fig = intervals.mean_with_interval(per_image, shared, mask)
        if mask.sum() > 1:
            fig.update({k: float(v) for k, v in robustness.variance_decomposition(per_image[mask], n_samples).items()})
        out[subset] = fig
    # ProbAcc_q: fraction of images with PR_i > 1 - q, over all images (`prob_acc`) and over
    # clean-correct images (`clean_correct.prob_acc`, AT-PR's Prob.Acc convention).
    out["prob_acc"] = {
        robustness.level_key(q): intervals.mean_with_interval(per_image > 1 - q, shared) for q in own.prob_acc_q
    }
    out["clean_correct"]["prob_acc"] = {
        robustness.level_key(q): intervals.mean_with_interval(per_image > 1 - q, shared, clean_correct)
        for q in own.prob_acc_q
    }
    out["expected_loss"] = intervals.mean_with_interval(mean_loss, shared)
    bound = robustness.lower_bound(mean_loss)
    out["lower_bound"] = intervals.mean_with_interval(bound, shared)
    # PR_i >= max(0, bound_i) too, so the mean of the positive parts is a (tighter) valid bound;
    # its Monte-Carlo estimate is biased up, though (E max(0, B-hat) >= max(0, E B-hat)).
    out["lower_bound_positive_part"] = intervals.mean_with_interval(np.maximum(bound, 0.0), shared)
    out["entropic_risk"] = intervals.mean_with_interval(risk, shared)
    # Biased high for finite N (the Monte-Carlo R_lambda is biased low, Jensen).
    out["lower_bound_entropic"] = intervals.mean_with_interval(robustness.lower_bound(risk), shared)
    out["per_image_clopper_pearson_mean_width"] = float(np.mean(cp_hi - cp_lo)) if per_image.size else None
    return out


def figures(per_image, s) -> dict:
    correct = per_image["clean"]["correct"]
    out = {}
    for d in s.own.distributions:
        _, keys = levels(s.own, d)
        st = per_image[f"pr_{d}"]
        out[d] = {
            k: level_figures(st["counts"][:, j], st["sum_loss"][:, j], st["lse_loss"][:, j], correct, s)
            for j, k in enumerate(keys)
        }
    return {"pr": out}


EVALUATOR = common.Evaluator(
    "pr",
    passes,
    make_batch_fn,
    figures,
    needs_clean=True,
    settings=PRSettings,
    name_part=name_part,
    describe=lambda settings: f"PR {law_words(settings)}",
    recorded=tuple(laws.REGISTRY),
)
