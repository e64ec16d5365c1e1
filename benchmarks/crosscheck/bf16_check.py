#!/usr/bin/env python3
"""Does bf16 compute change what a PAT-vs-PGD run compares? A CPU check before a bf16 GPU run.

`--config.compute_dtype=bfloat16` runs the network (convolutions, activations, BatchNorm's
normalization, the head) in bfloat16; parameters, optimizer state, the images and the sampler's
chain stay float32 (networks.Conv casts its float32 kernel at use; langevin.langevin_chain keeps
x_adv in x's dtype, and the input gradient comes back through the model's input cast as
float32). This script measures, with the same parameters, the same images and the same keys,
how far the bf16 network moves what the comparison is made of:

  --part dtypes   the dtypes of a bf16 run's state, gradients, chain and logits, and of every
                  convolution in the sampler's energy gradient and in a PAT step (by the jaxpr).
  --part sampler  Algorithm 1's endpoints (`methods.pat.langevin_adversarial_batch`, the function the
                  train step calls) under the paper's sampler (uniform start, T = 100) and the
                  cheaper one (start at x, T <= 20, tolerance 3e-4), and PGD-10's
                  (`methods.pgd.pgd_adversarial_batch`), bf16 against fp32, on kept models of a
                  suite; beside it, fp32 against fp32 with another key (the sampler's own
                  randomness) for scale. Also the training-mode losses, SNIS weights and
                  accuracy the update would see on those endpoints.
  --part eval     clean logits and accuracy, and PR under uniform noise (Table-1 protocol:
                  N = 100, eps 0.1/0.12/0.15/0.2), bf16 against fp32 evaluation.
  --part train    short training runs (main.py), PAT with the cheaper sampler and PGD-10, fp32
                  with two seeds and bf16 with one; summarizes their metrics.jsonl (loss curve,
                  final clean test accuracy). A finished run is not retrained (main.py resumes it
                  and finds nothing to do; its config must match the command's, or it refuses).

One JSON line per measurement on stdout (and appended to --out). Does not import torch.

  python benchmarks/crosscheck/bf16_check.py --part dtypes --out docs/results/bf16_check/dtypes.jsonl
  python benchmarks/crosscheck/bf16_check.py --part sampler --out docs/results/bf16_check/sampler.jsonl
  python benchmarks/crosscheck/bf16_check.py --part eval --out docs/results/bf16_check/eval.jsonl
  python benchmarks/crosscheck/bf16_check.py --part train --train-root runs/bf16_check \\
      --out docs/results/bf16_check/train.jsonl
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax

from patjax import methods
from patjax.data import cifar
from patjax.models.networks import ModelFns
from patjax.pat import langevin, robustness
from patjax.run import config as config_lib
from patjax.run import optimizer as optimizer_lib
from patjax.run import state as state_lib
from patjax.run import workdir as workdir_lib

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_RUNS = os.path.join(ROOT, "docs/results/convergence_cpu/runs/cifar10_small_cnn")
# The two sampler settings a run may train with: Algorithm 1 as the paper runs it, and the
# cheaper one the GPU run uses (docs/sampler_convergence.md).
SAMPLERS = {
    "paper_uniform_T100": dict(init="uniform", steps=100, tolerance=0.0),
    "cheap_clean_T20_tol3e-4": dict(init="clean", steps=20, tolerance=3e-4),
}


def emit(record: dict, out: str | None) -> None:
    line = json.dumps(record)
    print(line, flush=True)
    if out:
        os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
        with open(out, "a") as f:
            f.write(line + "\n")


def restore(run_dir: str, step: int | None):
    """(settings, {dtype: ModelFns}, params, batch_stats): the kept model, and the same network
    built in float32 and in bfloat16 (the parameters are float32 either way)."""
    settings, _, state = workdir_lib.restore(run_dir, step=step)
    fns = {
        dtype: ModelFns(dataclasses.replace(settings.model, compute_dtype=dtype).build().apply)
        for dtype in ("float32", "bfloat16")
    }
    return settings, fns, jax.device_get(state.params), jax.device_get(state.batch_stats), int(state.step)


def test_images(data_dir: str, n: int):
    split = cifar.load_split("cifar10", "test", data_dir)
    return np.asarray(cifar.to_float(split.images[:n])), np.asarray(split.labels[:n])


def per_image_norms(d: np.ndarray):
    flat = d.reshape(d.shape[0], -1).astype(np.float64)
    return np.linalg.norm(flat, axis=1), np.max(np.abs(flat), axis=1)


def relative_difference(x, a, b) -> dict:
    """||delta_b - delta_a|| / ||delta_a|| per image (delta = endpoint - x), L2 and L-inf; the
    per-image ratios' mean, median and max."""
    da, db = a - x, b - x
    l2_a, linf_a = per_image_norms(da)
    l2_d, linf_d = per_image_norms(db - da)
    out = {}
    for name, num, den in (("l2", l2_d, l2_a), ("linf", linf_d, linf_a)):
        ratio = num / np.maximum(den, 1e-12)
        out[f"rel_{name}_mean"] = float(np.mean(ratio))
        out[f"rel_{name}_median"] = float(np.median(ratio))
        out[f"rel_{name}_max"] = float(np.max(ratio))
    return out


