"""Square Attack (Andriushchenko, Croce, Flammarion, Hein, ECCV 2020, "Square attack: a
query-efficient black-box adversarial attack via random search"), L-inf and L2, as AutoAttack's
standard versions run it: fra31/auto-attack autoattack/square.py, SquareAttack.perturb with
norm='Linf' or 'L2', loss='margin', untargeted, p_init=0.8, n_queries=5000, n_restarts=1,
resc_schedule=False (autoattack.py builds its SquareAttack with these).

Both norms (attack_single_run), per clean-correct image: a random start x_best with
margin_min = margin(x_best) (1 query), then iterations i = 0 .. n_queries - 1, only while
margin_min > 0, each proposing x_new from x_best and a square of side s_i, with p_i = `p_selection(i)`;
x_best, margin_min <- x_new, margin(x_new) iff margin(x_new) < margin_min or margin(x_new) <= 0;
one query. margin(z) = z_y - max_{j != y} z_j (margin_and_loss with loss='margin': the loss of the
acceptance test is the margin itself). perturb: x_adv = x_best where argmax logits_fn(x_best) != y,
x otherwise. A corner (vh, vw) is uniform in {0 .. h - s - 1} x {0 .. w - s - 1} ({0} where h = s).

L-inf branch:
  - start: x_best = clip(x + eps * r, 0, 1), r one ±1 per (column, channel), constant along the
    height (vertical stripes);
  - s = min(max(int(round(sqrt(p_i * n_features / c))), 1), min(h, w)); one corner, one ±1 per
    channel; x_new = P(x_best + 2 eps sign on the square), P the projection onto the eps-ball
    around x intersected with [0, 1]^d (so the square is set to x ± eps per channel).
L2 branch: `patjax.attacks.square_l2`, which shares this module's loop (`random_search`).

Where this module differs from the reference:
  1. Batching: the reference queries only the images still unfooled (`idx_to_fool`, margin_min > 0)
     and breaks once all are fooled. Here the compiled loop evaluates every image each iteration
     but updates x_best, margin_min and the query counter only where margin_min > 0 (and the image
     was clean-correct); the loop stops when none is left or after n_queries iterations. Given the
     same random draws this gives each image exactly the reference's result; only the compute
     differs. The aa evaluator cuts the loop into spans of iterations (`random_search`'s span
     and resume) and drops the images fooled between them, nearer the reference's compute.
  2. Random numbers: JAX keys instead of torch's seeded generator, so runs are not bitwise
     reproducible across the two. The key of iteration i is fold_in(key, i), so with
     rescale_schedule=False a run of k queries is a prefix of a run of more queries.
  3. Squares per image: the reference draws each iteration's corners (random_int with shape
     [1]) once for the whole batch, and so the L-inf ±1 per channel (random_choice([c, 1, 1]))
     and L2's transposition of eta (one torch.rand([1]) per call, also one per block of the
     start). By default each image draws its own (the paper's Algorithms 1 and 2, per image).
     Each image then sees proposals with the same distribution as in the reference, so its result
     has the same law; only the correlation between images differs, and an image's result does
     not depend on the batch it is in. `shared_squares=True` draws them once for the batch, as the
     reference does. L2's ±1 per channel is per image in both modes, as the reference's
     random_choice([B, c, 1, 1]).
  4. Signs: the reference's sign(2u - 1) is 0 with probability 2^-24 per draw (u = 0.5);
     here every sign is ±1.
  5. Clean-misclassified images are not attacked (perturb's `acc`): x_adv = x, fooled = True,
     queries = 0 (perturb never passes them to attack_single_run, whose counter this reports).
     perturb discards attack_single_run's query counter; `queries` returns it: 1 for the
     start plus 1 per iteration in which the image was still unfooled, so at most
     n_queries + 1. The clean forward pass and perturb's final
     re-evaluation are not counted, as in the reference.
  6. Only the L-inf and L2, untargeted, margin-loss, single-restart configurations: the
     reference's loss='ce', targeted mode, L1 branch and n_restarts > 1 are not implemented.
  7. Layout: images are NHWC here, NCHW there; the stripes are the reference's
     random_choice([B, c, 1, w]) (constant along the height) in either layout.
  8. rescale_schedule defaults to False, AutoAttack's setting; SquareAttack's own default (and
     torchattacks.Square's) is True, which `rescale_schedule=True` selects.
Kept as in the reference, on purpose: the corner is drawn from {0 .. h - s - 1}
(random_int(0, h - s) never returns h - s), so after the start the last row and the last
column of an image are never in a square (in L2 they keep the start's values, only rescaled and clipped);
a margin of exactly 0 stops the search but the image counts as robust (argmax picks the first
maximum, y on a tie) and x is returned. The reference's L2 loop also computes the norm of
x_new - x after the step and never uses it; it is left out.
"""

