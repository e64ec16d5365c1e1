"""Command line: train a classifier with PAT or a baseline (`patjax-train`; `python main.py` in a
checkout runs the same).

  patjax-train --config=quickstart --workdir=runs/quickstart
  patjax-train --config=pat_cifar10 --workdir=runs/pat_c10
  python main.py --config=configs/pat_cifar10.py --workdir=runs/pat_c10

--config is a config file (a `get_config()` module) or the name of a shipped one
(`patjax.configs.NAMES`). CIFAR is read from --config.data_dir, else found ($PATJAX_DATA_DIR, a
shared/data beside the checkout, the download cache) or downloaded on first use
(patjax.data.cifar.resolve_data_dir). Running the same command again resumes from the latest
checkpoint in --workdir.
"""

from __future__ import annotations

import os
import sys

from absl import app, flags
from ml_collections import config_flags

from patjax import configs
from patjax.attacks import l2
from patjax.core import cli as cli_lib
from patjax.core import paths, sharding
from patjax.reporting import report
from patjax.run import config, train

FLAGS = flags.FLAGS


def shipped_config(argv: list[str]) -> list[str]:
    """argv with a --config that names a shipped config (`quickstart`) instead of a file
    replaced by that config's file: ml_collections' config flag loads files only. A value that
    is an existing file stays a file, so a local file named like a shipped config wins."""
    out = list(argv)
    for i, arg in enumerate(argv):
        if arg.startswith("--config="):
            name, prefix, at = arg[len("--config=") :], "--config=", i
        elif arg == "--config" and i + 1 < len(argv):
            name, prefix, at = argv[i + 1], "", i + 1
        else:
            continue
        # Only a file shadows the name: a folder named like a config is the run's workdir
        # (`--config=quickstart --workdir=quickstart`) when the command runs a second time.
        if name in configs.NAMES and not os.path.isfile(name):
            out[at] = prefix + configs.path(name)
    return out


@cli_lib.guarded
def main(argv):
    cli_lib.start(argv)
    paths.output_folder("workdir", FLAGS.workdir)
    complete_threat_models(FLAGS.config, config_flags.get_override_values(FLAGS["config"]))
    # The config is read here and nowhere below: typed, checked settings go down (the
    # evaluation's too, so that a bad one fails now, not after the training time was spent).
    settings = config.train_settings(FLAGS.config)
    state = train.train_run(
        settings,
        FLAGS.workdir,
        stop_after_steps=FLAGS.stop_after_steps,
        stop_at=cli_lib.stop_time(FLAGS.max_minutes),
    )
    if sharding.is_writer():
        print(train.closing_message(settings, FLAGS.workdir, int(state.step)))


def complete_threat_models(cfg, given: dict) -> None:
    """A threat model whose norm the command line sets (--config.attack.norm=l2), or the config
    file (`config.radii_of_another_norm`), without its radius or step takes the norm's standard
    ones (`l2.with_norm_radii`), said in one line."""
    in_file = config.radii_of_another_norm(cfg, given)
    for names in config.CONFIG_THREATS:
        filled = {k: v for k, v in l2.with_norm_radii(given, *names).items() if k not in given}
        from_file = {k: v for k, v in in_file.items() if k in names}
        cfg.update_from_flattened_dict({**filled, **from_file})
        if filled and sharding.is_writer():
            flags_given = {f"--config.{k}": v for k, v in filled.items()}
            print(report.norm_radii_line(f"--config.{names[0]}", given[names[0]], flags_given))
        if from_file and sharding.is_writer():
            print(report.norm_radii_line(f"the config's {names[0]}", cfg[names[0]], from_file))


class _ConfigFile(flags.ArgumentParser):
    """The parser of --config in place of ml_collections' own, which lets most ways a config file
    can fail through as tracebacks or defers them: `configs.load_file`, one line naming the file."""

    def parse(self, argument):
        cfg = configs.load_file(argument)
        cfg.lock()  # as lock_config=True: an override of a field the config lacks is refused
        return cfg

    def flag_type(self):
        return "config object"


def define_flags():
    # Every float field given as --config.x=... reads fractions too (--config.attack.epsilon=8/255):
    # ml_collections' public hook for the parser of a field's type.
    config_flags.register_flag_parser_for_type(float, cli_lib.FractionParser())
    config_flags.DEFINE_config_file(
        "config",
        None,
        f"Config file (a get_config() module) or a shipped config: {', '.join(configs.NAMES)}.",
        lock_config=True,
    )
    # DEFINE_config_file takes no parser; its flag parses through this attribute (absl's Flag.parser).
    FLAGS["config"].parser = _ConfigFile()
    flags.DEFINE_string("workdir", None, "Directory for the config, checkpoints and metrics.")
    flags.DEFINE_integer(
        "stop_after_steps",
        None,
        "Stop (with a checkpoint) after this many steps of this invocation; rerun to resume.",
    )
    flags.DEFINE_float(
        "max_minutes",
        None,
        "Stop (with a checkpoint) once this invocation has run this many minutes, after the step "
        "under way: a job's or a session's time limit; rerun to resume.",
    )
    flags.mark_flags_as_required(["config", "workdir"])


def cli():
    define_flags()
    app.run(main, argv=shipped_config(sys.argv), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
