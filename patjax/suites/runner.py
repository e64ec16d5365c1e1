"""Running a suite: train and evaluate its runs, share them between workers, keep the report current.

  python -m patjax.experiments --suite=NAME --workdir=DIR   (the command line of `run_suite`)

Each run lives in DIR/runs/GROUP/METHOD_sSEED (an ordinary workdir). For each run the runner
- trains it with `patjax.run.train.train_run` (which resumes from the latest checkpoint:
  an interrupted suite resumes inside the run it stopped in),
- marks it trained (suite_run.json), evaluates it with `patjax.run.evaluation.evaluate_workdir` and
  the suite's evaluation settings (the same images and evaluation seed for every run: common
  random numbers, so differences are paired image by image), reusing runs already evaluated
  (`patjax.suites.run_status` reads how far a run has come),
- rewrites DIR/results.md, DIR/results.json and DIR/pr_vs_eps.png after every run (pending
  runs are listed as such), and prints one progress line per stage.

Workers: any number of processes may run the same suite on the same DIR at once (a SLURM
job array, several machines on a shared filesystem, several processes on one machine):
- dynamic claims: a worker holds an flock on the run's .claim while it trains and evaluates
  the run; others skip it (naming the holder) and look again after a pass; the kernel drops the
  claim of a worker that dies, so the next worker takes the run over from its latest checkpoint;
- static partition: --num_workers=K --worker_index=i (or the SLURM job array's) gives worker i
  the runs at positions p % K == i of the plan (`patjax.suites.workers`);
- the report is rebuilt by one worker at a time (an flock on DIR/.report.lock).
docs/cluster.md has the details; `patjax.suites.handover` carries unfinished runs in git.
"""

from __future__ import annotations

import copy
import os
import shutil
import socket
import sys
import time
from typing import Callable, Optional

from patjax.core import files, locks, sharding
from patjax.core import provenance as provenance_lib
from patjax.core.errors import UserError, integer
from patjax.reporting import plots
from patjax.run import config, evaluation, kept_models, train
from patjax.run import workdir as workdir_lib
from patjax.suites import Run, Suite, aggregate, plan, results_md, run_status
from patjax.suites.run_outcomes import RECORD_FILE, load_outcome, read_record, run_dir
from patjax.suites.workers import CLAIM_FILE, partition, worker_slot


class _Progress:
    def __init__(self, total: int, stream=None):
        self.start = time.perf_counter()
        self.total = total
        self.stream = stream or sys.stdout

    def __call__(self, index: int, run: Run, message: str):
        elapsed = time.perf_counter() - self.start
        stamp = time.strftime("%H:%M:%S")
        print(
            f"[{stamp} +{elapsed / 60:5.1f} min] run {index}/{self.total} {run.name}: {message}",
            file=self.stream,
            flush=True,
        )


REPORT_LOCK = ".report.lock"  # in the suite's directory; held while the report is rebuilt
INVOCATIONS_FILE = "invocations.jsonl"  # in the suite's directory: one line per invocation


