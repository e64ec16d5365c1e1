"""Where arrays live: the 1-D 'data' mesh that splits the global batch, and placement on it."""
from __future__ import annotations

import jax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from patjax.errors import UserError


def make_mesh(batch_size: int):
    """A 1-D 'data' mesh over the devices that share the global batch.

    Accelerators: all of them, and the batch must divide evenly. CPU devices (one per core,
    `cli.use_cpu_cores_as_devices`): the most that divide the batch, since they are a way to
    use the cores, not hardware the user chose. Auto axes: XLA propagates the batch sharding
    set in the step through the computation.
    """
    devices = jax.devices()
    count = len(devices)
    if jax.default_backend() == "cpu":
        count = max(k for k in range(1, count + 1) if batch_size % k == 0)
    elif batch_size % count:
        raise UserError(f"batch_size {batch_size} is not divisible by the {count} devices")
    return jax.make_mesh((count,), ("data",), axis_types=(jax.sharding.AxisType.Auto,),
                         devices=devices[:count])


def place_on_mesh(mesh, state, *arrays):
    """Replicates the train state and the device-resident data set over the mesh."""
    replicated = NamedSharding(mesh, P())
    return jax.device_put((state, *arrays), replicated)


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
