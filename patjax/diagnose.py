"""Where does the Langevin chain settle? Algorithm 1 re-run step by step from a checkpoint.

  python -m patjax.diagnose --workdir=runs/quickstart [--num_examples=128] [--steps=200]
      [--chains=4] [--init=uniform|clean] [--compare_tolerance=3e-4 [--compare_steps=20]]
      [--out=DIR]

For each step t it reports, averaged over the images (and the K chains of each image):
mean and max |x_t - x| (per pixel), the L2 distance ||x_t - x||, the energy E_t of
Algorithm 2 line 11 (per example), CE(x_t), the fraction misclassified, the drift (mean
per-pixel gradient step, what `langevin.tolerance` compares), the distance to the chain's
last step mean |x_t - x_T|, and the spread between the K chains of one image (mean
per-pixel standard deviation across chains). It then states the first step from which the
chain stays within the stationary spread of its endpoint: mean |x_t - x_T| no larger than
ENDPOINT_MARGIN (1.1) times the mean |x_T - x'_T| between two independent chains of the
same image -- from there on a step is, within 10 %, as close to the endpoint as another draw
of the endpoint distribution is. (Without the margin the crossing is decided by noise: at
stationarity both distances measure the same fluctuation.)

Writes OUT/sampler_diagnostic.json (every curve; OUT defaults to WORKDIR/diagnose) and
OUT/sampler_diagnostic.png (energy and distances against t).
"""

from __future__ import annotations

import dataclasses
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from patjax import cli as cli_lib
from patjax import data, plots, samplers
from patjax import workdir as workdir_lib
from patjax.errors import UserError


def chain_curves(logits_fn, key, x, y, settings: samplers.LangevinSettings, chains: int) -> dict:
    """Per-step statistics of `chains` independent chains per image (arrays of length T+1,
    entry 0 the start), and "endpoint_spread", the mean |x_T - x'_T| between chains of one
    image. Pure jnp; jit it.

    Two passes over the same keys: the first finds each chain's endpoint x_T, the second
    measures every step's distance to it (a chain is deterministic given its key).
    """
    T = settings.steps
    batch = x.shape[0]
    xs = jnp.repeat(x, chains, axis=0)  # chain k of image i is row i * chains + k
    ys = jnp.repeat(y, chains, axis=0)
    chain = samplers.langevin_chain(logits_fn, key, xs, ys, settings)
    axes = tuple(range(1, x.ndim))

    def run(measure):
        def body(x_t, t):
            new, drift = chain.step(t, x_t)
            return new, measure(new, drift)

        first = measure(chain.start, jnp.full((xs.shape[0],), jnp.nan, xs.dtype))
        last, rest = jax.lax.scan(body, chain.start, jnp.arange(T))
        return last, jax.tree.map(lambda a, b: jnp.concatenate([a[None], b]), first, rest)

    end, _ = run(lambda x_t, drift: jnp.zeros(()))

    def measure(x_t, drift):
        delta = x_t - xs
        logits = logits_fn(x_t)
        ce = optax.softmax_cross_entropy_with_integer_labels(logits, ys)
        energy = samplers.per_example_energy(logits_fn, x_t, xs, ys, settings.c1, settings.c2)
        per_image = x_t.reshape((batch, chains) + x.shape[1:])
        return {
            "mean_abs_delta": jnp.mean(jnp.abs(delta)),
            "max_abs_delta": jnp.mean(jnp.max(jnp.abs(delta), axis=axes)),
            "l2_delta": jnp.mean(jnp.sqrt(jnp.sum(jnp.square(delta), axis=axes))),
            "energy": jnp.mean(energy),
            "cross_entropy": jnp.mean(ce),
            "misclassified": jnp.mean((jnp.argmax(logits, -1) != ys).astype(jnp.float32)),
            "drift": jnp.mean(drift),
            "distance_to_last": jnp.mean(jnp.abs(x_t - end)),
            "chain_spread": jnp.mean(jnp.std(per_image, axis=1)),
        }

    _, curves = run(measure)
    ends = end.reshape((batch, chains) + x.shape[1:])
    curves["endpoint_spread"] = jnp.mean(jnp.abs(ends[:, 1:] - ends[:, :1])) if chains > 1 else jnp.nan
    return curves


