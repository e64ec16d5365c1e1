"""The PyTorch peers (benchmarks/speed/torch_pat_peer.py) compute patjax's PAT step.

A second implementation of Algorithm 2, written from the paper in PyTorch, is given patjax's
weights (small CNN, and ResNet-18 at width 4), the same clean batch and the same sampler
randomness (patjax's own start, and the noise its keys draw), and must agree with patjax to
1e-5 on the logits and training-mode BatchNorm statistics, the sampler's samples after T = 3
steps, the SNIS-weighted loss, and the loss, parameters and BatchNorm running statistics after
one and then a second full `train.train_step` (the measured agreement is in
benchmarks/README.md). The sampler and the two steps are checked for both ways the peer runs:
eager, and compiled (torch.compile of the sampler step, the update and the optimizer step,
channels-last; a `reference` check: minutes of compilation on a cold cache). In bf16 (autocast
against patjax's compute_dtype=bfloat16) the compiled peer's weighted loss is checked at bf16's
tolerance.
"""

import dataclasses
import importlib.util
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from conftest import REPO
from flax import traverse_util

from patjax import methods
from patjax.data import cifar
from patjax.interop import torch_names
from patjax.models import networks
from patjax.pat import langevin
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import state as state_lib
from patjax.run import train

# Each test builds the PyTorch peer and runs it beside patjax, seconds apiece: the whole file is slow.
pytestmark = pytest.mark.slow
BATCH, STEPS = 8, 3
RESNET_WIDTH = 4  # ResNet-18 with stage widths 4/8/16/32: the same graph, test-sized
TOL = 1e-5
BF16_TOL = 2e-2  # a few units of bf16's 2**-8 relative rounding on a loss of about 2


