"""A batch's leaves against the sharding that places them (``sharding.put``): a leaf whose
axis the mesh cannot split, told which and how to make it fit, and a ``None`` in the
sharding's tree over a leaf the devices take, refused (JAX places that leaf on one device).

Example:
    >>> import jax, numpy as np
    >>> from jax.sharding import NamedSharding, PartitionSpec as P
    >>> mesh = jax.make_mesh((1,), ("data",))
    >>> undivided((8, 7), NamedSharding(mesh, P("data")), process_count=1) is None
    True
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import jax
import numpy as np
from jax.sharding import Sharding

from jaxloader.base.columns import host_only
from jaxloader.base.errors import ConfigError


def undivided(shape: tuple, sharding: Sharding, process_count: int) -> str | None:
    """The first axis of a leaf of local ``shape`` that ``sharding``'s mesh axes do not
    divide, said with its remedy (a padded leaf's: a length that they divide); None."""
    mesh, spec = getattr(sharding, "mesh", None), getattr(sharding, "spec", None)
    if mesh is None or spec is None:
        return None
    for axis, names in enumerate(tuple(spec)[:len(shape)]):
        names = () if names is None else (names,) if isinstance(names, str) else tuple(names)
        ways = int(np.prod([mesh.shape[n] for n in names], dtype=np.int64))
        size = shape[axis] * (process_count if axis == 0 else 1)
        if ways > 1 and size % ways:
            return (f"its axis {axis} ({size}{' rows, the global batch' if axis == 0 else ''}) "
                    f"is split over mesh axis {'x'.join(map(str, names))} of {ways} devices, "
                    f"which must divide it; " + (
                        "make batch_size x process_count a multiple of it" if axis == 0 else
                        f"make it a multiple of {ways} (a padded leaf: Pad(keys, multiple_of="
                        f"{ways}), or a length= that {ways} divides)"))
    return None


def refuse_none_over_leaf(paths: list[tuple], batch: Any, devices: list) -> list:
    """Refuses a ``None`` in the sharding's tree (at one of ``paths``) over a leaf of the batch
    that goes to the devices: JAX placed it whole on its first device, without a word, where
    the rest went to ``devices`` (a batch's ``None``, a leaf absent, is fine). Returns ``[]``."""
    for path in paths:
        under: Any = batch
        try:
            for key in path:
                under = (under[key.key] if hasattr(key, "key") else under[key.idx]
                         if hasattr(key, "idx") else getattr(under, key.name))
        except (KeyError, IndexError, TypeError, AttributeError):
            continue  # (not in the batch: its tree is said not to match where placed)
        placed = [leaf for leaf in jax.tree_util.tree_leaves(under)
                  if not host_only(getattr(leaf, "dtype", np.dtype(np.float32)))]
        if placed:
            several = jax.process_count() > 1  # (each process reads its own rows of every leaf)
            raise ConfigError(
                f"sharding: its tree holds None at {jax.tree_util.keystr(path) or '<root>'}, "
                f"over the batch's leaf of shape {np.shape(placed[0])}: JAX places it whole on "
                f"one device" + ("" if several else f" ({jax.devices()[0]})") + ", where the "
                f"other leaves go to {_devices_said(devices)}; give it a sharding: " + (
                    "jl.data_sharding(mesh), its rows split as the other leaves' (each of the "
                    "processes reads its own rows of every leaf: a leaf whole on each device, "
                    "or on one, is not to be had)" if several else
                    "NamedSharding(mesh, P()) places it whole on each device, "
                    "jl.data_sharding(mesh) splits its rows, a device itself puts it there"))
    return []


def rows_remedy(sharding: Any, me: int, process_count: int, G: int, held: int) -> str:
    """Why ``sharding`` gives process ``me``'s devices ``held`` rows of the global batch of
    ``G`` where it reads ``G // process_count``, and what to do (``sharding.put``'s refusal)."""
    counts = Counter(d.process_index for d in sharding.device_set)
    if set(counts) == {me}:
        return ("its mesh holds this process's devices alone (jax.local_devices()); make the "
                "mesh over every process's, jax.devices() (jax.make_mesh), so that the batch "
                "axis spans the processes")
    whole = (f"or give each process the whole batch and place it yourself: drop sharding= "
             f"and pass process_index=0, process_count=1, batch_size={G}, then each step "
             "jax.make_array_from_process_local_data(sharding, batch)")
    shares = [counts.get(p, 0) for p in range(process_count)]
    if held < G and len(set(shares)) > 1:  # (split, but unevenly: each device its share)
        said = ", ".join(f"process {p}: {n}" for p, n in enumerate(shares))
        return (f"the processes hold unequal numbers of its devices ({said}), and each "
                "device takes an equal share of the rows, where each process reads the same "
                "batch_size: make the mesh of as many devices of each process (jax.make_mesh "
                "over jax.devices()), " + whole)
    if G // process_count < held < G:  # (split over fewer parts than processes)
        return (f"the batch axis is split into {G // held} parts where {process_count} "
                "processes each read their own, so processes share rows: the mesh's other "
                "axes span processes too; lay the mesh out so that the batch axis alone spans "
                "the processes (each process's devices along the other axes), " + whole)
    return ("the batch axis is not split across the processes; shard it over a mesh axis "
            "that spans them (data_sharding(mesh, 'data'), 'data' first in the mesh), " + whole)


def _devices_said(devices: list) -> str:
    return (f"{devices[0]}" if len(devices) == 1 else
            f"{len(devices)} devices ({', '.join(map(str, devices[:4]))}"
            + (", ..." if len(devices) > 4 else "") + ")")
