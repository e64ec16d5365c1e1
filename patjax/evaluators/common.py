"""What every evaluator shares: the interface, the settings every evaluator reads (the shared
ones and the threat model) and the bundle each is handed, the padded and sharded batch loop, and
figures with intervals.

An evaluator (one module each: `clean`, `attack`, `apgd`, `autoattack`, `pr`, `certify`, each
declaring its own settings) is an `Evaluator`: one or more
passes over the test images, each a jitted per-batch function

    fn(params, batch_stats, images uint8, labels, image indices) -> {name: (batch, ...) array}

and a figures function from the per-image outputs of its passes to figures with intervals.
Randomness is keyed by the image's index in the test split (and the sample's index for PR):
batch size, chunk size and device count change no figure, and two models evaluated with the
same seed see the same perturbations (common random numbers).
"""

from __future__ import annotations

import dataclasses
import functools
import time
import zlib
from typing import Any, Callable, Mapping

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from patjax.attacks import l2
from patjax.core import sharding
from patjax.core.errors import UserError, check_counts, count, linf_radius
from patjax.data import cifar
from patjax.evaluators import stats

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
    above 1 is refused as one written in pixel levels."""

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


THREAT_BLOCK = "attack"  # the threat model's block of `eval`, which every attack evaluator reads


@dataclasses.dataclass(frozen=True)
class Settings:
    """What an evaluator is handed: the shared settings, and every block of the config's `eval`
    (`s["pr"]`, `s["attack"]`, ...: each evaluator's own, declared beside its code and named by its
    registry entry, and the threat model). Every block is read and checked whichever evaluators
    run, so that a bad field fails before any evaluation (`config.evaluation_settings`)."""

    shared: SharedSettings
    blocks: Mapping[str, Any]

    def __getitem__(self, block: str):
        return self.blocks[block]


@dataclasses.dataclass(frozen=True)
class Evaluator:
    """One evaluator behind the registry (`patjax.evaluators.REGISTRY`). Each function below is
    handed the evaluation's `Settings` `s`: its own block is `s[block]`.

    passes: settings -> names of its passes (one compiled function and one per-image output
      each; PR has one per perturbation distribution).
    make_batch_fn: (model_fns, settings, pass name) -> the jitted per-batch function.
    figures: (per-image outputs of every pass run, settings) -> {figure name: figure}.
    settings: its own frozen settings dataclass (each field a field of the config block
      `eval.<block>`, its default the config's), or None; evaluators that share a block (APGD-CE
      and APGD-DLR) name the same class.
    block: the block its settings are read from (default: its name).
    norms: the threat models (`eval.attack.norm`) it attacks under; None: it reads no threat
      model (clean accuracy, PR). An evaluation under a norm it lacks is refused before it runs.
    worst_case: whether its per-image outcome joins the worst case over attacks.
    label: its column's name in tables.
    subset: (pass name, per-image outputs of the passes before it) -> the indices of the images
      the pass runs on, or None for all of them (AutoAttack attacks only the points still
      robust); a pass on a subset returns zeros elsewhere and an `attacked` mask.
    combine: (per-image outputs of its passes, settings) -> its own per-image outputs (under its
      name), e.g. the outcome of several passes.
    make_rounds: (model_fns, settings, pass name) -> the pass's further rounds (`Rounds`: the
      images still to attack leave the others between them), or None for a pass of one round.
    needs_clean: whether its figures need the clean pass (PR over clean-correct images).
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

    @property
    def settings_block(self) -> str:
        return self.block or self.name