def load_peer():
    spec = importlib.util.spec_from_file_location("torch_pat_peer", REPO / "benchmarks" / "speed" / "torch_pat_peer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


peer = load_peer()
EXECUTIONS = {"eager": peer.Execution(), "compiled": peer.Execution(compile=True, channels_last=True)}
# torch.compile's first compilation of these graphs (Inductor, C++ through gcc) takes 1-2.5 min
# a test on 2 loaded cores, seconds once its cache holds them: a `reference` cross-check.
EXECUTION_PARAMS = ["eager", pytest.param("compiled", marks=pytest.mark.reference)]


def tiny_config(model):
    cfg = config_lib.default_config()
    cfg.model = model
    cfg.model_width = RESNET_WIDTH
    cfg.batch_size = BATCH
    cfg.num_train_steps = 10
    cfg.langevin.steps = STEPS
    cfg.pat.beta = 0.5  # far from uniform weights, so the SNIS weighting shows in the loss
    # Larger than Appendix E's 0.01 and 5e-4, so that the decay term of one update
    # (lr * wd * (1 + momentum) * p) stands well above the tolerance.
    cfg.learning_rate = 0.1
    cfg.weight_decay = 5e-3
    return cfg


def settings_of(cfg):
    lv = cfg.langevin
    return peer.LangevinSettings(
        steps=int(lv.steps),
        step_size=float(lv.step_size),
        noise_scale=float(lv.noise_scale),
        grad_clip=float(lv.grad_clip),
        c1=float(lv.c1),
        c2=float(lv.c2),
    )


def realistic_images(key, n):
    """uint8 NHWC images: smooth colour fields (upsampled 4x4 noise) with fine texture."""
    coarse_key, fine_key = jax.random.split(key)
    coarse = jax.random.uniform(coarse_key, (n, 4, 4, 3))
    smooth = jax.image.resize(coarse, (n, 32, 32, 3), "bilinear")
    texture = 0.08 * jax.random.normal(fine_key, (n, 32, 32, 3))
    return np.asarray(jnp.round(255 * jnp.clip(smooth + texture, 0, 1)), np.uint8)


def perturbed(state, key):
    """The initial state with BatchNorm affine parameters, running statistics and the Dense
    bias moved off their defaults, so the weight copy and the inference mode are exercised."""
    params = traverse_util.flatten_dict(state.params)
    stats = traverse_util.flatten_dict(state.batch_stats)
    for i, path in enumerate(p for p in stats if p[-1] == "mean"):
        k = jax.random.split(jax.random.fold_in(key, i), 4)
        module, c = path[:-1], stats[path].shape
        params[module + ("scale",)] = 1 + 0.2 * jax.random.normal(k[0], c)
        params[module + ("bias",)] = 0.1 * jax.random.normal(k[1], c)
        stats[module + ("mean",)] = 0.2 * jax.random.normal(k[2], c)
        stats[module + ("var",)] = jax.random.uniform(k[3], c, minval=0.5, maxval=2.0)
    params[("Dense_0", "bias")] = 0.1 * jax.random.normal(jax.random.fold_in(key, len(stats)), (10,))
    return state.replace(params=traverse_util.unflatten_dict(params), batch_stats=traverse_util.unflatten_dict(stats))


# ---------------------------------------------------------------------------------------
# Weights between layouts: Flax NHWC / HWIO / (in, out) <-> torch NCHW / OIHW / (out, in).

load_patjax_weights = peer.load_patjax_weights


def as_patjax_trees(model):
    """(params, batch_stats) of the torch model in patjax's names and layouts."""
    name = model.patjax_name
    kwargs = {"width": RESNET_WIDTH} if name in networks.TAKES_WIDTH else {}
    abstract = jax.eval_shape(
        lambda: networks.init_variables(networks.create_model(name, "cifar10", 10, **kwargs), jax.random.PRNGKey(0))
    )
    state_dict = {k: v.detach().numpy().copy() for k, v in model.state_dict().items()}
    params, stats, _ = torch_names.from_state_dict(name, state_dict, *abstract)
    return params, stats


def nchw(x):
    return torch.from_numpy(np.array(x, np.float32)).permute(0, 3, 1, 2).contiguous()


def nhwc(x):
    return x.detach().permute(0, 2, 3, 1).numpy()


def torch_labels(y):
    return torch.tensor(np.asarray(y), dtype=torch.long)


def max_tree_diff(a, b):
    diffs = jax.tree.map(lambda u, v: float(np.max(np.abs(np.asarray(u) - np.asarray(v)))), a, b)
    return max(jax.tree.leaves(diffs))


# ---------------------------------------------------------------------------------------
# The sampler's randomness as patjax draws it.


def sampler_noise(key, x, steps):
    """The noise patjax's Langevin chain adds at steps 0..steps-1, drawn from its keys:
    example i's key fold_in(key, i) splits into (start key, noise key), and step t's noise
    is normal(fold_in(noise key, t)). Also returns the start drawn the same way."""
    keys = langevin.per_example_keys(key, x.shape[0])
    init_keys, noise_keys = jnp.moveaxis(jax.vmap(jax.random.split)(keys), 1, 0)
    shape = x.shape[1:]
    start = jax.vmap(lambda k: jax.random.uniform(k, shape, x.dtype))(init_keys)
    noise = [
        jax.vmap(lambda k: jax.random.normal(jax.random.fold_in(k, t), shape, x.dtype))(noise_keys)
        for t in range(steps)
    ]
    return start, noise


def step_inputs(state, images, labels, permutation, cfg, steps_per_epoch):
    """What `train.train_step` draws for this step: the augmented batch, labels and method key."""
    position = int(state.step) % steps_per_epoch
    indices = permutation[position * cfg.batch_size : (position + 1) * cfg.batch_size]
    step_key = jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step)
    augment_key, method_key = jax.random.split(step_key)
    return cifar.augment(augment_key, images[indices]), labels[indices], method_key


# ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module", params=["small_cnn", "resnet18"])
def setup(request):
    torch.manual_seed(0)
    cfg = tiny_config(request.param)
    steps_per_epoch = 1
    settings = config_lib.train_settings(cfg)
    schedule = settings.optimizer.schedule(steps_per_epoch)
    tx = optimizer_lib.make_optimizer(settings.optimizer, schedule)
    model_fns, state = state_lib.create_train_state(settings.model, settings.seed, tx)
    state = perturbed(state, jax.random.PRNGKey(1))
    images = jnp.asarray(realistic_images(jax.random.PRNGKey(2), BATCH))
    labels = jax.random.randint(jax.random.PRNGKey(3), (BATCH,), 0, 10)
    permutation = jnp.arange(BATCH)
    net = peer.create_model(cfg.model, num_classes=10, width=RESNET_WIDTH)
    load_patjax_weights(net, state.params, state.batch_stats)
    return dict(
        cfg=cfg,
        settings=settings,
        tx=tx,
        schedule=schedule,
        model_fns=model_fns,
        state=state,
        images=images,
        labels=labels,
        permutation=permutation,
        steps_per_epoch=steps_per_epoch,
        net=net,
    )