def run_suite(
    suite: Suite,
    workdir: str,
    *,
    groups=None,
    methods=None,
    max_runs: Optional[int] = None,
    progress_bars: bool = False,
    stream=None,
    num_workers: int = 1,
    worker_index: int = 0,
    only: str = "",
    stop_at: Optional[float] = None,
) -> dict:
    """Trains and evaluates this worker's runs of the suite (reusing finished ones) and writes the report.

    Any number of workers may run at once on one workdir: a worker claims a run (an flock on
    the run's .claim file) for as long as it trains and evaluates it, and skips runs another
    worker holds. After a pass over its runs it looks again at the ones it skipped (their
    worker may have finished or died), until every one is finished or held by a live worker.
    num_workers, worker_index: the static partition (`partition`); the dynamic claims hold
      within and across shares.
    max_runs: leave after this many runs were trained or evaluated in this invocation (as an
      interrupted suite would); running again continues with the next run.
    only: "train" trains the runs and leaves their evaluation to a later invocation; "evaluate"
      evaluates (keeps models, evaluates curves) the runs already trained and leaves the others.
    stop_at: a wall-clock time (`time.time()`): a run in training then stops with a checkpoint
      (`train.train_run`), its segment's time recorded, and the worker leaves; rerun
      to resume, or `--handover` to carry the run in git. No run, no evaluation and no curve
      point's evaluation starts after it; one under way when it passes runs to its end (it
      cannot resume).
    Returns the suite's results (as written to DIR/results.json).
    """
    num_workers, worker_index = worker_slot(num_workers, worker_index, environ={})
    if only not in ("", "train", "evaluate"):
        raise UserError(f"--only must be 'train' or 'evaluate', got {only!r}")
    if max_runs is not None:  # 0 would leave at once, a successful invocation that did nothing
        integer("--max_runs", max_runs, 1, 1_000_000)
    runs = plan(suite, groups, methods)
    os.makedirs(workdir, exist_ok=True)
    out = stream or sys.stdout
    progress = _Progress(len(runs), stream)
    invocation_start = time.perf_counter()
    # The code this process runs: taken now, before anything can change it.
    provenance = provenance_lib.of_this_process()
    role = f"suite worker {worker_index} of {num_workers}"
    todo = partition(runs, num_workers, worker_index)
    if num_workers > 1:
        print(
            f"{role} (pid {os.getpid()} on {socket.gethostname()}): {len(todo)} of the {len(runs)} runs "
            f"(positions p with p % {num_workers} == {worker_index})",
            file=out,
            flush=True,
        )
    worked = 0
    leaving = False
    while todo:
        held_elsewhere = []
        for position, run in todo:
            index = position + 1
            directory = run_dir(workdir, run)
            if run_status.finished(suite, run, directory):
                progress(index, run, "reused (trained and evaluated earlier)")
                continue
            if only == "train" and run_status.trained(run, directory) is not None:
                progress(index, run, "trained; its evaluation is left for a later invocation (--only=train)")
                continue
            if only == "evaluate" and run_status.trained(run, directory) is None:
                progress(index, run, "not trained yet; left for a later invocation (--only=evaluate)")
                continue
            if max_runs is not None and worked >= max_runs:
                progress(index, run, f"left for the next invocation (--max_runs={max_runs})")
                leaving = True
                break
            if stop_at is not None and time.time() >= stop_at:
                progress(index, run, "left for the next invocation (its time is up)")
                leaving = True
                break
            os.makedirs(directory, exist_ok=True)
            with locks.lock(os.path.join(directory, CLAIM_FILE), role) as claim:
                if not claim.held:
                    progress(index, run, f"skipped: claimed by {claim.holder}")
                    held_elsewhere.append((position, run))
                    continue
                if run_status.finished(suite, run, directory) or (
                    only == "train" and run_status.trained(run, directory)
                ):
                    progress(index, run, "reused (finished by another worker)")
                    continue
                worked += 1
                stopped = _train_and_evaluate(
                    suite,
                    run,
                    directory,
                    lambda message: progress(index, run, message),
                    progress_bars,
                    only == "train",
                    stop_at,
                )
                leaving = leaving or stopped
            summary = write_report(suite, workdir)
            progress(index, run, f"report updated ({summary['num_done']}/{summary['num_runs']} runs done)")
            if leaving:
                break
        if leaving or held_elsewhere == todo:  # nothing changed since the last look: others hold the rest
            break
        todo = held_elsewhere
        if todo:
            print(f"{role}: looking again at {len(todo)} run(s) other workers held", file=out, flush=True)
    wall = time.perf_counter() - invocation_start
    _record_invocation(
        workdir,
        {
            "finished_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "wall_s": round(wall, 1),
            "runs_worked_on": worked,
            **provenance,
            "groups": list(groups or []),
            "methods": list(methods or []),
            "num_workers": num_workers,
            "worker_index": worker_index,
            "host": socket.gethostname(),
            "pid": os.getpid(),
        },
    )
    summary = write_report(suite, workdir)  # after the record: the report counts this invocation too
    print(
        f"suite {suite.name}: {summary['num_done']}/{summary['num_runs']} runs done; "
        f"{role if num_workers > 1 else 'this invocation'} worked on {worked} run(s) in {wall / 60:.1f} min; "
        f"wrote {os.path.join(workdir, 'results.md')}",
        file=out,
        flush=True,
    )
    return summary


