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

Every evaluation setting is also --eval.<path in the config's eval block> (--eval.pr.samples=20);
the short flags are aliases of one path each (`ALIASES`). This door parses the flags and hands
off to `patjax.api.evaluate_models`: every path and workdir checked first, then each model
evaluated with the first one's settings (a workdir's config's eval block, the default config's for
a PyTorch file or a RobustBench entry, with the flags) and all compared in one table, the first the
baseline of the paired differences. docs/evaluation.md describes the figures and their intervals.
"""

from __future__ import annotations

import sys

from absl import app, flags
from ml_collections import config_flags

from patjax import api, evaluators
from patjax.attacks import l2
from patjax.core import cli as cli_lib
from patjax.core import paths, sharding
from patjax.core.errors import UserError
from patjax.data import cifar
from patjax.evaluators import common, pr
from patjax.interop import zoo
from patjax.models import networks
from patjax.pat import laws
from patjax.reporting import plots, report
from patjax.run import config as config_lib

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
    given (which wins), each read as its field's type (`config.read_eval_value`)."""
    overrides = dict(FULL) if FLAGS.full else {}
    overrides.update(config_lib.eval_paths(pr.PRESETS[FLAGS.pr_preset]) if FLAGS.pr_preset else {})
    values = config_flags.get_override_values(FLAGS["eval"])
    for path, flag in typed.items():
        value = values[path] if flag == f"eval.{path}" else FLAGS[flag].value
        overrides[path] = config_lib.read_eval_value(path, value, flag)
    if "evaluators" in overrides:  # a name that is none is refused before any folder is read
        evaluators.parse(overrides["evaluators"])
    if FLAGS.data_dir:  # every model's test split, the workdirs' recorded folders included
        overrides["data_dir"] = paths.data_folder("data_dir", FLAGS.data_dir, cifar.TFDS)
    return overrides


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
        return api.evaluate_models(
            api.Models(
                workdirs=tuple(FLAGS.workdir or ()),
                torch_checkpoints=tuple(FLAGS.torch_checkpoint or ()),
                robustbench=tuple(FLAGS.robustbench or ()),
                **{name: FLAGS[name].value for name in api.MODEL_FIELDS},
            ),
            overrides,
            **{
                name: FLAGS[name].value
                for name in ("step", "eval_name", "overwrite", "compare_only", "plot", "plot_over")
            },
            list_only=FLAGS.list,
        )


def define_flags():
    flags.DEFINE_multi_string("workdir", None, "Workdir(s) of trained runs (several: one comparison).")
    flags.DEFINE_string("data_dir", None, "The test split's folder (cifar-10-batches-bin/ ...) or tfds, every model's.")
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
    flags.DEFINE_bool("full", False, "Every evaluator and PR law on the whole test split (flags given still win).")
    flags.DEFINE_integer("step", None, "The model of this step of one --workdir, into WORKDIR/curve/step_N/.")
    flags.DEFINE_bool(
        "compare_only", False, "Do not evaluate; compare the saved evaluations (--eval_name's, else each one's only)."
    )
    flags.DEFINE_string(
        "eval_name",
        None,
        "The evaluation's name in its folder (default: from its settings, e.g. linf-8_255.table1.n500), kept beside "
        "the others (eval/, then evals/NAME/). With --compare_only: which to read.",
    )
    flags.DEFINE_bool("list", False, "List the evaluations each folder keeps, with their settings; evaluate nothing.")
    flags.DEFINE_bool(
        "overwrite",
        False,
        "Evaluate again and replace the evaluation of the same name, even one made otherwise; without it a saved "
        "evaluation holding this one's figures is reused, and one made otherwise under the same name is refused.",
    )
    flags.DEFINE_multi_string("torch_checkpoint", None, "A PyTorch state_dict file to evaluate (repeatable).")
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
        "With one --torch_checkpoint or --robustbench: where eval/ goes (default: the file without its suffix, "
        "or FILE_suffix where that is a run's workdir).",
    )
    flags.DEFINE_multi_string("robustbench", None, "A RobustBench CIFAR-10 zoo entry (docs/api.md; repeatable).")
    flags.DEFINE_enum(
        "robustbench_threat_model",
        "Linf",
        list(zoo.THREAT_MODELS),
        "With --robustbench: the zoo the entries are from (the attacks' threat model is --attack_norm's).",
    )
    flags.DEFINE_string("robustbench_dir", zoo.DEFAULT_MODEL_DIR, "With --robustbench: RobustBench's model_dir.")
    flags.DEFINE_string(
        "plot", None, "PNG path of the comparison's plot (default: in the first's evaluation, pr_vs_eps.png for PR)."
    )
    flags.DEFINE_enum("plot_over", "clean_correct", list(plots.PR_IMAGE_SETS), "The images the plot's PR is over.")


def cli():
    with cli_lib.defining_config_flags(sys.argv):
        define_flags()
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