def first_batch(s):
    return step_inputs(s["state"], s["images"], s["labels"], s["permutation"], s["cfg"], s["steps_per_epoch"])


def fresh_peer(s, execution, state=None):
    """A peer on a new copy of the (given, else the fixture's) state's weights, with its own
    optimizer: the steps it takes leave the fixture's network alone."""
    state = state or s["state"]
    cfg = s["cfg"]
    net = peer.create_model(cfg.model, num_classes=10, width=RESNET_WIDTH)
    load_patjax_weights(net, state.params, state.batch_stats)
    optimizer = peer.make_optimizer(
        net, lr=float(cfg.learning_rate), momentum=float(cfg.momentum), weight_decay=float(cfg.weight_decay)
    )
    return peer.Peer(net, optimizer, settings_of(cfg), beta=float(cfg.pat.beta), execution=execution)


def test_weights_copy_round_trips(setup):
    params, stats = as_patjax_trees(setup["net"])
    assert max_tree_diff(params, setup["state"].params) == 0
    assert max_tree_diff(stats, setup["state"].batch_stats) == 0


def test_logits_and_training_mode_statistics_match(setup):
    s, net = setup, setup["net"]
    x, _, _ = first_batch(s)
    state = s["state"]
    infer = s["model_fns"].infer(state.params, state.batch_stats, x)
    train_logits, new_stats = s["model_fns"].train(state.params, state.batch_stats, x)
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    try:
        net.eval()
        with torch.no_grad():
            torch_infer = net(nchw(x)).numpy()
        net.train()
        with torch.no_grad():
            torch_train = net(nchw(x)).numpy()
        _, torch_stats = as_patjax_trees(net)
    finally:
        net.load_state_dict(saved)
    np.testing.assert_allclose(torch_infer, infer, rtol=0, atol=TOL)
    np.testing.assert_allclose(torch_train, train_logits, rtol=0, atol=TOL)
    assert max_tree_diff(torch_stats, new_stats) < TOL
    assert max_tree_diff(as_patjax_trees(net)[1], state.batch_stats) == 0


def test_sampler_start_reproduces_patjax_draw(setup):
    s = setup
    x, y, key = first_batch(s)
    logits_fn = s["model_fns"].attack_logits_fn(s["state"].params, s["state"].batch_stats)
    chain = langevin.langevin_chain(logits_fn, key, x, y, s["settings"].method.sampler)
    start, _ = sampler_noise(key, x, STEPS)
    np.testing.assert_array_equal(start, chain.start)


@pytest.mark.parametrize("execution", EXECUTION_PARAMS)
def test_sampler_samples_match_after_three_steps(setup, execution):
    s = setup
    x, y, key = first_batch(s)
    state = s["state"]
    x_adv, steps = methods.pat.langevin_adversarial_batch(
        state.params, s["model_fns"], state.batch_stats, x, y, key, s["settings"].method
    )
    assert np.all(np.asarray(steps) == STEPS)
    start, noise = sampler_noise(key, x, STEPS)
    sampler = fresh_peer(s, EXECUTIONS[execution])
    torch_adv = sampler.chain(nchw(x), torch_labels(y), nchw(start), [nchw(z) for z in noise])
    assert float(np.max(np.abs(np.asarray(x_adv) - np.asarray(start)))) > 0.1  # the chain moved
    np.testing.assert_allclose(nhwc(torch_adv), x_adv, rtol=0, atol=TOL)
    assert max_tree_diff(as_patjax_trees(sampler.model)[1], state.batch_stats) == 0  # inference mode: no update


