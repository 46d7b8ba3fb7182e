"""Host batch -> sharded ``jax.Array``s, on one host or many.

- One process: ``jax.device_put(leaf, sharding)``.
- Several processes: each passes its local rows to
  ``jax.make_array_from_process_local_data(sharding, local, global_shape)`` and gets the global
  array; the global batch is ``batch_size * process_count`` rows.

``sharding`` is one ``jax.sharding.Sharding`` for every leaf, or a pytree of them that is a
prefix of the batch (one per leaf or per subtree); a ``PartitionSpec`` stands for a
``NamedSharding`` over the mesh of ``jax.set_mesh``, and a device for that device.
``data_sharding(mesh, "data")`` builds the usual data-parallel one: the batch axis split over
the mesh axis ``"data"``, the other axes (and the other mesh axes) replicated. Object leaves
(strings, bytes), fixed-width strings and dates, which JAX has no type for, stay NumPy arrays.

Example:
    >>> import jax, numpy as np
    >>> mesh = jax.make_mesh((jax.device_count(),), ("data",))
    >>> put = Putter(data_sharding(mesh), process_count=1)
    >>> put({"x": np.zeros((jax.device_count() * 2, 3))})["x"].sharding == data_sharding(mesh)
    True
"""

from __future__ import annotations

import math
import warnings
from typing import Any, Iterable

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec, Sharding

from jaxloader.base import tree as tree_lib
from jaxloader.base.columns import device_dtype_problem, host_only
from jaxloader.base.errors import ConfigError, JaxloaderWarning
from jaxloader.base.one_device import is_one_device
from jaxloader.batching.collate import own_if_small
from jaxloader.sharding.given import as_shardings
from jaxloader.sharding.leaf_checks import refuse_none_over_leaf, rows_remedy, undivided
from jaxloader.sharding.x64 import check_32_bits
from jaxloader.workers.ring import SMALL_LEAF  # (a leaf this small is placed from a copy)


def data_sharding(mesh: Mesh, data_axis: str | tuple[str, ...] = "data") -> NamedSharding:
    """The batch axis split over ``data_axis`` of ``mesh``; everything else replicated.

    Example:
        >>> import jax, jaxloader as jl
        >>> mesh = jax.make_mesh((jax.device_count(), 1), ("data", "model"))
        >>> jl.data_sharding(mesh).spec == jax.sharding.PartitionSpec("data")
        True
    """
    if not isinstance(mesh, Mesh):
        raise ConfigError(
            f"data_sharding(mesh): expected a jax.sharding.Mesh, got {type(mesh).__name__} "
            f"{mesh!r:.80}; make one with jax.make_mesh((jax.device_count(),), ('data',))")
    axes = (data_axis,) if isinstance(data_axis, str) else tuple(
        data_axis if isinstance(data_axis, Iterable) and not isinstance(data_axis, bytes)
        else ())  # (a list, a tuple, a config's list)
    if not axes or not all(isinstance(a, str) for a in axes):  # ([]: every device whole)
        raise ConfigError(
            f"data_sharding(mesh, data_axis): expected a mesh axis's name or a non-empty tuple "
            f"of them, got {data_axis!r:.80}; the mesh's axes are {tuple(mesh.axis_names)}")
    missing = [a for a in axes if a not in mesh.axis_names]
    if missing:
        raise ConfigError(
            f"data_sharding: mesh axis {missing[0]!r} not in the mesh, whose axes are "
            f"{tuple(mesh.axis_names)}; pass data_axis= one of them"
        )
    return NamedSharding(mesh, PartitionSpec(axes[0] if len(axes) == 1 else axes))


_PARTIAL_REMEDY = "pass last_batch='pad' (full batches, a mask on the padding rows) or 'drop'"
_NUMERIC = np.dtype(np.float32)  # what a leaf without a dtype counts as: not an object leaf


def _is_sharding(x: Any) -> bool:
    return isinstance(x, Sharding)


def _a_row_each(leaf: Any) -> bool:
    """A 1-D leaf: a value a row (the pad mask, a Pad's lengths, a label), placed by the batch
    axis alone."""
    return isinstance(leaf, np.ndarray) and leaf.ndim == 1


