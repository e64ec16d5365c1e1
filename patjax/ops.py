"""Low-level array operations shared by every model.

`conv2d` is the one convolution all models use, so backend-specific work on how
convolutions and their gradients are computed happens here and nowhere else.
"""
from __future__ import annotations

import jax


def conv2d(x: jax.Array, kernel: jax.Array, strides: int, padding: int) -> jax.Array:
    """NHWC input, HWIO kernel, symmetric zero padding, no bias."""
    return jax.lax.conv_general_dilated(
        x, kernel,
        window_strides=(strides, strides),
        padding=((padding, padding), (padding, padding)),
        dimension_numbers=("NHWC", "HWIO", "NHWC"),
    )
