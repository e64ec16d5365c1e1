"""The batch loop every pass runs in: the images packed into a few fixed widths (`batch_widths`,
`pack`), padded and split over the devices of the mesh, a pass in rounds (`Rounds`), the
non-finite check (`checking_logits`), and one batch timed (`time_batch`).

Every evaluator is per example (keys from the image index, `streams`), so the packing and the
split change which batch and core compute an image, not what is computed.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np
from tqdm import tqdm

from patjax.core import sharding
from patjax.core.errors import UserError
from patjax.data import cifar


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
