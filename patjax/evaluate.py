"""Command line: evaluate trained runs and compare them.

  python -m patjax.evaluate --workdir=runs/pat_c10 [--full] [--num_examples=1000] [--batch_size=500]
      [--evaluators=clean,pgd20,cw20,apgd,pr] [--pr_samples=100] [--pr_distributions=uniform,gaussian,pdis]
      [--pr_preset=table1|prbench|l2]   # the headline PR at the radii of the paper's Table 1, PRBench's, or
                                        # under the L2 law uniform_l2 at L2 radii
      [--pr_epsilons=0.1,0.12,0.15,0.2]   # the radii of every law of eps
      [--attack_norm=l2 --attack_eps=0.5 --attack_step_size=0.125]   # every attack in the L2 ball
  python -m patjax.evaluate --workdir=runs/A --workdir=runs/B   # one comparison table + PNG plot
  python -m patjax.evaluate --workdir=runs/A --list   # its evaluations, each kept under its name (eval/, evals/NAME/)
  python -m patjax.evaluate --torch_checkpoint=model.safetensors [--model=wrn28_10] [--dataset=cifar10]
      [--model_width=W] [--normalize=none|dataset|cifar10|cifar100] [--out_dir=DIR] [the evaluation flags above]
  python -m patjax.evaluate --robustbench=Carmon2019Unlabeled [--robustbench_dir=models] [--out_dir=DIR] [...]
  python -m patjax.evaluate --workdir=runs/A --torch_checkpoint=theirs.safetensors \
      --robustbench=Carmon2019Unlabeled [the evaluation flags]   # models from any source in one table

A PyTorch state_dict (.safetensors, or .pt/.pth read with weights_only=True) of a network of
`patjax.models.networks` (named by --model, or by the metadata of a file `patjax.export` wrote) is
evaluated without a workdir (`patjax.api.evaluate_torch_checkpoint`,
names and layouts of `patjax.interop.torch_weights`) under the default config's eval settings;
--normalize is required unless the file holds its normalization (mu and sigma), and the
results go to OUT_DIR/eval/ (default: beside the file, FILE_without_suffix/, or FILE_suffix/ where
that is a run's workdir; `eval_files.default_out_dir`). An entry of
RobustBench's CIFAR-10 Linf zoo is such a file, read as RobustBench reads it, with the network
and normalization RobustBench gives it (`patjax.interop.zoo`).

Checks every path and every workdir (config, checkpoint, settings) first, then evaluates each model
(a workdir's newest checkpoint, `patjax.run.evaluation.evaluate_workdir`: DIR/eval/per_image.npz,
then DIR/eval/results.json) and prints the comparison of all of them
(`patjax.run.comparison.compare`): the workdirs, then the PyTorch checkpoints, then the RobustBench
entries, each in the order given, the first the baseline of the paired differences. Every model
is evaluated with the first one's settings (its config's eval block for a workdir, the default
config's for a file, with the flags; `run.config.handed_on`), decided before any model runs, so
all share their images and noise. The evaluators are those of `patjax.evaluators`; docs/evaluation.md
describes the figures and their intervals.
"""

from __future__ import annotations

import functools
import sys

from absl import app, flags
from ml_collections import config_flags

from patjax import api, evaluators
from patjax.attacks import l2
from patjax.core import cli as cli_lib
from patjax.core import sharding
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import common, pr
from patjax.interop import torch_weights, zoo
from patjax.models import networks
from patjax.pat import laws
from patjax.reporting import plots, report
from patjax.run import comparison, eval_files, evaluation
from patjax.run import config as config_lib
from patjax.run import workdir as workdir_lib

FLAGS = flags.FLAGS

