"""L2 Square Attack as AutoAttack's standard L2 version runs it: fra31/auto-attack
autoattack/square.py, SquareAttack.attack_single_run's norm == 'L2' branch (loss='margin',
untargeted, p_init=0.8, n_queries=5000, n_restarts=1, resc_schedule=False). The random search
around it (start query, acceptance rule, query counting, perturb's re-evaluation), the schedule
`square.square_sizes` and the departures the two norms share are `patjax.attacks.square`'s.

Per clean-correct image (delta = x_best - x, norms per image over every pixel and channel unless said):
  - eta(t): a t x t pattern, eta_rectangles(t // 2, t) on the top rows and -eta_rectangles(t - t // 2,
    t) below, scaled to unit L2 norm, transposed with probability 1/2; eta_rectangles(a, b) sums
    1 / (k + 1)^2 over nested rectangles of growing k around the centre, scaled to unit norm;
  - start: blocks of side t = h // 5 from (sp, sp), sp = (h - 5 t) // 2, h // t rows and w // t
    columns of them, each eta(t) times one ±1 per (image, channel), d their sum;
    x_best = clip(x + eps d / (|d| + 1e-12), 0, 1);
  - s = min(max(int(round(sqrt(p_i * n_features / c))), 3) made odd (+1 if even), min(h, w)); two
    windows of side s, W1 and W2, at independent corners; per channel, n1 = |delta on W1|,
    nw = |delta on W1 ∪ W2|, and the image's |delta| = n; on W1 the new values
    v = eta(s) * ±1 + delta / (1e-12 + n1), scaled per channel to norm
    sqrt(max(eps^2 - n^2, 0) / c + nw^2); delta is set to 0 on W2, then to v on W1 (W1 wins where
    they overlap); x_new = clip(x + eps delta / (|delta| + 1e-12), 0, 1). The rescaling moves the
    norm of W1 ∪ W2 (plus what the clip left unused) into W1; the last step puts delta back on the
    sphere of radius eps before the clip, so every point is in the L2 ball.

Where this branch differs from the reference, besides `square`'s shared items 1-5 and 7-8:
  1. Rounding: eta is computed in float64 and rounded to the images' dtype (the reference
     computes it in float32), and the window norms are sums over the whole image of the masked
     squares, so values can differ from the reference's in the last bits.
  2. The start's blocks: where a block would cross the border (small or non-square images, e.g.
     12 x 12), it is cropped; the reference raises there (or, for t = 1, skips
     it, which the crop matches). Images with h < 5 (t = 0, a division by zero there) are refused.
"""

from __future__ import annotations

from typing import Callable

import jax
import jax.numpy as jnp
import numpy as np

from patjax.attacks import l2
from patjax.attacks.logits import LogitsFn
from patjax.attacks.square import SquareResult, check_images, draw_corners, random_search, square_sizes, window
from patjax.core.errors import UserError

# draw(i, s) -> (vh, vw, vh2, vw2, transposed, signs): the two windows' corners (n,) int32,
# eta's transposition (n,) bool, n = B or 1, and signs (B, 1, 1, C).
SquareDrawL2 = Callable[[jax.Array, jax.Array], tuple]


def _eta_rectangles(rows: int, cols: int) -> np.ndarray:
    """square.py eta_rectangles (L2), float64: 1 / (k + 1)^2 added on the rectangle of rows
    [r0 - k, r0 + k] x cols [c0 - k, c0 + k] (cut to the array), r0 = rows // 2, c0 = cols // 2,
    for k < max(r0, c0) + 1; scaled to unit L2 norm."""
    delta = np.zeros((rows, cols))
    r0, c0 = rows // 2, cols // 2
    for k in range(max(r0, c0) + 1):
        delta[max(r0 - k, 0) : min(r0 + k + 1, rows), max(c0 - k, 0) : min(c0 + k + 1, cols)] += 1.0 / (k + 1) ** 2
    norm = np.sqrt(np.sum(delta**2))
    return delta / norm if norm > 0 else delta


