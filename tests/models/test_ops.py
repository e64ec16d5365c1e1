"""patjax.models.ops (the one convolution and max-pool of every model) and compute_dtype=bfloat16.

The convolution's custom VJP (input gradient through a reordered kernel copy) is checked
against JAX's own autodiff of `lax.conv_general_dilated`, an independent derivation, for
strides 1/2, paddings 0/1, 1x1 and 3x3 kernels, odd and even image sizes.
"""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from patjax.core.errors import UserError
from patjax.models import networks, ops
from patjax.pat import langevin


@pytest.fixture
def reordered_mode():
    previous = ops._input_grad_mode
    ops.set_conv_input_grad_mode("reordered")
    yield
    ops.set_conv_input_grad_mode(previous)


def plain_conv(x, kernel, strides, padding):
    return jax.lax.conv_general_dilated(
        x, kernel, (strides, strides), ((padding, padding),) * 2, dimension_numbers=("NHWC", "HWIO", "NHWC")
    )


@pytest.mark.parametrize("size", [7, 8])
@pytest.mark.parametrize("kernel_size", [1, 3])
@pytest.mark.parametrize("padding", [0, 1])
@pytest.mark.parametrize("strides", [1, 2])
def test_conv_custom_vjp_equals_autodiff(reordered_mode, strides, padding, kernel_size, size):
    kx, kk, kg = jax.random.split(jax.random.PRNGKey(kernel_size * 100 + strides * 10 + padding + size), 3)
    x = jax.random.normal(kx, (2, size, size, 3))
    kernel = jax.random.normal(kk, (kernel_size, kernel_size, 3, 5))
    out, vjp = jax.vjp(lambda x, k: ops.conv2d(x, k, strides, padding), x, kernel)
    expected_out, expected_vjp = jax.vjp(lambda x, k: plain_conv(x, k, strides, padding), x, kernel)
    cotangent = jax.random.normal(kg, out.shape)
    np.testing.assert_allclose(out, expected_out, rtol=1e-5, atol=1e-5)
    for got, expected in zip(vjp(cotangent), expected_vjp(cotangent)):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-4)
    # The input gradient really goes through the reordered kernel copy.
    jaxpr = str(jax.make_jaxpr(jax.grad(lambda x: ops.conv2d(x, kernel, strides, padding).sum()))(x))
    assert "optimization_barrier" in jaxpr


def test_conv_input_gradient_in_a_loop_reads_a_standard_layout_kernel(reordered_mode):
    """The performance property `conv2d`'s custom VJP exists for: inside a while loop (the
    sampler's fori_loop) no convolution reads its kernel with in/out swapped (XLA:CPU's slow path)."""
    kernel = jax.random.normal(jax.random.PRNGKey(0), (3, 3, 4, 6))

    def loop(x):
        grad = jax.grad(lambda x: jnp.sum(ops.conv2d(x, kernel, 1, 1) ** 2))
        return jax.lax.fori_loop(0, 3, lambda _, x: x - 0.1 * grad(x), x)

    hlo = jax.jit(loop).lower(jnp.ones((2, 6, 6, 4))).compile().as_text()
    conv_labels = [line.split("dim_labels=")[1].split(",")[0] for line in hlo.splitlines() if " convolution(" in line]
    assert conv_labels and all("01io" in labels for labels in conv_labels), conv_labels


def test_conv_mode_switch_and_bad_mode():
    previous = ops._input_grad_mode
    try:
        ops.set_conv_input_grad_mode("autodiff")
        assert ops.conv_input_grad_mode() == "autodiff"
        x, kernel = jnp.ones((1, 4, 4, 2)), jnp.ones((3, 3, 2, 2))
        assert "optimization_barrier" not in str(
            jax.make_jaxpr(jax.grad(lambda x: ops.conv2d(x, kernel, 1, 1).sum()))(x)
        )
        ops.set_conv_input_grad_mode("auto")
        assert ops.conv_input_grad_mode() == ("reordered" if jax.default_backend() == "cpu" else "autodiff")
        with pytest.raises(UserError, match="mode"):
            ops.set_conv_input_grad_mode("fast")
    finally:
        ops.set_conv_input_grad_mode(previous)


def test_max_pool_values_and_gradient():
    x = jax.random.normal(jax.random.PRNGKey(0), (2, 5, 4, 3))  # odd height: last row dropped
    pooled = ops.max_pool(x, 2)
    xn = np.asarray(x)[:, :4]
    windows = xn.reshape(2, 2, 2, 2, 2, 3)
    np.testing.assert_array_equal(pooled, windows.max(axis=(2, 4)))
    np.testing.assert_array_equal(pooled, nn.max_pool(x, (2, 2), strides=(2, 2)))
    weights = jax.random.normal(jax.random.PRNGKey(1), pooled.shape)
    grad = jax.grad(lambda x: jnp.sum(weights * ops.max_pool(x, 2)))(x)
    # Without ties: the weight goes to each window's argmax, zero elsewhere (row 4 included).
    expected = np.zeros_like(np.asarray(x))
    for b, i, j, c in np.ndindex(*pooled.shape):
        window = xn[b, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, c]
        di, dj = np.unravel_index(np.argmax(window), (2, 2))
        expected[b, 2 * i + di, 2 * j + dj, c] = weights[b, i, j, c]
    np.testing.assert_allclose(grad, expected, rtol=1e-6)