def compare_samplers(
    logits_fn, key, x, y, reference: samplers.LangevinSettings, candidate: samplers.LangevinSettings
) -> dict:
    """How close a cheaper sampler's samples are to the reference sampler's, against the floor.

    Returns the candidate's mean and max gradient steps per example; the mean per-pixel
    |x_candidate - x_reference| (independent chains of the same image); and the floor, the
    same distance between two independent reference chains. A candidate at the floor draws
    from the reference's distribution as far as this distance can tell. Pure jnp; jit it.
    """
    ref_key, floor_key, cand_key = jax.random.split(key, 3)
    ref, _ = samplers.langevin_sample_with_steps(logits_fn, ref_key, x, y, reference)
    ref2, _ = samplers.langevin_sample_with_steps(logits_fn, floor_key, x, y, reference)
    cand, steps = samplers.langevin_sample_with_steps(logits_fn, cand_key, x, y, candidate)
    return {
        "candidate_steps_mean": jnp.mean(steps.astype(jnp.float32)),
        "candidate_steps_max": jnp.max(steps),
        "reference_steps": jnp.float32(reference.steps),
        "distance_to_reference": jnp.mean(jnp.abs(cand - ref)),
        "floor": jnp.mean(jnp.abs(ref2 - ref)),
        "candidate_distance_to_x": jnp.mean(jnp.abs(cand - x)),
        "reference_distance_to_x": jnp.mean(jnp.abs(ref - x)),
    }


ENDPOINT_MARGIN = 1.1


def first_step_within(distance_to_last: np.ndarray, tolerance: float):
    """First t from which distance_to_last stays <= tolerance; None if only the last step does."""
    above = np.nonzero(~(np.asarray(distance_to_last) <= tolerance))[0]
    if len(above) == 0:
        return 0
    t = int(above[-1]) + 1
    return t if t < len(distance_to_last) - 1 else None


def check_settings(num_examples: int, chains: int, steps: int, init: str) -> None:
    if num_examples < 1 or chains < 2 or steps < 1:
        raise UserError(
            f"num_examples >= 1, chains >= 2 and steps >= 1 are needed, got {num_examples}, {chains}, {steps}"
        )
    samplers.LangevinSettings(init=init)  # the check of init, as for a config's


def diagnose(
    cfg,
    model_fns,
    state,
    split: data.Split,
    *,
    num_examples: int,
    chains: int,
    steps: int,
    init: str,
    seed: int,
    tolerance: float | None = None,
) -> dict:
    """The diagnostic's results dict (what sampler_diagnostic.json holds)."""
    check_settings(num_examples, chains, steps, init)
    settings = dataclasses.replace(
        samplers.LangevinSettings.from_config(cfg.langevin), steps=steps, init=init, tolerance=0.0
    )
    n = min(num_examples, len(split))
    x = data.to_float(jnp.asarray(split.images[:n]))
    y = jnp.asarray(split.labels[:n], jnp.int32)
    bn_mode = cfg.langevin.bn_mode
    logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats, bn_mode)
    fn = jax.jit(lambda k, x, y: chain_curves(logits_fn, k, x, y, settings, chains))
    curves = {k: np.asarray(v, np.float64) for k, v in jax.device_get(fn(jax.random.PRNGKey(seed), x, y)).items()}
    spread = float(curves.pop("endpoint_spread"))
    result = {
        "settings": {
            **dataclasses.asdict(settings),
            "num_examples": n,
            "chains": chains,
            "seed": seed,
            "checkpoint_step": int(state.step),
            "bn_mode": bn_mode,
        },
        "curves": {k: [None if not np.isfinite(v) else float(v) for v in c] for k, c in curves.items()},
        "endpoint_spread": spread,
        "endpoint_margin": ENDPOINT_MARGIN,
        "steps_to_endpoint": first_step_within(curves["distance_to_last"], ENDPOINT_MARGIN * spread),
    }
    if tolerance is not None:
        result["tolerance"] = tolerance
        result["steps_to_tolerance"] = first_step_within(curves["distance_to_last"], tolerance)
    return result


def write(result: dict, out_dir: str, name: str = "sampler_diagnostic") -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    workdir_lib.write_json(path, result)
    workdir_lib.save_figure(plots.plot_sampler_diagnostic(result), os.path.join(out_dir, f"{name}.png"), dpi=110)
    return path