def attack_evaluator(
    name: str,
    label: str,
    batch_robust: Callable,
    settings: Callable,
    settings_type: type | None = None,
    block: str = "",
    norms: tuple = ("linf",),
) -> Evaluator:
    """A worst-case attack as an evaluator: one pass whose per-image output is `robust`.

    batch_robust(logits_fn, key, indices, x, y, s) -> (batch,) bool: whether each image is still
    classified correctly after the attack (keys per image: `per_example`, from the attack's own
    stream, `attack_key(seed, name)`); settings(s) -> the attack's settings recorded with its figure;
    settings_type, block, norms: its own settings, their block, the norms it attacks under (`Evaluator`).
    """

    def passes(s) -> tuple:
        return (name,)

    def make_batch_fn(model_fns, s, pass_name):
        key = attack_key(s.shared.seed, name)

        def fn(params, batch_stats, images, labels, indices):
            logits_fn = model_fns.attack_logits_fn(params, batch_stats)
            return {"robust": batch_robust(logits_fn, key, indices, cifar.to_float(images), labels, s)}

        return jax.jit(fn)

    def figures(per_image, s) -> dict:
        return {name: dict(proportion(per_image[name]["robust"], s.shared.confidence), settings=settings(s))}

    return Evaluator(
        name,
        passes,
        make_batch_fn,
        figures,
        worst_case=True,
        label=label,
        settings=settings_type,
        block=block,
        norms=norms,
    )


# The streams the committed figures were drawn with, numbered by hand before streams were derived
# from names: jax.random.split(PRNGKey(seed), 5)[k]. Every other attack's stream is its name's.
KEPT_STREAMS = {"pgd20": 1, "cw20": 2, "apgd_ce": 3, "apgd_dlr": 4}
# Derived streams lie at or above this: past every image index PR folds into the same root key
# (`attack_key`), past AutoAttack's own streams (100 + k), so a derived key is never one of theirs.
NAME_STREAMS_FROM = 2**24


def name_stream(name: str) -> int:
    """The key stream of an attack registered as `name`: a hash of the name (CRC-32, the same in
    every process and Python version, unlike `hash`) in [NAME_STREAMS_FROM, 2^31)."""
    return NAME_STREAMS_FROM + zlib.crc32(name.encode()) % (2**31 - NAME_STREAMS_FROM)


def attack_key(seed: int, name: str):
    """The random-start key of the attack registered as `name`, a stream of its own each (not
    independent of PR's noise: split(root, 5)[k] equals fold_in(root, k), PR's key of image k;
    that couples different images only, so no mean is biased): the kept streams are
    jax.random.split(PRNGKey(seed), 5)[KEPT_STREAMS[name]], every other name's
    fold_in(PRNGKey(seed), name_stream(name)) (PR keys its noise by PRNGKey(seed) itself)."""
    root = jax.random.PRNGKey(seed)
    if name in KEPT_STREAMS:
        return jax.random.split(root, len(KEPT_STREAMS) + 1)[KEPT_STREAMS[name]]
    return jax.random.fold_in(root, name_stream(name))


def per_example(attack, key, indices, x, y, *rest):
    """Runs `attack(key_i, x_i[None], y_i[None], *rest_i)` per example with key_i = fold_in(key,
    index_i); rest: further per-example arrays (or pytrees of them), each example's with a batch
    axis of 1."""

    def one(i, xi, yi, *ri):
        out = attack(jax.random.fold_in(key, i), xi[None], yi[None], *jax.tree.map(lambda a: a[None], ri))
        return jax.tree.map(lambda a: a[0], out)

    return jax.vmap(one)(indices, x, y, *rest)


def padded_batches(split: cifar.Split, image_indices: np.ndarray, batch_size: int):
    """Yields (images uint8, labels, image indices, mask) with every batch of batch_size."""
    for start in range(0, len(image_indices), batch_size):
        chosen = image_indices[start : start + batch_size]
        yield _padded(split, chosen, batch_size)


def _padded(split: cifar.Split, chosen: np.ndarray, width: int):
    """(images, labels, indices, mask) of the images `chosen`, padded to `width`."""
    pad = width - len(chosen)
    images = np.pad(split.images[chosen], ((0, pad), (0, 0), (0, 0), (0, 0)))
    labels = np.pad(split.labels[chosen], (0, pad))
    # Padding takes indices past the chosen ones': its keys never collide with a real image's.
    indices = np.concatenate([chosen, np.arange(pad) + len(split)]).astype(np.int32)
    return images, labels, indices, np.arange(width) < len(chosen)


