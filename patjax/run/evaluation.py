"""Evaluating trained runs: the chosen evaluators over the test split, their figures and the
workdir's eval/ files (`comparison` sets several evaluated runs side by side).

`evaluate_state` is the library call (a state and a split in, a results dict out);
`evaluate_workdir` evaluates a workdir's newest checkpoint (or its kept model) and writes
DIR/eval/per_image.npz (per-image outcomes and PR statistics, for paired comparisons) and then,
last, DIR/eval/results.json (strict JSON; NaN/inf as null):
  clean_accuracy      fraction of test images classified correctly
  pr                  the headline PR: {"0.1": {value, interval, n}, ...}, the mean of per-image
                      PR_i over the images the model classifies correctly, under
                      eval.pr.distribution (default uniform: the Table-1 protocol, `PROTOCOL`)
  pr_all_images       the same law's mean over every evaluated image (misclassified ones included)
  pr_protocol         what `pr` is, in words
  figures             every figure with its interval, method, number of images and settings;
                      per distribution and level: all, clean_correct (with its own prob_acc,
                      AT-PR's Prob.Acc), prob_acc, expected_loss, the lower bounds, entropic_risk
  settings            seed, number of images, checkpoint step, every evaluator's settings
  evaluator_wall_time_s, wall_time_s
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import time

import jax
import numpy as np

from patjax import evaluators as evaluators_lib
from patjax.core import files, sharding
from patjax.data import cifar
from patjax.evaluators import batches, intervals, stats
from patjax.pat import laws
from patjax.run import checkpoints, eval_files
from patjax.run import settings as settings_lib
from patjax.run import workdir as workdir_lib

# The paper's Table 1 reports PR above clean accuracy for every adversarially trained model, so
# its PR is a mean over the images each model classifies correctly; the law is not stated and
# is inferred from the AT-PR code's evaluate.py (docs/evaluation.md, "The Table-1 protocol").
PROTOCOL = (
    "Table-1 protocol: per image, the fraction of N samples uniform on [max(x - eps, 0), "
    "min(x + eps, 1)] per pixel with s(x') < 0 (ties adversarial); the mean over the images the "
    "model classifies correctly"
)


def evaluate_state(
    settings: settings_lib.EvaluationSettings,
    model_fns,
    state,
    split: cifar.Split,
    *,
    progress: bool = True,
    per_image_out: dict | None = None,
    announce_on: bool | None = None,
    reused: dict | None = None,
) -> dict:
    """settings.evaluators on the first settings.num_examples images of `split` (-1: all of them).

    reused: {evaluator: {pass: per-image outputs}} of evaluators whose outcomes a saved evaluation
      of the same model, images and view already holds (`eval_files.reusable_evaluators`): their
      passes are not run, their figures are made from these as from their own.

    announce_on (default: progress): a long evaluation says what will run and its estimated time
    (`announce`); every process of a multi-process evaluation times the same batches, process 0 speaks.

    settings: `config.evaluation_settings`; its dataset (the split's) is recorded with the figures.
    per_image_out: if a dict, receives the per-image arrays (per_image.npz holds them and the
      evaluation's identity, `eval_files.identity`).
    """
    s, names, batch_size = settings.evaluator_settings, settings.evaluators, settings.batch_size
    n = num_images(settings, split)
    chosen = [evaluators_lib.REGISTRY[name] for name in names]
    if "clean" not in names and any(e.needs_clean for e in chosen):
        chosen.append(evaluators_lib.REGISTRY["clean"])  # for the clean-correct subset; runs last
    start_time = time.perf_counter()
    reused = reused or {}
    views = {evaluator.name: s.view(evaluator) for evaluator in chosen}  # what each is handed
    batch_fns = {
        (evaluator.name, pass_name): batches.checking_logits(
            evaluator.make_batch_fn(model_fns, views[evaluator.name], pass_name), model_fns
        )
        for evaluator in chosen
        if evaluator.name not in reused
        for pass_name in evaluator.passes(views[evaluator.name])
    }
    estimate = (
        announce(settings, batch_fns, state, split, n) if (progress if announce_on is None else announce_on) else None
    )
    per_image, walls, figures = {}, {}, {}
    for evaluator in chosen:
        view = views[evaluator.name]
        per_image.update(reused.get(evaluator.name, {}))
        for pass_name in evaluator.passes(view) if evaluator.name not in reused else ():
            subset = evaluator.subset(pass_name, per_image) if evaluator.subset else None
            rounds = evaluator.make_rounds(model_fns, view, pass_name) if evaluator.make_rounds else None
            if rounds is not None:
                rounds = batches.Rounds(rounds.count, batches.checking_logits(rounds.fn, model_fns))
            per_image[pass_name], walls[pass_name] = batches.evaluate_pass(
                batch_fns[evaluator.name, pass_name], state, split, n, batch_size, pass_name, progress, subset, rounds
            )
            if estimate:
                estimate.pop(pass_name)
                if sharding.is_writer():
                    print(time_left_line(pass_name, time.perf_counter() - start_time, estimate), flush=True)
        if evaluator.combine:
            per_image[evaluator.name] = evaluator.combine(per_image, view)
    for evaluator in sorted(chosen, key=lambda e: evaluators_lib.NAMES.index(e.name)):
        figures.update(evaluator.figures(per_image, views[evaluator.name]))
    worst = evaluators_lib.worst_case(per_image, names, s)
    if worst is not None:
        figures["worst_case"] = worst
    intervals.bootstrap_indices.cache_clear()

    results = {}
    if "clean" in per_image:
        results["clean_accuracy"] = float(per_image["clean"]["correct"].mean())
    if "pr" in names:
        pr = s[evaluators_lib.pr.BLOCK]
        headline = figures["pr"][pr.distribution]
        keep = ("value", "interval", "n")
        results["pr"] = {k: {f: v["clean_correct"][f] for f in keep} for k, v in headline.items()}
        results["pr_all_images"] = {k: {f: v["all"][f] for f in keep} for k, v in headline.items()}
        results["pr_protocol"] = protocol_text(pr.distribution, pr.samples, pr.epsilons)
    results["figures"] = figures
    results["settings"] = settings_record(
        settings,
        n,
        int(state.step),
        num_clean_correct=int(per_image["clean"]["correct"].sum()) if "clean" in per_image else None,
    )
    results["evaluator_wall_time_s"] = {k: round(v, 2) for k, v in walls.items()}
    results["wall_time_s"] = round(time.perf_counter() - start_time, 2)
    if per_image_out is not None:
        per_image_out.update(_flatten_per_image(per_image, s, n))
    return results


# An evaluation of at least this many batches a pass (the quickstart's has two) says before it
# starts what will run and about how long it will take, from one timed batch of each pass (the
# work of one batch a pass, an eighth of the work at most, a twentieth for the whole test
# split at the default batch of 500), and after each pass the time left.
ANNOUNCE_BATCHES = 8


def announce(settings: settings_lib.EvaluationSettings, batch_fns: dict, state, split, n: int):
    """For an evaluation of ANNOUNCE_BATCHES batches a pass or more, prints what will run and an
    estimate of its time from one timed batch of each pass (`batches.time_batch`), and returns
    {pass: estimated seconds}; else returns None and prints nothing."""
    num_batches = -(-n // settings.batch_size)
    if num_batches < ANNOUNCE_BATCHES:
        return None
    what = evaluators_lib.labels(settings_record(settings, n, int(state.step)))[1]
    say = print if sharding.is_writer() else lambda *a, **k: None
    say(
        f"evaluating {', '.join(settings.evaluators)} on {n} images of {settings.dataset}'s test split, "
        f"{num_batches} batches of {settings.batch_size} a pass{''.join(f'; {w}' for w in what)}; timing one batch of "
        f"each of the {len(batch_fns)} passes ...",
        flush=True,
    )
    seconds = {name: batches.time_batch(fn, state, split, settings.batch_size) for (_, name), fn in batch_fns.items()}
    estimate = {name: t * num_batches for name, t in seconds.items()}
    say(
        f"estimate: {duration(sum(estimate.values()))} in all ("
        + ", ".join(f"{name} {duration(t)}" for name, t in estimate.items())
        + "; a pass over a subset of the images, such as PR's clean-correct ones, counted on all of them)",
        flush=True,
    )
    return estimate


def time_left_line(done: str, elapsed: float, left: dict) -> str:
    """After pass `done`: the time so far and the estimate of the passes `left` ({pass: seconds})."""
    rest = f"about {duration(sum(left.values()))} left ({', '.join(left)})" if left else "the figures next"
    return f"{done} done, {duration(elapsed)} so far; {rest}"


def duration(seconds: float) -> str:
    """'45 s', '12 min', '3.4 h'."""
    if seconds < 90:
        return f"{seconds:.0f} s"
    return f"{seconds / 60:.0f} min" if seconds < 5400 else f"{seconds / 3600:.1f} h"


def num_images(settings: settings_lib.EvaluationSettings, split: cifar.Split) -> int:
    """How many images an evaluation takes: the first settings.num_examples of the split, or all."""
    n = settings.num_examples
    return len(split) if n == settings_lib.WHOLE_SPLIT else min(n, len(split))


def settings_record(settings: settings_lib.EvaluationSettings, n: int, step: int, num_clean_correct=None) -> dict:
    """results.json's "settings": what an evaluation of `n` images of the model of `step` was made with."""
    return {
        "evaluators": list(settings.evaluators),
        "num_examples": int(n),
        "batch_size": int(settings.batch_size),
        "num_clean_correct": num_clean_correct,
        "dataset": settings.dataset,
        "split": "test",
        # Devices each batch was split over (batches.evaluate_pass): the figures are the same on any
        # count up to float summation order (tests/core/test_sharding.py).
        "devices": int(sharding.make_mesh(settings.batch_size).size),
        "step": int(step),
        **laws.definitions(settings.evaluator_settings["pr"].distributions),
        # The shared settings, then one dict per block of `eval`.
        **evaluators_lib.record(settings.evaluator_settings),
    }


def protocol_text(distribution: str, num_samples: int, epsilons=()) -> str:
    """What the headline `pr` of results.json is: the Table-1 protocol at Table 1's radii and N
    (PRBench's at PRBench's), else the same estimand under the law, radii and N it was made with."""
    preset = evaluators_lib.pr.preset_of(distribution, epsilons, num_samples)
    if preset == "table1":
        return PROTOCOL.replace("N samples", f"N = {num_samples} samples")
    if preset == "prbench":
        text = PROTOCOL.replace("N samples", f"N = {num_samples} samples")
        return text.replace("Table-1 protocol", "PRBench's protocol (the Table-1 protocol's law at its radii)")
    radii = ", ".join(f"{float(e):g}" for e in epsilons)
    return (
        f"per image, the fraction of N = {num_samples} samples of {laws.get(distribution).definition} "
        f"at eps = {radii} with s(x') < 0; the mean over the images the model classifies correctly (not the "
        f"Table-1 protocol, whose law is uniform at eps 0.1, 0.12, 0.15, 0.2 with N = 100)"
    )


def _flatten_per_image(per_image, s, n) -> dict:
    flat = {"image_index": np.arange(n, dtype=np.int32)}
    for name, out in per_image.items():
        for k, v in out.items():
            flat[f"{name}.{k}"] = v
        if "counts" in out:  # per-image PR_i = counts / N and its Clopper-Pearson interval
            samples = s[evaluators_lib.pr.BLOCK].samples
            flat[f"{name}.pr"] = out["counts"] / samples
            flat[f"{name}.cp_lower"], flat[f"{name}.cp_upper"] = stats.clopper_pearson(
                out["counts"], samples, s.shared.confidence
            )
    return flat


def check_workdir(
    workdir: str,
    num_examples=None,
    batch_size=None,
    evaluators=None,
    overrides: dict | None = None,
    overwrite: bool = True,
    step: int | None = None,
    eval_name: str | None = None,
    keep: bool = False,
    same_as: settings_lib.EvaluationSettings | None = None,
) -> settings_lib.EvaluationSettings:
    """Everything `evaluate_workdir` needs that can be checked without evaluating: config.json, a
    checkpoint, the run's evaluation settings with the overrides and the arguments given (with
    `same_as`, a comparison's first model's, handed on: `settings.handed_on`); with
    overwrite=False also that an existing eval/results.json (curve/step_N/ with a step; with keep,
    the evaluation of the same name) was made as this evaluation would be made, or with fewer
    evaluators or laws (`check_replaceable`). Returns the settings."""
    settings = workdir_lib.evaluation_settings(
        workdir, overrides, evaluators=evaluators, num_examples=num_examples, batch_size=batch_size
    )
    if same_as is not None:
        settings = settings_lib.handed_on(same_as, settings)
    newest = checkpoints.require_checkpoint(workdir)
    if not overwrite and (keep or os.path.isfile(eval_files.results_path(workdir, step))):
        split = cifar.load_split(settings.dataset, "test", settings.data_dir)
        check_replaceable(
            settings, workdir, newest if step is None else step, split, step=step, eval_name=eval_name, keep=keep
        )
    return settings


def check_replaceable(settings, out_dir, model_step, split, record=None, step=None, eval_name=None, keep=False) -> None:
    """`eval_files.check_replaceable` of out_dir's eval/ (curve/step_N/ with a step) against an
    evaluation with `settings` of the model of `model_step` on `split`; with keep, of the
    evaluation of its name (`eval_name`, else `eval_files.derived_name`), unless a saved evaluation
    holds its figures (`eval_files.reusable`: it is reused, nothing is replaced)."""
    planned = settings_record(settings, num_images(settings, split), model_step)
    if not keep:
        eval_files.check_replaceable(out_dir, planned, record, step)
    elif eval_files.reusable(out_dir, planned, record, eval_name) is None:
        eval_files.check_replaceable(out_dir, planned, record, name=eval_name or eval_files.derived_name(planned))


def weights_digest(state):
    """sha256 of a model's parameters and BatchNorm statistics, leaf by leaf in tree order: what
    tells a model from another of the same step; None where this process does not hold them whole."""
    digest = hashlib.sha256()
    for leaf in jax.tree.leaves((state.params, state.batch_stats)):
        if isinstance(leaf, jax.Array) and not leaf.is_fully_addressable:
            return None
        digest.update(np.ascontiguousarray(np.asarray(leaf)).tobytes())
    return digest.hexdigest()


@dataclasses.dataclass(frozen=True)
class Kept:
    """An evaluation kept under its name in a folder (a workdir, a model file's out_dir): its
    results (as written, or as read where a saved one was reused) and where they are."""

    name: str
    folder: str
    results: dict
    reused: bool


def evaluate_workdir(
    workdir: str,
    num_examples: int | None = None,
    batch_size: int | None = None,
    progress: bool = True,
    evaluators=None,
    overrides: dict | None = None,
    overwrite: bool = True,
    step: int | None = None,
    eval_name: str | None = None,
    keep: bool = False,
    same_as: settings_lib.EvaluationSettings | None = None,
):
    """Evaluates a workdir's newest model (its newest checkpoint or kept model); writes
    eval/per_image.npz, then eval/results.json (`eval_files.write_results`). Returns the results
    as written (non-finite numbers as None). overwrite=False (the command line's default) refuses
    to replace an evaluation made with other settings or more evaluators or laws.
    step: evaluate the kept model of that step instead, into curve/step_N/ (a learning curve's point).
    keep, eval_name: the evaluation is kept beside the workdir's others (`evaluate_and_write`); returns `Kept`.
    same_as: a comparison's first model's settings, with which this one is evaluated (`check_workdir`).
    """
    # Whether eval/ may be replaced is decided once, under the lock, by evaluate_and_write.
    settings = check_workdir(workdir, num_examples, batch_size, evaluators, overrides, True, step, same_as=same_as)
    # Process 0 writes eval/ and holds the workdir's lock for the evaluation's processes.
    with sharding.writer_lock(workdir, "an evaluation"):
        _, model_fns, state = workdir_lib.restore(workdir, step=step)
        return evaluate_and_write(
            settings, model_fns, state, workdir, progress, step, overwrite=overwrite, eval_name=eval_name, keep=keep
        )


def taken_outcomes(settings: settings_lib.EvaluationSettings, out_dir: str, planned: dict, held: dict) -> dict:
    """{evaluator: (saved evaluation's name, {pass: per-image outputs})} for each evaluator of this
    evaluation (and the clean pass PR needs) whose outcomes a saved evaluation of out_dir holds
    for the same model, images and view (`eval_files.reusable_evaluators`); each read back
    checked (`eval_files.load_results`)."""
    wanted = eval_files.ran({"evaluators": list(settings.evaluators)})
    found = eval_files.reusable_evaluators(out_dir, planned, held, wanted)
    loaded, taken = {}, {}
    for name, source in found.items():
        if source not in loaded:
            loaded[source] = eval_files.load_results(out_dir, name=source)[1]
        evaluator = evaluators_lib.REGISTRY[name]
        passes = evaluator.passes(settings.evaluator_settings.view(evaluator))
        taken[name] = (source, eval_files.evaluator_outcomes(loaded[source], evaluator, passes))
    return taken


def evaluate_and_write(
    settings: settings_lib.EvaluationSettings,
    model_fns,
    state,
    out_dir,
    progress=True,
    step=None,
    record: dict | None = None,
    overwrite: bool = True,
    eval_name: str | None = None,
    keep: bool = False,
):
    """`evaluate_state` on settings.dataset's test split, written to out_dir/eval/ (or
    curve/step_N/) by process 0 with `record`'s entries added; returns the results as written.
    overwrite=False: refuses, before evaluating, to replace an evaluation made otherwise
    (`check_replaceable`; the model restored decides the step).

    keep: the evaluation is kept beside out_dir's others under `eval_name` (default: its settings',
    `eval_files.derived_name`), replacing only the one of that name; without overwrite, a saved
    evaluation that holds its figures (`eval_files.reusable`) is reused instead. Returns `Kept`."""
    split = cifar.load_split(settings.dataset, "test", settings.data_dir)
    if keep:
        planned = settings_record(settings, num_images(settings, split), int(state.step))
        # The weights themselves decide reuse, not the step alone: a run trained again in its folder.
        weights = {eval_files.WEIGHTS_KEY: weights_digest(state)}
        held = None if overwrite or weights[eval_files.WEIGHTS_KEY] is None else {**(record or {}), **weights}
        saved = held and eval_files.reusable(out_dir, planned, held, eval_name)
        if saved is not None:
            return Kept(
                saved,
                eval_files.eval_dir(out_dir, name=saved),
                eval_files.load_results(out_dir, name=saved)[0],
                True,
            )
        eval_name = eval_name or eval_files.derived_name(planned)
    if not overwrite:
        check_replaceable(settings, out_dir, int(state.step), split, record, step, eval_name, keep)
    taken = taken_outcomes(settings, out_dir, planned, held) if keep and held else {}
    per_image = {}
    results = evaluate_state(
        settings,
        model_fns,
        state,
        split,
        progress=progress and sharding.is_writer(),
        per_image_out=per_image,
        announce_on=progress,
        reused={name: outcomes for name, (_, outcomes) in taken.items()},
    )
    results.update(record or {})
    if keep:
        results.update(weights)
        if taken:  # where each evaluator's figures come from, when not from this run
            results[eval_files.REUSED_KEY] = {name: source for name, (source, _) in taken.items()}
    if not sharding.is_writer():
        results = files.json_safe(results)
    else:
        # The folder is decided before the write: a first evaluation goes to eval/.
        folder = eval_files.eval_dir(out_dir, step, eval_name if keep else None)
        results = eval_files.write_results(out_dir, results, per_image, step, eval_name if keep else None)
    return Kept(eval_name, folder if sharding.is_writer() else "", results, False) if keep else results