# The short flags users type, each an alias of one evaluation setting, named by its path in the
# config's `eval` block (--pr_samples is --eval.pr.samples; every setting is --eval.<path>,
# `config.default_eval_block`), with its help; each flag takes its path's type.
ALIASES = {
    "num_examples": ("num_examples", "Test images to evaluate, the first ones of the split; -1: all of them."),
    "batch_size": ("batch_size", "Images per evaluation batch."),
    "evaluators": (
        "evaluators",
        f"Comma-separated, from {', '.join(evaluators.NAMES)}, or the groups {', '.join(evaluators.ALIASES)}.",
    ),
    "seed": ("seed", "Evaluation seed (attack starts, PR noise, bootstrap)."),
    "pr_samples": ("pr.samples", "N perturbations per image for PR."),
    "pr_chunk_size": ("pr.chunk_size", "Perturbations per image evaluated at once (memory)."),
    "pr_distribution": (
        "pr.distribution",
        "Law of the headline PR (results.json's `pr`): uniform (the Table-1 protocol, the default) or another "
        f"law of eps: {', '.join(laws.of_eps())}.",
    ),
    "pr_distributions": ("pr.distributions", f"Comma-separated laws computed beside it, from {','.join(laws.names())}"),
    "pr_epsilons": ("pr.epsilons", "Comma-separated radii of the laws of eps, numbers or fractions."),
    "apgd_steps": ("apgd.steps", "APGD iterations."),
    "attack_norm": (
        "attack.norm",
        f"The attacks' threat model, one of {', '.join(common.NORMS)}: linf (the paper's, the default) or l2 (pgd20 "
        "and cw20 as PGD-L2, APGD and AutoAttack as their L2 versions); without --attack_eps and --attack_step_size, "
        "the norm's standard ones: L-inf 8/255 and 2/255, L2 0.5 and 0.125 (RobustBench's and AutoAttack's).",
    ),
    "attack_eps": (
        "attack.eps",
        "The attacks' radius, a number or a fraction (default: the norm's, L-inf 8/255, L2 0.5)",
    ),
    "attack_step_size": ("attack.step_size", "PGD-20's and CW-20's step (default: the norm's, L-inf 2/255, L2 0.125)."),
    "certify_sigma": ("certify.sigma", "certify: the smoothing noise's sigma in [0,1] pixels."),
    "certify_radii": ("certify.radii", "certify: comma-separated L2 radii."),
    "certify_samples": ("certify.samples", "certify: n, CERTIFY's estimation samples."),
    "certify_selection_samples": ("certify.selection_samples", "certify: n0, the selection samples."),
    "certify_alpha": ("certify.alpha", "certify: the failure probability."),
    "certify_chunk_size": ("certify.chunk_size", "certify: samples per image evaluated at once (memory)."),
}

# What --torch_checkpoint takes and --robustbench decides itself.
_CHECKPOINT_FLAGS = ("model", "model_width", "normalize", "dataset")

# --full: every evaluator, the laws at the L-inf radii (uniform_l2 is at L2 radii: --pr_preset=l2), the
# whole test split, whatever the workdir's config says.
FULL = {"evaluators": ("all",), "num_examples": -1, "pr.distributions": ("uniform", "gaussian", "pdis")}


def typed_flags() -> dict:
    """{path in `eval`: the flag the user typed for it}: the aliases given and every --eval.<path>;
    the same setting under two flags is refused."""
    typed = {path: name for name, (path, _) in ALIASES.items() if FLAGS[name].present}
    for path in config_flags.get_override_values(FLAGS["eval"]):
        if path in typed:
            raise UserError(f"--{typed[path]} and --eval.{path} set the same setting: give one")
        typed[path] = f"eval.{path}"
    return typed


def overrides_from_flags(typed: dict) -> dict:
    """The eval settings the flags give, by path: --full's and a --pr_preset's, then each flag
    given (which wins), each read as its field's type (`config.read_as_default`)."""
    overrides = dict(FULL) if FLAGS.full else {}
    overrides.update(config_lib.eval_paths(pr.PRESETS[FLAGS.pr_preset]) if FLAGS.pr_preset else {})
    values = config_flags.get_override_values(FLAGS["eval"])
    for path, flag in typed.items():
        value = values[path] if flag == f"eval.{path}" else FLAGS[flag].value
        overrides[path] = config_lib.read_as_default(path, value, flag)
    if "evaluators" in overrides:  # a name that is none is refused before any folder is read
        evaluators.parse(overrides["evaluators"])
    if FLAGS.data_dir:  # every model's test split, the workdirs' recorded folders included
        overrides["data_dir"] = cli_lib.data_folder("data_dir", FLAGS.data_dir, cifar.TFDS)
    return overrides


