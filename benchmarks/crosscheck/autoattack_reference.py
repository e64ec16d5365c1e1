#!/usr/bin/env python3
"""patjax's `aa` against the reference AutoAttack on the same weights and images.

The reference is Croce & Hein's own code as packaged on PyPI (`pyautoattack`, the fra31/auto-
attack sources), standard version, run on a PyTorch copy of a patjax model (the small CNN or
ResNet-18 of benchmarks/speed/torch_pat_peer.py, weights copied with `load_patjax_weights`; the
script first checks that both give the same logits). torchattacks' `AutoAttack(version=
'standard')` is run too when installed: it is not the reference's standard version (its APGD,
APGD-T and FAB run 10 iterations, not 100, and its Square rescales the p schedule), so it is
reported beside, not compared against.

  pip install torch==2.13.0 pyautoattack==0.2.0 torchattacks==3.5.1
  python benchmarks/crosscheck/autoattack_reference.py --workdir=docs/results/table1_cpu/runs/cifar10_small_cnn/pgd_s0 \
      --num_examples=500 --out=aa_pgd_s0.json [--norm=L2]   # L2: eps 0.5 unless --eps

Prints and writes one JSON object: robust accuracy after each attack for both, the images on
which they disagree, and the wall time of each (patjax's four attack passes, the reference's
run_standard_evaluation) on this machine. Timings are of one run each: compare them as the
ratio of alternating runs (`--only`). With --individual, each attack alone on every image
instead, robust accuracy and the images disagreeing attack by attack (FAB-T and Square rarely
find anything after APGD-T in the sequence, so only this compares them); `--only` and
`--attacks` pick whose and which, so that runs can alternate attack by attack. Each side's
robust images are listed (`robust_images`), so runs made in separate processes can be compared
image by image, and patjax's seconds of compilation (JAX's tracing, lowering and compiling, by
pass: `compile_s_passes`, `patjax_compile_s`) beside its wall times.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import logging
import pathlib
import sys
import time

import numpy as np

STAGES = ("apgd_ce", "apgd_t", "fab_t", "square")  # the reference's order, patjax's aa passes
REPO = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO))  # patjax from this checkout, also in an environment that has not installed it
sys.path.insert(0, str(REPO / "benchmarks"))
import timing  # noqa: E402

from patjax.core.errors import UserError  # noqa: E402


def load_peer():
    spec = importlib.util.spec_from_file_location("torch_pat_peer", REPO / "benchmarks" / "speed" / "torch_pat_peer.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--workdir", required=True, help="a patjax run with a checkpoint or kept model")
    p.add_argument("--num_examples", type=int, default=500, help="the first N test images")
    p.add_argument("--norm", choices=("Linf", "L2"), default="Linf", help="the reference's norm (patjax's linf / l2)")
    p.add_argument("--eps", type=float, default=None, help="default 8/255 under Linf, 0.5 under L2 (RobustBench's)")
    p.add_argument("--batch_size", type=int, default=250)
    p.add_argument("--data_dir", default=None)
    p.add_argument(
        "--only",
        choices=("patjax", "reference", "torchattacks"),
        action="append",
        help="run only these (repeatable); default: all that are installed",
    )
    p.add_argument(
        "--individual",
        action="store_true",
        help="instead of the sequence, run each of the four attacks alone on every image (patjax's aa "
        "passes; the reference's run_standard_evaluation_individual) and compare attack by attack",
    )
    p.add_argument(
        "--attacks",
        choices=STAGES,
        action="append",
        help="with --individual, only these attacks (repeatable); default: all four",
    )
    p.add_argument("--out", default=None, help="write the JSON here too")
    p.add_argument(
        "--torch_weights",
        default=None,
        help="the run exported to PyTorch (`python -m patjax.export`): the reference's weights read from it, "
        "so that a reference-only run (--only=reference) loads no JAX",
    )
    return p.parse_args(argv)


@contextlib.contextmanager
def compile_seconds_by_pass(batches):
    """Seconds spent compiling in each `batches.evaluate_pass` call, by pass name, while inside."""
    by_pass, evaluate_pass, spans = {}, batches.evaluate_pass, timing.compile_spans()

    def timed(*args, **kwargs):
        before = len(spans)
        try:
            return evaluate_pass(*args, **kwargs)
        finally:
            by_pass[args[5]] = round(timing.union_length(spans[before:]), 3)  # args[5]: the pass's name

    batches.evaluate_pass = timed
    try:
        yield by_pass
    finally:
        batches.evaluate_pass = evaluate_pass


def run_patjax(settings, model_fns, state, split):
    from patjax.evaluators import batches
    from patjax.run import evaluation

    per_image = {}
    with compile_seconds_by_pass(batches) as compile_s:
        results = evaluation.evaluate_state(
            settings,
            model_fns,
            state,
            split,
            progress=False,
            per_image_out=per_image,
        )
    fig = results["figures"]["aa"]
    walls = results["evaluator_wall_time_s"]
    return {
        "robust_accuracy": fig["value"],
        "interval": fig["interval"],
        "after": {
            "clean": float(per_image["aa_apgd_ce.clean_correct"].mean()),
            **{k: v["value"] for k, v in fig["after"].items()},
        },
        "masking": fig["masking"],
        "wall_s_attacks": round(sum(walls[f"aa_{s}"] for s in ("apgd_ce", "apgd_t", "fab_t", "square")), 1),
        "wall_s_passes": walls,
        "compile_s_passes": compile_s,
        "robust": per_image["aa.robust"],
    }


def run_patjax_individual(settings, model_fns, state, split, batch_size, stages):
    """Robust (per image) under each attack of the sequence alone, on every image: the aa
    evaluator's own passes of each attack (`autoattack.make_batch_fn` and its rounds,
    `autoattack.make_rounds`, run by `batches.evaluate_pass` as an evaluation runs them) on all
    images rather than on those the attacks before it left."""
    from patjax.data import cifar
    from patjax.evaluators import autoattack, batches

    clean = np.asarray(model_fns.infer(state.params, state.batch_stats, cifar.to_float(split.images))).argmax(1)
    out = {}
    for stage in stages:
        s, name = settings.evaluator_settings.view(autoattack.EVALUATOR), f"aa_{stage}"
        fn, rounds = autoattack.make_batch_fn(model_fns, s, name), autoattack.make_rounds(model_fns, s, name)
        with compile_seconds_by_pass(batches) as compile_s:
            per_image, wall = batches.evaluate_pass(
                fn, state, split, len(split), batch_size, name, False, rounds=rounds
            )
        out[stage] = (per_image["robust"] & (clean == split.labels), round(wall, 1), compile_s[name])
    return out


def run_reference_individual(torch_model, x, y, eps, batch_size, norm, stages, seed=0):
    """The reference's run_standard_evaluation_individual: each attack alone on every image."""
    from pyautoattack import AutoAttack

    adversary = AutoAttack(torch_model, norm=norm, eps=eps, version="standard", seed=seed)
    names = {"apgd-ce": "apgd_ce", "apgd-t": "apgd_t", "fab-t": "fab_t", "square": "square"}
    out = {}
    for name, stage in names.items():
        if stage not in stages:
            continue
        adversary.attacks_to_run = [name]
        start = time.perf_counter()
        x_adv, _ = adversary.run_standard_evaluation(x, y, batch_size=batch_size)
        out[stage] = (predict(torch_model, x_adv, batch_size) == y.numpy(), round(time.perf_counter() - start, 1))
    return out


