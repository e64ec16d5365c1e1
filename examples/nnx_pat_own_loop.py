"""PAT in your own Flax NNX training loop: your module, your optimizer, your `nnx.jit` train step,
patjax's PAT loss (Algorithm 2) inside it; then `patjax.api.evaluate` on the module (clean,
PGD-20, PR) printing the table `python -m patjax.evaluate` prints.

  python examples/nnx_pat_own_loop.py                  # 300 steps of batch 128 on CIFAR-10
  python examples/nnx_pat_own_loop.py --steps=2 --batch_size=8 --langevin_steps=2 \
      --eval_images=16 --pr_samples=4                  # a tiny run, as the CI test runs it

CIFAR-10 is read from the data folder (`PATJAX_DATA_DIR`, or shared/data beside the checkout;
docs/data.md). The CNN below is patjax's small CNN written in NNX (`patjax.models.networks.SmallCNN`
is its Linen form), so `tests/test_own_loop.py` can hand both the same weights.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

import patjax
from patjax.data import cifar
from patjax.models import ops
from patjax.reporting import report

CIFAR10_MEAN, CIFAR10_STD = (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)


class SmallCNN(nnx.Module):
    """Three (3x3 conv, BatchNorm, ReLU, 2x2 max-pool) blocks, global average pool, linear head:
    the layers of patjax's Linen `SmallCNN`, with PyTorch's BatchNorm defaults (momentum 0.1 as
    Flax's 0.9, epsilon 1e-5) and torchvision's Kaiming fan-out initialization."""

    def __init__(self, num_classes: int = 10, widths=(32, 64, 128), *, rngs: nnx.Rngs):
        kaiming = jax.nn.initializers.variance_scaling(2.0, "fan_out", "normal")
        channels = (3, *widths)
        self.kernels = nnx.List(
            [nnx.Param(kaiming(rngs.params(), (3, 3, cin, cout))) for cin, cout in zip(channels, widths)]
        )
        self.norms = nnx.List([nnx.BatchNorm(w, momentum=0.9, epsilon=1e-5, rngs=rngs) for w in widths])
        self.head = nnx.Linear(widths[-1], num_classes, rngs=rngs)

    def __call__(self, x):
        x = (x - jnp.asarray(CIFAR10_MEAN)) / jnp.asarray(CIFAR10_STD)  # the model normalizes its [0, 1] input
        for kernel, norm in zip(self.kernels, self.norms):
            x = ops.max_pool(nnx.relu(norm(ops.conv2d(x, kernel[...], 1, 1))), 2)
        return self.head(jnp.mean(x, axis=(1, 2)))


def make_train_step(sampler: patjax.LangevinSettings, beta: float):
    """Your train step: patjax's PAT loss on the NNX module, SGD on its parameters."""

    @nnx.jit
    def train_step(model, optimizer, x, y, key):
        def loss_fn(model):
            # The training-mode forward (BatchNorm updates its statistics in the module) and a
            # detached inference-mode copy for Algorithm 1's sampler.
            train_fn, attack_fn = patjax.nnx_forwards(model)
            loss, (_, metrics) = patjax.pat_loss(train_fn, attack_fn, key, x, y, sampler=sampler, beta=beta)
            return loss, metrics

        (_, metrics), grads = nnx.value_and_grad(loss_fn, has_aux=True)(model)
        optimizer.update(model, grads)
        return metrics

    return train_step


def main(
    steps=300,
    batch_size=128,
    learning_rate=0.05,
    langevin_steps=patjax.LangevinSettings.steps,
    eval_images=500,
    pr_samples=100,
    seed=0,
    log_every=50,
):
    train = cifar.load_split("cifar10", "train", cifar.find_data_dir("cifar10", "train"))
    test = cifar.load_split("cifar10", "test", cifar.find_data_dir("cifar10", "test"))
    model = SmallCNN(rngs=nnx.Rngs(seed))
    optimizer = nnx.Optimizer(model, optax.sgd(learning_rate, momentum=0.9), wrt=nnx.Param)
    train_step = make_train_step(patjax.LangevinSettings(steps=langevin_steps), beta=0.001)

    order = np.random.default_rng(seed).permutation(len(train))
    key = jax.random.PRNGKey(seed)
    model.train()
    start = time.perf_counter()
    for step in range(steps):
        idx = order[(step * batch_size) % (len(order) - batch_size) :][:batch_size]
        augment_key, loss_key = jax.random.split(jax.random.fold_in(key, step))
        x = cifar.augment(augment_key, jnp.asarray(train.images[idx]))  # random crop and flip, [0, 1] floats
        metrics = train_step(model, optimizer, x, jnp.asarray(train.labels[idx]), loss_key)
        if (step + 1) % log_every == 0 or step + 1 == steps:
            loss = float(metrics["loss"])
            if not np.isfinite(loss):
                raise SystemExit(f"training stopped: loss {loss} at step {step + 1}")
            print(
                f"step {step + 1}: PAT loss {loss:.3f}, adversarial accuracy {float(metrics['adv_accuracy']):.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )

    # Evaluated as model.eval() sets it (BatchNorm's running statistics), on a copy.
    results = patjax.evaluate_model(
        model,
        test.images[:eval_images],
        test.labels[:eval_images],
        evaluators="clean,pgd20,pr",
        pr={"samples": pr_samples, "distributions": ["uniform"]},  # Table 1's law
    )
    print(report.comparison(["nnx own loop"], [results]))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in zip(main.__code__.co_varnames, main.__defaults__):
        parser.add_argument(f"--{name}", type=type(value), default=value)
    main(**vars(parser.parse_args()))
