"""Command line: a run's model as a PyTorch state_dict, for PyTorch tools (AutoAttack,
RobustBench, torchattacks).

  python -m patjax.export --workdir=runs/pat_c10 --out=pat_c10.safetensors [--format=safetensors|pt] [--step=N]
      [--overwrite]

Writes the run's newest model (or the kept model / checkpoint of --step; `torch_weights.export_run`)
under the reference PyTorch names and layouts (`patjax.interop.torch_names`), with the run's input
normalization as the buffers mu and sigma. An existing --out is replaced only with --overwrite
(the refusal names the model the file holds, from its metadata). Load it into the matching network of
`patjax_torch.models` (the metadata of a .safetensors file names the network, its width and
dataset, and the run: its name, method, seed and step, no path of this machine):

  net = patjax_torch.models.create_model("resnet18", 10, normalize=patjax.models.networks.DATASET_STATS["cifar10"])
  net.load_state_dict({k: torch.from_numpy(v) for k, v in safetensors.numpy.load_file(FILE).items()})
"""

from __future__ import annotations

import os

from absl import app, flags

from patjax.core import cli as cli_lib
from patjax.core import paths
from patjax.core.errors import UserError
from patjax.interop import torch_weights

FLAGS = flags.FLAGS


def main(argv):
    cli_lib.start(argv)
    if not FLAGS.workdir or not FLAGS.out:
        raise UserError("--workdir and --out are required")
    paths.existing_folder("workdir", FLAGS.workdir)
    paths.output_file("out", FLAGS.out)
    suffix = os.path.splitext(FLAGS.out)[1].lower()
    if FLAGS.format is not None and torch_weights.FORMATS.get(FLAGS.format) != suffix:
        raise UserError(f"--format={FLAGS.format} needs --out ending in {torch_weights.FORMATS.get(FLAGS.format)}")
    if suffix not in torch_weights.FORMATS.values():
        raise UserError(f"--out must end in {' or '.join(torch_weights.FORMATS.values())}, got {FLAGS.out!r}")
    path, metadata = torch_weights.export_run(FLAGS.workdir, FLAGS.out, step=FLAGS.step, overwrite=FLAGS.overwrite)
    print(
        f"wrote {path}: {metadata['model']} of step {metadata['step']}, inputs normalized with the "
        f"{metadata['dataset']} statistics"
    )


def cli():
    flags.DEFINE_string("workdir", None, "A trained run (a checkpoint or a kept model).")
    flags.DEFINE_string("out", None, "The file to write: .safetensors or .pt.")
    flags.DEFINE_enum("format", None, sorted(torch_weights.FORMATS), "Optional; must agree with --out's suffix.")
    flags.DEFINE_integer("step", None, "Export the model of this step (default: the newest).")
    flags.DEFINE_bool("overwrite", False, "Replace an existing --out (refused without it).")
    app.run(cli_lib.guarded(main), flags_parser=cli_lib.parse_flags)


if __name__ == "__main__":
    cli()
