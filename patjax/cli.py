"""Command-line glue: user errors become one line on stderr and exit status 2, no traceback;
on a CPU host, every usable core becomes a JAX device (data parallelism, see below)."""
from __future__ import annotations

import os
import sys
from typing import Callable

from patjax.errors import UserError


def use_cpu_cores_as_devices() -> int:
    """Expose one JAX CPU device per usable core; returns the count requested (0: unchanged).

    XLA:CPU runs one convolution on one core at these small CIFAR shapes: a single device
    left the second core of a 2-core machine nearly idle (ResNet-18 PAT step, batch 32:
    4.3 images/s on one device with both cores, 4.2 pinned to one core). With one device
    per core the train step's batch is split over a 'data' mesh (train.make_mesh), and the
    sampler of each half runs on its own core (benchmarks/README.md). The math is the same
    on any number of devices (tests/test_sharding.py); float sums are ordered differently.

    PATJAX_CPU_DEVICES=N overrides the count (1: a single device, as plain JAX); an
    explicit --xla_force_host_platform_device_count in XLA_FLAGS is left alone. Must run
    before JAX initializes its backends; afterwards it does nothing.
    """
    import jax

    if "xla_force_host_platform_device_count" in os.environ.get("XLA_FLAGS", ""):
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
    return count


def guarded(main: Callable) -> Callable:
    def wrapped(argv):
        try:
            use_cpu_cores_as_devices()
            return main(argv)
        except UserError as error:
            print(f"error: {error}", file=sys.stderr)
            sys.exit(2)
        except KeyboardInterrupt:
            print("interrupted; the latest complete checkpoint is kept", file=sys.stderr)
            sys.exit(130)
    return wrapped


def parse_flags(argv):
    """absl's flag parsing, with a config file that cannot be loaded (a missing path, a field
    the config does not have, a value of the wrong type) reported in one line, exit 2.

    ml_collections' config flags load the file and apply `--config.x=...` overrides while absl
    parses the command line, before `main` (and `guarded`) run, and raise plain Python errors
    there (or, for a missing file, leave a stand-in that raises on first use). absl's own flag
    errors (an unknown flag, a value of the wrong type) are reported the same way.
    """
    from absl import flags

    try:
        args = flags.FLAGS(argv)
        config = flags.FLAGS["config"].value if "config" in flags.FLAGS else None
        if config is not None:
            config.keys()  # a config that failed to load is a stand-in that raises on any use
        return args
    except flags.Error as error:
        print(f"error: {_one_line(error)} (--helpshort lists the flags)", file=sys.stderr)
        sys.exit(2)
    except (OSError, AttributeError, KeyError, TypeError, ValueError, SyntaxError) as error:
        detail = _one_line(error) or type(error).__name__
        print(f"error: cannot load the config given on the command line: {type(error).__name__}: {detail}",
              file=sys.stderr)
        sys.exit(2)


def _one_line(error: BaseException) -> str:
    return " ".join(str(error).split())