def update_view(fns: ModelFns, params, batch_stats, x_adv, y, beta: float) -> dict:
    """What the update of Algorithm 2 (lines 16-18) sees on a batch of endpoints: the
    training-mode per-example losses, their SNIS weights, and the accuracy."""
    logits, _ = fns.train(params, batch_stats, x_adv)
    losses = optax.softmax_cross_entropy_with_integer_labels(logits, y)
    return {
        "losses": losses,
        "weights": methods.common.snis_weights(losses, beta),
        "correct": jnp.argmax(logits, -1) == y,
    }


def compare_updates(a: dict, b: dict) -> dict:
    la, lb = np.asarray(a["losses"], np.float64), np.asarray(b["losses"], np.float64)
    wa, wb = np.asarray(a["weights"], np.float64), np.asarray(b["weights"], np.float64)
    return {
        "loss_mean": [float(la.mean()), float(lb.mean())],
        "loss_abs_diff_mean": float(np.mean(np.abs(lb - la))),
        "loss_abs_diff_max": float(np.max(np.abs(lb - la))),
        "snis_weight_rel_diff_max": float(np.max(np.abs(wb / wa - 1.0))),
        "adv_accuracy": [float(np.mean(a["correct"])), float(np.mean(b["correct"]))],
    }


def part_sampler(args) -> None:
    x_np, y_np = test_images(args.data_dir, args.images)
    x, y = jnp.asarray(x_np), jnp.asarray(y_np)
    keys = {"A": jax.random.PRNGKey(args.key), "B": jax.random.PRNGKey(args.other_key)}
    for run in args.runs:
        settings, fns, params, batch_stats, step = restore(os.path.join(args.runs_dir, run), args.step)
        # The run's config's sampler, weights and attack, whichever method it trained.
        blocks = config_lib.block_settings(workdir_lib.load_config(os.path.join(args.runs_dir, run)))
        beta = blocks["pat"].beta
        attacks = {
            name: methods.MethodSettings(
                "pat", sampler=dataclasses.replace(blocks["langevin"], **kw), snis=blocks["pat"]
            )
            for name, kw in SAMPLERS.items()
        }
        # PGD-10 as the pgd method runs it (its reference's BatchNorm mode: batch statistics).
        attacks["pgd10_train_attack"] = methods.MethodSettings(
            "pgd", attack=dataclasses.replace(blocks["attack"], bn_mode=methods.REFERENCE_ATTACK_BN_MODE["pgd"])
        )
        for name, s in attacks.items():
            pgd = name.startswith("pgd")

            def draw(model_fns, key, s=s, pgd=pgd):
                if pgd:
                    return methods.pgd.pgd_adversarial_batch(params, model_fns, batch_stats, x, y, key, s), jnp.zeros(
                        x.shape[0], jnp.int32
                    )
                return methods.pat.langevin_adversarial_batch(params, model_fns, batch_stats, x, y, key, s)

            endpoints, steps, views, walls = {}, {}, {}, {}
            for label, dtype, key in (
                ("fp32_A", "float32", "A"),
                ("fp32_B", "float32", "B"),
                ("bf16_A", "bfloat16", "A"),
            ):
                f = jax.jit(lambda k, fn=fns[dtype]: draw(fn, k))
                start = time.perf_counter()
                xa, st = jax.block_until_ready(f(keys[key]))
                walls[label] = round(time.perf_counter() - start, 2)  # compilation included
                endpoints[label], steps[label] = np.asarray(xa), np.asarray(st)
                views[label] = jax.device_get(update_view(fns[dtype], params, batch_stats, xa, y, beta))
            d_fp = endpoints["fp32_A"] - x_np
            l2, linf = per_image_norms(d_fp)
            record = {
                "part": "sampler",
                "run": run,
                "step": step,
                "attack": name,
                "settings": dict(SAMPLERS.get(name, {}), bn_mode=s.attack.bn_mode if pgd else s.sampler.bn_mode),
                "images": int(x.shape[0]),
                "delta_fp32_l2_mean": float(l2.mean()),
                "delta_fp32_linf_mean": float(linf.mean()),
                "bf16_vs_fp32": relative_difference(x_np, endpoints["fp32_A"], endpoints["bf16_A"]),
                "fp32_key_vs_key": relative_difference(x_np, endpoints["fp32_A"], endpoints["fp32_B"]),
                "update_bf16_vs_fp32": compare_updates(views["fp32_A"], views["bf16_A"]),
                "update_fp32_key_vs_key": compare_updates(views["fp32_A"], views["fp32_B"]),
                "wall_s": walls,
            }
            if not pgd:
                record["chain_steps_mean"] = {k: float(v.mean()) for k, v in steps.items()}
                record["chain_steps_differ"] = int(np.sum(steps["bf16_A"] != steps["fp32_A"]))
            emit(record, args.out)