def _train_and_evaluate(
    suite: Suite,
    run: Run,
    directory: str,
    say: Callable[[str], None],
    progress_bars: bool,
    train_only: bool = False,
    stop_at: Optional[float] = None,
) -> bool:
    """Trains the run (resuming from its latest checkpoint) unless trained, then evaluates it
    (unless train_only). Returns whether it stopped at stop_at, unfinished: in its training, or
    before one of its curve points."""
    cfg = copy.deepcopy(run.config)
    cfg.progress_bar = bool(progress_bars)
    record_path = os.path.join(directory, RECORD_FILE)
    record = run_status.trained(run, directory)
    settings = config.train_settings(cfg)
    final = settings.total_steps()
    if record is None:
        existing = read_record(directory) or {}
        say(
            f"training {final} steps"
            + (
                " (resuming from its latest checkpoint)"
                if os.path.isdir(os.path.join(directory, "checkpoints"))
                else ""
            )
        )
        t0 = time.perf_counter()
        state = train.train_run(settings, directory, stop_at=stop_at)
        train_wall = time.perf_counter() - t0
        # Written after every segment, the finishing one last: a step short of the run's length
        # marks it unfinished (`_trained`), and the segments add up to its training time.
        record = {
            "step": int(state.step),
            "train_wall_s": round(existing.get("train_wall_s", 0.0) + train_wall, 1),
            "train_segments_s": existing.get("train_segments_s", []) + [round(train_wall, 1)],
        }
        del state
        files.write_json(record_path, record)
        if stop_at is not None and record["step"] < final:
            # The stop's extra checkpoint pushes the oldest out of the manager's window; the
            # curve steps reached so far are kept as models now, as `handover` keeps them.
            if suite.keep_models:
                with _worker_writing(directory):
                    workdir_lib.keep_models(directory, set(run_status.curve_steps(suite, run, final)))
            say(
                f"stopped at step {record['step']} with a checkpoint after {train_wall / 60:.1f} min (its time "
                f"is up); rerun to resume, or --handover to carry it in git"
            )
            return True
        say(f"trained in {train_wall / 60:.1f} min")
        if train_only:
            return False
        if stop_at is not None and time.time() >= stop_at:
            say("trained; its evaluation is left for the next invocation (its time is up)")
            return True
    elif "eval_wall_s" in record and not run_status.eval_matches(suite, int(record["step"]), directory):
        # A stale evaluation is about to be replaced: until the new one is complete, the run is
        # not evaluated (a report built meanwhile, by another worker, leaves it out).
        del record["eval_wall_s"]
        files.write_json(record_path, record)
    step = int(record["step"])
    if suite.keep_models:
        with _worker_writing(directory):
            written = workdir_lib.keep_models(directory, set(run_status.curve_steps(suite, run, step)) | {step})
        if written:
            say(f"kept the models of steps {', '.join(map(str, written))} in {kept_models.MODELS_DIR}/")
    if not run_status.eval_matches(suite, step, directory):
        say(f"evaluating ({', '.join(suite.evaluators)})")
        t0 = time.perf_counter()
        chosen, overrides = run_status.evaluation_settings(suite, curve=False)
        evaluation.evaluate_workdir(
            directory,
            num_examples=suite.num_eval_examples,
            batch_size=suite.eval_batch_size,
            progress=progress_bars,
            evaluators=list(chosen),
            overrides=overrides,
        )
        record["eval_wall_s"] = round(time.perf_counter() - t0, 1)
        files.write_json(record_path, record)
        say(f"evaluated in {record['eval_wall_s'] / 60:.1f} min")
    for curve_step in run_status.curve_steps(suite, run, step):
        if run_status.eval_matches(suite, curve_step, directory, curve=True):
            continue
        if stop_at is not None and time.time() >= stop_at:
            # Each curve point is an evaluation of its own, kept when written: the ones left are
            # the next invocation's, and the run stays unfinished (with its checkpoints) until then.
            say(f"curve points from step {curve_step} on are left for the next invocation (its time is up)")
            return True
        t0 = time.perf_counter()
        chosen, overrides = run_status.evaluation_settings(suite, curve=True)
        evaluation.evaluate_workdir(
            directory,
            num_examples=suite.num_eval_examples,
            batch_size=suite.eval_batch_size,
            progress=progress_bars,
            evaluators=list(chosen),
            overrides=overrides,
            step=curve_step,
        )
        say(f"curve point at step {curve_step} evaluated in {(time.perf_counter() - t0) / 60:.1f} min")
    if suite.keep_models and run_status.models_and_curve_done(suite, run, step, directory):
        # Its kept models are all a finished run needs; a checkpoint carried in git by `handover`
        # leaves the tree with it.
        with _worker_writing(directory):
            shutil.rmtree(os.path.join(directory, "checkpoints"), ignore_errors=True)
    return False


