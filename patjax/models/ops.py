"""Low-level array operations shared by every model.

`conv2d` is the one convolution all models use, so backend-specific work on how
convolutions and their gradients are computed happens here and nowhere else.

Input gradients on XLA:CPU. Autodiff writes the input gradient of a
convolution as a convolution of the output gradient with the *same* kernel read with its
in/out dimensions swapped and its window reversed (HLO `dim_labels=b01f_01oi->b01f`).
In straight-line code XLA materializes that reordered kernel once; inside a `while` loop
(the Langevin sampler's `fori_loop`) it keeps the swapped read, and XLA:CPU only hands
standard-layout (`b01f_01io->b01f`) convolutions to its fast library (YNNPACK/oneDNN)
path, so under plain autodiff every input-gradient convolution of the sampler falls back to
a slow generic loop. `conv2d` therefore has a custom VJP: the input gradient is the transposed
convolution computed through a physically reordered copy of the kernel (window reversed,
in/out swapped) held behind `jax.lax.optimization_barrier`, so XLA cannot fold the
reorder back into the convolution; the weight gradient stays plain autodiff. The result
equals autodiff's up to float summation order (tests/models/test_ops.py).

The RGB stem: inputs with a channel count that is not a multiple of 4 (3) are zero-padded
to one on CPU (input and kernel alike, so no value changes): the library kernels run a
4-channel convolution faster than a 3-channel one (measured in benchmarks/README.md, "The
3-channel stem").

The switch: `set_conv_input_grad_mode('reordered' | 'autodiff' | 'auto')`, or the
environment variable PATJAX_CONV_INPUT_GRAD with the same values; 'auto' (the default)
uses the reordered kernel on the CPU backend only, where it was measured to help
(benchmarks/README.md). The mode is read when a function is traced, so set it before
the first `jax.jit` call.
"""

from __future__ import annotations

import functools
import os

import jax
import jax.numpy as jnp

from patjax.core.errors import UserError

_MODES = ("auto", "reordered", "autodiff")
_input_grad_mode = os.environ.get("PATJAX_CONV_INPUT_GRAD", "auto")


def set_conv_input_grad_mode(mode: str) -> None:
    """'reordered' (custom VJP), 'autodiff' (plain JAX VJP) or 'auto' (reordered on CPU only)."""
    global _input_grad_mode
    if mode not in _MODES:
        raise UserError(f"conv input-gradient mode must be one of {_MODES}, got {mode!r}")
    _input_grad_mode = mode


def conv_input_grad_mode() -> str:
    """The mode in effect now, with 'auto' resolved against the default backend."""
    if _input_grad_mode not in _MODES:
        raise UserError(f"PATJAX_CONV_INPUT_GRAD must be one of {_MODES}, got {_input_grad_mode!r}")
    if _input_grad_mode == "auto":
        return "reordered" if jax.default_backend() == "cpu" else "autodiff"
    return _input_grad_mode


def _conv(x, kernel, strides, padding):
    return jax.lax.conv_general_dilated(
        x,
        kernel,
        window_strides=(strides, strides),
        padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


# XLA:CPU's convolution library runs a 3-channel input (the RGB stem) slower than a 4-channel
# one (measured in benchmarks/README.md); zero channels added to input and kernel change no
# value. None: 4 on the CPU backend, 1 (no padding) elsewhere.
_pad_input_channels_to_multiple: int | None = None


def _channel_multiple() -> int:
    if _pad_input_channels_to_multiple is not None:
        return _pad_input_channels_to_multiple
    return 4 if jax.default_backend() == "cpu" else 1


def conv2d(x: jax.Array, kernel: jax.Array, strides: int, padding: int) -> jax.Array:
    """NHWC input, HWIO kernel, symmetric zero padding, no bias."""
    extra = -x.shape[-1] % _channel_multiple()
    if extra:  # zero input channels meet zero kernel rows: the same sums
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, extra)))
        kernel = jnp.pad(kernel, ((0, 0), (0, 0), (0, extra), (0, 0)))
    if conv_input_grad_mode() == "reordered":
        return _conv_reordered_input_grad(x, kernel, strides, padding)
    return _conv(x, kernel, strides, padding)