def _eqn_dtypes(jaxpr, primitive: str, found: dict) -> dict:
    """{dtype: count} of the outputs of `primitive` in a jaxpr, sub-jaxprs included."""
    for eqn in jaxpr.eqns:
        if eqn.primitive.name == primitive:
            for v in eqn.outvars:
                found[str(v.aval.dtype)] = found.get(str(v.aval.dtype), 0) + 1
        for param in eqn.params.values():
            for p in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(p, "jaxpr", p)
                if hasattr(inner, "eqns"):
                    _eqn_dtypes(inner, primitive, found)
    return found


def part_dtypes(args) -> None:
    """Where the precision of a bf16 run lives: the train state's arrays, the sampler's chain
    and input gradient, and the dtype of every convolution in the sampler's step and in the
    update (from the jaxprs of the bf16 model)."""
    x_np, y_np = test_images(args.data_dir, 4)
    x, y = jnp.asarray(x_np), jnp.asarray(y_np)
    settings, fns, params, batch_stats, _ = restore(os.path.join(args.runs_dir, args.runs[0]), args.step)
    bf16 = fns["bfloat16"]
    s = dataclasses.replace(
        settings.method, sampler=dataclasses.replace(settings.method.sampler, steps=1, tolerance=0.0)
    )
    logits_fn = bf16.attack_logits_fn(params, batch_stats, s.sampler.bn_mode)
    energy_grad = jax.grad(lambda xa: langevin.langevin_energy(logits_fn, xa, x, y, s.sampler.c1, s.sampler.c2))
    loss = methods.make_method(s)

    def tree_dtypes(tree):
        return sorted({str(a.dtype) for a in jax.tree_util.tree_leaves(tree)})

    state_settings = dataclasses.replace(settings.model, compute_dtype="bfloat16")
    # The optimizer state of a fresh bf16 run.
    tx = optimizer_lib.make_optimizer(settings.optimizer, settings.optimizer.schedule(1))
    state = jax.eval_shape(lambda: state_lib.create_train_state(state_settings, 0, tx)[1])
    sample = methods.pat.langevin_adversarial_batch(params, bf16, batch_stats, x, y, jax.random.PRNGKey(0), s)[0]
    grads = jax.grad(lambda p: loss(p, bf16, batch_stats, x, y, jax.random.PRNGKey(0))[0])(params)
    emit(
        {
            "part": "dtypes",
            "compute_dtype": "bfloat16",
            "params": tree_dtypes(state.params),
            "batch_stats": tree_dtypes(state.batch_stats),
            "opt_state": tree_dtypes(state.opt_state),
            "param_grads": tree_dtypes(grads),
            "sampler_endpoint": str(sample.dtype),
            "energy_input_grad": str(energy_grad(x).dtype),
            "logits": str(logits_fn(x).dtype),
            "convolutions_in_energy_grad": _eqn_dtypes(
                jax.make_jaxpr(energy_grad)(x).jaxpr, "conv_general_dilated", {}
            ),
            "convolutions_in_step_loss_grad": _eqn_dtypes(
                jax.make_jaxpr(jax.grad(lambda p: loss(p, bf16, batch_stats, x, y, jax.random.PRNGKey(0))[0]))(
                    params
                ).jaxpr,
                "conv_general_dilated",
                {},
            ),
        },
        args.out,
    )