def _devices_remedy(devices: list | tuple, batch: Any) -> str:
    """What a list or tuple of devices given as the sharding does, and what was likely meant.

    Example:
        >>> print(_devices_remedy(jax.devices()[:1], {"x": 0}))  # doctest: +ELLIPSIS
        a list of 1 device(s) puts a list batch's element i on device i; to put ...: jax.devices()[0]
    """
    n, kind, made = len(devices), type(devices).__name__, type(batch)
    named = "jax.devices()" if list(devices) == jax.devices() else "your_devices"
    said = f"a {kind} of {n} device(s) puts a {kind} batch's element i on device i"
    if isinstance(batch, (list, tuple)) and made is not type(devices) and len(batch) == n:
        spread = f"*{named}" if hasattr(made, "_fields") else named  # (a namedtuple's fields)
        said += f" (this batch is a {made.__name__}: {made.__name__}({spread}))"
    if n > 1:
        return said + ("; to split each batch's rows over them, pass jaxloader.data_sharding("
                       f"jax.make_mesh(({n},), ('data',), devices={named}))")
    at = jax.devices().index(devices[0]) if devices[0] in jax.devices() else None
    return said + ("; to put each whole batch on one device, pass the device itself: "
                   + (f"jax.devices()[{at}]" if at is not None else "your_devices[0]"))


