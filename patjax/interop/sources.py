"""A model from any source evaluated as a run is, and several compared: a run's workdir, a
PyTorch state_dict file of a network of `patjax.models.networks` (`evaluate_torch_checkpoint`),
an entry of RobustBench's CIFAR-10 zoo (`evaluate_robustbench`); `evaluate_models` evaluates the
models a `Models` names with one set of settings and prints one table of them
(`python -m patjax.evaluate` hands its flags off to it; `patjax.api` names these functions)."""

from __future__ import annotations

import dataclasses
import functools
from typing import Optional

from patjax.core import paths, sharding
from patjax.core.errors import UserError
from patjax.interop import torch_weights, zoo
from patjax.reporting import report
from patjax.run import comparison, eval_files, evaluation
from patjax.run import config as config_lib
from patjax.run import settings as settings_lib
from patjax.run import workdir as workdir_lib

OUT_DIR_REMEDY = "wait for it to finish, or use another --out_dir"


def evaluate_torch_checkpoint(
    path,
    model_name,
    dataset,
    normalize,
    out_dir,
    evaluators=None,
    num_examples=None,
    batch_size=None,
    overrides=None,
    width=None,
    overwrite: bool = True,
    eval_name=None,
    keep: bool = False,
    same_as: settings_lib.EvaluationSettings | None = None,
):
    """A PyTorch state_dict file (`torch_weights.load_arrays`) evaluated as a run is, under the
    default config's eval settings with `overrides`; results in out_dir/eval/. model_name, dataset
    and width may be None where the file's metadata names them (`torch_weights.network`). The
    results record the file (`eval_files.checkpoint_record`), the network and its input
    normalization under "model". overwrite=False refuses to replace an evaluation of out_dir made
    otherwise, of another file (sha256) included. keep, eval_name: kept beside out_dir's other
    evaluations, or a saved one reused (`evaluation.evaluate_and_write`). same_as: a comparison's
    first model's settings, handed on (`settings.handed_on`) instead of the default config's."""
    model_name, dataset, width = torch_weights.network(path, model_name, dataset, width)
    # Every setting is checked before the weights are read.
    settings = config_lib.default_evaluation_settings(
        dataset, overrides, evaluators=evaluators, num_examples=num_examples, batch_size=batch_size
    )
    if same_as is not None:
        settings = settings_lib.handed_on(same_as, settings)
    tensors = torch_weights.read_state_dict(path)
    model_fns, state = torch_weights.load_arrays(tensors, model_name, dataset, normalize, width, source=path)
    normalization = normalize if normalize is not None else "the file's mu and sigma"
    record = {
        "model": {
            **eval_files.checkpoint_record(path),
            "model": model_name,
            "width": width,
            "normalize": normalization,
        }
    }
    # out_dir/eval/ is written as a run's eval/ is.
    with sharding.writer_lock(out_dir, "an evaluation", remedy=OUT_DIR_REMEDY):
        return evaluation.evaluate_and_write(
            settings, model_fns, state, out_dir, record=record, overwrite=overwrite, eval_name=eval_name, keep=keep
        )


def evaluate_robustbench(
    name,
    model_dir,
    out_dir,
    evaluators=None,
    num_examples=None,
    batch_size=None,
    overrides=None,
    overwrite=True,
    threat_model="Linf",
    eval_name=None,
    keep: bool = False,
    same_as: settings_lib.EvaluationSettings | None = None,
):
    """A RobustBench CIFAR-10 zoo entry of `threat_model` (`zoo.load_model`: its checkpoint in
    model_dir, fetched there if missing) evaluated as a PyTorch checkpoint is; results in
    out_dir/eval/ (keep, eval_name: as `evaluate_torch_checkpoint`). The attacks' threat model is the
    evaluation's (`eval.attack`), not the entry's. same_as: as `evaluate_torch_checkpoint`'s."""
    settings = config_lib.default_evaluation_settings(
        zoo.DATASET, overrides, evaluators=evaluators, num_examples=num_examples, batch_size=batch_size
    )
    if same_as is not None:
        settings = settings_lib.handed_on(same_as, settings)
    model_fns, state, path = zoo.load_model(name, model_dir, threat_model)
    zoo_entry = zoo.entry(name, threat_model)
    record = {
        "model": {
            "robustbench": name,
            "threat_model": threat_model,
            **eval_files.checkpoint_record(path),
            "model": zoo_entry.model,
            "normalize": zoo_entry.normalize or "none",
        }
    }
    with sharding.writer_lock(out_dir, "an evaluation", remedy=OUT_DIR_REMEDY):
        return evaluation.evaluate_and_write(
            settings, model_fns, state, out_dir, record=record, overwrite=overwrite, eval_name=eval_name, keep=keep
        )