from __future__ import annotations

import math
from typing import Callable, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from patjax.attacks import logits as logits_lib
from patjax.attacks.logits import LogitsFn
from patjax.attacks.pgd import project_linf

NORMS = ("Linf", "L2")


def margin(logits: jax.Array, y: jax.Array) -> jax.Array:
    """Per-example z_y - max_{j != y} z_j (square.py margin_and_loss), -s(x) of the paper;
    <= 0 iff some other class reaches the true logit."""
    return -logits_lib.margin(logits, y)


def p_selection(it: int, n_queries: int = 5000, p_init: float = 0.8, rescale_schedule: bool = False) -> float:
    """Fraction of pixels the square covers at iteration `it` (0-based), square.py p_selection:
    halved at iterations 10, 50, 200, 500, 1000, 2000, 4000, 6000, 8000 (of a 10000-query
    schedule); with rescale_schedule, `it` is first mapped to int(it / n_queries * 10000)."""
    if rescale_schedule:
        it = int(it / n_queries * 10000)
    for divisor, upper in (
        (1, 10),
        (2, 50),
        (4, 200),
        (8, 500),
        (16, 1000),
        (32, 2000),
        (64, 4000),
        (128, 6000),
        (256, 8000),
    ):
        if it <= upper:
            return p_init / divisor
    return p_init / 512


def square_sizes(
    n_queries: int,
    height: int,
    width: int,
    channels: int,
    p_init: float = 0.8,
    rescale_schedule: bool = False,
    norm: str = "Linf",
) -> np.ndarray:
    """Side of the square at each iteration, (n_queries,) int32, computed in Python floats exactly
    as square.py does from r = int(round(sqrt(p * n_features / c))): L-inf
    s = min(max(r, 1), min(h, w)); L2 s = min(max(r, 3) made odd (+1 if even), min(h, w))."""
    if norm not in NORMS:
        raise ValueError(f"norm must be one of {NORMS}, got {norm!r}")
    n_features = channels * height * width
    sizes = []
    for i in range(n_queries):
        p = p_selection(i, n_queries, p_init, rescale_schedule)
        s = int(round(math.sqrt(p * n_features / channels)))
        if norm == "Linf":
            s = max(s, 1)
        else:
            s = max(s, 3)
            s += 1 - s % 2
        sizes.append(min(s, min(height, width)))
    return np.asarray(sizes, np.int32).reshape(n_queries)


class SquareResult(NamedTuple):
    x_adv: jax.Array  # (B, H, W, C) x_best where the run fooled the image, x otherwise (perturb)
    fooled: jax.Array  # (B,) bool: argmax logits_fn(x_adv) != y (clean-misclassified images included)
    queries: jax.Array  # (B,) int32 queries of the run: 1 + iterations spent unfooled; 0 if not attacked
    margin: jax.Array  # (B,) margin_min at the end (the clean margin for clean-misclassified images)
    x_best: jax.Array  # (B, H, W, C) the last accepted point, fooled or not (x if not attacked)
    margin_trace: jax.Array | None  # (n_queries + 1, B) margin_min after each iteration, or None