def test_max_pool_gradient_with_ties_goes_to_the_first_maximum_as_reduce_window():
    """Flat regions (saturated pixels, clipped samples) give exact ties: the gradient must go
    to one element per window, the first maximum in row-major order, as flax's reduce_window
    max-pool (XLA select-and-scatter) and PyTorch give it -- not split among the ties."""
    x = jnp.round(jax.random.uniform(jax.random.PRNGKey(2), (2, 6, 5, 3)) * 2) / 2  # many ties
    weights = jax.random.normal(jax.random.PRNGKey(3), (2, 3, 2, 3))
    reference = jax.grad(lambda x: jnp.sum(weights * nn.max_pool(x, (2, 2), strides=(2, 2))))(x)
    for fn in (jax.grad, lambda f: jax.jit(jax.grad(f))):
        grad = fn(lambda x: jnp.sum(weights * ops.max_pool(x, 2)))(x)
        np.testing.assert_array_equal(grad, reference)
    xn = np.asarray(x)
    ties = [
        (xn[b, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, c] == xn[b, 2 * i : 2 * i + 2, 2 * j : 2 * j + 2, c].max()).sum()
        for b, i, j, c in np.ndindex(2, 3, 2, 3)
    ]
    assert max(ties) > 1  # the case is exercised
    assert np.count_nonzero(np.asarray(reference)) == weights.size  # one element per window


@pytest.mark.slow
def test_bf16_sampler_stays_close_to_fp32():
    """The same small CNN and parameters, computed in float32 and in bfloat16."""
    x = jax.random.uniform(jax.random.PRNGKey(0), (8, 16, 16, 3))
    y = jnp.arange(8) % 10
    kw = dict(widths=(4, 8))
    fp32 = networks.create_model("small_cnn", "cifar10", 10, dtype=jnp.float32, **kw)
    bf16 = networks.create_model("small_cnn", "cifar10", 10, dtype=jnp.bfloat16, **kw)
    params, batch_stats = networks.init_variables(fp32, jax.random.PRNGKey(1), image_shape=(16, 16, 3))
    variables = {"params": params, "batch_stats": batch_stats}
    logits32 = fp32.apply(variables, x)
    logits16 = bf16.apply(variables, x)
    assert logits16.dtype == jnp.float32  # cast back at the head
    # bf16 keeps 8 mantissa bits: logits agree to ~1% of their scale, not bitwise.
    scale = float(jnp.max(jnp.abs(logits32)))
    assert 0 < float(jnp.max(jnp.abs(logits16 - logits32))) < 0.03 * scale
    assert "bf16" in str(jax.make_jaxpr(lambda x: bf16.apply(variables, x))(x))

    key = jax.random.PRNGKey(2)
    run = lambda model, steps: jax.jit(
        lambda x: langevin.langevin_sample(
            lambda z: model.apply(variables, z), key, x, y, langevin.LangevinSettings(steps=steps)
        )
    )(x)
    x32, x16, start = run(fp32, 5), run(bf16, 5), run(fp32, 0)
    assert x16.dtype == jnp.float32  # the sampler's state stays float32; the network runs in bf16
    moved = float(jnp.mean(jnp.abs(x32 - start)))
    difference = float(jnp.mean(jnp.abs(x16 - x32)))
    assert moved > 0.1  # the sampler moved the samples ...
    assert difference < 0.01 * moved  # ... and bf16 moved them (almost) the same way


@pytest.mark.slow
def test_bf16_update_keeps_float32_parameters_and_gradients():
    from patjax import methods
    from patjax.run import config as config_lib
    from patjax.run import optimizer as optimizer_lib

    cfg = config_lib.default_config()
    cfg.langevin.steps = 2
    model = networks.create_model("small_cnn", "cifar10", 10, dtype=jnp.bfloat16, widths=(4,))
    params, batch_stats = networks.init_variables(model, jax.random.PRNGKey(0), image_shape=(8, 8, 3))
    x = jax.random.uniform(jax.random.PRNGKey(1), (4, 8, 8, 3))
    y = jnp.arange(4)
    loss_and_grad = jax.value_and_grad(methods.pat.pat, has_aux=True)
    settings = config_lib.train_settings(cfg)
    args = (params, networks.ModelFns(model.apply), batch_stats, x, y, jax.random.PRNGKey(2), settings.method)
    step = jax.jit(lambda p: loss_and_grad(p, *args[1:]))
    (loss, (new_stats, _)), grads = step(params)
    assert np.isfinite(float(loss))
    assert all(g.dtype == jnp.float32 for g in jax.tree.leaves(grads))
    assert all(s.dtype == jnp.float32 for s in jax.tree.leaves(new_stats))
    tx = optimizer_lib.make_optimizer(settings.optimizer, lambda step: 0.01)
    updates, opt_state = tx.update(grads, tx.init(params), params)
    floating = [a for a in jax.tree.leaves((updates, opt_state)) if jnp.issubdtype(a.dtype, jnp.floating)]
    assert floating and all(a.dtype == jnp.float32 for a in floating)  # (the step count is int)
    # Both phases (sampler and update) run their convolutions in bf16.
    jaxpr = str(jax.make_jaxpr(step)(params))
    conv_lines = [line for line in jaxpr.splitlines() if "conv_general_dilated[" in line]
    assert conv_lines and all("bf16" in line for line in conv_lines)