class Putter:
    """Turns a host batch (pytree of NumPy arrays) into a batch of global ``jax.Array``s."""

    def __init__(self, sharding: Any, process_count: int, batch_size: int | None = None) -> None:
        # (jax.devices() as the sharding: a tree of one device a leaf, refused at the first
        # batch as a tree the batch's is not; that error says what was meant)
        self._devices = sharding if isinstance(sharding, (list, tuple)) and sharding and all(
            isinstance(d, jax.Device) for d in sharding) else None
        sharding = as_shardings(sharding)
        leaves = jax.tree_util.tree_leaves(sharding, is_leaf=_is_sharding)
        loose = next((s for s in leaves if isinstance(s, NamedSharding) and any(
            e is PartitionSpec.UNCONSTRAINED for e in s.spec)), None)
        if loose is not None:  # (a TypeError as made, or a KeyError at next(): JAX's own)
            raise ConfigError(
                f"sharding: {loose} leaves a dimension UNCONSTRAINED, which is for "
                "jax.lax.with_sharding_constraint in a jitted function: an array is placed "
                "with every dimension said; name its mesh axes (PartitionSpec('data')), or None "
                "for a dimension each device holds whole")
        if not leaves or not all(_is_sharding(s) for s in leaves):
            bad = next((s for s in leaves if not _is_sharding(s)), sharding)
            raise ConfigError(
                f"sharding: expected a jax.sharding.Sharding or a pytree of them, got "
                f"{type(bad).__name__} {bad!r:.80}; for data parallelism pass "
                "jaxloader.data_sharding(mesh, 'data')"
            )
        self.sharding = sharding
        # one sharding of several axes (a sequence's over "seq": P(None, "seq")): a 1-D leaf,
        # a value a row (the pad mask of a pass that ends or of last_batch='pad', a Pad's
        # lengths, a label), takes its batch axis's part (it failed at the first batch, or
        # the first padded one, the remedy a dict of shardings or another mesh's)
        self._rows_only = NamedSharding(sharding.mesh, PartitionSpec(sharding.spec[0]),
                                        memory_kind=sharding.memory_kind) if (
            isinstance(sharding, NamedSharding) and len(sharding.spec) > 1) else None
        self.process_count = process_count
        self.batch_size = batch_size  # per process: a batch with fewer rows is a partial one
        # One process, every leaf on one device: no step can wait in a collective, so the
        # copies may be issued from a thread (see jaxloader.sharding.prefetch).
        self.single_device = process_count == 1 and all(len(s.device_set) == 1 for s in leaves)
        # On the CPU backend a placed array may be the host array's memory (a worker's slot,
        # all of a batch's): a small leaf kept (labels for an epoch's metric) held its whole
        # batch's slot, 1 MiB a step. Small leaves are placed from a copy of their own.
        self._copy_small = all(d.platform == "cpu" for s in leaves for d in s.device_set)
        self._kinds: list | None = None  # the first batch's leaves' shapes past rows, dtypes
        self._said_kinds = False  # (several processes: _same_kinds, said once)
        self._placed_on = sorted({d for s in leaves for d in s.device_set}, key=lambda d: d.id)
        self._nones = [path for path, s in jax.tree_util.tree_flatten_with_path(  # (checked
            self.sharding, is_leaf=lambda x: x is None)[0]  # at the first batch; where all go
            if s is None] if self._placed_on != [jax.devices()[0]] else []  # to JAX's first: no)
        if batch_size is not None:  # (refused here, not at the first batch's placement)
            for s, axes, ways in self._batch_axes():
                if batch_size * process_count % ways:
                    raise ConfigError(
                        f"sharding: a global batch of {batch_size * process_count} rows "
                        f"(batch_size {batch_size} x {process_count} process(es)) cannot be "
                        f"split over the {ways} devices of mesh axes {axes} ({s}); make it a "
                        f"multiple of {ways}, or shard the batch over fewer devices")

    def _batch_axes(self) -> list[tuple[Any, tuple, int]]:
        """``(sharding, mesh axes, devices over them)`` of each leaf's ``NamedSharding`` that
        splits the batch's first axis over named mesh axes."""
        found = []
        for s in jax.tree_util.tree_leaves(self.sharding, is_leaf=_is_sharding):
            if not isinstance(s, NamedSharding) or not len(s.spec) or s.spec[0] is None:
                continue
            axes = (s.spec[0],) if isinstance(s.spec[0], str) else tuple(s.spec[0])
            if all(isinstance(a, str) and a in s.mesh.shape for a in axes):
                # (else not axis names, UNCONSTRAINED say: left to placement)
                found.append((s, axes, math.prod(s.mesh.shape[a] for a in axes)))
        return found

    def rows(self) -> np.ndarray | None:
        """The rows of the global batch this process's devices hold (ascending, ``batch_size``
        of them), when several processes place it: JAX puts a process's rows on its own
        devices, in the mesh's order, so a process reads these (a mesh not in process order,
        or a batch axis that interleaves the processes, holds other rows than block
        ``process_index``). ``None`` with one process (or a count passed by hand) or no
        ``NamedSharding`` (nor one device's). Refuses a sharding that gives this process
        other than ``batch_size`` rows (the batch axis replicated across processes, or on one
        device), or leaves that give it different rows."""
        B = self.batch_size
        if self.process_count == 1 or B is None or jax.process_count() != self.process_count:
            return None  # (a process count passed by hand: one JAX process)
        G, me = B * self.process_count, jax.process_index()
        found: dict[tuple, tuple[str, Any]] = {}  # rows -> the first leaf (path, sharding)
        for path, s in jax.tree_util.tree_flatten_with_path(self.sharding,
                                                             is_leaf=_is_sharding)[0]:
            if is_one_device(s):  # (one process's device)
                shape: tuple = (G,)
            elif not isinstance(s, NamedSharding):
                continue
            else:
                shape = (G, *(math.prod(s.mesh.shape[a] for a in (
                    (e,) if isinstance(e, str) else e or ()) if a in s.mesh.shape)
                              for e in s.spec[1:]))
            held = {(i[0].start or 0, G if i[0].stop is None else i[0].stop)
                    for d, i in s.devices_indices_map(shape).items()
                    if d.process_index == me}
            rows = tuple(sorted({r for start, stop in held for r in range(start, stop)}))
            if len(rows) != B:
                remedy = rows_remedy(s, me, self.process_count, G, len(rows))
                leaf = f" (at leaf {jax.tree_util.keystr(path)})" if path else ""
                raise ConfigError(
                    f"sharding: {s}{leaf} gives this process's devices {len(rows)} rows of the "
                    f"global batch of {G}, where each of the {self.process_count} processes "
                    f"reads its batch_size={B}: {remedy}")
            found.setdefault(rows, (jax.tree_util.keystr(path), s))
        if len(found) > 1:
            (one, (at, s)), (other, (other_at, other_s)) = list(found.items())[:2]
            spec, other_spec = getattr(s, "spec", s), getattr(other_s, "spec", other_s)
            raise ConfigError(
                f"sharding: leaf {at} puts this process's devices at {_said(one)} of the global "
                f"batch of {G}, leaf {other_at} at {_said(other)}; one process reads the same "
                "rows for every leaf: give the leaves shardings that split the batch axis over "
                + (f"the same mesh axes (the spec {spec} for both, not {other_spec})"
                   if str(spec) != str(other_spec) else "one mesh (their specs are alike, "
                   f"{spec}, but their meshes list the devices in another order)"))
        return np.array(next(iter(found)), np.int64) if found else None

    def meshes(self) -> list | None:
        """Each ``NamedSharding``'s spec and mesh (its axes, their sizes, its devices' ids in
        its order), as the processes compare them (``sharding.hosts``): JAX needs the same on
        every process, and each reads the rows its devices hold in its own (a mesh of each
        process's devices first: the processes read the same rows, half the data never, and
        a jitted step on the batch waited in a collective). ``None`` with one process."""
        if self.process_count == 1:
            return None
        found: list = []
        for s in jax.tree_util.tree_leaves(self.sharding, is_leaf=_is_sharding):
            if isinstance(s, NamedSharding) and isinstance(s.mesh, Mesh):
                said = [str(s.spec), list(s.mesh.axis_names), list(s.mesh.devices.shape),
                        [int(d.id) for d in s.mesh.devices.flat]]
                found += [said] if said not in found else []
        return found or None

    def block(self, process_index: int) -> int:
        """The block of ``batch_size`` rows this process's devices hold (``rows``), where they
        are one; else ``process_index``: a stream's rows are its readers', its own."""
        rows = self.rows()
        B = self.batch_size or 1
        if rows is None or rows[-1] - rows[0] != B - 1 or rows[0] % B:
            return process_index
        return int(rows[0]) // B

    def check_last_batch(self, rows: int, num_records: int) -> None:
        """Refuses, before the first batch, an epoch's last (partial) batch of ``rows`` rows
        that the batch axis of a leaf's ``NamedSharding`` cannot split evenly; otherwise it
        would be refused only when placed, at the end of the first epoch."""
        for s, axes, ways in self._batch_axes():
            if rows % ways:
                raise ConfigError(
                    f"last_batch='partial': an epoch's last batch holds {rows} rows "
                    f"({num_records} records, batch_size {self.batch_size}), which the sharding "
                    f"{s} cannot split over the {ways} devices of mesh axes {axes}; "
                    + _PARTIAL_REMEDY)

    def __call__(self, batch: Any) -> Any:
        """The batch placed, its dicts' keys in their order (JAX's tree functions sort them)."""
        return tree_lib.reordered(self._placed(batch), tree_lib.skeleton(batch))

    def _placed(self, batch: Any) -> Any:
        if self._copy_small:
            batch = jax.tree_util.tree_map(lambda leaf: own_if_small(leaf, SMALL_LEAF), batch)
        leaves, tree = jax.tree_util.tree_flatten(batch)
        if self.process_count > 1 and not self._said_kinds:
            self._same_kinds(batch, leaves)
        if not jax.config.read("jax_enable_x64"):
            check_32_bits(batch, leaves)
        if self._nones:
            self._nones = refuse_none_over_leaf(self._nones, batch, self._placed_on)
        sharding = self.sharding
        if self._rows_only is not None and any(_a_row_each(leaf) for leaf in leaves):
            sharding = jax.tree_util.tree_unflatten(tree, [  # (in a tuple, a nested dict too)
                self._rows_only if _a_row_each(leaf) else sharding for leaf in leaves])
        if self.process_count == 1 and not any(
                host_only(getattr(leaf, "dtype", _NUMERIC)) for leaf in leaves):
            try:  # the hot path: one call, shardings matched to leaves by JAX's C++ tree code
                return jax.device_put(batch, sharding)
            except (TypeError, ValueError, AssertionError):  # (JAX 0.10: a spec longer than
                pass  # a leaf's rank asserts) the per-leaf path below says which leaf and why
        try:
            return jax.tree_util.tree_map_with_path(self._put_subtree, sharding, batch,
                                                    is_leaf=_is_sharding)
        except ConfigError:
            raise  # (a leaf's, named: its words may say "structured")
        except ValueError as e:
            if "structure" not in str(e) and "prefix" not in str(e):
                raise
            raise ConfigError(
                f"sharding: its tree must be a prefix of the batch's tree; sharding tree "
                f"{jax.tree_util.tree_structure(self.sharding, is_leaf=_is_sharding)}, batch "
                f"tree {jax.tree_util.tree_structure(batch)}; " + (
                    _devices_remedy(self._devices, batch) if self._devices is not None else
                    "pass one Sharding for all leaves or mirror the batch's keys")
            ) from e

    def _put_subtree(self, at: tuple, sharding: Sharding, subtree: Any) -> Any:
        paths_leaves, treedef = jax.tree_util.tree_flatten_with_path(subtree)
        placed = [self._put_leaf(sharding, leaf, jax.tree_util.keystr((*at, *path)))
                  for path, leaf in paths_leaves]
        return jax.tree_util.tree_unflatten(treedef, placed)

    def _put_leaf(self, sharding: Sharding, leaf: Any, path: str) -> Any:
        if isinstance(leaf, np.ndarray) and host_only(leaf.dtype):
            return leaf  # strings, objects and dates have no device representation
        try:
            if self.process_count == 1:
                return jax.device_put(leaf, sharding)
            global_shape = (leaf.shape[0] * self.process_count, *leaf.shape[1:])
            return jax.make_array_from_process_local_data(sharding, leaf, global_shape)
        except (ValueError, TypeError, AssertionError, IndexError) as e:  # (IndexError: JAX's
            # for a spec of more axes than the leaf, on several processes)
            rows = np.shape(leaf)[0] if np.ndim(leaf) else None
            problem = device_dtype_problem(np.dtype(getattr(leaf, "dtype", _NUMERIC)))
            if problem is not None:
                remedy = problem
            elif self.batch_size is not None and rows is not None and rows < self.batch_size:
                remedy = (f"this is an epoch's last batch, of {rows} rows, not {self.batch_size} "
                          f"(last_batch='partial'); {_PARTIAL_REMEDY}")
            elif len(spec := tuple(getattr(sharding, "spec", ()))) > np.ndim(leaf):
                # (its rows' axis, or one it names: P(None) would place the rows whole)
                axis = next((a for a in spec if a is not None), None)
                ways = [f"NamedSharding(mesh, P({axis!r})) splits its rows alone"] * (
                    axis is not None) + ["NamedSharding(mesh, P()) places it whole on each "
                                         "device"] * (spec[0] is None)
                remedy = (f"its spec names {len(spec)} dimensions, the leaf has "
                          f"{np.ndim(leaf)}: give this leaf a sharding of its own (a dict of "
                          f"shardings, the batch's keys: {', or '.join(ways)})")
            else:
                remedy = undivided(np.shape(leaf), sharding, self.process_count) or (
                    "the global batch (batch_size x process_count) must divide evenly over the "
                    "devices of the data axis, and each other axis over the mesh axes its spec "
                    "names")
            raise ConfigError(
                f"sharding: cannot place batch leaf {path or '<root>'} (local shape "
                f"{np.shape(leaf)}, dtype {getattr(leaf, 'dtype', type(leaf).__name__)}, "
                f"{self.process_count} process(es)) with {sharding}: {e}; {remedy}"
            ) from e

    def _same_kinds(self, batch: Any, leaves: list) -> None:
        """Warns, once, where a leaf's shape past its rows or its dtype differs from the
        first batch's, with several processes: each builds the global array's shape from its
        own part, and JAX compares none, so processes whose widths differ at a step hold
        global arrays of other shapes (each its own loss, replicated parameters drifting
        apart) until a collective's sizes differ; a width of the batch's own (a ``BatchMap``
        padding to its batch's longest) is that, bucketing over the global batch is not."""
        kinds = [(np.shape(leaf)[1:], getattr(leaf, "dtype", None)) for leaf in leaves]
        if self._kinds is None or kinds == self._kinds:
            self._kinds = kinds
            return
        self._said_kinds = True
        paths = [jax.tree_util.keystr(p) for p, _ in jax.tree_util.tree_leaves_with_path(batch)]
        path, (was, now) = next((path, pair) for path, pair in zip(paths, zip(self._kinds, kinds))
                                if pair[0] != pair[1])

        def shape(kind: tuple) -> str:
            return "(rows" + "".join(f", {size}" for size in kind[0]) + f") {kind[1]}"

        warnings.warn(
            f"batch leaf {path} went from shape {shape(was)} to {shape(now)} between two "
            f"batches, over {self.process_count} processes: each "
            "process builds the global array's shape from its own rows, and nothing compares "
            "them, so where the processes' shapes differ at a step their global arrays "
            "differ (a loss of its own on each); pad to a width the same on every process "
            "(jl.Pad(length=...)), not to each batch's longest, unless every process's batch of "
            "a step has the same shapes (a bucketing by length over the global batch)",
            JaxloaderWarning, stacklevel=2)


def _said(rows: tuple) -> str:
    """Rows for a message: ``rows 4-7``, or the first few where they are apart."""
    if rows[-1] - rows[0] == len(rows) - 1:
        return f"rows {rows[0]}-{rows[-1]}"
    return "rows " + ", ".join(map(str, rows[:6])) + (", ..." if len(rows) > 6 else "")