# How a comparison reads its models' files and entries and where their results go: `Models`'
# fields beside the sources, each the evaluate command's flag of that name.
MODEL_FIELDS = (
    "model",
    "model_width",
    "normalize",
    "dataset",
    "out_dir",
    "robustbench_dir",
    "robustbench_threat_model",
)
# What --torch_checkpoint takes and --robustbench decides itself.
_CHECKPOINT_FIELDS = ("model", "model_width", "normalize", "dataset")


@dataclasses.dataclass(frozen=True)
class Models:
    """The models one comparison evaluates (`python -m patjax.evaluate`'s flags of the same names):
    workdirs, then PyTorch checkpoint files, then RobustBench entries, each in the order given;
    the files' network, width, normalization and dataset (None: the file's metadata's), the folder
    of a single file's or entry's results, RobustBench's model_dir and zoo."""

    workdirs: tuple = ()
    torch_checkpoints: tuple = ()
    robustbench: tuple = ()
    model: Optional[str] = None
    model_width: Optional[int] = None
    normalize: Optional[str] = None
    dataset: Optional[str] = None
    out_dir: Optional[str] = None
    robustbench_dir: str = zoo.DEFAULT_MODEL_DIR
    robustbench_threat_model: str = "Linf"


def _sources(m: Models, keeping: dict, overwrite: bool, step) -> list:
    """(the folder its eval/ goes to, what the user named it by, evaluate(**settings) -> results)
    of every model `m` names, in its order; every path and name is checked before any model is
    evaluated."""
    found = []
    for workdir in m.workdirs:
        paths.existing_folder("workdir", workdir)
        evaluate = functools.partial(evaluation.evaluate_workdir, workdir, overwrite=overwrite, step=step, **keeping)
        found.append((workdir, workdir, evaluate))
    for path in m.torch_checkpoints:
        paths.existing_file("torch_checkpoint", path)
        out_dir = m.out_dir or eval_files.default_out_dir(path)
        if out_dir != path:  # a file without suffix is refused for its suffix
            paths.output_folder("out_dir", out_dir)
        evaluate = functools.partial(
            evaluate_torch_checkpoint,
            path,
            m.model,
            m.dataset,
            m.normalize,
            out_dir,
            width=m.model_width,
            overwrite=overwrite,
            **keeping,
        )
        found.append((out_dir, path, evaluate))
    if m.robustbench:
        paths.output_folder("robustbench_dir", m.robustbench_dir)
    threat_model = m.robustbench_threat_model
    for name in m.robustbench:
        zoo.entry(name, threat_model)
        out_dir = m.out_dir or eval_files.default_out_dir(zoo.checkpoint_path(name, m.robustbench_dir, threat_model))
        paths.output_folder("out_dir", out_dir)
        evaluate = functools.partial(
            evaluate_robustbench,
            name,
            m.robustbench_dir,
            out_dir,
            overwrite=overwrite,
            threat_model=threat_model,
            **keeping,
        )
        found.append((out_dir, name, evaluate))
    return found


def _check_models(m: Models) -> None:
    """The fields that describe a PyTorch checkpoint's network, only where there is one; several
    models each write beside their own file."""
    given = [f"--{name}" for name in _CHECKPOINT_FIELDS if getattr(m, name) is not None]
    if given and not m.torch_checkpoints:
        what = "--robustbench names the network and its normalization itself" if m.robustbench else "there is no file"
        verb = "describes" if len(given) == 1 else "describe"
        raise UserError(f"{', '.join(given)} {verb} a --torch_checkpoint file: {what}")
    if m.out_dir and len(m.workdirs) + len(m.torch_checkpoints) + len(m.robustbench) > 1:
        raise UserError("--out_dir names the folder of one --torch_checkpoint or --robustbench, not of several models")


