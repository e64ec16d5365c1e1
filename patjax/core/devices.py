"""The devices and processes a command runs on: on a CPU host every usable core becomes a JAX
device (data parallelism, `use_cpu_cores_as_devices`), with an intra-op thread pool sized for
them; several processes start `jax.distributed` from the environment. Each must run before JAX
initializes its backends."""

from __future__ import annotations

import os
import re

import jax

from patjax.core.errors import UserError


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
    (tests/core/test_sharding.py); float sums are ordered differently. Also sizes XLA's intra-op
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
