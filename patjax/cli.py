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