def first_settings(m: Models, overrides: Optional[dict] = None) -> settings_lib.EvaluationSettings:
    """The evaluation settings of the first model `m` names, with `overrides` (by path): a
    workdir's config's eval block, else the default config's on the file's (or the zoo's) dataset."""
    if m.workdirs:
        return workdir_lib.evaluation_settings(m.workdirs[0], overrides)
    if m.torch_checkpoints:
        dataset = torch_weights.network(m.torch_checkpoints[0], m.model, m.dataset, m.model_width)[1]
    else:
        dataset = zoo.DATASET
    return config_lib.default_evaluation_settings(dataset, overrides)


def evaluate_models(
    m: Models,
    overrides: Optional[dict] = None,
    *,
    step=None,
    eval_name=None,
    overwrite: bool = False,
    compare_only: bool = False,
    list_only: bool = False,
    plot=None,
    plot_over: str = "clean_correct",
) -> None:
    """Every model `m` names evaluated with one set of settings, the first model's with
    `overrides` (`first_settings`), decided before anything runs and handed to the others whole
    (`settings.handed_on`), so that all share their images and noise (common random numbers); then
    one table with the paired differences against the first (`comparison.compare`), printed by
    process 0. step: a learning-curve point of one workdir, its own figures; compare_only: the
    saved evaluations (`eval_name`'s); list_only: the evaluations each folder keeps."""
    say = print if sharding.is_writer() else lambda *a, **k: None
    _check_models(m)
    # Each evaluation kept beside a folder's others under its name (eval_name, else its
    # settings'), or a saved one reused; a learning-curve point goes to curve/step_N/.
    keeping = dict(keep=step is None, eval_name=eval_name and eval_files.check_name(eval_name))
    found = _sources(m, keeping, overwrite, step)
    if not found:
        raise UserError("--workdir, --torch_checkpoint or --robustbench is required")
    if plot:
        paths.output_file("plot", plot)
    folders = [folder for folder, _, _ in found]
    names = comparison.labels([named for _, named, _ in found])
    if step is not None and (len(found) != 1 or not m.workdirs or compare_only):
        raise UserError("--step evaluates a step of one --workdir (not --compare_only, no other model)")
    if step is not None and eval_name:
        raise UserError("--eval_name names an evaluation of the newest model; --step's goes to curve/step_N/")
    if list_only:
        print("\n\n".join(report.evaluation_list(f, eval_files.evaluations(f)) for f in folders))
        return
    # A comparison reads the evaluation of each folder that eval_name names (else its only one).
    evals = [eval_files.chosen(folder, keeping["eval_name"]) for folder in folders] if compare_only else []
    if not compare_only:
        # The first model's settings, typed and resolved, are every model's; each reads its own
        # test split from its own data folder (data_dir: every model's).
        overrides = overrides or {}
        same = dict(same_as=first_settings(m, overrides))
        if "data_dir" in overrides:
            same["overrides"] = {"data_dir": overrides["data_dir"]}
        # Every workdir is checked with those settings before any model is evaluated, so a mistake
        # in the last one does not surface after the first ones ran for hours.
        for workdir in m.workdirs:
            evaluation.check_workdir(workdir, overwrite=overwrite, step=step, **keeping, **same)
        for folder, name, (_, _, evaluate) in zip(folders, names, found):
            results = evaluate(**same)
            if step is None:
                evals.append(results.name)
            say(comparison.kept_line(name, results, eval_files.results_path(folder, step)))
    if step is not None:  # a learning-curve point: its own figures, compared with nothing
        say(report.comparison([f"{names[0]} step {step}"], [results]))
        return
    say(comparison.compare(folders, plot, plot_over, names, evals))
    where = [eval_files.eval_dir(f, name=e) for f, e in zip(folders, evals)]
    say("evaluations: " + ", ".join(f"{n} in {w}" for n, w in zip(names, where)))
