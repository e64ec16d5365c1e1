"""Command line: run an experiment suite, or list or report it.

  python -m patjax.experiments --suite=stationary_cpu --workdir=DIR   # train, evaluate, report
  python -m patjax.experiments --suite=paper_full --workdir=DIR [--groups=cifar10_resnet18]
  python -m patjax.experiments --suite=NAME --workdir=DIR --dry_run       # the plan, nothing run
  python -m patjax.experiments --suite=NAME --workdir=DIR --report_only   # rebuild the report
  python -m patjax.experiments --suite=NAME --workdir=DIR --num_workers=K --worker_index=i
  python -m patjax.experiments --suite=NAME --workdir=DIR --max_minutes=M  # stop with checkpoints after M min
  python -m patjax.experiments --suite=NAME --workdir=DIR --handover      # carry unfinished runs in git

The suites are those of `patjax.configs.suites`; `patjax.suites.runner` runs them (workers, claims,
resume: docs/cluster.md), `patjax.suites.handover` carries unfinished runs in git and
`patjax.suites.aggregate` computes the tables' figures.
"""

from __future__ import annotations

import os

import jax
from absl import app, flags

from patjax import suites
from patjax.configs import suites as shipped_suites
from patjax.core import cli as cli_lib
from patjax.core import paths
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.suites import handover, run_outcomes, runner, workers

FLAGS = flags.FLAGS


def _names(value):
    return [v for v in (value or "").split(",") if v] or None


def main(argv):
    cli_lib.start(argv)
    if not FLAGS.workdir:
        raise UserError("--workdir is required")
    # --report_only and --handover read a suite folder; the others may create it.
    check = paths.existing_folder if FLAGS.report_only or FLAGS.handover else paths.output_folder
    check("workdir", FLAGS.workdir)
    if FLAGS.data_dir:
        paths.data_folder("data_dir", FLAGS.data_dir, cifar.TFDS)
    data_dir = FLAGS.data_dir or cifar.find_data_dir()  # None: found or downloaded when a run loads it
    suite = shipped_suites.get_suite(FLAGS.suite, data_dir)
    groups, methods = _names(FLAGS.groups), _names(FLAGS.methods)
    runs = suites.plan(suite, groups, methods)
    num_workers, worker_index = workers.worker_slot(FLAGS.num_workers, FLAGS.worker_index)
    if FLAGS.dry_run:
        mine = workers.partition(runs, num_workers, worker_index)
        print(
            f"suite {suite.name}: {len(runs)} runs; data: {data_dir or 'downloaded at first use'}"
            + (f"; worker {worker_index} of {num_workers} takes {len(mine)}" if num_workers > 1 else "")
        )
        for position, r in mine:
            c = r.config
            length = f"steps {c.num_train_steps}" if c.num_train_steps > 0 else f"{c.num_epochs} epochs"
            print(
                f"  run {position + 1}/{len(runs)} {r.name}: {c.dataset} {c.model} batch {c.batch_size} "
                f"{length} T={c.langevin.steps} -> {run_outcomes.run_dir(FLAGS.workdir, r)}"
            )
        return
    if FLAGS.handover:
        kept = handover.handover(suite, FLAGS.workdir)
        print(f"{len(kept)} unfinished run(s) keep their newest checkpoint; commit them with the suite:")
        for path in kept:
            print(f"  git add -f {os.path.relpath(path)}")
        return
    if FLAGS.report_only:
        summary = runner.write_report(suite, FLAGS.workdir)
        print(
            f"wrote {os.path.join(FLAGS.workdir, 'results.md')} ({summary['num_done']}/{summary['num_runs']} runs done)"
        )
        return
    stop_at = cli_lib.stop_time(FLAGS.max_minutes)
    if FLAGS.compilation_cache:
        # Runs of one method differ only in the seed, and every run of a group is evaluated by the
        # same functions: XLA's persistent cache compiles each once per suite.
        jax.config.update("jax_compilation_cache_dir", os.path.join(os.path.abspath(FLAGS.workdir), "jax_cache"))
    else:  # not even the command lines' default one (core.compile_cache)
        jax.config.update("jax_enable_compilation_cache", False)
    runner.run_suite(
        suite,
        FLAGS.workdir,
        groups=groups,
        methods=methods,
        max_runs=FLAGS.max_runs,
        progress_bars=FLAGS.progress_bars,
        num_workers=num_workers,
        worker_index=worker_index,
        only=FLAGS.only,
        stop_at=stop_at,
    )


def define_flags():
    flags.DEFINE_string("suite", "stationary_cpu", f"One of {sorted(shipped_suites.SUITES)}.")
    flags.DEFINE_string("workdir", None, "Suite directory (runs/, results.md, results.json, pr_vs_eps.png).")
    flags.DEFINE_string(
        "data_dir",
        None,
        "CIFAR binary archives directory (default: $PATJAX_DATA_DIR, else a "
        "shared/data beside the checkout, else the download cache, downloaded at first use); "
        "'tfds': tensorflow-datasets.",
    )
    flags.DEFINE_string("groups", None, "Comma-separated groups of the suite to run (default: all).")
    flags.DEFINE_string("methods", None, "Comma-separated methods of the suite to run (default: all).")
    flags.DEFINE_integer("max_runs", None, "Leave after working on this many runs; rerun to continue.")
    flags.DEFINE_bool("dry_run", False, "Print the runs and leave.")
    flags.DEFINE_bool(
        "handover",
        False,
        "Keep each unfinished run's curve models and newest checkpoint only, and print how to "
        "commit them (a clean clone then resumes); refused while a worker holds one of the runs.",
    )
    flags.DEFINE_string(
        "only",
        "",
        "'train': train the runs and leave their evaluation to a later invocation; "
        "'evaluate': evaluate the runs already trained and leave the others.",
    )
    flags.DEFINE_float(
        "max_minutes",
        None,
        "Stop training with a checkpoint once this invocation has run this many minutes, and "
        "leave (a session's or job's time limit); rerun to resume, or --handover.",
    )
    flags.DEFINE_bool("report_only", False, "Rewrite results.md/json/png from finished runs only.")
    flags.DEFINE_bool("progress_bars", True, "tqdm bars for training and evaluation (stderr).")
    flags.DEFINE_bool("compilation_cache", True, "Persistent XLA compilation cache in DIR/jax_cache.")
    flags.DEFINE_integer(
        "num_workers",
        None,
        "Static partition: K workers share the suite; this one takes "
        "the runs at positions p with p % K == --worker_index (default: SLURM_ARRAY_TASK_COUNT "
        "in a SLURM job array, else 1).",
    )
    flags.DEFINE_integer(
        "worker_index",
        None,
        "This worker's index i, 0 to K-1 (default: SLURM_ARRAY_TASK_ID - "
        "SLURM_ARRAY_TASK_MIN in a SLURM job array, else 0).",
    )


def cli():
    define_flags()
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