def _transposed_conv_padding(
    in_size: int, kernel_size: int, out_size: int, strides: int, padding: int
) -> tuple[int, int]:
    """Padding of the transposed convolution that maps the output gradient back to the input.

    Same arithmetic as jax/_src/lax/convolution.py `_conv_general_vjp_lhs_padding`: the
    output gradient, dilated by the stride, is padded so that a stride-1 correlation with
    the reversed kernel yields exactly `in_size` positions.
    """
    dilated_out = (out_size - 1) * strides + 1
    before = kernel_size - padding - 1
    after = in_size + kernel_size - 1 - dilated_out - before
    return before, after


def conv_input_grad(g: jax.Array, kernel: jax.Array, in_shape, strides: int, padding: int) -> jax.Array:
    """d(sum(g * conv2d(x, kernel)))/dx through a reordered copy of the kernel."""
    # Window reversed, HWIO -> HWOI, then read as HWIO: the input features of this
    # convolution are the forward's output features.
    reordered = jax.lax.optimization_barrier(jnp.flip(kernel, (0, 1)).transpose(0, 1, 3, 2))
    pads = tuple(
        _transposed_conv_padding(in_shape[axis], kernel.shape[axis - 1], g.shape[axis], strides, padding)
        for axis in (1, 2)
    )
    return jax.lax.conv_general_dilated(
        g,
        reordered,
        window_strides=(1, 1),
        padding=pads,
        lhs_dilation=(strides, strides),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )


@functools.partial(jax.custom_vjp, nondiff_argnums=(2, 3))
def _conv_reordered_input_grad(x, kernel, strides, padding):
    return _conv(x, kernel, strides, padding)


def _conv_fwd(x, kernel, strides, padding):
    return _conv(x, kernel, strides, padding), (x, kernel)


def _conv_bwd(strides, padding, residuals, g):
    x, kernel = residuals
    _, kernel_vjp = jax.vjp(lambda k: _conv(x, k, strides, padding), kernel)
    (kernel_grad,) = kernel_vjp(g)
    x_grad = conv_input_grad(g, kernel, x.shape, strides, padding).astype(x.dtype)
    return x_grad, kernel_grad


_conv_reordered_input_grad.defvjp(_conv_fwd, _conv_bwd)


def _pool_windows(x: jax.Array, window: int) -> jax.Array:
    """(B, H', W', C, window*window): each non-overlapping window's values, row-major."""
    b, h, w, c = x.shape
    h, w = h // window, w // window
    x = x[:, : h * window, : w * window, :].reshape(b, h, window, w, window, c)
    return x.transpose(0, 1, 3, 5, 2, 4).reshape(b, h, w, c, window * window)


@functools.partial(jax.custom_vjp, nondiff_argnums=(1,))
def max_pool(x: jax.Array, window: int) -> jax.Array:
    """Non-overlapping window x window max pooling of NHWC input (stride = window, VALID).

    Equal to `flax.linen.max_pool(x, (window, window), strides=(window, window))` in value
    and in gradient: the gradient of each window goes to its first maximum in row-major
    order, as `reduce_window`'s select-and-scatter (and PyTorch's max_pool2d) give it.
    Written as a reshape, a max and, in the backward pass, a one-hot of the argmax, because
    XLA:CPU expands select-and-scatter into an argmax reduce-window carrying four int32
    index arrays and a scatter, a large share of the small CNN's PAT step (the profile is in
    benchmarks/README.md, "Max-pool gradients"). Not the gradient of `jnp.max`, which splits
    it among tied maxima and finds the ties by comparing each value with the recomputed
    maximum: CIFAR images and clipped samples have flat regions, so exact ties are common,
    and whether a tie is seen then depends on how XLA fuses (and rounds) the recomputation.
    """
    return jnp.max(_pool_windows(x, window), axis=-1)


def _max_pool_fwd(x, window):
    return max_pool(x, window), x


def _max_pool_bwd(window, x, g):
    windows = _pool_windows(x, window)
    first_max = jax.nn.one_hot(jnp.argmax(windows, axis=-1), window * window, dtype=g.dtype)
    b, h, w, c = g.shape
    grad = (first_max * g[..., None]).reshape(b, h, w, c, window, window)
    grad = grad.transpose(0, 1, 4, 2, 5, 3).reshape(b, h * window, w * window, c)
    # Rows and columns beyond the last full window (odd sizes) get no gradient.
    return (jnp.pad(grad, ((0, 0), (0, x.shape[1] - h * window), (0, x.shape[2] - w * window), (0, 0))),)


max_pool.defvjp(_max_pool_fwd, _max_pool_bwd)
