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

import functools
import os

from absl import app, flags
from tqdm import tqdm

from patjax.core import cli as cli_lib
from patjax.core import files, locks, paths
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.pat import langevin, langevin_diagnostic
from patjax.reporting import plots
from patjax.run import workdir as workdir_lib


def write(result: dict, out_dir: str, name: str = "sampler_diagnostic") -> str:
    os.makedirs(out_dir, exist_ok=True)
    path = os.path.join(out_dir, f"{name}.json")
    files.write_json(path, result)
    plots.save_figure(plots.plot_sampler_diagnostic(result), os.path.join(out_dir, f"{name}.png"), dpi=110)
    return path


def main(argv):
    FLAGS = flags.FLAGS
    cli_lib.start(argv)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    paths.existing_folder("workdir", FLAGS.workdir)
    paths.output_folder("out", FLAGS.out or os.path.join(FLAGS.workdir, "diagnose"))
    langevin_diagnostic.DiagnosticSettings(
        FLAGS.num_examples, FLAGS.chains, FLAGS.steps, FLAGS.init, FLAGS.seed, FLAGS.tolerance
    )
    if FLAGS.compare_steps is not None and (FLAGS.compare_tolerance is None or FLAGS.compare_steps < 1):
        raise UserError(f"--compare_steps needs --compare_tolerance and a value >= 1, got {FLAGS.compare_steps}")
    if FLAGS.compare_tolerance is not None:
        # The compared sampler's own check, made now rather than after the diagnostic has run.
        with cli_lib.named_as_flags({"langevin.tolerance": "compare_tolerance", "langevin.steps": "compare_steps"}):
            langevin.LangevinSettings(
                steps=FLAGS.compare_steps or FLAGS.steps, init=FLAGS.init, tolerance=FLAGS.compare_tolerance
            )
    if FLAGS.out is not None:
        return _diagnose(FLAGS.out)
    # Into the run's own diagnose/: under the run's lock, as every writer of a workdir.
    remedy = "wait for it to finish, or write elsewhere with --out"
    with locks.exclusive(FLAGS.workdir, "a sampler diagnostic", remedy=remedy):
        return _diagnose(os.path.join(FLAGS.workdir, "diagnose"))


def _diagnose(out_dir: str) -> None:
    FLAGS = flags.FLAGS
    settings, model_fns, state = workdir_lib.restore(FLAGS.workdir)
    split = cifar.load_split(settings.dataset, "test", settings.data_dir)
    # The run's sampler; the diagnostic varies its T and start.
    sampler = workdir_lib.sampler_settings(FLAGS.workdir)
    sampler, bn_mode = sampler.langevin_settings(), sampler.bn_mode
    bar = functools.partial(tqdm, unit="step", dynamic_ncols=True, disable=not FLAGS.progress_bars)
    with bar(total=2 * FLAGS.steps, desc=f"{FLAGS.num_examples} images x {FLAGS.chains} chains, 2 passes") as chain:
        result = langevin_diagnostic.diagnose(
            sampler,
            bn_mode,
            model_fns,
            state,
            split,
            num_examples=FLAGS.num_examples,
            chains=FLAGS.chains,
            steps=FLAGS.steps,
            init=FLAGS.init,
            seed=FLAGS.seed,
            tolerance=FLAGS.tolerance,
            on_step=lambda: chain.update(1),
        )
    if FLAGS.compare_tolerance is not None:
        with bar(total=3, unit="sampler", desc="compare samplers: reference, floor, candidate") as compared:
            result["sampler_comparison"] = langevin_diagnostic.comparison(
                sampler,
                bn_mode,
                model_fns,
                state,
                split,
                num_examples=FLAGS.num_examples,
                steps=FLAGS.steps,
                init=FLAGS.init,
                tolerance=FLAGS.compare_tolerance,
                candidate_steps=FLAGS.compare_steps or FLAGS.steps,
                seed=FLAGS.seed + 1,
                on_sample=lambda: compared.update(1),
            )
        f = result["sampler_comparison"]
        print(
            f"init={FLAGS.init}, tolerance={FLAGS.compare_tolerance}: {f['candidate_steps_mean']:.1f} gradient "
            f"steps per example on average (max {f['candidate_steps_max']:.0f}) vs {FLAGS.steps}; mean "
            f"|x_cand - x_ref| {f['distance_to_reference']:.5f} vs {f['floor']:.5f} between two reference chains"
        )
    path = write(result, out_dir, f"sampler_diagnostic_{FLAGS.init}")
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
        f"{langevin_diagnostic.ENDPOINT_MARGIN} x of it from step {result['steps_to_endpoint']}"
        + (f"; within {FLAGS.tolerance} from step {result['steps_to_tolerance']}" if FLAGS.tolerance else "")
    )
    print(f"wrote {path}")


def cli():
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
    flags.DEFINE_bool("progress_bars", True, "tqdm bars for the chains and the sampler comparison (stderr).")
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