def main(argv):
    from absl import flags

    FLAGS = flags.FLAGS
    cli_lib.start(argv)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    check_settings(FLAGS.num_examples, FLAGS.chains, FLAGS.steps, FLAGS.init)
    if FLAGS.compare_steps is not None and (FLAGS.compare_tolerance is None or FLAGS.compare_steps < 1):
        raise UserError(f"--compare_steps needs --compare_tolerance and a value >= 1, got {FLAGS.compare_steps}")
    cfg, model_fns, state = workdir_lib.restore(FLAGS.workdir)
    split = data.load_split(cfg.dataset, "test", cfg.data_dir)
    result = diagnose(
        cfg,
        model_fns,
        state,
        split,
        num_examples=FLAGS.num_examples,
        chains=FLAGS.chains,
        steps=FLAGS.steps,
        init=FLAGS.init,
        seed=FLAGS.seed,
        tolerance=FLAGS.tolerance,
    )
    if FLAGS.compare_tolerance is not None:
        reference = dataclasses.replace(
            samplers.LangevinSettings.from_config(cfg.langevin), steps=FLAGS.steps, init="uniform", tolerance=0.0
        )
        candidate = dataclasses.replace(
            reference, init=FLAGS.init, tolerance=FLAGS.compare_tolerance, steps=FLAGS.compare_steps or FLAGS.steps
        )
        n = min(FLAGS.num_examples, len(split))
        logits_fn = model_fns.attack_logits_fn(state.params, state.batch_stats, cfg.langevin.bn_mode)
        fn = jax.jit(lambda k, x, y: compare_samplers(logits_fn, k, x, y, reference, candidate))
        x = data.to_float(jnp.asarray(split.images[:n]))
        figures = jax.device_get(fn(jax.random.PRNGKey(FLAGS.seed + 1), x, jnp.asarray(split.labels[:n], jnp.int32)))
        result["sampler_comparison"] = {
            "reference": dataclasses.asdict(reference),
            "candidate": dataclasses.asdict(candidate),
            **{k: float(v) for k, v in figures.items()},
        }
        f = result["sampler_comparison"]
        print(
            f"init={FLAGS.init}, tolerance={FLAGS.compare_tolerance}: {f['candidate_steps_mean']:.1f} gradient "
            f"steps per example on average (max {f['candidate_steps_max']:.0f}) vs {FLAGS.steps}; mean "
            f"|x_cand - x_ref| {f['distance_to_reference']:.5f} vs {f['floor']:.5f} between two reference chains"
        )
    path = write(result, FLAGS.out or os.path.join(FLAGS.workdir, "diagnose"), f"sampler_diagnostic_{FLAGS.init}")
    c = result["curves"]
    marks = sorted({t for t in (0, 1, 5, 10, 25, 50, 100, 200, FLAGS.steps) if t <= FLAGS.steps})
    print(f"{'t':>5} {'mean|x_t-x|':>12} {'max|x_t-x|':>11} {'|x_t-x_T|':>10} {'drift':>9} {'energy':>9} {'miscls':>7}")
    for t in marks:
        drift = c["drift"][t]
        print(
            f"{t:>5} {c['mean_abs_delta'][t]:>12.5f} {c['max_abs_delta'][t]:>11.4f} "
            f"{c['distance_to_last'][t]:>10.5f} {'' if drift is None else f'{drift:.6f}':>9} "
            f"{c['energy'][t]:>9.4f} {c['misclassified'][t]:>7.3f}"
        )
    print(
        f"between-chain spread at T={FLAGS.steps}: {result['endpoint_spread']:.5f}; the chain stays within "
        f"{ENDPOINT_MARGIN} x of it from step {result['steps_to_endpoint']}"
        + (f"; within {FLAGS.tolerance} from step {result['steps_to_tolerance']}" if FLAGS.tolerance else "")
    )
    print(f"wrote {path}")


def cli():
    from absl import app, flags

    flags.DEFINE_string("workdir", None, "Workdir of a trained run (its newest checkpoint is used).")
    flags.DEFINE_integer("num_examples", 128, "Test images (the first ones of the split).")
    flags.DEFINE_integer("steps", 200, "Langevin steps T to run.")
    flags.DEFINE_integer("chains", 4, "Independent chains per image (>= 2, for the spread).")
    flags.DEFINE_string("init", "uniform", "Chain start: uniform (Algorithm 1) or clean (x).")
    flags.DEFINE_float("tolerance", None, "Also report the first step within this mean |x_t - x_T|.")
    flags.DEFINE_float(
        "compare_tolerance",
        None,
        "Also compare the sampler with --init and this "
        "langevin.tolerance against the paper's (uniform start, --steps steps): steps "
        "taken and distance of its samples to the paper's against the floor.",
    )
    flags.DEFINE_integer(
        "compare_steps", None, "The compared sampler's maximum T (default: --steps); the reference keeps --steps."
    )
    flags.DEFINE_integer("seed", 0, "Seed of the chains.")
    flags.DEFINE_string("out", None, "Output directory (default: WORKDIR/diagnose).")
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
