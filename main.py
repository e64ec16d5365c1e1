"""Train a classifier with PAT or a baseline.

  python main.py --config=configs/pat_cifar10.py --workdir=runs/pat_c10
  python main.py --config=configs/quickstart.py --workdir=runs/quickstart

CIFAR is read from --config.data_dir, else found ($PATJAX_DATA_DIR, a shared/data beside the
checkout, the download cache) or downloaded on first use (patjax.data.resolve_data_dir).

Running the same command again resumes from the latest checkpoint in --workdir.
"""

from absl import app, flags
from ml_collections import config_flags

from patjax import config, sharding, train
from patjax.cli import guarded, parse_flags, start

FLAGS = flags.FLAGS
config_flags.DEFINE_config_file("config", None, "Config file (configs/*.py).", lock_config=True)
flags.DEFINE_string("workdir", None, "Directory for the config, checkpoints and metrics.")
flags.DEFINE_integer(
    "stop_after_steps", None, "Stop (with a checkpoint) after this many steps of this invocation; rerun to resume."
)
flags.mark_flags_as_required(["config", "workdir"])


@guarded
def main(argv):
    start(argv)
    # The config is read here and nowhere below: typed, checked settings go down (the
    # evaluation's too, so that a bad one fails now, not after the training time was spent).
    settings = config.train_settings(FLAGS.config)
    state = train.train_and_evaluate(settings, FLAGS.workdir, stop_after_steps=FLAGS.stop_after_steps)
    if sharding.is_writer():
        print(train.closing_message(settings, FLAGS.workdir, int(state.step)))


if __name__ == "__main__":
    app.run(main, flags_parser=parse_flags)
