#!/usr/bin/env python3
"""What the public path costs: a user's own jitted train step calling `patjax.pat_loss` against
main.py's compiled step (`run.train.create_step`), the same model, batch, data and settings.

  python benchmarks/speed/own_loop_step.py --model small_cnn --batch 128 --steps 20 --rounds 3

Both steps gather the batch from the device-resident uint8 training set, augment it, run PAT's
loss (Algorithm 1's sampler, then the SNIS-weighted cross-entropy), differentiate it and apply
the same optimizer: main.py's through `methods.make_method`, the own loop through
`patjax.linen_forwards` and `patjax.pat_loss` in a `jax.jit` of its own (as
examples/linen_pat_own_loop.py, with the batch assembly of main.py's step in front). Each arm
runs in a process of its own (`--arm`), the arms alternate over --rounds rounds (own, main, own,
main, ...), the 1-minute load average is printed before and after every arm, and each arm reports
its compile time apart from the mean seconds per step over --steps steps after it. The figure is
the ratio of the medians, own / main (issue 68: within 5 %), valid on a quiet machine only.

`--arm own|main` runs one arm and prints one JSON line, {"wall_s", "compile_s", "step_s"}: the
layout benchmarks/timing.py's arms report, so its runner can take these commands as they are.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

ARMS = ("own", "main")


def _settings(args):
    from patjax.run import config as config_lib

    cfg = config_lib.default_config()
    cfg.method = "pat"
    cfg.model = args.model
    cfg.batch_size = args.batch
    cfg.langevin.steps = args.langevin_steps
    return config_lib.train_settings(cfg)


def run_arm(args) -> dict:
    """One arm in this process: compile (timed apart), then --steps steps."""
    import jax
    import optax

    import patjax
    from patjax.core import sharding
    from patjax.data import cifar
    from patjax.run import train as train_lib

    settings = _settings(args)
    split = cifar.load_split("cifar10", "train", settings.data_dir)
    steps_per_epoch = len(split) // settings.batch_size
    mesh = sharding.make_mesh(settings.batch_size)
    model_fns, state, main_step = train_lib.create_step(settings, steps_per_epoch, mesh)
    state, images, labels = sharding.place_on_mesh(mesh, state, split.images, split.labels)
    permutation = cifar.epoch_permutation(jax.random.fold_in(state.rng, 0), 0, len(split))

    module = settings.model.build()
    tx = train_lib.optimizer_lib.make_optimizer(settings.optimizer, settings.optimizer.schedule(steps_per_epoch))
    sampler, beta, batch = settings.method.sampler.langevin_settings(), settings.method.snis.beta, settings.batch_size

    def own_step(state, images, labels, permutation):
        # main.py's batch assembly, then the user's step on the public objective.
        position = state.step % steps_per_epoch
        indices = jax.lax.dynamic_slice_in_dim(permutation, position * batch, batch)
        augment_key, key = jax.random.split(jax.random.fold_in(jax.random.fold_in(state.rng, 1), state.step))
        x, y = cifar.augment(augment_key, images[indices]), labels[indices]

        def loss_fn(params):
            train_fn, attack_fn = patjax.linen_forwards(module, params, state.batch_stats)
            return patjax.pat_loss(train_fn, attack_fn, key, x, y, state=state.batch_stats, sampler=sampler, beta=beta)

        (_, (batch_stats, metrics)), grads = jax.value_and_grad(loss_fn, has_aux=True)(state.params)
        updates, opt_state = tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(step=state.step + 1, params=params, batch_stats=batch_stats, opt_state=opt_state), metrics

    step = main_step if args.arm == "main" else jax.jit(own_step, donate_argnums=(0,))
    start = time.perf_counter()
    state, metrics = step(state, images, labels, permutation)
    jax.block_until_ready(metrics["loss"])
    compile_s = time.perf_counter() - start
    start = time.perf_counter()
    for _ in range(args.steps):
        state, metrics = step(state, images, labels, permutation)
    jax.block_until_ready((state.params, metrics["loss"]))
    wall = time.perf_counter() - start
    return {"wall_s": wall, "compile_s": compile_s, "step_s": wall / args.steps, "arm": args.arm}


def arm_command(arm: str, args) -> list:
    flags = [f"--model={args.model}", f"--batch={args.batch}", f"--steps={args.steps}"]
    flags.append(f"--langevin_steps={args.langevin_steps}")
    return [sys.executable, os.path.abspath(__file__), f"--arm={arm}", *flags]


def run_process(command: list) -> dict:
    """One arm in a fresh process; its last output line is its JSON (swappable for
    benchmarks/timing.py's runner)."""
    out = subprocess.run(command, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=ARMS)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--langevin_steps", type=int, default=100)  # Appendix E's T
    p.add_argument("--rounds", type=int, default=3)
    args = p.parse_args()
    if args.arm:
        print(json.dumps(run_arm(args)), flush=True)
        return
    times = {arm: [] for arm in ARMS}
    for r in range(args.rounds):
        for arm in ARMS:
            load_before = os.getloadavg()[0]
            result = run_process(arm_command(arm, args))
            times[arm].append(result["step_s"])
            print(
                f"round {r + 1} {arm}: {result['step_s'] * 1e3:.1f} ms/step, compile {result['compile_s']:.1f} s, "
                f"load {load_before:.2f} -> {os.getloadavg()[0]:.2f}",
                flush=True,
            )
    median = {arm: statistics.median(t) for arm, t in times.items()}
    print(
        f"own / main = {median['own'] / median['main']:.3f} (medians {median['own'] * 1e3:.1f} and "
        f"{median['main'] * 1e3:.1f} ms/step over {args.rounds} rounds; {args.model}, batch {args.batch}, "
        f"T = {args.langevin_steps})"
    )


if __name__ == "__main__":
    main()
