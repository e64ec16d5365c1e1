#!/usr/bin/env python3
"""What the public path costs: a user's own jitted train step calling `patjax.pat_loss` against
main.py's compiled step (`run.train.create_step`), the same model, batch, data and settings.

  python benchmarks/speed/own_loop_step.py --model small_cnn --batch 128 --steps 20 --rounds 3

Both steps gather the batch from the device-resident uint8 training set, augment it, run PAT's
loss (Algorithm 1's sampler, then the SNIS-weighted cross-entropy), differentiate it and apply
the same optimizer: main.py's through `methods.make_method`, the own loop through
`patjax.linen_forwards` and `patjax.pat_loss` in a `jax.jit` of its own (as
examples/linen_pat_own_loop.py, with the batch assembly of main.py's step in front). Each arm
runs in a process of its own (`--arm`), timed by benchmarks/timing.py (alternating rounds, the
load gated and recorded before and after every arm), and reports its compile time apart from the
mean seconds per step over --steps steps after it. The figure is the ratio of the medians,
own / main: the public path is meant to cost nothing (within 5 %).

`--arm own|main` runs one arm and prints timing.py's JSON line, with its seconds per step.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from epoch_throughput import emit  # noqa: E402
from torch_arms import timing  # noqa: E402

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


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--arm", choices=ARMS)
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--langevin_steps", type=int, default=100)  # Appendix E's T
    p.add_argument("--json", action="store_true", help="print one JSON line instead of a summary")
    timing.add_arguments(p)
    args = p.parse_args()
    if args.arm:
        result = run_arm(args)
        print(timing.arm_line(result["wall_s"], result["compile_s"], step_s=result["step_s"]), flush=True)
        return
    flags = [f"--model={args.model}", f"--batch={args.batch}", f"--steps={args.steps}"]
    flags.append(f"--langevin_steps={args.langevin_steps}")
    command = (sys.executable, os.path.abspath(__file__), *flags)
    arms = [timing.Arm(arm, (*command, f"--arm={arm}")) for arm in ARMS]
    measured = timing.measure(arms, rounds=args.rounds, max_load=args.max_load, force=args.force)
    steps = {arm: statistics.median(r["step_s"] for r in measured["arms"][arm]["records"]) for arm in ARMS}
    out = {
        "model": args.model,
        "batch": args.batch,
        "langevin_steps": args.langevin_steps,
        "figure": measured["figure"],
        "start_load": measured["start_load"],
        "rounds": measured["rounds"],
        "loads": {arm: [(r["load_before"], r["load_after"]) for r in measured["arms"][arm]["records"]] for arm in ARMS},
        "median_step_s": {arm: round(v, 4) for arm, v in steps.items()},
        "compile_s": {arm: measured["arms"][arm]["compile_s"] for arm in ARMS},
        "own_over_main": round(steps["own"] / steps["main"], 3),
    }
    emit(out, args.json)


if __name__ == "__main__":
    main()
