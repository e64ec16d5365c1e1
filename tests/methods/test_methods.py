"""The SNIS-weighted PAT update (Algorithm 2, lines 16-20) against independent computations."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from helpers import Linear, np_cross_entropy, np_softmax

from patjax import methods
from patjax.methods.common import snis_weights, weighted_loss
from patjax.models import networks
from patjax.pat.langevin import langevin_sample
from patjax.run import config as config_lib
from patjax.run.config import default_config


def setup(batch=6, k=4):
    model = Linear(k)
    x = jax.random.uniform(jax.random.PRNGKey(0), (batch, 3, 3, 2))
    y = jnp.arange(batch) % k
    params = model.init(jax.random.PRNGKey(1), x)["params"]
    params = jax.tree.map(lambda p: p * 4.0, params)  # spread the per-example losses
    return model, x, y, params


def per_example_losses(model, params, x, y):
    return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": params}, x), y)


@pytest.mark.slow
def test_gradient_is_the_weighted_sum_of_per_example_gradients_with_detached_weights():
    model, x, y, params = setup()
    beta = 0.7
    loss_fn = lambda p: weighted_loss(per_example_losses(model, p, x, y), beta)[0]
    grad = jax.grad(loss_fn)(params)
    # Independent: per-example gradients (Jacobian) and numpy softmax weights.
    losses = np.asarray(per_example_losses(model, params, x, y))
    w = np_softmax(-beta * losses)
    jac = jax.jacrev(lambda p: per_example_losses(model, p, x, y))(params)
    expected = jax.tree.map(lambda j: jnp.tensordot(jnp.asarray(w, j.dtype), j, axes=1), jac)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), grad, expected)
    # Differentiating through the weights would give a different gradient: the test can fail.
    through = jax.grad(
        lambda p: jnp.sum(
            jax.nn.softmax(-beta * per_example_losses(model, p, x, y)) * per_example_losses(model, p, x, y)
        )
    )(params)
    assert not np.allclose(through["Dense_0"]["kernel"], expected["Dense_0"]["kernel"], atol=1e-4)


def test_beta_zero_is_the_mean_loss():
    model, x, y, params = setup()
    losses = per_example_losses(model, params, x, y)
    loss, w = weighted_loss(losses, 0.0)
    np.testing.assert_allclose(loss, np.mean(np.asarray(losses)), rtol=1e-6)
    np.testing.assert_allclose(w, np.full(len(y), 1 / len(y)), rtol=1e-6)


def test_large_beta_concentrates_on_the_lowest_loss_example():
    losses = jnp.array([2.0, 0.5, 1.0, 3.0])
    loss, w = weighted_loss(losses, 1e3)
    assert float(w[1]) > 1 - 1e-6
    np.testing.assert_allclose(loss, 0.5, atol=1e-5)


def test_weights_match_the_papers_formula():
    losses = np.array([0.3, 1.2, 2.5, 0.1])
    beta = 0.001
    expected = np.exp(-beta * losses) / np.exp(-beta * losses).sum()
    np.testing.assert_allclose(snis_weights(jnp.asarray(losses), beta), expected, rtol=1e-6)


def pat_config(steps=3, beta=0.5):
    cfg = default_config()
    cfg.langevin.steps = steps
    cfg.pat.beta = beta
    return config_lib.method_settings(cfg)


def test_pat_method_loss_equals_hand_computation_on_its_samples():
    model, x, y, params = setup()
    fns = networks.ModelFns(model.apply)
    cfg = pat_config()
    key = jax.random.PRNGKey(9)
    loss, (_, metrics) = methods.pat.pat(params, fns, {}, x, y, key, cfg)
    x_adv = langevin_sample(lambda z: model.apply({"params": params}, z), key, x, y, cfg.sampler)
    logits = np.asarray(model.apply({"params": params}, x_adv))
    l = np_cross_entropy(logits, np.asarray(y))
    w = np.exp(-0.5 * l) / np.exp(-0.5 * l).sum()
    np.testing.assert_allclose(loss, np.sum(w * l), rtol=1e-5)
    np.testing.assert_allclose(metrics["snis_weight_max"], w.max(), rtol=1e-5)
    loss_wos, _ = methods.REGISTRY["pat_wos"].loss(params, fns, {}, x, y, key, cfg)
    np.testing.assert_allclose(loss_wos, l.mean(), rtol=1e-5)


def test_no_gradient_flows_through_the_sampler():
    """The gradient of the PAT loss equals that of the weighted loss at fixed x_adv."""
    model, x, y, params = setup()
    fns = networks.ModelFns(model.apply)
    cfg = pat_config(beta=0.3)
    key = jax.random.PRNGKey(2)
    grad = jax.grad(lambda p: methods.pat.pat(p, fns, {}, x, y, key, cfg)[0])(params)
    x_adv = langevin_sample(lambda z: model.apply({"params": params}, z), key, x, y, cfg.sampler)
    fixed = jax.grad(lambda p: weighted_loss(per_example_losses(model, p, x_adv, y), 0.3)[0])(params)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-7), grad, fixed)


@pytest.mark.slow
def test_batchnorm_inference_mode_in_sampler_and_training_mode_in_update():
    from patjax.models.networks import SmallCNN

    model = SmallCNN(num_classes=3, mean=(0.5,) * 3, std=(0.25,) * 3, widths=(4,))
    x = jax.random.uniform(jax.random.PRNGKey(0), (8, 8, 8, 3))
    y = jnp.arange(8) % 3
    variables = model.init(jax.random.PRNGKey(1), x)
    params, stats = variables["params"], variables["batch_stats"]
    fns = networks.ModelFns(model.apply)
    cfg = pat_config(steps=2)
    _, (new_stats, _) = methods.pat.pat(params, fns, stats, x, y, jax.random.PRNGKey(3), cfg)
    # The statistics are those of one training-mode pass on x_adv, sampled in inference mode.
    x_adv = langevin_sample(lambda z: fns.infer(params, stats, z), jax.random.PRNGKey(3), x, y, cfg.sampler)
    _, direct = model.apply(variables, x_adv, train=True, mutable=["batch_stats"])
    jax.tree.map(np.testing.assert_allclose, new_stats, direct["batch_stats"])
    assert not np.allclose(new_stats["BatchNorm_0"]["mean"], stats["BatchNorm_0"]["mean"])