def batch_widths(batch_size: int) -> tuple:
    """The widths a pass's batches take, ascending: batch_size and, below it, the devices of its
    mesh times 1, 2, 4, ... A pass compiles once per width it meets, so the images an earlier
    attack or round left (any number) are packed into these few widths, never into a width of
    their own; each is a multiple of the mesh's devices (`sharding.make_mesh(batch_size)`)."""
    devices = sharding.make_mesh(batch_size).size
    widths, width = {batch_size}, devices
    while width < batch_size:
        widths.add(width)
        width *= 2
    return tuple(sorted(widths))


# A batch is padded by at most a quarter of its images (or is the smallest width): padding costs
# as much as an image (an attack runs on it to the end), a smaller batch costs one more call.
MAX_PADDING = 0.25


def pack(num_images: int, widths: tuple) -> list:
    """(images, width) of each batch that takes `num_images` images at `widths` (ascending): whole
    batches of the largest width, then the rest in the largest widths it fills, until one width
    holds what is left with at most MAX_PADDING of it padding."""
    batches, left = [], num_images
    while left > 0:
        up = next((w for w in widths if w >= left), widths[-1])
        if up < left:
            batches.append((up, up))
        elif up == widths[0] or up - left <= MAX_PADDING * up:
            batches.append((left, up))
        else:
            up = max(w for w in widths if w <= left)
            batches.append((up, up))
        left -= batches[-1][0]
    return batches


NON_FINITE = "non_finite"  # the per-image flag `checking_logits` adds to a pass's outputs
# A pass run in rounds (`Rounds`) flags in ACTIVE the images still to attack in the next round;
# outputs whose names begin with PRIVATE (ACTIVE among them) travel from round to round and are
# not the pass's outputs.
PRIVATE = "_"
ACTIVE = PRIVATE + "active"


@dataclasses.dataclass(frozen=True)
class Rounds:
    """A pass run in rounds, so that the images already settled leave the batch between rounds
    (AutoAttack's target classes, Square's spans of queries), as the reference attacks only the
    images still robust. Round 0 is the pass's batch function; each of rounds 1 .. count - 1 is

        fn(params, batch_stats, images, labels, indices, round, carried) -> outputs

    on the images whose ACTIVE output is still set, `carried` their outputs of the round before;
    the images that left keep the outputs of the round they left in. Each image's randomness is
    keyed by its index, so which images share a batch changes no outcome."""

    count: int
    fn: Callable


def checking_logits(batch_fn, model_fns):
    """batch_fn with the per-image flag NON_FINITE: the model's logits at the image are not all
    finite, or the pass's own float outputs hold a NaN (PR's losses at its perturbed images).

    Any figure computed from such logits is meaningless: argmax of a NaN row picks class 0, a NaN
    margin compares False. `evaluate_pass` refuses the pass; the flag travels to the host with
    the outputs it already fetches per batch, so the check adds no synchronization, only one
    forward pass per batch (an attack's tens of forward and backward passes dwarf it; in the
    clean pass XLA may share it with the pass's own forward pass). A round's function
    (`Rounds.fn`, its further arguments passed on) is checked alike.
    """

    def fn(params, batch_stats, images, labels, indices, *rest):
        out = batch_fn(params, batch_stats, images, labels, indices, *rest)
        logits = model_fns.infer(params, batch_stats, cifar.to_float(images))
        bad = ~jnp.all(jnp.isfinite(logits), axis=-1)
        for value in jax.tree.leaves(out):
            if jnp.issubdtype(value.dtype, jnp.floating):
                bad = bad | jnp.any(jnp.isnan(value).reshape(value.shape[0], -1), axis=-1)
        return {**out, NON_FINITE: bad}

    return jax.jit(fn)


