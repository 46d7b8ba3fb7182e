"""What ``sharding=`` may be given as, made the shardings ``Putter`` places by: a
``PartitionSpec`` (over the mesh ``jax.set_mesh`` set, as ``jax.device_put(x, P("data"))``
reads it), a device (its single-device sharding) and a ``NamedSharding`` over an
``AbstractMesh`` (the sharding of an explicit mesh's array type, ``jax.typeof(x).sharding``:
over the mesh set, whose devices it names), each refused with a remedy where no mesh is set.
"""

from __future__ import annotations

from typing import Any

import jax
from jax.sharding import NamedSharding, PartitionSpec, Sharding

from jaxloader.base.errors import ConfigError
from jaxloader.base.one_device import one_device


def _is_placement(x: Any) -> bool:
    return isinstance(x, (Sharding, PartitionSpec, jax.Device))


_ABSTRACT = getattr(jax.sharding, "AbstractMesh", ())  # (a mesh of axes, with no devices)


def _concrete(sharding: NamedSharding) -> NamedSharding:
    """``sharding`` over an ``AbstractMesh`` (``jax.typeof(x).sharding``, as an explicit mesh
    types an array) made one over the mesh ``jax.set_mesh`` set, of the same axes; refused
    where none is (JAX's bare ValueError, "device_set is not implemented")."""
    mesh = jax.sharding.get_mesh()
    if not isinstance(mesh, _ABSTRACT) and dict(mesh.shape) == dict(sharding.mesh.shape):
        return NamedSharding(mesh, sharding.spec, memory_kind=sharding.memory_kind)
    raise ConfigError(
        f"sharding: {sharding} is over an AbstractMesh (the sharding of an array's type, "
        "jax.typeof(x).sharding), which names no devices; pass NamedSharding(mesh, "
        f"{sharding.spec}) over the mesh itself, or create the loader inside `with "
        f"jax.set_mesh(mesh):` (a mesh of axes {dict(sharding.mesh.shape)})")


def as_shardings(sharding: Any) -> Any:
    """``sharding`` with each ``PartitionSpec`` made a ``NamedSharding`` over the mesh set by
    ``jax.set_mesh`` (as ``jax.device_put(x, P("data"))`` reads it there) and each device its
    single-device sharding (``base.one_device``); other leaves as they are.

    Example:
        >>> from jax.sharding import PartitionSpec as P
        >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
        >>> with jax.set_mesh(mesh):
        ...     placed = as_shardings({"x": P("data")})
        >>> placed["x"] == NamedSharding(mesh, P("data"))
        True
    """
    def one(x: Any) -> Any:
        if isinstance(x, jax.Device):
            return one_device(x)
        if isinstance(x, NamedSharding) and isinstance(x.mesh, _ABSTRACT):
            return _concrete(x)
        if not isinstance(x, PartitionSpec):
            return x
        mesh = jax.sharding.get_mesh()
        if not mesh.axis_names:
            raise ConfigError(
                f"sharding: got {x}, a PartitionSpec, with no mesh set to name its axes; "
                f"create the loader inside `with jax.set_mesh(mesh):`, or pass "
                f"NamedSharding(mesh, {x}) (jaxloader.data_sharding(mesh, 'data') for data "
                "parallelism)")
        free = getattr(PartitionSpec, "UNCONSTRAINED", None)  # (no axis: JAX's choice)
        named = [a for part in x if part is not None and part is not free
                 for a in (part if isinstance(part, tuple) else (part,))]
        unknown = [a for a in named if a not in mesh.axis_names]
        if unknown:  # (JAX's own ValueError named no remedy, unlike data_sharding's)
            raise ConfigError(
                f"sharding: {x} names the axis {unknown[0]!r}, which the mesh set has not: its "
                f"axes are {tuple(mesh.axis_names)}; name one of those (a typo?)")
        return NamedSharding(mesh, x)
    return jax.tree_util.tree_map(one, sharding, is_leaf=_is_placement)


def local_only(sharding: Any) -> bool:
    """Whether every device ``sharding`` places on is this process's (a mesh of
    ``jax.local_devices()``: a loader of ``process_count=1`` places its own batch there);
    devices and specs as placed (``as_shardings``), ``False`` where none names devices."""
    try:
        placed = jax.tree_util.tree_leaves(as_shardings(sharding),
                                           is_leaf=lambda x: isinstance(x, Sharding))
        devices = [d for s in placed for d in s.device_set]
    except (ValueError, AttributeError, ConfigError):  # (an AbstractMesh's, no mesh set)
        return False
    return bool(devices) and all(d.process_index == jax.process_index() for d in devices)