def compare_individually(args, wanted, settings, model_fns, state, split, torch_model, x, y) -> dict:
    """Each chosen attack alone on the first n images, patjax's and/or the reference's, side by
    side when both ran."""
    from patjax.data import cifar

    stages = [s for s in STAGES if s in (args.attacks or STAGES)]
    runs = {}
    if "patjax" in wanted:
        first = cifar.Split(split.images[: len(y)], split.labels[: len(y)])
        runs["patjax"] = run_patjax_individual(settings, model_fns, state, first, args.batch_size, stages)
    if "reference" in wanted:
        with contextlib.suppress(ImportError):
            runs["reference"] = run_reference_individual(
                torch_model, x, y, args.eps, args.batch_size, args.norm, stages
            )
    out = {}
    for stage in stages:
        row = {who: float(r[stage][0].mean()) for who, r in runs.items()}
        row["wall_s"] = {who: r[stage][1] for who, r in runs.items()}
        row["robust_images"] = {who: robust_images(r[stage][0]) for who, r in runs.items()}
        if "patjax" in runs:
            row["patjax_compile_s"] = runs["patjax"][stage][2]
        if len(runs) == 2:
            mine, theirs = runs["patjax"][stage][0], runs["reference"][stage][0]
            row["difference_pp"] = round(100 * (mine.mean() - theirs.mean()), 2)
            row["images_disagreeing"] = int(np.sum(mine != theirs))
        out[stage] = row
    return out


def robust_images(robust) -> list:
    return [int(i) for i in np.flatnonzero(robust)]