def refuse_non_finite(outputs: list, pass_name: str) -> list:
    """A pass's per-batch outputs without the NON_FINITE flag, or a one-line UserError naming the
    pass and how many of its images have it."""
    flags = [out.pop(NON_FINITE) for out in outputs if NON_FINITE in out]
    if flags and np.any(np.concatenate(flags)):
        bad = np.concatenate(flags)
        raise UserError(
            f"the model's logits are not finite on {int(np.sum(bad))} of {bad.size} images in the "
            f"{pass_name} pass; no figure is computed from them"
        )
    return outputs


def time_batch(batch_fn, state, split, batch_size) -> float:
    """Seconds one batch of a pass takes on the first images at its first batch's width, once
    compiled: a measured rate to extrapolate a long evaluation's time from. The compilation
    (ahead of time, `jax.jit(...).lower().compile()`) is the one the pass then reuses from jit's
    cache, so the measurement costs one batch."""
    taken, width = pack(len(split), batch_widths(batch_size))[0]
    mesh = sharding.make_mesh(batch_size)
    params, batch_stats = sharding.place_on_mesh(mesh, (state.params, state.batch_stats))[0]
    images, labels, indices, _ = _padded(split, np.arange(taken), width)
    args = (params, batch_stats, *sharding.shard_batch(mesh, images, labels, indices))
    compiled = batch_fn.lower(*args).compile()
    start = time.perf_counter()
    sharding.to_host(compiled(*args))
    return time.perf_counter() - start


def evaluate_pass(batch_fn, state, split, n, batch_size, desc, progress, subset=None, rounds=None):
    """Per-example outputs of one pass over the first n images (padding removed) and its wall time;
    with `subset` (image indices below n), over those images only: zeros elsewhere, and
    `attacked` marks the images it ran on. With `rounds` (`Rounds`), the pass's further rounds,
    each on the images the one before left ACTIVE.

    The images are packed into batches of `batch_widths(batch_size)` (`pack`), each split over the
    devices of `sharding.make_mesh(batch_size)` (on a CPU host one per core, see
    devices.use_cpu_cores_as_devices): every evaluator is per example (keys from the image
    index), so the packing and the split change which batch and core compute an image, not what
    is computed.
    """
    chosen = np.arange(n) if subset is None else np.asarray(subset, np.int64)
    widths = batch_widths(batch_size)
    mesh = sharding.make_mesh(batch_size)
    params, batch_stats = sharding.place_on_mesh(mesh, (state.params, state.batch_stats))[0]
    bar = tqdm(total=len(chosen), unit="img", desc=desc, dynamic_ncols=True, disable=not progress)
    start = time.perf_counter()

    def run(fn, positions, *extra, carried=None):
        """fn's outputs on the images chosen[positions], in order; `extra` and the images'
        `carried` outputs (a dict of arrays, one row per position) are its further arguments."""
        outputs, done = [], 0
        for taken, width in pack(len(positions), widths):
            part = slice(done, done + taken)
            done += taken
            images, labels, indices, mask = _padded(split, chosen[positions[part]], width)
            args = sharding.shard_batch(mesh, images, labels, indices) + extra
            if carried is not None:
                pad = [(0, width - taken)]
                values = [np.pad(v[part], pad + [(0, 0)] * (v.ndim - 1)) for v in carried.values()]
                args += (dict(zip(carried, sharding.shard_batch(mesh, *values))),)
            out = sharding.to_host(fn(params, batch_stats, *args))
            outputs.append(jax.tree.map(lambda a: np.asarray(a)[mask], out))
            left = outputs[-1][ACTIVE] if ACTIVE in outputs[-1] else np.zeros(taken, bool)
            bar.update(int(taken - left.sum()))
        bar.set_postfix(img_s=f"{bar.n / (time.perf_counter() - start):.1f}")
        outputs = refuse_non_finite(outputs, desc)
        return jax.tree.map(lambda *a: np.concatenate(a), *outputs) if outputs else None

    out = run(batch_fn, np.arange(len(chosen)))
    for round_index in range(1, rounds.count if rounds is not None and out is not None else 1):
        live = np.flatnonzero(out[ACTIVE])
        if not live.size:
            break
        new = run(rounds.fn, live, np.int32(round_index), carried={k: v[live] for k, v in out.items()})
        for key, value in new.items():
            out[key][live] = value
    bar.update(bar.total - bar.n)
    bar.close()
    wall = time.perf_counter() - start
    if out is not None:
        out = {k: v for k, v in out.items() if not k.startswith(PRIVATE)}
    if subset is None:
        return out, wall
    attacked = np.zeros(n, bool)
    attacked[chosen] = True
    if out is None:
        # No image to run on (every image misclassified before an attack on the robust ones, say):
        # the pass's outputs are zeros everywhere, shaped as one traced batch's, so that what
        # reads them (the next stage's subset, the figures) finds every key.
        images, labels, indices, _ = _padded(split, np.arange(1), widths[0])
        images, labels, indices = sharding.shard_batch(mesh, images, labels, indices)
        shapes = dict(jax.eval_shape(batch_fn, params, batch_stats, images, labels, indices))
        shapes = {k: v for k, v in shapes.items() if k != NON_FINITE and not k.startswith(PRIVATE)}
        empty = jax.tree.map(lambda a: np.zeros((n,) + a.shape[1:], a.dtype), shapes)
        return {**empty, "attacked": attacked}, wall

    def scatter(values):
        full = np.zeros((n,) + values.shape[1:], values.dtype)
        full[chosen] = values
        return full

    return {**jax.tree.map(scatter, out), "attacked": attacked}, wall