def sources() -> list:
    """(the folder its eval/ goes to, what the user named it by, evaluate(**settings) -> results)
    of every model the flags name: the workdirs, then the PyTorch checkpoints, then the RobustBench
    entries, each in the order given; every path and name is checked before any model is evaluated."""
    found = []
    for workdir in FLAGS.workdir or ():
        cli_lib.existing_folder("workdir", workdir)
        evaluate = functools.partial(
            evaluation.evaluate_workdir, workdir, overwrite=FLAGS.overwrite, step=FLAGS.step, **keeping()
        )
        found.append((workdir, workdir, evaluate))
    for path in FLAGS.torch_checkpoint or ():
        cli_lib.existing_file("torch_checkpoint", path)
        out_dir = FLAGS.out_dir or eval_files.default_out_dir(path)
        if out_dir != path:  # a file without suffix is refused for its suffix
            cli_lib.output_folder("out_dir", out_dir)
        evaluate = functools.partial(
            api.evaluate_torch_checkpoint,
            path,
            FLAGS.model,
            FLAGS.dataset,
            FLAGS.normalize,
            out_dir,
            width=FLAGS.model_width,
            overwrite=FLAGS.overwrite,
            **keeping(),
        )
        found.append((out_dir, path, evaluate))
    if FLAGS.robustbench:
        cli_lib.output_folder("robustbench_dir", FLAGS.robustbench_dir)
    threat_model = FLAGS.robustbench_threat_model
    for name in FLAGS.robustbench or ():
        zoo.entry(name, threat_model)
        out_dir = FLAGS.out_dir or eval_files.default_out_dir(
            zoo.checkpoint_path(name, FLAGS.robustbench_dir, threat_model)
        )
        cli_lib.output_folder("out_dir", out_dir)
        evaluate = functools.partial(
            api.evaluate_robustbench,
            name,
            FLAGS.robustbench_dir,
            out_dir,
            overwrite=FLAGS.overwrite,
            threat_model=threat_model,
            **keeping(),
        )
        found.append((out_dir, name, evaluate))
    return found


def keeping() -> dict:
    """Each evaluation kept beside a folder's others under its name (--eval_name, else its
    settings'), or a saved one reused; a learning-curve point (--step) goes to curve/step_N/."""
    return dict(keep=FLAGS.step is None, eval_name=FLAGS.eval_name and eval_files.check_name(FLAGS.eval_name))


def check_model_flags() -> None:
    """The flags that describe a PyTorch checkpoint's network, only where there is one; several
    models each write beside their own file."""
    checkpoints, entries = FLAGS.torch_checkpoint or (), FLAGS.robustbench or ()
    given = [f"--{name}" for name in _CHECKPOINT_FLAGS if FLAGS[name].present]
    if given and not checkpoints:
        what = "--robustbench names the network and its normalization itself" if entries else "there is no file"
        verb = "describes" if len(given) == 1 else "describe"
        raise UserError(f"{', '.join(given)} {verb} a --torch_checkpoint file: {what}")
    if FLAGS.out_dir and len(FLAGS.workdir or ()) + len(checkpoints) + len(entries) > 1:
        raise UserError("--out_dir names the folder of one --torch_checkpoint or --robustbench, not of several models")


def first_settings(overrides):
    """The evaluation settings of the first model the flags name, with the flags: a workdir's
    config's eval block, else the default config's on the file's (or the zoo's) dataset."""
    if FLAGS.workdir:
        return workdir_lib.evaluation_settings(FLAGS.workdir[0], overrides)
    if FLAGS.torch_checkpoint:
        dataset = torch_weights.network(FLAGS.torch_checkpoint[0], FLAGS.model, FLAGS.dataset, FLAGS.model_width)[1]
    else:
        dataset = zoo.DATASET
    return config_lib.default_evaluation_settings(dataset, overrides)