def _worker_writing(directory: str):
    """The run's workdir lock, for what a worker writes or deletes there besides its training and
    evaluation (which take the lock themselves): kept models, its checkpoints once they are
    kept. The worker holds the run's claim throughout; the lock also keeps out a trainer, an
    evaluation or a diagnostic started on the run's directory by hand."""
    return sharding.writer_lock(directory, "a suite worker")


def _record_invocation(workdir: str, entry: dict) -> None:
    """Appends the invocation to DIR/invocations.jsonl, one writer at a time (see write_report)."""
    with locks.lock(os.path.join(workdir, REPORT_LOCK), "invocation log writer", wait=True):
        files.append_json_line(os.path.join(workdir, INVOCATIONS_FILE), entry)


def write_report(suite: Suite, workdir: str) -> dict:
    """Rebuilds DIR/results.json, results.md and pr_vs_eps.png from the runs finished so far.

    One writer at a time (an flock on DIR/.report.lock, waited for): workers that finish runs
    at once take turns, and each reads the runs' files only once it holds the lock, so the
    last report written has seen every run finished before it.
    """
    with locks.lock(os.path.join(workdir, REPORT_LOCK), "report writer", wait=True):
        outcomes = {r.name: load_outcome(workdir, r, suite.pr_distribution) for r in plan(suite)}
        invocations = files.read_json_lines(
            os.path.join(workdir, INVOCATIONS_FILE), "repair or remove that line (it only feeds the report's time)"
        )
        results = aggregate.build(suite, workdir, outcomes, invocations)
        files.write_json(os.path.join(workdir, "results.json"), results)
        files.write_text(os.path.join(workdir, "results.md"), results_md.markdown(results))
        figure = plots.plot_suite(results)
        if figure is not None:
            plots.save_figure(figure, os.path.join(workdir, "pr_vs_eps.png"), dpi=110)
        figure = plots.plot_curves(results)
        if figure is not None:
            plots.save_figure(figure, os.path.join(workdir, "pr_vs_accuracy.png"), dpi=110)
        for sweep in results["sweeps"]:
            figure = plots.plot_sweep(sweep)
            if figure is not None:
                plots.save_figure(figure, os.path.join(workdir, f"sweep_{sweep['name']}.png"), dpi=110)
        return results
