"""Where arrays live: the 1-D 'data' mesh that splits the global batch, and placement on it."""

from __future__ import annotations

import contextlib
from typing import Any

import jax
import numpy as np
from jax.experimental import multihost_utils
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from patjax.core import locks
from patjax.core.errors import UserError


def make_mesh(batch_size: int):
    """A 1-D 'data' mesh over the devices that share the global batch.

    Accelerators, and every device of a multi-process run: all of them, and the batch must
    divide evenly (a process left out of the mesh would hold no part of any array). CPU
    devices of one process (one per core, `devices.use_cpu_cores_as_devices`): the most that
    divide the batch, since they are a way to use the cores, not hardware the user chose.
    Auto axes: XLA propagates the batch sharding set in the step through the computation.
    """
    devices = jax.devices()
    count = len(devices)
    if jax.default_backend() == "cpu" and jax.process_count() == 1:
        count = max(k for k in range(1, count + 1) if batch_size % k == 0)
    elif batch_size % count:
        raise UserError(f"batch_size {batch_size} is not divisible by the {count} devices")
    return jax.make_mesh((count,), ("data",), axis_types=(jax.sharding.AxisType.Auto,), devices=devices[:count])


def place_on_mesh(mesh, state, *arrays):
    """Replicates the train state and the device-resident data set over the mesh.

    Every process holds the same host values (the same seed, the whole CIFAR split), so each
    fills its own devices from them: `make_array_from_callback` moves nothing between
    processes, where `device_put` onto a global sharding would all-gather every array to
    check that the processes agree. Arrays already on the mesh (a restored state) stay.
    """
    replicated = NamedSharding(mesh, P())

    def place(x):
        if isinstance(x, jax.Array) and x.sharding == replicated:
            return x
        host = np.asarray(x)
        return jax.make_array_from_callback(host.shape, replicated, lambda index: host[index])

    return jax.tree.map(place, (state, *arrays))


def shard_batch(mesh, *arrays):
    """Host arrays of the global batch (the same on every process), split over 'data'."""
    split = NamedSharding(mesh, P("data"))
    return tuple(jax.make_array_from_callback(a.shape, split, lambda index, a=a: a[index]) for a in arrays)


def to_host(tree):
    """Every element of `tree` as numpy on every process (an all-gather across processes)."""
    if jax.process_count() == 1:
        return jax.device_get(tree)
    return multihost_utils.process_allgather(tree, tiled=True)


def process0_decides(flag: bool) -> bool:
    """Process 0's value of flag on every process: a decision every process must take alike
    (e.g. to stop after this step, or the others wait in the next step's collectives forever)."""
    if jax.process_count() == 1:
        return bool(flag)
    return bool(multihost_utils.broadcast_one_to_all(np.asarray(flag)))


def is_writer() -> bool:
    """Process 0 writes the workdir's files (config, metrics, results); checkpoints are saved by
    every process, as Orbax requires."""
    return jax.process_index() == 0


def writer_lock(workdir: str, role: str, **kwargs):
    """The workdir's lock (`locks.exclusive`), taken by process 0 alone: it writes the workdir's
    files for every process of the run; the others take nothing."""
    return locks.exclusive(workdir, role, **kwargs) if is_writer() else contextlib.nullcontext()


def batch_sharding_for(mesh):
    """The sharding the step gives its batch: split over 'data' (None on a single device)."""
    return NamedSharding(mesh, P("data")) if mesh.size > 1 else None


def replicated_target(state: Any, mesh) -> Any:
    """Abstract `state` (arrays or ShapeDtypeStructs) placed replicated over `mesh`.

    Restoring onto these shardings lets Orbax reshard a checkpoint written on any number of
    devices (or processes) onto the devices this process has.
    """
    sharding = NamedSharding(mesh, P())
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=sharding), state)
