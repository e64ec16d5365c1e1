"""Command-line glue: user errors become one line on stderr and exit status 2, no traceback;
on a CPU host, every usable core becomes a JAX device (data parallelism, see below)."""

from __future__ import annotations

import contextlib
import os
import re
import sys
from typing import Callable, Mapping

import jax
from absl import flags, logging

from patjax.core.errors import UserError, one_line


def intra_op_threads(devices: int) -> int:
    """Size of XLA:CPU's intra-op thread pool for `devices` CPU devices in one process.

    Why not the core count (XLA's default): with several CPU devices in one process, an
    all-reduce is a rendezvous that blocks a thread of this one shared pool until every
    device reaches it. XLA orders collectives by *scheduling* edges only (a collective may
    start once the previous one has started, not finished), so a device can hold several
    collectives at once, e.g. a BatchNorm all-reduce of the clean forward pass while a PGD
    loop whose body holds BatchNorm all-reduces runs beside it. When one device runs ahead
    (other processes on the cores delay the other), its blocked collectives can take every
    thread of a core-sized pool; the lagging device then has no thread left to reach them
    and both wait until XLA aborts the process (docs/device_layer.md has the trace). A pool
    with room for every device's blocked collectives plus the threads that compute keeps
    the lagging device running. Blocked threads sleep, so the extra threads cost no CPU.
    """
    cores = len(os.sched_getaffinity(0))
    return max(cores, 4 * devices) if devices > 1 else cores


def use_cpu_cores_as_devices() -> int:
    """Expose one JAX CPU device per usable core; returns the count requested (0: unchanged).

    XLA:CPU runs one convolution on one core at these small CIFAR shapes, so a single device
    leaves the other cores nearly idle; with one device per core the train step's batch is
    split over a 'data' mesh (sharding.make_mesh) and each share runs on its own core
    (benchmarks/README.md). The math is the same on any number of devices
    (tests/test_sharding.py); float sums are ordered differently. Also sizes XLA's intra-op
    thread pool for that many devices (`intra_op_threads`) unless PJRT_NPROC is set.

    PATJAX_CPU_DEVICES=N overrides the count (1: a single device, as plain JAX); an
    explicit --xla_force_host_platform_device_count in XLA_FLAGS is left alone. Must run
    before JAX initializes its backends; afterwards it does nothing.
    """
    forced = re.search(r"xla_force_host_platform_device_count=(\d+)", os.environ.get("XLA_FLAGS", ""))
    if forced:
        os.environ.setdefault("PJRT_NPROC", str(intra_op_threads(int(forced.group(1)))))
        return 0
    requested = os.environ.get("PATJAX_CPU_DEVICES", "")
    try:
        count = int(requested) if requested else len(os.sched_getaffinity(0))
    except ValueError:
        raise UserError(f"PATJAX_CPU_DEVICES must be a positive integer, got {requested!r}") from None
    if count < 1:
        raise UserError(f"PATJAX_CPU_DEVICES must be a positive integer, got {requested!r}")
    try:
        jax.config.update("jax_num_cpu_devices", count)
    except RuntimeError:  # JAX refuses once its backends are initialized (e.g. called in-process twice)
        return 0
    os.environ.setdefault("PJRT_NPROC", str(intra_op_threads(count)))  # read when the CPU client starts
    return count


def initialize_distributed() -> int:
    """Starts jax.distributed when the environment asks for it; returns the process count.

    PATJAX_COORDINATOR=host:port with PATJAX_NUM_PROCESSES=N and PATJAX_PROCESS_ID=i (what
    a launcher script sets), or PATJAX_DISTRIBUTED=auto, which lets JAX read the cluster's
    own variables (SLURM, Open MPI, cloud TPU/GPU launchers). Neither: one process, nothing
    started. Must run before JAX initializes its backends. On a CPU host each process then
    defaults to one device (PATJAX_CPU_DEVICES overrides): start one process per core.
    """
    coordinator = os.environ.get("PATJAX_COORDINATOR", "")
    auto = os.environ.get("PATJAX_DISTRIBUTED", "") == "auto"
    if not coordinator and not auto:
        return 1
    if coordinator:
        try:
            num_processes = int(os.environ["PATJAX_NUM_PROCESSES"])
            process_id = int(os.environ["PATJAX_PROCESS_ID"])
        except (KeyError, ValueError):
            raise UserError("PATJAX_COORDINATOR needs PATJAX_NUM_PROCESSES and PATJAX_PROCESS_ID (integers)") from None
        if not 0 <= process_id < num_processes:
            raise UserError(f"PATJAX_PROCESS_ID must be in [0, {num_processes}), got {process_id}")
        kwargs = dict(coordinator_address=coordinator, num_processes=num_processes, process_id=process_id)
    else:
        kwargs = {}
    os.environ.setdefault("PATJAX_CPU_DEVICES", "1")
    jax.distributed.initialize(**kwargs)
    return jax.process_count()


def guarded(main: Callable) -> Callable:
    def wrapped(argv):
        try:
            initialize_distributed()
            use_cpu_cores_as_devices()
            return main(argv)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted; the latest complete checkpoint is kept", file=sys.stderr)
            sys.exit(130)

    return wrapped