def evaluate_and_compare(overrides) -> None:
    """Every model the flags name evaluated with one set of settings, the first model's
    (`first_settings`), decided before anything runs, so that all share their images and noise
    (common random numbers); then one table with the paired differences against the first
    (`comparison.compare`). A single model prints its own figures."""
    check_model_flags()
    found = sources()
    if not found:
        raise UserError("--workdir, --torch_checkpoint or --robustbench is required")
    if FLAGS.plot:
        cli_lib.output_file("plot", FLAGS.plot)
    folders = [folder for folder, _, _ in found]
    names = comparison.labels([named for _, named, _ in found])
    if FLAGS.step is not None and (len(found) != 1 or not FLAGS.workdir or FLAGS.compare_only):
        raise UserError("--step evaluates a step of one --workdir (not --compare_only, no other model)")
    if FLAGS.step is not None and FLAGS.eval_name:
        raise UserError("--eval_name names an evaluation of the newest model; --step's goes to curve/step_N/")
    if FLAGS.list:
        print("\n\n".join(report.evaluation_list(f, eval_files.evaluations(f)) for f in folders))
        return
    # A comparison reads the evaluation of each folder that --eval_name names (else its only one).
    evals = [eval_files.chosen(folder, keeping()["eval_name"]) for folder in folders] if FLAGS.compare_only else []
    if not FLAGS.compare_only:
        # The first model's settings, typed and resolved, are every model's; each reads its own
        # test split from its own data folder (--data_dir: every model's).
        same = dict(same_as=first_settings(overrides))
        if "data_dir" in overrides:
            same["overrides"] = {"data_dir": overrides["data_dir"]}
        # Every workdir is checked with those settings before any model is evaluated, so a mistake
        # in the last one does not surface after the first ones ran for hours.
        for workdir in FLAGS.workdir or ():
            evaluation.check_workdir(workdir, overwrite=FLAGS.overwrite, step=FLAGS.step, **keeping(), **same)
        for folder, name, (_, _, evaluate) in zip(folders, names, found):
            results = evaluate(**same)
            if FLAGS.step is None:
                evals.append(results.name)
            if sharding.is_writer():
                print(comparison.kept_line(name, results, eval_files.results_path(folder, FLAGS.step)))
    if FLAGS.step is not None:  # a learning-curve point: its own figures, compared with nothing
        if sharding.is_writer():
            print(report.comparison([f"{names[0]} step {FLAGS.step}"], [results]))
        return
    if sharding.is_writer():
        print(comparison.compare(folders, FLAGS.plot, FLAGS.plot_over, names, evals))
        where = [eval_files.eval_dir(f, name=e) for f, e in zip(folders, evals)]
        print("evaluations: " + ", ".join(f"{n} in {w}" for n, w in zip(names, where)))


def main(argv):
    cli_lib.start(argv)
    # Every setting a flag gives is checked under its config field's name (eval.pr.samples);
    # here the user typed the flag.
    typed = typed_flags()
    with cli_lib.named_as_flags({f"eval.{path}": flag for path, flag in typed.items()}):
        overrides = overrides_from_flags(typed)
        filled = {k: v for k, v in l2.with_norm_radii(overrides, *config_lib.EVAL_THREAT).items() if k not in overrides}
        if filled and sharding.is_writer():  # a default that decides every attack's figure is said
            norm = config_lib.EVAL_THREAT[0]
            alias = {path: name for name, (path, _) in ALIASES.items()}
            by_alias = typed[norm] != f"eval.{norm}"
            named = {f"--{alias[k] if by_alias else f'eval.{k}'}": v for k, v in filled.items()}
            print(report.norm_radii_line(f"--{typed[norm]}", overrides[norm], named))
        return evaluate_and_compare(overrides)