def part_eval(args) -> None:
    x_np, y_np = test_images(args.data_dir, args.eval_images)
    for run in args.runs:
        settings, fns, params, batch_stats, step = restore(os.path.join(args.runs_dir, run), args.step)
        handed = settings.evaluation.evaluator_settings
        ev = handed["pr"]
        root = jax.random.PRNGKey(handed.shared.seed)
        results, walls = {}, {}
        for dtype, model_fns in fns.items():
            logits_fn = model_fns.attack_logits_fn(params, batch_stats)  # inference-mode BatchNorm

            @jax.jit
            def batch_fn(xb, yb, idx, logits_fn=logits_fn):
                pr = robustness.pr_statistics(
                    logits_fn, root, xb, yb, idx, ev.epsilons, ev.samples, ev.chunk_size, "uniform", 0.0
                )
                return logits_fn(xb), pr["counts"].T  # (B, classes), (B, levels)

            start = time.perf_counter()
            parts = [
                jax.device_get(
                    batch_fn(
                        x_np[i : i + args.eval_batch],
                        y_np[i : i + args.eval_batch],
                        jnp.arange(i, i + len(x_np[i : i + args.eval_batch])),
                    )
                )
                for i in range(0, len(x_np), args.eval_batch)
            ]
            walls[dtype] = round(time.perf_counter() - start, 1)
            results[dtype] = (np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts]))
        (lf, cf), (lb, cb) = results["float32"], results["bfloat16"]
        correct_f, correct_b = lf.argmax(-1) == y_np, lb.argmax(-1) == y_np
        n = ev.samples
        pr = {}
        for j, eps in enumerate(ev.epsilons):
            pf, pb = cf[:, j] / n, cb[:, j] / n
            pr[robustness.level_key(eps)] = {
                # Table 1: each evaluation's mean PR over its own clean-correct images.
                "clean_correct_fp32": float(pf[correct_f].mean()),
                "clean_correct_bf16": float(pb[correct_b].mean()),
                "all_fp32": float(pf.mean()),
                "all_bf16": float(pb.mean()),
                "per_image_abs_diff_mean": float(np.mean(np.abs(pb - pf))),
                "per_image_abs_diff_max": float(np.max(np.abs(pb - pf))),
            }
        emit(
            {
                "part": "eval",
                "run": run,
                "step": step,
                "images": int(len(y_np)),
                "clean_accuracy": {"fp32": float(correct_f.mean()), "bf16": float(correct_b.mean())},
                "argmax_agreement": float(np.mean(lf.argmax(-1) == lb.argmax(-1))),
                "logit_abs_diff_mean": float(np.mean(np.abs(lb - lf))),
                "logit_abs_diff_max": float(np.max(np.abs(lb - lf))),
                "logit_abs_mean_fp32": float(np.mean(np.abs(lf))),
                "pr_uniform": pr,
                "pr_samples": n,
                "wall_s": walls,
            },
            args.out,
        )


# Part 2: the short runs. PAT with the cheaper sampler (as the GPU run) and PGD-10, small CNN,
# batch 128, the paper's optimizer (the config's defaults: SGD lr 0.01, Nesterov, wd 5e-4).
TRAIN_RUNS = (
    ("pat", "float32", 0),
    ("pat", "bfloat16", 0),
    ("pgd", "float32", 0),
    ("pgd", "bfloat16", 0),
    ("pat", "float32", 1),
    ("pgd", "float32", 1),
)


def train_command(workdir: str, method: str, dtype: str, seed: int, steps: int, data_dir: str) -> list[str]:
    return [
        sys.executable,
        os.path.join(ROOT, "main.py"),
        f"--config={os.path.join(ROOT, 'configs/pat_cifar10.py')}",
        f"--workdir={workdir}",
        f"--config.method={method}",
        f"--config.compute_dtype={dtype}",
        f"--config.seed={seed}",
        "--config.model=small_cnn",
        "--config.batch_size=128",
        f"--config.num_train_steps={steps}",
        "--config.log_every_steps=25",
        "--config.log_test_examples=10000",
        f"--config.checkpoint_every_steps={steps}",
        f"--config.data_dir={data_dir}",
        "--config.langevin.init=clean",
        "--config.langevin.steps=20",
        "--config.langevin.tolerance=3e-4",
    ]