# L-inf: draw(i, s) -> (vh, vw, signs): corners (n,) int32 and signs (n, 1, 1, C), n = B or 1.
SquareDraw = Callable[[jax.Array, jax.Array], tuple]


def check_images(name: str, x: jax.Array, n_queries: int) -> None:
    if x.ndim != 4:
        raise ValueError(f"{name} expects NHWC images, got shape {x.shape}")
    if n_queries < 0:
        raise ValueError(f"n_queries must be >= 0, got {n_queries}")


def draw_corners(k_h: jax.Array, k_w: jax.Array, n: int, height: int, width: int, s: jax.Array) -> tuple:
    # random_int(0, h - s): floor(U[0, 1) * (h - s)), i.e. {0 .. h - s - 1}, and 0 when h = s.
    vh = jax.random.randint(k_h, (n,), 0, jnp.maximum(height - s, 1))
    vw = jax.random.randint(k_w, (n,), 0, jnp.maximum(width - s, 1))
    return vh, vw


def window(height: int, width: int, vh: jax.Array, vw: jax.Array, s: jax.Array) -> jax.Array:
    """(n, H, W, 1) mask of the s x s windows with top-left corners (vh, vw), (n,) each."""
    rows, cols = jnp.arange(height), jnp.arange(width)
    in_rows = (rows >= vh[:, None]) & (rows < vh[:, None] + s)  # (n, H)
    in_cols = (cols >= vw[:, None]) & (cols < vw[:, None] + s)  # (n, W)
    return in_rows[:, :, None, None] & in_cols[:, None, :, None]


def _padded(sizes: np.ndarray) -> jax.Array:
    # One unused entry past the end, so that n_queries = 0 still traces (the body never runs).
    return jnp.asarray(np.append(np.asarray(sizes, np.int32), 1), jnp.int32)