def define_flags():
    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of trained runs (several: one comparison).")
    flags.DEFINE_string(
        "data_dir",
        None,
        "The folder of the test split (holding cifar-10-batches-bin/ ...) or tfds (default: the workdir's config's, "
        "else found or downloaded).",
    )
    flags.DEFINE_enum(
        "pr_preset",
        None,
        list(pr.PRESETS),
        "The headline PR's law, radii and N of a published table (the flags above still win): table1 (the "
        "paper's: uniform, eps 0.1/0.12/0.15/0.2, N = 100), prbench (PRBench's protocol: its uniform law "
        "alone, eps 0.03, 0.08, 0.1, 0.12, N = 100) or l2 (uniform_l2 alone at L2 radii 0.5, 1, 2, 4, 8, N = 100).",
    )
    # Every evaluation setting as --eval.<path> (--eval.pr.samples=20), from the eval block the
    # settings classes write; only the values typed override the workdir's config (`typed_flags`).
    # A float field takes a fraction (8/255), as the aliases of its radii do.
    config_flags.register_flag_parser_for_type(float, cli_lib.FractionParser())
    config_flags.DEFINE_config_dict("eval", config_lib.default_eval_block(), "The evaluation settings by path.")
    block = config_lib.default_eval_block()
    for name, (path, help_text) in ALIASES.items():
        default = block[path]
        text = f"{help_text} Alias of --eval.{path} (default: the config's, {default!r} in the default config)."
        if isinstance(default, bool) or not isinstance(default, (int, float)):
            flags.DEFINE_string(name, None, text)
        elif isinstance(default, int):
            flags.DEFINE_integer(name, None, text)
        else:
            cli_lib.define_fraction(name, None, text)
    flags.DEFINE_bool(
        "full",
        False,
        "Every evaluator and PR law on the whole test split (flags given "
        "explicitly still win), whatever the workdir's config evaluates by default.",
    )
    flags.DEFINE_integer(
        "step",
        None,
        "Evaluate the model of this training step (its checkpoint or kept model) of one --workdir "
        "instead of the newest, into WORKDIR/curve/step_N/: a learning-curve point.",
    )
    flags.DEFINE_bool(
        "compare_only", False, "Do not evaluate; compare the saved evaluations (--eval_name's, else each one's only)."
    )
    flags.DEFINE_string(
        "eval_name",
        None,
        "The evaluation's name in its folder (default: from its settings, e.g. linf-8_255.table1.n500); a workdir "
        "keeps each name's evaluation beside the others (eval/, then evals/NAME/). With --compare_only: which to read.",
    )
    flags.DEFINE_bool("list", False, "List the evaluations each folder keeps, with their settings; evaluate nothing.")
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Evaluate again and replace the evaluation of the same name, even one made otherwise (other images, seed, N, "
        "step, settings; or evaluators or PR laws this one does not run); without it a saved evaluation holding "
        "this one's figures is reused, and one made otherwise under the same name is refused.",
    )
    flags.DEFINE_multi_string(
        "torch_checkpoint",
        None,
        "A PyTorch state_dict file to evaluate (repeatable; beside workdirs and --robustbench entries: one table "
        "on the same images and noise).",
    )
    flags.DEFINE_string(
        "model",
        None,
        f"With --torch_checkpoint: its network, one of {', '.join(networks.MODELS)} (default: the one the file's "
        "metadata names, as patjax.export writes it).",
    )
    flags.DEFINE_string(
        "dataset", None, "With --torch_checkpoint: the test split to evaluate on (default: the file's, else cifar10)."
    )
    flags.DEFINE_integer(
        "model_width",
        None,
        f"With --torch_checkpoint: the stem width of {', '.join(networks.TAKES_WIDTH)} (default: the file's, else 64).",
    )
    flags.DEFINE_string(
        "normalize",
        None,
        "With --torch_checkpoint: the network's input normalization: none (inputs in [0, 1], as "
        "RobustBench's), dataset or a dataset name; default: the file's mu and sigma.",
    )
    flags.DEFINE_string(
        "out_dir",
        None,
        "With --torch_checkpoint or --robustbench: where eval/ goes (default: the checkpoint file without its suffix, "
        "or FILE_suffix where that is a run's workdir).",
    )
    flags.DEFINE_multi_string(
        "robustbench",
        None,
        "A RobustBench CIFAR-10 Linf zoo entry to evaluate (e.g. Carmon2019Unlabeled; docs/api.md lists those "
        "patjax loads; repeatable): its checkpoint in --robustbench_dir, fetched there by the robustbench "
        "package if missing.",
    )
    flags.DEFINE_enum(
        "robustbench_threat_model",
        "Linf",
        list(zoo.THREAT_MODELS),
        "With --robustbench: the zoo the entries are from, RobustBench's Linf or L2 (the attacks' threat model "
        "is --attack_norm's).",
    )
    flags.DEFINE_string(
        "robustbench_dir",
        zoo.DEFAULT_MODEL_DIR,
        "With --robustbench: RobustBench's model_dir (NAME.pt in cifar10/Linf/).",
    )
    flags.DEFINE_string("plot", None, "PNG path of the PR-vs-eps plot (default: FIRST/eval/pr_vs_eps.png).")
    flags.DEFINE_enum(
        "plot_over",
        "clean_correct",
        list(plots.PR_IMAGE_SETS),
        "The images the plot's PR is over: clean_correct (each run's, the Table-1 estimand of every table's "
        "headline) or all.",
    )


def cli():
    with cli_lib.defining_config_flags(sys.argv):
        define_flags()
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