def _eta(s: int) -> np.ndarray:
    """square.py eta (L2) before its random transposition, float64 (s, s): eta_rectangles on the
    top s // 2 rows, minus eta_rectangles on the others, scaled to unit L2 norm."""
    delta = np.concatenate([_eta_rectangles(s // 2, s), -_eta_rectangles(s - s // 2, s)])
    return delta / np.sqrt(np.sum(delta**2))


def l2_start_grid(height: int, width: int) -> tuple[int, int, int, int]:
    """(t, sp, rows, cols) of the L2 start: blocks of side t = h // 5 with top-left corners
    (sp + i t, sp + j t), sp = (h - 5 t) // 2, for i < rows = h // t and j < cols = w // t."""
    if height < 5:
        raise UserError(
            f"L2 Square (AutoAttack under eval.attack.norm='l2') needs images at least 5 pixels high (its start's "
            f"blocks have side h // 5); these are {height}"
        )
    t = height // 5
    return t, (height - 5 * t) // 2, height // t, width // t


def _l2_start(signs: jax.Array, transposed: jax.Array, height: int, width: int) -> jax.Array:
    """The L2 start's unnormalized perturbation (B, H, W, C): block (i, j) of `l2_start_grid` is
    eta(t), transposed where transposed[:, i, j] ((n, rows, cols), n = B or 1), times
    signs[:, i, j, :] ((B, rows, cols, C)); zero outside the blocks."""
    t, sp, n_rows, n_cols = l2_start_grid(height, width)
    batch, channels = signs.shape[0], signs.shape[-1]
    if n_cols == 0:
        return jnp.zeros((batch, height, width, channels), signs.dtype)

    def grid(length, n):
        offset = np.arange(length) - sp
        inside = (offset >= 0) & (offset < n * t)
        return np.where(inside, offset // t, 0), offset % t, inside

    block_r, local_r, inside_r = grid(height, n_rows)
    block_c, local_c, inside_c = grid(width, n_cols)
    eta = _eta(t)
    eta_pair = jnp.asarray(np.stack([eta, eta.T]), signs.dtype)
    flip = transposed.astype(jnp.int32)[:, block_r[:, None], block_c[None, :]]  # (n, H, W)
    values = eta_pair[flip, local_r[None, :, None], local_c[None, None, :]]  # (n, H, W)
    delta = values[..., None] * signs[:, block_r[:, None], block_c[None, :], :]
    return jnp.where((inside_r[:, None] & inside_c[None, :])[None, :, :, None], delta, 0.0)


def _window_norms(v: jax.Array, mask: jax.Array) -> jax.Array:
    """Per (image, channel) L2 norms of v on the mask, (B, 1, 1, C)."""
    return jnp.sqrt(jnp.sum(jnp.where(mask, jnp.square(v), 0.0), axis=(1, 2), keepdims=True))


def _on_sphere(x: jax.Array, delta: jax.Array, eps) -> jax.Array:
    """clip(x + normalize(delta) * eps, 0, 1), normalize(d) = d / (|d| + 1e-12) as square.py's."""
    return jnp.clip(x + delta / (l2.norms(delta) + 1e-12) * eps, 0.0, 1.0)


def square_l2(
    logits_fn: LogitsFn,
    key: jax.Array,
    x: jax.Array,
    y: jax.Array,
    *,
    eps,
    n_queries: int = 5000,
    p_init: float = 0.8,
    rescale_schedule: bool = False,
    shared_squares: bool = False,
    return_trace: bool = False,
    resume: SquareResult | None = None,
    span: tuple | None = None,
) -> SquareResult:
    """L2 Square Attack on a batch of NHWC images in [0, 1], at least 5 pixels high (see the
    module docstring).

    n_queries, p_init, rescale_schedule, shared_squares and return_trace must be Python values
    (they fix the compiled schedule and shapes); eps may be traced. Pure and jit-compatible.
    resume, span: a piece of the run (`square.random_search`).
    """
    check_images("square_l2", x, n_queries)
    batch, height, width, channels = x.shape
    _, _, n_rows, n_cols = l2_start_grid(height, width)
    init_key, loop_key = jax.random.split(key)
    k_flip, k_sign = jax.random.split(init_key)
    n_draw = 1 if shared_squares else batch
    start_transposed = jax.random.bernoulli(k_flip, 0.5, (n_draw, n_rows, n_cols))
    start_signs = jax.random.rademacher(k_sign, (batch, n_rows, n_cols, channels), x.dtype)

    def draw(i, s):
        k_h, k_w, k_h2, k_w2, k_flip, k_sign = jax.random.split(jax.random.fold_in(loop_key, i), 6)
        vh, vw = draw_corners(k_h, k_w, n_draw, height, width, s)
        vh2, vw2 = draw_corners(k_h2, k_w2, n_draw, height, width, s)
        transposed = jax.random.bernoulli(k_flip, 0.5, (n_draw,))
        return vh, vw, vh2, vw2, transposed, jax.random.rademacher(k_sign, (batch, 1, 1, channels), x.dtype)

    sizes = square_sizes(n_queries, height, width, channels, p_init, rescale_schedule, norm="L2")
    return square_l2_run(
        logits_fn,
        x,
        y,
        eps=eps,
        sizes=sizes,
        start_signs=start_signs,
        start_transposed=start_transposed,
        draw=draw,
        return_trace=return_trace,
        resume=resume,
        span=span,
    )


def square_l2_run(
    logits_fn: LogitsFn,
    x: jax.Array,
    y: jax.Array,
    *,
    eps,
    sizes: np.ndarray,
    start_signs: jax.Array,
    start_transposed: jax.Array,
    draw: SquareDrawL2,
    return_trace: bool = False,
    resume: SquareResult | None = None,
    span: tuple | None = None,
) -> SquareResult:
    """The L2 attack with its random draws given: for the start, start_signs (B, rows, cols, C)
    of ±1 and start_transposed (n, rows, cols) bool, n = B or 1, one per block of
    `l2_start_grid`; draw(i, s) for iteration i's two windows of side s, eta(s)'s transposition
    and its signs. `square_l2` supplies them from a key; a cross-check can replay another
    implementation's draws here."""
    _, height, width, channels = x.shape
    n_queries = len(sizes)
    sizes = np.append(np.asarray(sizes, np.int32), 1)  # the unused entry of `square._padded`
    # eta(s) and its transpose for each side the schedule uses, zero-padded to the image, so an
    # iteration gathers its window's pattern from a table of static shape.
    sides = np.unique(sizes)
    tables = np.zeros((len(sides), 2, height, width))
    for k, s in enumerate(sides):
        tables[k, 0, :s, :s] = _eta(int(s))
        tables[k, 1, :s, :s] = _eta(int(s)).T
    tables = jnp.asarray(tables, x.dtype)
    side_index = jnp.asarray(np.searchsorted(sides, sizes), jnp.int32)
    sizes = jnp.asarray(sizes, jnp.int32)
    rows, cols = jnp.arange(height), jnp.arange(width)
    eps_sq = jnp.square(jnp.asarray(eps, x.dtype))

    def propose(i, x_best):
        s = sizes[i]
        vh, vw, vh2, vw2, transposed, signs = draw(i, s)
        window_1 = window(height, width, vh, vw, s)
        window_2 = window(height, width, vh2, vw2, s)
        r = jnp.clip(rows[None, :] - vh[:, None], 0, height - 1)  # (n, H)
        c = jnp.clip(cols[None, :] - vw[:, None], 0, width - 1)  # (n, W)
        table = tables[side_index[i]][transposed.astype(jnp.int32)]  # (n, H, W)
        pattern = jnp.take_along_axis(jnp.take_along_axis(table, r[:, :, None], axis=1), c[:, None, :], axis=2)
        delta = x_best - x
        norm_1 = _window_norms(delta, window_1)
        norm_windows = _window_norms(delta, window_1 | window_2)
        norm_image = l2.norms(delta)
        new = jnp.where(window_1, pattern[..., None] * signs + delta / (1e-12 + norm_1), 0.0)
        target = jnp.sqrt(jnp.maximum(eps_sq - jnp.square(norm_image), 0.0) / channels + jnp.square(norm_windows))
        new = new / (1e-12 + _window_norms(new, window_1)) * target
        delta = jnp.where(window_1, new, jnp.where(window_2, 0.0, delta))
        return _on_sphere(x, delta, eps)

    x_start = _on_sphere(x, _l2_start(start_signs, start_transposed, height, width), eps)
    return random_search(logits_fn, x, y, x_start, propose, n_queries, return_trace, resume, span)
