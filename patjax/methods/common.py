"""What the training methods share: the registry's entry (`Method`), the settings handed to a
method (`MethodSettings`) and the shared blocks they are built from (the baselines' inner attack,
Algorithm 1's sampler, PAT's importance weights), the SNIS weights of Eq. 2 and the training-mode
passes and metrics every method makes.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Mapping, Optional

import jax
import jax.numpy as jnp
import optax

from patjax.attacks import l2
from patjax.attacks import pgd as pgd_lib
from patjax.core.errors import UserError, check_counts, count, linf_radius, small_l2_radius
from patjax.models.networks import BN_MODES
from patjax.pat import langevin as langevin_lib


@dataclasses.dataclass(frozen=True)
class Method:
    """A registered training method: its loss and what the config hands it.

    `loss(params, model, batch_stats, x, y, key, s) -> (loss, (new_batch_stats, metrics))`, with
    `s` the run's `MethodSettings`: `s.own` an instance of `settings` read from the config block
    `block` (the method's name unless it reads another method's: fgsm_cor reads fgsm's), and the
    shared blocks the flags below ask for."""

    name: str  # --config.method=NAME
    loss: Callable[..., Any]
    display_name: str  # its row in the tables
    settings: Optional[type] = None  # its own frozen settings dataclass; each field is a config field
    block: str = ""
    # BatchNorm during its inner attack in its reference code, where it has one (s.attack): how
    # attack.bn_mode='auto' resolves.
    attack_bn_mode: Optional[str] = None
    # The threat models its inner attack has a form for (`attack.norm`); a run under another is refused.
    attack_norms: tuple = ("linf",)
    sampler: bool = False  # runs Algorithm 1 (s.sampler, config `langevin`)
    weighted: bool = False  # weights its per-example losses with PAT's SNIS weights (s.snis, config `pat`)

    @property
    def settings_block(self) -> str:
        """The config block its own settings are read from."""
        return self.block or self.name


@dataclasses.dataclass(frozen=True)
class AttackSettings:
    """The baselines' inner attack (config block `attack`), shared by fgsm, pgd, alp, clp, trades,
    mart, atpr, pgd_cor and fgsm_cor: Appendix E, "10-step attack, L-inf <= 8/255"; alpha = 2/255
    as MadryLab/cifar10_challenge and AT-PR (TRADES and MART use their own step sizes). Under
    norm 'l2' epsilon is the L2 ball's radius and step_size each normalized-gradient step's length
    (`attacks.l2.pgd_l2`), for the methods whose entry lists it (`Method.attack_norms`)."""

    epsilon: float = 8 / 255
    step_size: float = 2 / 255
    steps: int = count("attack.steps", 0, 100_000, default=10)
    norm: str = "linf"  # the threat model: 'linf' (the paper's) | 'l2'
    # BatchNorm during the attack: 'auto' = the baseline's reference code (batch statistics for
    # fgsm/pgd/alp/clp/atpr and the COR variants, running statistics for trades/mart, each
    # method's `Method.attack_bn_mode`); 'inference' | 'train' force one mode for all. Never
    # updates the running statistics. A method is handed it resolved (`config.method_settings`).
    bn_mode: str = "auto"

    def __post_init__(self):
        check_counts(self)
        if self.bn_mode not in ("auto",) + BN_MODES:
            raise UserError(f"attack.bn_mode must be 'auto', 'inference' or 'train', got {self.bn_mode!r}")
        if self.epsilon < 0 or self.step_size < 0:
            raise UserError("attack.epsilon and attack.step_size must be >= 0")
        if self.norm not in l2.NORMS:
            raise UserError(f"attack.norm must be one of {', '.join(l2.NORMS)}, got {self.norm!r}")
        if self.norm == "linf":
            linf_radius("attack.epsilon", self.epsilon)
            linf_radius("attack.step_size", self.step_size)
        else:
            small_l2_radius("attack.epsilon", self.epsilon, l2.RADII["l2"][0])


@dataclasses.dataclass(frozen=True)
class SamplerSettings(langevin_lib.LangevinSettings):
    """Algorithm 1 as the methods run it (config block `langevin`): its settings (Appendix E's by
    default; `python -m patjax.diagnose` measures where the chain settles, for the opt-in `init`
    and `tolerance`), and BatchNorm inside the sampler, inference by default (our choice where the
    paper is silent: each chain's energy then depends on its own image only; docs/design.md)."""

    bn_mode: str = "inference"

    def __post_init__(self):
        super().__post_init__()
        if self.bn_mode not in BN_MODES:
            raise UserError(f"langevin.bn_mode must be 'inference' or 'train', got {self.bn_mode!r}")

    def langevin_settings(self) -> langevin_lib.LangevinSettings:
        """Algorithm 1's settings alone, without the model's BatchNorm mode."""
        fields = dataclasses.fields(langevin_lib.LangevinSettings)
        return langevin_lib.LangevinSettings(**{f.name: getattr(self, f.name) for f in fields})


@dataclasses.dataclass(frozen=True)
class SnisSettings:
    """PAT's importance weights (config block `pat`), read by pat and by the COR variants of
    Table 2, which train on the PGD / FGSM batch with these weights."""

    beta: float = 0.001  # SNIS smoothing factor (Eq. 2, Sec. 5.4); 0 is PAT(WOS)

    def __post_init__(self):
        if self.beta < 0:
            raise UserError(f"pat.beta must be >= 0 (0 is PAT(WOS)), got {self.beta}")


@dataclasses.dataclass(frozen=True)
class Resolution:
    """What a block may read to fill a default that depends on the run: the network's name and the
    shared training blocks' settings (`SHARED_BLOCKS`: langevin, pat, attack). A settings class
    with such a default defines a classmethod `resolve(cls, fields, r)` that returns the settings
    its plug-in is handed, checked once on the resolved values; the config reader calls it
    (`settings_of`) and knows no plug-in by name."""

    model: str
    blocks: Mapping[str, Any]


def settings_of(settings_class, fields: dict, r: Optional[Resolution] = None):
    """A block's settings from its fields: `settings_class.resolve(fields, r)` where the class
    defines one, else `settings_class(**fields)`."""
    resolve = getattr(settings_class, "resolve", None)
    if resolve is None:
        return settings_class(**fields)
    assert r is not None, f"{settings_class.__name__} resolves defaults from the run; pass a Resolution"
    return resolve(fields, r)


# The shared blocks and their settings; a method's own block is declared by its `Method` entry.
SHARED_BLOCKS = {"langevin": SamplerSettings, "pat": SnisSettings, "attack": AttackSettings}


@dataclasses.dataclass(frozen=True)
class MethodSettings:
    """What a method reads, typed and checked once from the config (`config.method_settings`):
    its name, its own settings and the shared blocks its `Method` entry asks for (None for a
    block it does not read). No class holds every method's settings."""

    name: str
    own: Any = None  # its `Method.settings`
    attack: Optional[AttackSettings] = None  # bn_mode resolved for this method
    sampler: Optional[SamplerSettings] = None
    snis: Optional[SnisSettings] = None

    def __post_init__(self):
        # Algorithm 1 starts each chain at Uniform[0,1]^d (Algorithm 2, line 7), not at x, and x
        # enters only through the gradient steps (the loop of lines 8-14) on the energy's c1 ||x_adv - x||^2
        # (line 11): from that start, with no step, a zero step size or c1 = 0, the batch a method
        # trains on does not depend on x, and the run would train without complaint on images
        # unrelated to their labels.
        s = self.sampler
        if s is None or s.init != "uniform":
            return
        for field in ("steps", "step_size", "c1"):
            if getattr(s, field) == 0:
                paper = getattr(SamplerSettings(), field)  # its default, Appendix E's
                raise UserError(
                    f"{self.name} trains on Algorithm 1's samples, which from langevin.init = 'uniform' with "
                    f"langevin.{field} = 0 do not depend on x (the chain reaches x only by its steps on the energy's "
                    f"c1 ||x_adv - x||^2); set langevin.{field} > 0 (Appendix E: {paper:g}) or langevin.init = 'clean'"
                )


def check_beta(beta) -> None:
    """The one check of beta where an objective takes it (`SnisSettings`'s): a Python number is
    checked; a traced one (a schedule of beta in the user's step) is the caller's to keep >= 0."""
    if isinstance(beta, (int, float)):
        SnisSettings(beta=beta)


def snis_weights(losses: jax.Array, beta: float) -> jax.Array:
    """Self-normalized importance weights over the batch (Algorithm 2, lines 17-18; Eq. 2).

    w = softmax(Detach(-beta * l)): beta = 0 gives uniform weights (PAT(WOS)).
    """
    return jax.nn.softmax(jax.lax.stop_gradient(-beta * losses), axis=0)


def weighted_loss(losses: jax.Array, beta: float):
    """(sum_i w_i l_i, w) with the SNIS weights (Algorithm 2, line 19)."""
    weights = snis_weights(losses, beta)
    return jnp.sum(weights * losses), weights


def accuracy(logits, y):
    return jnp.mean(jnp.argmax(logits, axis=-1) == y)


# The training-mode forward an objective differentiates: (x, state) -> (logits, state). `state` is
# whatever the model updates in training mode and the objective threads from pass to pass in the
# order the reference code makes its passes: Linen's batch_stats (`mutable=["batch_stats"]`), or
# None for an NNX module, which updates its BatchStat variables itself (`models.forwards`).
TrainFn = Callable[[jax.Array, Any], tuple]


def train_logits(train_fn: TrainFn, x: jax.Array, state):
    """(logits, state) of one training-mode pass, its shape checked while tracing: an objective
    reads per-example logits (B, classes), and other shapes would broadcast into a wrong loss."""
    logits, state = train_fn(x, state)
    if getattr(logits, "ndim", 0) != 2 or logits.shape[0] != x.shape[0] or logits.shape[1] < 2:
        raise UserError(
            f"the training forward must return (B, classes) logits with classes >= 2 for B = {x.shape[0]} images, "
            f"got shape {getattr(logits, 'shape', type(logits).__name__)}"
        )
    return logits, state


def train_passes(train_fn: TrainFn, state, inputs):
    """Training-mode forward passes on `inputs` in order, as consecutive PyTorch calls under
    model.train(): each pass is normalized by its own batch statistics and makes one
    momentum update of the running statistics. Returns ([logits per input], state).
    Repeated inputs give identical logits; they are repeated for the statistics only."""
    all_logits = []
    for x in inputs:
        logits, state = train_logits(train_fn, x, state)
        all_logits.append(logits)
    return all_logits, state


def weighted_ce(train_fn: TrainFn, x_adv, y, beta: float, state=None):
    """Phase 2 of Algorithm 2 on a given adversarial batch (lines 15-19): one training-mode pass,
    sum_i w_i CE_i with the detached SNIS weights (beta = 0: the mean). (loss, (state, metrics))."""
    logits, state = train_logits(train_fn, x_adv, state)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)  # line 16
    loss, weights = weighted_loss(losses, beta)
    metrics = {
        "loss": loss,
        "adv_accuracy": accuracy(logits, y),
        "snis_weight_mean": jnp.mean(weights),
        "snis_weight_max": jnp.max(weights),
    }
    return loss, (state, metrics)


def mean_ce(logits, y):
    return jnp.mean(pgd_lib.cross_entropy_loss(logits, y))


def uniform_weights(batch: int) -> dict:
    """The SNIS metrics of a method without importance weights: 1/B each."""
    return {"snis_weight_mean": jnp.float32(1.0 / batch), "snis_weight_max": jnp.float32(1.0 / batch)}
