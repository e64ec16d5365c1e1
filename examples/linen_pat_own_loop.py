"""PAT in your own Flax Linen training loop: your module and variables, optax, your `jax.jit`
train step with patjax's PAT loss (Algorithm 2) inside it, BatchNorm's statistics threaded the
Linen way (`mutable=["batch_stats"]`); then `patjax.api.evaluate` on (module, variables) (clean,
PGD-20, PR) printing the table `python -m patjax.evaluate` prints.

  python examples/linen_pat_own_loop.py                # 300 steps of batch 128 on CIFAR-10
  python examples/linen_pat_own_loop.py --steps=2 --batch_size=8 --langevin_steps=2 \
      --eval_images=16 --pr_samples=4                  # a tiny run, as the CI test runs it

The module is patjax's small CNN (`patjax.models.networks`); any Linen module whose __call__
takes (x, train=...) works the same way. `tests/test_own_loop.py` checks that this train step
makes the same parameters as main.py's from the same weights, data order and keys.
"""

import argparse
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

import patjax
from patjax.data import cifar
from patjax.models import networks
from patjax.reporting import report


def make_train_step(module, tx: optax.GradientTransformation, sampler: patjax.LangevinSettings, beta: float):
    """Your train step: patjax's PAT loss on the Linen module, `tx` on its parameters."""

    @jax.jit
    def train_step(params, batch_stats, opt_state, x, y, key):
        def loss_fn(params):
            # The training-mode forward threads batch_stats through module.apply(...,
            # mutable=["batch_stats"]); the sampler's forward is the detached inference-mode model.
            train_fn, attack_fn = patjax.linen_forwards(module, params, batch_stats)
            return patjax.pat_loss(train_fn, attack_fn, key, x, y, state=batch_stats, sampler=sampler, beta=beta)

        (_, (batch_stats, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), batch_stats, opt_state, metrics

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
    module = networks.create_model("small_cnn", "cifar10", num_classes=10)
    variables = module.init(jax.random.PRNGKey(seed), jnp.zeros((1, 32, 32, 3)), train=False)
    params, batch_stats = variables["params"], variables["batch_stats"]
    tx = optax.sgd(learning_rate, momentum=0.9)
    opt_state = tx.init(params)
    train_step = make_train_step(module, tx, patjax.LangevinSettings(steps=langevin_steps), beta=0.001)

    order = np.random.default_rng(seed).permutation(len(train))
    key = jax.random.PRNGKey(seed)
    start = time.perf_counter()
    for step in range(steps):
        idx = order[(step * batch_size) % (len(order) - batch_size) :][:batch_size]
        augment_key, loss_key = jax.random.split(jax.random.fold_in(key, step))
        x = cifar.augment(augment_key, jnp.asarray(train.images[idx]))  # random crop and flip, [0, 1] floats
        params, batch_stats, opt_state, metrics = train_step(
            params, batch_stats, opt_state, x, jnp.asarray(train.labels[idx]), loss_key
        )
        if (step + 1) % log_every == 0 or step + 1 == steps:
            loss = float(metrics["loss"])
            if not np.isfinite(loss):
                raise SystemExit(f"training stopped: loss {loss} at step {step + 1}")
            print(
                f"step {step + 1}: PAT loss {loss:.3f}, adversarial accuracy {float(metrics['adv_accuracy']):.3f} "
                f"({time.perf_counter() - start:.0f} s)"
            )

    results = patjax.evaluate_model(
        (module, {"params": params, "batch_stats": batch_stats}),
        test.images[:eval_images],
        test.labels[:eval_images],
        evaluators="clean,pgd20,pr",
        pr={"samples": pr_samples, "distributions": ["uniform"]},  # Table 1's law
    )
    print(report.comparison(["linen own loop"], [results]))
    return results


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    for name, value in zip(main.__code__.co_varnames, main.__defaults__):
        parser.add_argument(f"--{name}", type=type(value), default=value)
    main(**vars(parser.parse_args()))