def run_reference(torch_model, x, y, eps, batch_size, norm, seed=0):
    from pyautoattack import AutoAttack

    adversary = AutoAttack(torch_model, norm=norm, eps=eps, version="standard", seed=seed)
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: records.append(record.getMessage())
    adversary.logger.addHandler(handler)
    adversary.logger.setLevel(logging.DEBUG)
    adversary.verbose = True
    start = time.perf_counter()
    x_adv, _ = adversary.run_standard_evaluation(x, y, batch_size=batch_size)
    wall = time.perf_counter() - start
    robust = predict(torch_model, x_adv, batch_size) == y.numpy()
    after = {}
    names = {"APGD-CE": "apgd_ce", "APGD-T": "apgd_t", "FAB-T": "fab_t", "SQUARE": "square"}
    for message in records:
        if message.startswith("initial accuracy"):
            after["clean"] = float(message.split(":")[1].strip().rstrip("%")) / 100
        if message.startswith("robust accuracy after"):
            name = message.split("after ")[1].split(":")[0]
            after[names.get(name, name)] = float(message.split(":")[1].split("%")[0]) / 100
    return {
        "robust_accuracy": float(robust.mean()),
        "after": after,
        "wall_s": round(wall, 1),
        "robust": robust,
        "settings": f"pyautoattack 0.2.0 AutoAttack(norm={norm!r}, version='standard', seed=0)",
    }


def run_torchattacks(torch_model, x, y, eps, batch_size, norm):
    import torchattacks

    attack = torchattacks.AutoAttack(torch_model, norm=norm, eps=eps, version="standard", n_classes=10, seed=0)
    start = time.perf_counter()
    x_adv = np.concatenate(
        [attack(x[i : i + batch_size], y[i : i + batch_size]).numpy() for i in range(0, len(x), batch_size)]
    )
    wall = time.perf_counter() - start
    import torch

    robust = predict(torch_model, torch.from_numpy(x_adv), batch_size) == y.numpy()
    return {
        "robust_accuracy": float(robust.mean()),
        "wall_s": round(wall, 1),
        "robust": robust,
        "settings": "torchattacks 3.5.1 AutoAttack(version='standard'): APGD/APGD-T/FAB 10 steps, "
        "Square 5000 queries with resc_schedule=True",
    }


def predict(torch_model, x, batch_size):
    import torch

    with torch.no_grad():
        return np.concatenate(
            [torch_model(x[i : i + batch_size]).argmax(1).numpy() for i in range(0, len(x), batch_size)]
        )


def torch_copy(args, run, state):
    """The PyTorch copy of the run's network: from --torch_weights (an export of the run, read
    without JAX), else from the restored state."""
    from patjax.data import cifar

    if args.torch_weights:
        import torch

        from patjax.interop import torch_weights
        from patjax_torch import models as torch_models

        name, dataset, width = torch_weights.network(args.torch_weights)
        if (name, dataset) != (run.model.name, run.dataset):
            raise SystemExit(f"error: {args.torch_weights} holds {name} on {dataset}, not the run's network")
        arrays = torch_weights.read_state_dict(args.torch_weights)
        normalize = (arrays["mu"].ravel(), arrays["sigma"].ravel()) if "mu" in arrays else None
        net = torch_models.create_model(
            name, cifar.NUM_CLASSES[dataset], normalize, **({"width": width} if width else {})
        )
        net.load_state_dict({k: torch.from_numpy(v) for k, v in arrays.items()}, strict=True)
        return net.eval()
    import jax

    peer = load_peer()
    if run.model.name not in ("small_cnn", "resnet18"):
        raise SystemExit(f"error: no PyTorch copy of model {run.model.name!r}")
    torch_model = peer.create_model(
        run.model.name, num_classes=cifar.NUM_CLASSES[run.dataset], width=run.model.width, dataset=run.dataset
    )
    params, batch_stats = jax.device_get((state.params, state.batch_stats))
    peer.load_patjax_weights(torch_model, params, batch_stats)
    return torch_model.eval()


def timing_line(out: dict) -> str:
    """The arm's line for benchmarks/timing.py: the seconds of the attacks this process ran
    (patjax's with JAX's compile seconds of the same passes), each attack alone as a part."""
    who = next(w for w in ("patjax", "reference", "torchattacks") if w in out or w in str(out.get("individual")))
    if "individual" in out:
        parts = {}
        for stage, row in out["individual"].items():
            parts[stage] = {"wall_s": row["wall_s"][who]}
            if who == "patjax":
                parts[stage]["compile_s"] = row["patjax_compile_s"]
        total = sum(p["wall_s"] for p in parts.values())
        compile_s = sum(p["compile_s"] for p in parts.values()) if who == "patjax" else None
        return timing.arm_line(total, compile_s, arm=who, parts=parts)
    if who == "patjax":
        passes = out["patjax"]["compile_s_passes"]
        compile_s = sum(passes.get(f"aa_{s}", 0.0) for s in STAGES)
        return timing.arm_line(out["patjax"]["wall_s_attacks"], compile_s, arm=who)
    return timing.arm_line(out[who]["wall_s"], arm=who)


