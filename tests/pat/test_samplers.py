"""Algorithm 1 (the Langevin sampler) against closed forms and hand-computed steps."""

import chex
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import linear_setup, np_softmax

from patjax.pat.langevin import LangevinSettings, langevin_sample

B, SHAPE, K = 4, (4, 4, 3), 3


def sample(logits_fn, key, x, y, **kw):
    return langevin_sample(logits_fn, key, x, y, LangevinSettings(**kw))


@pytest.mark.parametrize("use_jit", [True, False])
def test_stays_in_unit_box_and_keeps_shape(use_jit):
    logits_fn, x, y, _, _ = linear_setup()
    run = lambda key, x, y: sample(logits_fn, key, x, y, steps=5, noise_scale=0.5)
    out = (jax.jit(run) if use_jit else run)(jax.random.PRNGKey(0), x, y)
    chex.assert_shape(out, x.shape)
    chex.assert_type(out, jnp.float32)
    assert float(out.min()) >= 0.0 and float(out.max()) <= 1.0


def test_zero_steps_return_the_uniform_start_independent_of_x():
    logits_fn, x, y, _, _ = linear_setup()
    key = jax.random.PRNGKey(3)
    start = sample(logits_fn, key, x, y, steps=0)
    assert jnp.array_equal(start, sample(logits_fn, key, 1.0 - x, (y + 1) % K, steps=0))
    constant_logits = lambda xa: jnp.zeros((xa.shape[0], K))
    big = sample(constant_logits, key, jnp.zeros((64, 16, 16, 3)), jnp.zeros(64, jnp.int32), steps=0)
    # Uniform[0,1]: mean 1/2, variance 1/12 (49k draws: 5-sigma bands).
    assert abs(float(big.mean()) - 0.5) < 5 * np.sqrt(1 / 12 / big.size)
    assert abs(float(big.var()) - 1 / 12) < 0.003


@pytest.mark.parametrize("field", ["step_size", "c1"])
def test_from_the_uniform_start_a_zero_step_size_or_c1_leaves_the_samples_independent_of_x(field):
    """What the methods' check refuses (MethodSettings): with eta = 0 no gradient step moves the
    chain, with c1 = 0 the energy is -c2 CE(x_adv, y), in which x is absent; either way the same
    key and label give the same samples for x and 1 - x. With both nonzero they differ."""
    logits_fn, x, y, _, _ = linear_setup()
    key = jax.random.PRNGKey(5)
    given = dict(steps=5, noise_scale=0.01, **{field: 0.0})
    np.testing.assert_array_equal(sample(logits_fn, key, x, y, **given), sample(logits_fn, key, 1.0 - x, y, **given))
    assert not np.array_equal(sample(logits_fn, key, x, y, steps=5), sample(logits_fn, key, 1.0 - x, y, steps=5))


def test_same_key_same_output_other_key_other_output():
    logits_fn, x, y, _, _ = linear_setup()
    a = sample(logits_fn, jax.random.PRNGKey(0), x, y, steps=3)
    b = sample(logits_fn, jax.random.PRNGKey(0), x, y, steps=3)
    c = sample(logits_fn, jax.random.PRNGKey(1), x, y, steps=3)
    assert jnp.array_equal(a, b)
    assert not jnp.allclose(a, c)


def test_one_step_matches_hand_computed_langevin_update():
    """sigma = 0: x1 = clip(x0 - eta * clip(2 c1 (x0 - x) - c2 W^T (p - onehot), -rho, rho))."""
    logits_fn, x, y, W, b = linear_setup()
    key = jax.random.PRNGKey(5)
    eta, rho, c1, c2 = 0.3, 0.05, 0.3, 0.42
    x0 = np.asarray(sample(logits_fn, key, x, y, steps=0))
    x1 = np.asarray(sample(logits_fn, key, x, y, steps=1, noise_scale=0.0, step_size=eta, grad_clip=rho, c1=c1, c2=c2))
    flat0 = x0.reshape(B, -1)
    p = np_softmax(flat0 @ W + b)
    onehot = np.eye(K)[np.asarray(y)]
    # d/dx CE(Wx+b, y) = W (p - onehot); the energy subtracts c2 * CE (untargeted).
    grad = 2 * c1 * (flat0 - np.asarray(x).reshape(B, -1)) - c2 * (p - onehot) @ W.T
    expected = np.clip(flat0 - eta * np.clip(grad, -rho, rho), 0, 1).reshape(x0.shape)
    np.testing.assert_allclose(x1, expected, atol=1e-5)