@contextlib.contextmanager
def named_as_flags(settings: Mapping[str, str]):
    """Within it, a UserError about a setting that came from a flag names the flag the user
    typed: {"eval.pr_samples": "pr_samples"} turns `eval.pr_samples must be ...` into
    `--pr_samples must be ...`. The settings' own checks name the field, which is what a caller
    of the library or a config file set; on a command line that name was never typed."""
    try:
        yield
    except UserError as error:
        message = str(error)
        for setting, flag in settings.items():
            if message.startswith(f"{setting} "):
                raise type(error)(f"--{flag}{message[len(setting) :]}") from None
        raise


def given(*names: str) -> list:
    """The flags among `names` that the command line sets."""
    return [name for name in names if flags.FLAGS[name].present]


def start(argv) -> None:
    """What every command line does first: no positional arguments, and Orbax's and JAX's
    INFO lines kept out of the way unless --verbosity asks for them."""
    if len(argv) > 1:
        raise UserError(f"unexpected arguments: {' '.join(argv[1:])}")
    if not flags.FLAGS["verbosity"].present:
        logging.set_verbosity(logging.WARNING)


def parse_flags(argv):
    """absl's flag parsing, with a config file that cannot be loaded (a missing path, a field
    the config does not have, a value of the wrong type) reported in one line, exit 2.

    ml_collections' config flags load the file and apply `--config.x=...` overrides while absl
    parses the command line, before `main` (and `guarded`) run, and raise plain Python errors
    there (or, for a missing file, leave a stand-in that raises on first use). absl's own flag
    errors (an unknown flag, a value of the wrong type) are reported the same way.
    """
    # A console script's (patjax-train's) main module is its wrapper, not the patjax module that
    # defined the flags; --helpshort lists the main module's key flags, so they are made its own.
    for module, defined in list(flags.FLAGS.flags_by_module_dict().items()):
        if module.startswith("patjax."):
            for flag in defined:
                flags.FLAGS.register_key_flag_for_module(argv[0], flag)
    try:
        args = flags.FLAGS(argv)
        config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
        if config is not None:
            config.keys()  # a config that failed to load is a stand-in that raises on any use
        return args
    except flags.Error as error:
        # absl wraps a ValueError from a flag's parser, and UserError is one: the config file's
        # loader's own line names the file and what is wrong, without absl's frame around it.
        cause = error.__cause__ or error.__context__
        if isinstance(cause, UserError):
            print(f"error: {cause}", file=sys.stderr)
        else:
            print(f"error: {one_line(error)} (--helpshort lists the flags)", file=sys.stderr)
        sys.exit(2)
    except UserError as error:  # a config file that the command's own loader refuses
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    except (OSError, AttributeError, KeyError, TypeError, ValueError, SyntaxError) as error:
        detail = one_line(error) or type(error).__name__
        print(
            f"error: cannot load the config given on the command line: {type(error).__name__}: {detail}",
            file=sys.stderr,
        )
        sys.exit(2)


# Path flags: each command checks its paths with these before it reads or writes anything, so a
# path of the wrong kind is one line naming the flag, never a traceback from deep inside or a
# command that succeeds having done nothing.


def existing_folder(flag: str, path: str) -> str:
    """A folder the command reads (a workdir, a data folder): it must exist."""
    if not os.path.exists(path):
        raise UserError(f"--{flag}={path}: no such folder")
    if not os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a file, not a folder")
    return path


def existing_file(flag: str, path: str) -> str:
    """A file the command reads: it must exist and not be a folder."""
    if not os.path.exists(path):
        raise UserError(f"--{flag}={path}: no such file")
    if os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a folder, not a file")
    return path


def output_folder(flag: str, path: str) -> str:
    """A folder the command writes into: an existing folder, or one it can create."""
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a file, not a folder")
    _creatable(flag, path, path)
    return path


def output_file(flag: str, path: str) -> str:
    """A file the command writes: not a folder, in a folder that exists or can be created."""
    if os.path.isdir(path):
        raise UserError(f"--{flag}={path}: is a folder; name the file to write")
    if os.path.islink(path) and not os.path.exists(path):  # writing would replace the link, not fill its target
        raise UserError(
            f"--{flag}={path}: is a symbolic link to {os.readlink(path)}, which does not exist; "
            "remove the link or name another file"
        )
    _creatable(flag, path, os.path.dirname(os.path.abspath(path)))
    return path


def _creatable(flag: str, value: str, folder: str) -> None:
    """The folder (of flag's value) exists, or its nearest existing ancestor is a folder this
    process may write in."""
    ancestor = os.path.abspath(folder)
    while not os.path.exists(ancestor):
        ancestor = os.path.dirname(ancestor)
    if not os.path.isdir(ancestor):
        raise UserError(f"--{flag}={value}: {ancestor} is a file, so nothing can be made under it")
    if ancestor != os.path.abspath(folder) and not os.access(ancestor, os.W_OK | os.X_OK):
        raise UserError(f"--{flag}={value}: cannot create it, {ancestor} is not writable")