def test_snis_weighted_loss_matches(setup):
    s, net = setup, setup["net"]
    x, y, key = first_batch(s)
    state = s["state"]
    x_adv, _ = methods.pat.langevin_adversarial_batch(
        state.params, s["model_fns"], state.batch_stats, x, y, key, s["settings"].method
    )
    loss, (_, metrics) = methods.pat.pat(
        state.params, s["model_fns"], state.batch_stats, x, y, key, s["settings"].method
    )
    saved = {k: v.clone() for k, v in net.state_dict().items()}
    try:
        net.train()
        losses = torch.nn.functional.cross_entropy(net(nchw(x_adv)), torch_labels(y), reduction="none")
        torch_loss, weights = peer.weighted_loss(losses, float(s["cfg"].pat.beta))
    finally:
        net.load_state_dict(saved)
    assert float(weights.max() - weights.min()) > 1e-3  # the weights are not uniform
    np.testing.assert_allclose(float(torch_loss.detach()), float(loss), rtol=0, atol=TOL)
    np.testing.assert_allclose(float(weights.max()), float(metrics["snis_weight_max"]), rtol=0, atol=TOL)


@pytest.mark.parametrize("execution", EXECUTION_PARAMS)
def test_two_train_steps_give_equal_parameters_and_statistics(setup, execution):
    """patjax's compiled train step against the peer's Peer.step_from, twice in a row (the second
    step uses the momentum buffer of the first): loss, parameters, running statistics."""
    s = setup
    step_fn = train.make_train_step(
        methods.make_method(s["settings"].method),
        s["model_fns"],
        s["tx"],
        s["schedule"],
        s["steps_per_epoch"],
        s["settings"].batch_size,
    )
    state = jax.tree.map(jnp.copy, s["state"])
    stepper = fresh_peer(s, EXECUTIONS[execution])
    for _ in range(2):
        x, y, key = step_inputs(state, s["images"], s["labels"], s["permutation"], s["cfg"], s["steps_per_epoch"])
        start, noise = sampler_noise(key, x, STEPS)
        before = jax.device_get(state.params)
        state, metrics = step_fn(state, s["images"], s["labels"], s["permutation"])
        torch_loss = stepper.step_from(nchw(x), torch_labels(y), nchw(start), [nchw(z) for z in noise])
        params, stats = as_patjax_trees(stepper.model)
        np.testing.assert_allclose(float(torch_loss), float(metrics["loss"]), rtol=0, atol=TOL)
        assert max_tree_diff(params, state.params) < TOL
        assert max_tree_diff(stats, state.batch_stats) < TOL
        # The update itself, not only the parameters it is added to.
        moved = jax.tree.map(lambda a, b: np.asarray(a) - np.asarray(b), state.params, before)
        torch_moved = jax.tree.map(lambda a, b: a - np.asarray(b), params, before)
        assert max_tree_diff(torch_moved, moved) < TOL
        assert max(float(np.max(np.abs(m))) for m in jax.tree.leaves(moved)) > 1e-3


@pytest.mark.reference
def test_compiled_bf16_weighted_loss_matches_patjax_bf16(setup):
    """Autocast to bf16 in the compiled peer against patjax's compute_dtype=bfloat16: the same
    weights on patjax's own bf16 sample give the same SNIS-weighted loss to bf16's tolerance,
    and a loss that differs from the float32 peer's on that sample (the autocast took effect)."""
    s = setup
    x, y, key = first_batch(s)
    state = s["state"]
    bf16_model = dataclasses.replace(s["settings"].model, compute_dtype="bfloat16")
    bf16_fns, _ = state_lib.create_train_state(bf16_model, s["settings"].seed, s["tx"])
    x_adv, _ = methods.pat.langevin_adversarial_batch(
        state.params, bf16_fns, state.batch_stats, x, y, key, s["settings"].method
    )
    loss, _ = methods.pat.pat(state.params, bf16_fns, state.batch_stats, x, y, key, s["settings"].method)
    bf16 = peer.Execution(compile=True, channels_last=True, compute_dtype="bfloat16")
    torch_bf16 = float(fresh_peer(s, bf16).update(nchw(x_adv), torch_labels(y)))
    torch_fp32 = float(fresh_peer(s, EXECUTIONS["eager"]).update(nchw(x_adv), torch_labels(y)))
    np.testing.assert_allclose(torch_bf16, float(loss), rtol=0, atol=BF16_TOL)
    assert abs(torch_bf16 - torch_fp32) > TOL