# ---------------------------------------------------------------------------------------
# Figures with intervals (host side, float64).


def proportion(hits, confidence) -> dict:
    """Fraction of hits with its Clopper-Pearson interval."""
    hits = np.asarray(hits, bool)
    lo, hi = stats.clopper_pearson(hits.sum(), hits.size, confidence)
    return {
        "value": float(hits.mean()) if hits.size else None,
        "interval": [float(lo), float(hi)],
        "interval_method": "clopper-pearson",
        "n": int(hits.size),
    }


@functools.lru_cache(maxsize=1)
def bootstrap_indices(num_items: int, num_resamples: int, seed: int) -> np.ndarray:
    """stats.bootstrap_indices over all evaluated images, drawn once per (images, resamples,
    seed): every figure resamples the same images (read-only; 80 MB at 2,000 x 10,000 as int32;
    `bootstrap_indices.cache_clear()` once an evaluation's figures are computed)."""
    idx = stats.bootstrap_indices(num_items, num_resamples, seed).astype(np.int32)
    idx.setflags(write=False)
    return idx


def mean_with_interval(values, s: SharedSettings, mask=None) -> dict:
    """Mean of per-image `values` over the images in `mask` (default: all), with the interval of
    `stats.ratio_interval`: resampling all images, so a subset such as the clean-correct images
    is drawn anew in every resample, exactly as the suite tables do."""
    values = np.asarray(values, np.float64)
    mask = np.ones(values.shape) if mask is None else np.asarray(mask, np.float64)
    if mask.sum() == 0:
        return {"value": None, "interval": [None, None], "n": 0}
    idx = bootstrap_indices(int(values.size), s.bootstrap_resamples, int(s.seed))
    value, (lo, hi) = stats.ratio_interval((values * mask)[None], mask[None], idx, s.confidence)
    return {
        "value": value,
        "interval": [lo, hi],
        "n": int(mask.sum()),
        "interval_method": f"percentile bootstrap over images ({s.bootstrap_resamples} resamples)",
    }