def square_linf(
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
    """L-inf Square Attack on a batch of NHWC images in [0, 1] (see the module docstring).

    n_queries, p_init, rescale_schedule, shared_squares and return_trace must be Python values
    (they fix the compiled schedule and shapes); eps may be traced. Pure and jit-compatible.
    resume, span: a piece of the run (`random_search`).
    """
    check_images("square_linf", x, n_queries)
    batch, height, width, channels = x.shape
    init_key, loop_key = jax.random.split(key)
    stripes = jax.random.rademacher(init_key, (batch, 1, width, channels), x.dtype)
    n_draw = 1 if shared_squares else batch

    def draw(i, s):
        k_h, k_w, k_sign = jax.random.split(jax.random.fold_in(loop_key, i), 3)
        vh, vw = draw_corners(k_h, k_w, n_draw, height, width, s)
        return vh, vw, jax.random.rademacher(k_sign, (n_draw, 1, 1, channels), x.dtype)

    sizes = square_sizes(n_queries, height, width, channels, p_init, rescale_schedule)
    return square_linf_run(
        logits_fn,
        x,
        y,
        eps=eps,
        sizes=sizes,
        stripes=stripes,
        draw=draw,
        return_trace=return_trace,
        resume=resume,
        span=span,
    )


def square_linf_run(
    logits_fn: LogitsFn,
    x: jax.Array,
    y: jax.Array,
    *,
    eps,
    sizes: np.ndarray,
    stripes: jax.Array,
    draw: SquareDraw,
    return_trace: bool = False,
    resume: SquareResult | None = None,
    span: tuple | None = None,
) -> SquareResult:
    """The attack with its random draws given: stripes (B, 1, W, C) of ±1 for the start, and
    draw(i, s) for iteration i's square of side s. `square_linf` supplies them from a key; a
    cross-check can replay another implementation's draws here."""
    _, height, width, _ = x.shape
    n_queries = len(sizes)
    sizes = _padded(sizes)

    def propose(i, x_best):
        s = sizes[i]
        vh, vw, signs = draw(i, s)
        square = window(height, width, vh, vw, s)
        return project_linf(x_best + jnp.where(square, 2.0 * eps * signs, 0.0), x, eps)

    x_start = jnp.clip(x + eps * stripes, 0.0, 1.0)
    return random_search(logits_fn, x, y, x_start, propose, n_queries, return_trace, resume, span)


def random_search(
    logits_fn: LogitsFn,
    x: jax.Array,
    y: jax.Array,
    x_start: jax.Array,
    propose: Callable[[jax.Array, jax.Array], jax.Array],
    n_queries: int,
    return_trace: bool,
    resume: SquareResult | None = None,
    span: tuple | None = None,
) -> SquareResult:
    """What both norms share: the start's query, the loop over iterations i < n_queries while an
    image is unfooled, x_new = propose(i, x_best) (every image; only the unfooled ones update),
    the acceptance rule, the query counter and perturb's final re-evaluation.

    span = (first, stop) (may be traced) runs iterations first <= i < stop only, from `resume`
    (the result of the iterations before first: its x_best, margin and queries) instead of the
    start: the same search cut into pieces, so that the images already fooled can leave the
    batch between them (iteration i's draws depend on i alone). Not with return_trace."""
    batch = x.shape[0]
    # perturb: only clean-correct images are passed to attack_single_run.
    clean_logits = logits_fn(x)
    attacked = jnp.argmax(clean_logits, axis=-1) == y
    first, stop = (0, n_queries) if span is None else span
    if resume is None:
        margin_min = jnp.where(attacked, margin(logits_fn(x_start), y), margin(clean_logits, y))
        x_best, queries = x_start, attacked.astype(jnp.int32)
    else:
        x_best, margin_min, queries = resume.x_best, resume.margin, resume.queries
    trace = jnp.zeros((n_queries + 1, batch), margin_min.dtype).at[0].set(margin_min) if return_trace else None

    def still_to_fool(margin_min):
        return attacked & (margin_min > 0.0)

    def cond(state):
        i, _, margin_min, _, _ = state
        return (i < stop) & jnp.any(still_to_fool(margin_min))

    def body(state):
        i, x_best, margin_min, queries, trace = state
        x_new = propose(i, x_best)
        margin_new = margin(logits_fn(x_new), y)
        active = still_to_fool(margin_min)
        # idx_improved = max(loss < loss_min, margin <= 0), loss = margin for loss='margin'.
        improved = active & ((margin_new < margin_min) | (margin_new <= 0.0))
        x_best = jnp.where(improved[:, None, None, None], x_new, x_best)
        margin_min = jnp.where(improved, margin_new, margin_min)
        queries = queries + active.astype(jnp.int32)
        if trace is not None:
            trace = trace.at[i + 1].set(margin_min)
        return i + 1, x_best, margin_min, queries, trace

    state = (jnp.asarray(first, jnp.int32), x_best, margin_min, queries, trace)
    if not (isinstance(stop, int) and isinstance(first, int) and stop <= first):  # a start alone needs no loop
        state = jax.lax.while_loop(cond, body, state)
    last, x_best, margin_min, queries, trace = state
    if trace is not None:
        # After the loop stops every margin_min is frozen: later rows repeat the last one.
        trace = jnp.where(jnp.arange(n_queries + 1)[:, None] > last, margin_min[None, :], trace)

    x_best = jnp.where(attacked[:, None, None, None], x_best, x)
    # perturb re-evaluates the returned points and keeps those that are misclassified.
    run_fooled = attacked & (jnp.argmax(logits_fn(x_best), axis=-1) != y)
    x_adv = jnp.where(run_fooled[:, None, None, None], x_best, x)
    return SquareResult(
        jax.lax.stop_gradient(x_adv),
        run_fooled | ~attacked,
        queries,
        jax.lax.stop_gradient(margin_min),
        jax.lax.stop_gradient(x_best),
        None if trace is None else jax.lax.stop_gradient(trace),
    )
