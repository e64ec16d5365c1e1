#!/usr/bin/env python3
"""What the evaluation's non-finite check costs: wall time of the clean, PGD-20 and PR passes
with and without `evaluators.batches.checking_logits` (one more forward pass per batch), the
evaluation's own batch functions and `evaluate_pass`, on the first CIFAR-10 test images and a
randomly initialized network.

  python benchmarks/speed/nonfinite_check_cost.py --model small_cnn --images 512 --batch 256 --pr-samples 20 --repeats 5

Each pass is compiled by a warm-up run of both arms, then timed --repeats times, the two arms
alternately (so that other load on the machine falls on both alike); the best of each is shown.
"""

from __future__ import annotations

import argparse

from patjax.data import cifar
from patjax.evaluators import REGISTRY, batches
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import state as state_lib


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="small_cnn")
    p.add_argument("--images", type=int, default=512)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--pr-samples", type=int, default=20)
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args()
    overrides = {"pr.samples": args.pr_samples, "pr.distributions": ("uniform",)}
    s = config_lib.default_evaluation_settings("cifar10", overrides).evaluator_settings
    cfg = config_lib.default_config()
    cfg.model = args.model
    train = config_lib.train_settings(cfg)
    tx = optimizer_lib.make_optimizer(train.optimizer, train.optimizer.schedule(1))
    model_fns, state = state_lib.create_train_state(train.model, 0, tx)
    split = cifar.load_split("cifar10", "test", None)
    for name, pass_name in (("clean", "clean"), ("pgd20", "pgd20"), ("pr", "pr_uniform")):
        plain = REGISTRY[name].make_batch_fn(model_fns, s.view(REGISTRY[name]), pass_name)
        arms = {"plain": plain, "checked": batches.checking_logits(plain, model_fns)}
        times = {arm: [] for arm in arms}
        for fn in arms.values():
            batches.evaluate_pass(fn, state, split, args.batch, args.batch, pass_name, False)
        for _ in range(args.repeats):
            for arm, fn in arms.items():
                times[arm].append(batches.evaluate_pass(fn, state, split, args.images, args.batch, pass_name, False)[1])
        best = {arm: min(t) for arm, t in times.items()}
        print(
            f"{pass_name}: plain {best['plain']:.2f} s, checked {best['checked']:.2f} s "
            f"({100 * (best['checked'] / best['plain'] - 1):+.1f} %)",
            flush=True,
        )


if __name__ == "__main__":
    main()
