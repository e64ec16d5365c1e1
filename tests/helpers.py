"""What several test files share: tiny models with closed-form gradients and the configs that
train or evaluate them in seconds; PyTorch networks made to look trained and the shapes and
images their weights are compared on; weights files cut short; a command line run as a user runs it."""

import os
import subprocess
import sys
import types

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from conftest import REPO
from safetensors import SafetensorError, safe_open

from patjax.configs import quickstart
from patjax.data import cifar
from patjax.models import networks
from patjax.models.networks import ModelFns
from patjax.run import config as config_lib
from patjax.run import evaluation


class Linear(nn.Module):
    """logits = flatten(x) @ W + b: gradients have closed forms."""

    num_classes: int = 3

    @nn.compact
    def __call__(self, x, train: bool = False):
        return nn.Dense(self.num_classes)(x.reshape(x.shape[0], -1))


def np_softmax(z):
    z = z - z.max(axis=-1, keepdims=True)
    e = np.exp(z)
    return e / e.sum(axis=-1, keepdims=True)


def np_cross_entropy(logits, labels):
    p = np_softmax(logits)
    return -np.log(p[np.arange(len(labels)), labels])


def trained_looking(torch, net, seed):
    """Random BatchNorm affine parameters and running statistics moved far from (0, 1) by
    train-mode passes, so that a swapped, transposed or dropped BatchNorm tensor shows."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for m in net.modules():
            if isinstance(m, torch.nn.BatchNorm2d):
                m.weight.copy_(1 + 0.3 * torch.randn(m.weight.shape, generator=gen))
                m.bias.copy_(0.2 * torch.randn(m.bias.shape, generator=gen))
                m.momentum = 0.5
            if isinstance(m, torch.nn.Linear):
                m.bias.copy_(0.1 * torch.randn(m.bias.shape, generator=gen))
        net.train()
        for _ in range(2):
            net(0.5 + 0.3 * torch.randn((8, 3, 32, 32), generator=gen))
    return net.eval()


def abstract_variables(name, **kwargs):
    """The shapes of a CIFAR-10 network's (params, batch_stats), without initializing it."""
    model = networks.create_model(name, "cifar10", 10, **kwargs)
    return jax.eval_shape(lambda: networks.init_variables(model, jax.random.PRNGKey(0)))


def random_images():
    """Four 8-bit images of CIFAR's shape as floats (for comparing networks' logits, not their accuracy)."""
    pixels = np.random.default_rng(0).integers(0, 256, (4, 32, 32, 3), dtype=np.uint8)
    return np.asarray(cifar.to_float(pixels))


def torch_logits(torch, net, x):
    with torch.no_grad():
        return net(torch.from_numpy(x).permute(0, 3, 1, 2).contiguous()).numpy()


def cut_short(path) -> str:
    """Truncates the .safetensors file `path` to half its bytes (a copy interrupted); returns the
    reason the safetensors library itself gives for refusing it."""
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)
    with pytest.raises(SafetensorError) as error:
        safe_open(path, framework="numpy")
    return str(error.value)


def run_module(module, *flags, timeout=300):
    """`python -m module flags...` from the repository root, its output captured."""
    return subprocess.run(
        [sys.executable, "-m", module, *flags], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )


# ---------------------------------------------------------------------------------------
# Configs and setups that train or evaluate in seconds.


def tiny_config(**overrides):
    cfg = quickstart.get_config()
    cfg.batch_size = 8
    cfg.num_train_steps = 4
    cfg.langevin.steps = 2
    cfg.checkpoint_every_steps = 2
    cfg.log_every_steps = 2
    cfg.progress_bar = False
    cfg.eval.num_examples = 16
    cfg.eval.batch_size = 8
    cfg.eval.pr.samples = 4
    cfg.eval.pr.chunk_size = 2
    for key, value in overrides.items():
        target = cfg
        *path, last = key.split(".")
        for p in path:
            target = target[p]
        target[last] = value
    return cfg


def linear_setup(seed=0):
    """A sharp linear classifier of 3 classes and 4 random images: (logits_fn, x, y, W, b)."""
    model = Linear(3)
    x = jax.random.uniform(jax.random.PRNGKey(seed), (4, 4, 4, 3))
    y = jnp.array([0, 1, 2, 1])
    variables = model.init(jax.random.PRNGKey(1), x)
    W = np.asarray(variables["params"]["Dense_0"]["kernel"]) * 5.0  # a sharper classifier
    b = np.asarray(variables["params"]["Dense_0"]["bias"])
    variables = {"params": {"Dense_0": {"kernel": jnp.asarray(W), "bias": jnp.asarray(b)}}}
    logits_fn = lambda xa: model.apply(variables, xa)
    return logits_fn, x, y, W, b


