"""PGD-L2 (patjax.attacks.l2) against closed forms: the projection against a numpy transcription
of torchattacks' `PGDL2` rescale-then-clip, the attack on a linear two-class model against the
exact L2 step along the weight vector, and the random start's radius against U(0, 1)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import Linear, np_softmax
from scipy import stats as scipy_stats

from patjax.attacks import inner, l2


def np_project(x_adv, x, eps):
    """torchattacks PGDL2: delta * min(eps / |delta|, 1), then clamp(x + delta, 0, 1)."""
    delta = (x_adv - x).reshape(len(x), -1)
    norms = np.linalg.norm(delta, axis=1, keepdims=True)
    factor = np.minimum(eps / norms, 1.0)
    return np.clip(x + (delta * factor).reshape(x.shape), 0.0, 1.0)


def test_the_projection_rescales_into_the_ball_then_clips_to_the_box():
    rng = np.random.default_rng(0)
    x = rng.uniform(0, 1, (8, 4, 4, 3)).astype(np.float32)
    # Half the perturbations outside the ball, half inside; some points leave the box.
    delta = rng.normal(0, 1, x.shape).astype(np.float32)
    delta *= (np.array([3.0, 0.2] * 4) / np.linalg.norm(delta.reshape(8, -1), axis=1)).reshape(8, 1, 1, 1)
    got = np.asarray(l2.project_l2(jnp.asarray(x + delta), jnp.asarray(x), 0.5))
    np.testing.assert_allclose(got, np_project(x + delta, x, 0.5), rtol=0, atol=1e-6)
    assert np.all(np.linalg.norm((got - x).reshape(8, -1), axis=1) <= 0.5 + 1e-6)
    assert got.min() >= 0 and got.max() <= 1
    # A point at x stays x (torchattacks would divide 0 by 0 there).
    np.testing.assert_array_equal(np.asarray(l2.project_l2(jnp.asarray(x), jnp.asarray(x), 0.5)), x)


@pytest.mark.parametrize("steps, moved", [(2, 0.4), (5, 0.5)])
def test_pgd_l2_on_a_linear_model_steps_along_the_weights_until_the_ball_stops_it(steps, moved):
    """Two classes with logits (0, w.x + b): the cross-entropy's input gradient is a multiple of w,
    of sign -1 for label 1 and +1 for label 0, so every step moves step_size along -+w/|w| and the
    ball stops the walk at eps (interior images: no clipping)."""
    rng = np.random.default_rng(1)
    x = rng.uniform(0.3, 0.7, (6, 8, 8, 3)).astype(np.float32)
    w = rng.normal(0, 1, x[0].size).astype(np.float32)
    y = np.array([0, 1, 0, 1, 1, 0], np.int32)

    def logits_fn(z):
        score = z.reshape(z.shape[0], -1) @ w + 0.1
        return jnp.stack([jnp.zeros_like(score), score], axis=-1)

    got = l2.pgd_l2(logits_fn, jax.random.PRNGKey(0), x, y, eps=0.5, step_size=0.2, steps=steps, random_start=False)
    direction = np.where(y == 1, -1.0, 1.0)[:, None] * (w / np.linalg.norm(w))[None]
    expected = x + (moved * direction).reshape(x.shape)
    np.testing.assert_allclose(np.asarray(got), expected, rtol=0, atol=2e-6)


def test_the_random_start_is_uniform_in_radius_within_the_ball():
    x = jnp.full((4000, 4, 4, 3), 0.5, jnp.float32)
    start = np.asarray(l2.l2_random_start(jax.random.PRNGKey(3), x, 0.1))
    radii = np.linalg.norm((start - 0.5).reshape(4000, -1), axis=1) / 0.1  # 0.1 keeps every pixel inside [0, 1]
    assert radii.max() <= 1 + 1e-5
    assert scipy_stats.kstest(radii, "uniform").pvalue > 1e-3


def test_trades_l2_attack_ends_on_the_l2_sphere_along_the_linear_models_direction():
    """TRADES' distance='l_2' ascent on KL(p(x) || p(x')) for a two-class linear model: the KL's
    gradient points along +-(w_1 - w_0) everywhere (its sign set by the start's noise), so 10 steps
    of 2 eps / 10 reach the sphere |delta|_2 = eps along that line, the start's 0.001 N(0, 1) aside
    (pixels in [0.25, 0.75]: the box is never met)."""
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.uniform(0.25, 0.75, (6, 3, 3, 2)), jnp.float32)
    model = Linear(2)
    params = model.init(jax.random.PRNGKey(1), x)
    eps = 0.2
    x_adv = inner.trades_kl_attack(
        lambda v: model.apply(params, v), jax.random.PRNGKey(2), x, eps=eps, step_size=0.0, steps=10, norm="l2"
    )
    w = np.asarray(params["params"]["Dense_0"]["kernel"], np.float64)
    direction = (w[:, 1] - w[:, 0]) / np.linalg.norm(w[:, 1] - w[:, 0])
    delta = np.asarray(x_adv - x, np.float64).reshape(6, -1)
    norms = np.linalg.norm(delta, axis=1)
    np.testing.assert_allclose(norms, eps, rtol=1e-5)
    np.testing.assert_allclose(np.abs(delta @ direction) / norms, 1.0, atol=1e-3)


@pytest.mark.slow
def test_trades_l2_ascent_follows_the_reference_loop_step_by_step():
    """yaodongyu/TRADES trades.py's distance='l_2' branch transcribed in PyTorch (SGD on delta with
    lr = 2 eps / steps on -KL(sum), the gradient divided by its per-example L2 norm, clamp, renorm_),
    from the same start delta, on a linear model of 3 classes where the box is met: the same x_adv."""
    import torch

    rng = np.random.default_rng(3)
    x = rng.uniform(0.0, 1.0, (5, 3, 3, 2)).astype(np.float32)
    x[:, 0] = 0.0  # pixels on the box's faces: the clamp acts
    w = rng.normal(size=(18, 3)).astype(np.float32)
    b = rng.normal(size=3).astype(np.float32)
    delta0 = (0.001 * rng.normal(size=x.shape)).astype(np.float32)
    eps, steps = 0.5, 7

    xt, wt, bt = torch.from_numpy(x), torch.from_numpy(w), torch.from_numpy(b)
    model = lambda v: v.reshape(v.shape[0], -1) @ wt + bt
    delta = torch.from_numpy(delta0.copy()).requires_grad_(True)
    optimizer = torch.optim.SGD([delta], lr=eps / steps * 2)
    clean = torch.softmax(model(xt), dim=1)
    for _ in range(steps):
        optimizer.zero_grad()
        loss = -1 * torch.nn.KLDivLoss(reduction="sum")(torch.log_softmax(model(xt + delta), dim=1), clean)
        loss.backward()
        delta.grad.div_(delta.grad.view(5, -1).norm(p=2, dim=1).view(-1, 1, 1, 1))
        optimizer.step()
        delta.data.add_(xt)
        delta.data.clamp_(0, 1).sub_(xt)
        delta.data.renorm_(p=2, dim=0, maxnorm=eps)
    expected = (xt + delta).detach().numpy()

    logits_fn = lambda v: v.reshape(v.shape[0], -1) @ jnp.asarray(w) + jnp.asarray(b)
    clean_probs = jax.nn.softmax(logits_fn(jnp.asarray(x)), axis=-1)
    got = l2.trades_l2_ascent(
        logits_fn,
        jnp.asarray(x + delta0),
        jnp.asarray(x),
        clean_probs,
        eps=eps,
        steps=steps,
        loss_fn=inner.kl_from_clean_loss,
    )
    np.testing.assert_allclose(np.asarray(got), expected, atol=2e-5)
    assert np.abs(expected - x).max() > 0.05  # the attack moved


def np_l2_ascent(x, start, grad_fn, eps, steps, step=None):
    """trades.py's distance='l_2' loop written out in numpy: steps of 2 eps / steps along the
    gradient over its per-example L2 norm, clamp to [0, 1], renorm delta to L2 <= eps."""
    z = start.copy()
    for _ in range(steps):
        g = grad_fn(z)
        g = g / np.linalg.norm(g.reshape(len(g), -1), axis=1).reshape(-1, 1, 1, 1)
        delta = np.clip(z + (2 * eps / steps if step is None else step) * g, 0, 1) - x
        norm = np.linalg.norm(delta.reshape(len(x), -1), axis=1).reshape(-1, 1, 1, 1)
        z = x + delta * np.minimum(1.0, eps / norm)
    return z


@pytest.mark.parametrize("method", ["trades", "mart"])
def test_trades_and_mart_l2_attacks_take_steps_of_two_eps_over_steps_where_the_box_binds(method):
    """The step of TRADES' L2 ascent (and MART's, on CE) is 2 eps / steps whatever step_size says:
    on a linear model of 3 classes with pixels on the box's faces, where the path (not only its
    end on the sphere) depends on the step, the attack equals the loop written out in numpy with
    the closed-form gradients (KL: W (p(z) - p(x)); CE: W (p(z) - onehot(y)))."""
    rng = np.random.default_rng(7)
    x = rng.uniform(0.0, 1.0, (5, 3, 3, 2)).astype(np.float32)
    x[:, 0] = 0.0
    x[:, -1] = 1.0
    w = rng.normal(size=(18, 3)).astype(np.float32)
    b = rng.normal(size=3).astype(np.float32)
    y = np.array([0, 1, 2, 0, 1])
    eps, steps, key = 1.0, 6, jax.random.PRNGKey(4)
    logits_fn = lambda v: v.reshape(v.shape[0], -1) @ jnp.asarray(w) + jnp.asarray(b)
    probs = lambda z: np_softmax(z.reshape(len(z), -1).astype(np.float64) @ w + b)
    target = probs(x) if method == "trades" else np.eye(3)[y]
    grad_fn = lambda z: ((probs(z) - target) @ w.T).reshape(z.shape)
    # step_size is not read under L2; a start of 0.1 N(0, 1) keeps KL's first gradient (p(z) - p(x),
    # near 0 at the reference's 0.001) well above float32's rounding, so its direction is defined.
    attack = dict(eps=eps, step_size=123.0, steps=steps, init_noise=0.1, norm="l2")
    if method == "trades":
        got = inner.trades_kl_attack(logits_fn, key, jnp.asarray(x), **attack)
    else:
        got = inner.mart_attack(logits_fn, key, jnp.asarray(x), jnp.asarray(y), **attack)
    start = np.asarray(inner.gaussian_start(key, jnp.asarray(x), 0.1), np.float64)
    expected = np_l2_ascent(x.astype(np.float64), start, grad_fn, eps, steps)
    np.testing.assert_allclose(np.asarray(got), expected, atol=1e-4)
    # A step of eps / steps would end elsewhere: the test sees the step.
    half = np_l2_ascent(x.astype(np.float64), start, grad_fn, eps, steps, step=eps / steps)
    assert np.abs(half - expected).max() > 1e-2