def read_metrics(workdir: str) -> list[dict]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def part_train(args) -> None:
    curves = {}
    for method, dtype, seed in TRAIN_RUNS:
        name = f"{method}_{dtype}_s{seed}"
        workdir = os.path.join(args.train_root, name)
        start = time.perf_counter()
        subprocess.run(train_command(workdir, method, dtype, seed, args.train_steps, args.data_dir), check=True)
        rows = read_metrics(workdir)
        curves[name] = rows
        emit(
            {
                "part": "train",
                "run": name,
                "steps": rows[-1]["step"],
                "loss": [round(r["loss"], 4) for r in rows],
                "adv_accuracy": [round(r["adv_accuracy"], 4) for r in rows],
                "test_clean_accuracy": [r["test_clean_accuracy"] for r in rows],
                "logged_steps": [r["step"] for r in rows],
                "images_per_s": [round(r["images_per_s"], 1) for r in rows],
                "langevin_steps": [round(r["langevin_steps"], 2) for r in rows if "langevin_steps" in r],
                "this_call_wall_s": round(time.perf_counter() - start, 1),
            },
            args.out,
        )
    for method in ("pat", "pgd"):
        f0, f1, b0 = (curves[f"{method}_{d}_s{s}"] for d, s in (("float32", 0), ("float32", 1), ("bfloat16", 0)))

        def gap(a, b, key):
            diffs = np.abs(np.array([r[key] for r in a]) - np.array([r[key] for r in b]))
            return {"mean": float(diffs.mean()), "max": float(diffs.max()), "final": float(diffs[-1])}

        emit(
            {
                "part": "train_summary",
                "method": method,
                "final_test_clean_accuracy": {
                    "fp32_s0": f0[-1]["test_clean_accuracy"],
                    "fp32_s1": f1[-1]["test_clean_accuracy"],
                    "bf16_s0": b0[-1]["test_clean_accuracy"],
                },
                # Over the logging windows: |bf16 s0 - fp32 s0| (same seed: same data order and
                # initialization) against |fp32 s1 - fp32 s0| (the seed's noise).
                "loss_gap_bf16_vs_fp32": gap(b0, f0, "loss"),
                "loss_gap_seed1_vs_seed0": gap(f1, f0, "loss"),
                "test_accuracy_gap_bf16_vs_fp32": gap(b0, f0, "test_clean_accuracy"),
                "test_accuracy_gap_seed1_vs_seed0": gap(f1, f0, "test_clean_accuracy"),
            },
            args.out,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--part", choices=("dtypes", "sampler", "eval", "train"), required=True)
    parser.add_argument("--runs-dir", default=DEFAULT_RUNS, help="the suite group's runs (kept models)")
    parser.add_argument("--runs", nargs="+", default=["pat_s0", "pgd_s0"])
    parser.add_argument("--step", type=int, default=5850, help="the kept model's step")
    parser.add_argument("--data-dir", default="/work/shared/data")
    parser.add_argument("--images", type=int, default=256, help="test images for --part sampler")
    parser.add_argument("--key", type=int, default=0, help="the sampler's key (both dtypes)")
    parser.add_argument("--other-key", type=int, default=1, help="fp32's second key: the sampler's own randomness")
    parser.add_argument("--eval-images", type=int, default=500)
    parser.add_argument("--eval-batch", type=int, default=50, help="images a PR batch (x 4 levels x 25 samples)")
    parser.add_argument("--train-root", default=os.path.join(ROOT, "runs/bf16_check"))
    parser.add_argument("--train-steps", type=int, default=200)
    parser.add_argument("--out", default=None, help="also append the JSON lines here")
    args = parser.parse_args()
    emit({"part": args.part, "jax": jax.__version__, "backend": jax.default_backend(), "argv": sys.argv[1:]}, args.out)
    {"dtypes": part_dtypes, "sampler": part_sampler, "eval": part_eval, "train": part_train}[args.part](args)


if __name__ == "__main__":
    main()