def linear_batch(batch=6, k=3, shape=(2, 2, 3), seed=0, interior=False, margin=0.1):
    """A linear classifier z = flatten(x) W + b (weights scaled by 3) and a batch with labels
    0, 1, ..., k - 1, 0, ...: (logits_fn, x, y, W, b); interior: x in [margin, 1 - margin], else
    pixels on the box faces."""
    model = Linear(k)
    x = jax.random.uniform(jax.random.PRNGKey(seed), (batch, *shape))
    if interior:
        x = margin + (1 - 2 * margin) * x
    else:  # pixels on the box faces, where the [0, 1] clip binds
        x = x.at[:, 0].set(0.0).at[:, -1].set(1.0)
    y = jnp.arange(batch) % k
    params = model.init(jax.random.PRNGKey(seed + 1), x)["params"]
    params = jax.tree.map(lambda p: 3.0 * p, params)
    logits_fn = lambda z: model.apply({"params": params}, z)
    W = np.asarray(params["Dense_0"]["kernel"], np.float64)
    b = np.asarray(params["Dense_0"]["bias"], np.float64)
    return logits_fn, x, y, W, b


def tiny_setup(scale=1.0, num_images=7, model_seed=0):
    """A linear model and images labelled by the model of seed 0 (a third of them wrongly); another
    model_seed gives another model on the same labelled images."""
    rng = np.random.default_rng(0)
    images = rng.integers(0, 256, size=(num_images, 4, 4, 3), dtype=np.uint8)
    model = Linear(num_classes=10)
    init = lambda seed: jax.tree.map(
        lambda p: p * 8.0 * scale, model.init(jax.random.PRNGKey(seed), jnp.zeros((1, 4, 4, 3)))["params"]
    )
    params = init(0)
    logits = np.asarray(model.apply({"params": params}, cifar.to_float(images)))
    labels = logits.argmax(1).astype(np.int32)
    labels[::3] = (labels[::3] + 1) % 10  # some clean errors
    if model_seed:
        params = jax.tree.map(lambda a, b: 0.6 * a + 0.4 * b, params, init(model_seed))
    state = types.SimpleNamespace(params=params, batch_stats={}, step=np.int32(3))
    return ModelFns(model.apply), state, cifar.Split(images, labels)


def evaluate(cfg, model_fns, state, split, evaluators=None, batch_size=None, **kwargs):
    """evaluation.evaluate_state with the settings of cfg, as evaluate_workdir builds them."""
    settings = config_lib.evaluation_settings(cfg, evaluators=evaluators, batch_size=batch_size)
    return evaluation.evaluate_state(settings, model_fns, state, split, **kwargs)


def eval_config(**eval_overrides):
    """The default config with an evaluation small enough for a linear model on a few images, and
    `eval_overrides` by path: a block's fields as a dict (pr={"samples": 4}), a shared one as itself."""
    cfg = config_lib.default_config()
    cfg.eval.pr.samples = 6
    cfg.eval.pr.chunk_size = 4
    cfg.eval.attack.steps = 3
    cfg.eval.apgd.steps = 6
    cfg.eval.attack.eps = 0.05
    cfg.eval.attack.step_size = 0.02
    cfg.eval.bootstrap_resamples = 200
    return config_lib.with_eval_overrides(cfg, eval_overrides)


def hand_made_results(correct, pr_correct, pr_all, bound, attacks):
    """A results.json as a user reads it, with the figures written out by hand (PR at eps 0.1 and 0.2)."""
    fig = lambda v: {"value": v, "interval": [v - 0.01, v + 0.01], "n": 100}
    level = lambda j: {
        "clean_correct": dict(fig(pr_correct[j]), n=correct),
        "all": fig(pr_all[j]),
        "lower_bound": fig(bound[j]),
    }
    return {
        "figures": {
            "clean_accuracy": fig(correct / 100),
            "pgd20": fig(0.2),
            "cw20": fig(0.18),
            **(
                {"aa": dict(fig(0.15), after={"apgd-ce": fig(0.16)}, masking={"masking_signs": []})}
                if "aa" in attacks
                else {}
            ),
            "worst_case": dict(fig(0.14), attacks=attacks),
            "pr": {"uniform": {"0.1": level(0), "0.2": level(1)}},
        },
        "pr_protocol": evaluation.protocol_text("uniform", 100),
        "settings": {
            "num_examples": 100,
            "num_clean_correct": correct,
            "dataset": "cifar10",
            "pr": {"distribution": "uniform", "distributions": ["uniform"], "samples": 100},
            "seed": 0,
            "confidence": 0.95,
        },
    }