def main(argv=None):
    args = parse_args(argv)
    if args.eps is None:
        args.eps = 8 / 255 if args.norm == "Linf" else 0.5
    from patjax.data import cifar
    from patjax.run import workdir as workdir_lib

    wanted = set(args.only or ("patjax", "reference", "torchattacks"))
    run = workdir_lib.load_settings(args.workdir)
    split = cifar.load_split(run.dataset, "test", args.data_dir or run.data_dir)
    n = min(args.num_examples, len(split))
    x_np = np.asarray(cifar.to_float(split.images[:n]))
    y_np = np.asarray(split.labels[:n]).astype(np.int64)
    out = {"workdir": args.workdir, "num_examples": n, "norm": args.norm, "eps": args.eps}
    # JAX runs only where patjax is timed or where it gives the PyTorch copy its weights, and
    # PyTorch only where a PyTorch side is timed: an arm of benchmarks/timing.py (one --only, with
    # --torch_weights for the reference) holds one framework.
    state = model_fns = None
    if "patjax" in wanted or not args.torch_weights:
        from patjax.core import compile_cache, devices

        devices.use_cpu_cores_as_devices()
        compile_cache.enable()
        import jax

        timing.compile_spans()  # listening before the first compilation
        _, model_fns, state = workdir_lib.restore(args.workdir)
        out.update(step=int(state.step), jax_devices=jax.device_count())
    if wanted - {"patjax"}:
        import torch

        torch_model = torch_copy(args, run, state)
        x = torch.from_numpy(x_np).permute(0, 3, 1, 2).contiguous()
        y = torch.from_numpy(y_np)
        out["torch_threads"] = torch.get_num_threads()
        if state is not None:
            with torch.no_grad():
                torch_logits = torch_model(x[:64]).numpy()
            jax_logits = np.asarray(model_fns.infer(state.params, state.batch_stats, x_np[:64]))
            logit_gap = float(np.max(np.abs(torch_logits - jax_logits)))
            if logit_gap > 1e-3 * max(1.0, float(np.max(np.abs(jax_logits)))):
                raise SystemExit(f"error: the PyTorch copy's logits differ from patjax's by {logit_gap}")
            out["max_logit_difference"] = logit_gap
    else:
        torch_model = x = None
        y = y_np
    settings = workdir_lib.evaluation_settings(
        args.workdir,
        {"attack.eps": args.eps, "attack.norm": args.norm.lower()},
        evaluators="aa",
        num_examples=n,
        batch_size=args.batch_size,
    )
    if args.individual:
        out["individual"] = compare_individually(args, wanted, settings, model_fns, state, split, torch_model, x, y)
        wanted = set()  # each attack alone instead of the sequence
    robust = {}
    if "patjax" in wanted:
        res = run_patjax(settings, model_fns, state, split)
        robust["patjax"] = res.pop("robust")
        out["patjax"] = res
    if "reference" in wanted:
        with contextlib.suppress(ImportError):
            res = run_reference(torch_model, x, y, args.eps, args.batch_size, args.norm)
            robust["reference"] = res.pop("robust")
            out["reference"] = res
    if "torchattacks" in wanted:
        with contextlib.suppress(ImportError):
            res = run_torchattacks(torch_model, x, y, args.eps, args.batch_size, args.norm)
            robust["torchattacks"] = res.pop("robust")
            out["torchattacks"] = res
    for who, r in robust.items():
        out[who]["robust_images"] = robust_images(r)
    if "patjax" in robust and "reference" in robust:
        a, b = robust["patjax"], robust["reference"]
        out["difference_pp"] = round(100 * (a.mean() - b.mean()), 2)
        out["robust_in_patjax_only"] = [int(i) for i in np.flatnonzero(a & ~b)]
        out["robust_in_reference_only"] = [int(i) for i in np.flatnonzero(~a & b)]
    text = json.dumps(out, indent=1, default=float)
    print(text)
    if args.out:
        pathlib.Path(args.out).write_text(text + "\n")
    if len(args.only or ()) == 1:
        print(timing_line(out))
    return out


if __name__ == "__main__":
    try:
        main()
    except UserError as error:  # bad input: one line, not a traceback
        sys.exit(f"error: {error}")