def test_targeted_step_descends_cross_entropy_to_target():
    logits_fn, x, y, W, b = linear_setup()
    key = jax.random.PRNGKey(5)
    target = (y + 1) % K
    x0 = np.asarray(sample(logits_fn, key, x, y, steps=0))
    x1 = np.asarray(langevin_sample(logits_fn, key, x, y, LangevinSettings(steps=1, noise_scale=0.0), target=target))
    flat0 = x0.reshape(B, -1)
    p = np_softmax(flat0 @ W + b)
    grad = 2 * 0.3 * (flat0 - np.asarray(x).reshape(B, -1)) + 0.42 * (p - np.eye(K)[np.asarray(target)]) @ W.T
    expected = np.clip(flat0 - 0.3 * np.clip(grad, -1, 1), 0, 1).reshape(x0.shape)
    np.testing.assert_allclose(x1, expected, atol=1e-5)


def test_each_step_moves_a_coordinate_by_at_most_eta_rho_plus_noise():
    logits_fn, x, y, _, _ = linear_setup()
    key = jax.random.PRNGKey(2)
    eta, rho = 0.3, 0.01
    x0 = sample(logits_fn, key, x, y, steps=0)
    x1 = sample(logits_fn, key, x, y, steps=1, noise_scale=0.0, step_size=eta, grad_clip=rho)
    move = jnp.abs(x1 - x0)
    assert float(move.max()) <= eta * rho + 1e-6
    assert float(move.max()) >= eta * rho - 1e-6  # the clip is active somewhere
    # With noise sigma the move is at most sigma|z| + eta*rho; |z| < 6 for these few draws.
    sigma = 1e-3
    x1n = sample(logits_fn, key, x, y, steps=1, noise_scale=sigma, step_size=eta, grad_clip=rho)
    assert float(jnp.abs(x1n - x0).max()) <= eta * rho + 6 * sigma


def test_without_noise_and_victim_term_converges_to_x_at_the_closed_form_rate():
    """sigma = 0, c2 = 0: E = c1||x_adv - x||^2, so x_t - x = (1 - 2 eta c1)^t (x_0 - x)."""
    logits_fn, x, y, _, _ = linear_setup()
    key = jax.random.PRNGKey(4)
    x0 = sample(logits_fn, key, x, y, steps=0)
    for t in (1, 5, 20):
        xt = sample(logits_fn, key, x, y, steps=t, noise_scale=0.0, c2=0.0)
        np.testing.assert_allclose(xt, x + (1 - 2 * 0.3 * 0.3) ** t * (x0 - x), atol=1e-5)
    x100 = sample(logits_fn, key, x, y, steps=100, noise_scale=0.0, c2=0.0)
    np.testing.assert_allclose(x100, x, atol=1e-6)


def test_sample_depends_only_on_its_own_example():
    logits_fn, x, y, _, _ = linear_setup()
    key = jax.random.PRNGKey(7)
    full = sample(logits_fn, key, x, y, steps=4)
    changed = sample(logits_fn, key, x.at[1:].set(1.0 - x[1:]), y.at[1:].set(0), steps=4)
    np.testing.assert_array_equal(full[0], changed[0])
    assert not jnp.allclose(full[1:], changed[1:])
    # Nor on the batch size: the first two of a batch of four equal a batch of two.
    np.testing.assert_array_equal(full[:2], sample(logits_fn, key, x[:2], y[:2], steps=4))


# ---------------------------------------------------------------------------------------
# The opt-in cheaper sampler: start at x, and the per-chain convergence exit.


def contraction_setup():
    """c2 = 0 and sigma = 0: x_t - x = (1 - 2 eta c1)^t (u - x) exactly (no clipping: the
    gradient 2 c1 (x_t - x) stays below rho and x_t stays between u and x)."""
    logits_fn, x, y, _, _ = linear_setup()
    settings = dict(steps=60, step_size=0.3, c1=0.3, c2=0.0, noise_scale=0.0)
    return logits_fn, x, y, settings, 1 - 2 * 0.3 * 0.3


@pytest.mark.slow
def test_convergence_exit_freezes_each_chain_at_its_closed_form_step():
    logits_fn, x, y, settings, rate = contraction_setup()
    key = jax.random.PRNGKey(5)
    u = sample(logits_fn, key, x, y, **dict(settings, steps=0))
    m = np.mean(np.abs(np.asarray(u - x)), axis=(1, 2, 3))  # mean |u_i - x_i| per example
    tol = 0.004
    # Drift of step t (t = 1, 2, ...): (rate^(t-1) - rate^t) m_i; the chain stops after the first
    # step whose drift is below tol.
    expected_steps = np.array([next(t for t in range(1, 61) if (1 - rate) * rate ** (t - 1) * mi < tol) for mi in m])
    assert len(set(expected_steps.tolist())) > 1  # the examples stop at different steps
    out, steps = samplers_with_steps(logits_fn, key, x, y, dict(settings, tolerance=tol))
    np.testing.assert_array_equal(np.asarray(steps), expected_steps)
    expected = np.asarray(x) + rate ** expected_steps[:, None, None, None] * np.asarray(u - x)
    np.testing.assert_allclose(np.asarray(out), expected, atol=2e-6)
    # An example's result does not depend on the rest of the batch.
    for i in range(B):
        alone, _ = samplers_with_steps(
            logits_fn, key, x[i : i + 1], y[i : i + 1], dict(settings, tolerance=tol), index_offset=i
        )
        np.testing.assert_array_equal(np.asarray(alone[0]), np.asarray(out[i]))


def test_convergence_exit_caps_at_T_and_default_is_T_steps():
    logits_fn, x, y, settings, rate = contraction_setup()
    key = jax.random.PRNGKey(5)
    out, steps = samplers_with_steps(logits_fn, key, x, y, dict(settings, steps=3, tolerance=1e-9))
    assert np.all(np.asarray(steps) == 3)
    np.testing.assert_array_equal(np.asarray(out), np.asarray(sample(logits_fn, key, x, y, **dict(settings, steps=3))))
    _, steps = samplers_with_steps(logits_fn, key, x, y, dict(settings, steps=7))
    assert np.all(np.asarray(steps) == 7)


def test_clean_start_is_x_and_x_is_the_fixed_point_without_the_classifier_term():
    logits_fn, x, y, settings, _ = contraction_setup()
    key = jax.random.PRNGKey(2)
    np.testing.assert_array_equal(
        np.asarray(sample(logits_fn, key, x, y, **dict(settings, steps=0, init="clean"))), np.asarray(x)
    )
    out, steps = samplers_with_steps(logits_fn, key, x, y, dict(settings, init="clean", tolerance=1e-6))
    np.testing.assert_array_equal(np.asarray(out), np.asarray(x))
    assert np.all(np.asarray(steps) == 1)  # zero drift: every chain stops after its first step


def samplers_with_steps(logits_fn, key, x, y, settings, index_offset=0):
    from patjax.pat.langevin import langevin_sample_with_steps

    return jax.jit(
        lambda k, x, y: langevin_sample_with_steps(
            logits_fn, k, x, y, LangevinSettings(**settings), index_offset=index_offset
        )
    )(key, x, y)
