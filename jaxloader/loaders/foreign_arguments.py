"""PyTorch's and Grain's keyword arguments given to ``DataLoader`` or ``StreamLoader``, answered
in jaxloader's terms.

A PyTorch user's first loader is ``DataLoader(ds, batch_size=32, shuffle=True, drop_last=True,
num_workers=4, pin_memory=True)``; Python alone would say only "unexpected keyword argument
'drop_last'". ``DataLoader`` takes such names as ``**unknown: Never`` (a type checker still
flags them) and ``refuse`` raises, naming what to pass instead. Their attributes
(``loader.sampler``, ``get_state``) and a Grain iterator's state given as a loader's
(``grain_state_hint``) are answered the same way.
"""

from __future__ import annotations

import difflib

from typing import TYPE_CHECKING, Any, NoReturn

from jaxloader.base.checks import brief_value
from jaxloader.base.errors import ArgumentError

_REMEDIES = {
    # torch.utils.data.DataLoader
    "drop_last": "use last_batch='drop' (the default; drop_last=True) or last_batch='partial' "
                 "(drop_last=False), or last_batch='pad' to keep every record with a mask",
    "collate_fn": "batches are collated for you (a pytree of stacked arrays), records of one "
                  "shape each: pad ragged ones to the batch's longest with "
                  "transforms=[..., jaxloader.Pad(keys)] (what a padding collate_fn did), or "
                  "pad or crop them in a Map (token sequences: jaxloader.PackedSource); to "
                  "change a whole batch, pass transforms=[..., jaxloader.BatchMap(fn)], whose "
                  "fn gets the batch collated (a pytree of stacked arrays), not a list of "
                  "records: a collate_fn rewritten for it",
    "pin_memory": "pass sharding= (and device_prefetch=) to have batches placed on the "
                  "devices ahead of the step (one device's copies by a background thread, "
                  "several devices' dispatched asynchronously from next()); on a GPU the "
                  "workers' slots are page-locked for the copies, nothing to set",
    "prefetch_factor": "use prefetch= (tasks in flight per worker, a task up to 16 batches)",
    "persistent_workers": "nothing to set: workers live as long as the loader; close() ends "
                          "them",
    "sampler": "the order comes from shuffle=True or jaxloader.LocalShuffle(...) and seed=; "
               "Grain's IndexSampler(num_epochs=n, shard_options=...) is num_epochs=n (epochs "
               "an iter(loader)) and process_index=, process_count=; for a subset use "
               "jaxloader.FilteredSource(source, indices=...)",
    "batch_sampler": "batches come from batch_size=, shuffle= and seed=; for a subset use "
                     "jaxloader.FilteredSource(source, indices=...)",
    "generator": "use seed= (an int: the order and every RandomMap draw follow from it)",
    "shuffle_seed": "use seed= (an int: the order and every RandomMap draw follow from it)",
    "timeout": "use timeout_s= (seconds a batch may take before the loader raises, naming "
               "what each worker is doing; stall_warning_s= logs it first); a worker that "
               "dies or raises is reported at once",
    "multiprocessing_context": "use start_method= ('exec', the default, or 'fork')",
    "in_order": "nothing to set: batches always come in order",
    "pin_memory_device": "pass sharding= (a device, a mesh's sharding): batches are placed "
                         "there ahead of the step (device_prefetch=)",
    # flax.jax_utils.prefetch_to_device(iterator, size), a mesh or devices to place on
    "prefetch_to_device": "use device_prefetch= (batches kept placed ahead) with "
                          "sharding=",
    "mesh": "pass sharding=jaxloader.data_sharding(mesh, 'data') (the batch axis over the "
            "mesh's 'data' axis), or a NamedSharding(mesh, spec)",
    "data_axis": "pass sharding=jaxloader.data_sharding(mesh, 'data') (its second argument: "
                 "the mesh axis, or a tuple of them, that the batch axis is split over)",
    "device": "pass sharding=device (a jax.Device: the batches placed there), or "
              "jaxloader.data_sharding(mesh) for several",
    "devices": "pass sharding=jaxloader.data_sharding(jax.make_mesh((n,), ('data',))) (the "
               "batch split over n devices), or sharding=device for one",
    # grain.load
    "transformations": "use transforms= (jaxloader.Map, RandomMap, BatchMap)",
    # grain.DataLoader / grain.MapDataset
    "worker_count": "use num_workers=",
    "drop_remainder": "use last_batch='drop' (the default) or last_batch='partial'",
    "operations": "use transforms= (jaxloader.Map, RandomMap, BatchMap)",
    "shard_options": "use process_index= and process_count= (left None: JAX's)",
    "data_source": "pass the source as the first argument",
    # tf.data's map, shuffle and padded_batch
    "num_parallel_calls": "use num_workers= (or 'auto'): transforms run in worker processes",
    "deterministic": "nothing to set: a batch is a function of (seed, epoch, step), always",
    "reshuffle_each_iteration": "shuffle=True shuffles each epoch anew from (seed, epoch); one "
                                "order for every epoch: shuffle=False over jaxloader."
                                "FilteredSource(source, indices=a permutation)",
    "padded_shapes": "pad in transforms=[..., jaxloader.Pad(keys)] (to each batch's longest; "
                     "jaxloader.Pad(keys, length=n): to n), along the first axis; pad the "
                     "others in a Map",
    "padding_values": "use jaxloader.Pad(keys, value=...) (one value, or a dict of them a key)",
    # torch.utils.data.DataLoader(dataset=...)
    "dataset": "pass the source as the first argument",
    "worker_buffer_size": "use prefetch= (tasks in flight per worker, a task up to 16 batches)",
    "per_worker_buffer_size": "use prefetch= (tasks in flight per worker, a task up to 16 "
                              "batches)",
    "read_options": "use read_threads= (its num_threads: a batch's records read on threads "
                    "in each worker) and prefetch=",
}


_REMEDIES.update(dict.fromkeys(("shard_index", "shard_id", "rank"), (
    "use process_index= (this host's place among process_count= hosts; left None: JAX's "
    "jax.process_index()): each host reads its own share of every batch")))
_REMEDIES.update(dict.fromkeys(("num_shards", "shard_count", "world_size"), (
    "use process_count= (the hosts that share each batch; left None: JAX's "
    "jax.process_count())")))
_REMEDIES.update(dict.fromkeys(("seed_worker", "worker_seed", "worker_seeds"), (
    "use seed=: every random draw (RandomMap's rng, the order) follows from it per record, "
    "the same with any number of workers; worker_init_fn=fn(worker_id) runs your own setup "
    "in each worker")))

_FULL = ("a stream's batches are all full (it is endless by default); a pass that ends "
         "(num_epochs=n) pads its last batches, marking the real rows in batch['mask']")
_IN_ORDER = ("a stream is read in order, its shards dealt to the readers by seed= each epoch; "
             "to leave records out, transforms=[..., jaxloader.Filter(fn)]")
# StreamLoader: the same names, where a stream answers them otherwise
_STREAM_REMEDIES = {
    **_REMEDIES,
    "shuffle": "a stream's shards are reordered every epoch by seed=, and records are "
               "shuffled within a window given to the stream: jaxloader.Stream.jsonl(paths, "
               "shuffle_window=1000) (every Stream maker takes shuffle_window=)",
    "drop_last": _FULL, "last_batch": _FULL, "drop_remainder": _FULL,
    "sampler": _IN_ORDER, "batch_sampler": _IN_ORDER,
    "reshuffle_each_iteration": "a stream's shards are reordered each epoch by seed=, its "
                                "records within the stream's shuffle_window=",
    "read_options": "use num_workers= (and prefetch=): a stream's readers read in order, "
                    "each in its worker",
    "read_threads": "a stream's readers read in order, each in its worker: more of them "
                    "overlap reads that wait (readers_per_process=, num_workers=)",
}
_STREAM_REMEDIES.update(dict.fromkeys(("shuffle_window", "shuffle_buffer", "buffer_size"), (
    "a stream's records are shuffled within a window given to the stream: "
    "jaxloader.Stream.jsonl(paths, shuffle_window=1000) (every Stream maker takes "
    "shuffle_window=; the loader's seed= seeds it)")))
_REMEDIES.update(dict.fromkeys(("shuffle_window", "shuffle_buffer", "buffer_size"), (
    "shuffle=True shuffles the whole source; shuffle=jaxloader.LocalShuffle(window=8) "
    "shuffles blocks, and records within windows of blocks (a ParquetSource's row groups)")))


class _Required:
    """The default of an argument that must be given: so that the call's other arguments are
    seen first. ``DataLoader(data_source=...)`` (Grain's) or ``DataLoader(dataset=...)``
    (PyTorch's) is answered by ``refuse``, and ``DataLoader(ds, 32)`` by ``refuse_call``, not by
    Python's "missing 1 required argument" (of the source, or of the batch size just given)."""

    def __repr__(self) -> str:
        return "<required>"


REQUIRED: Any = _Required()
# PyTorch's DataLoader arguments by position, after the dataset (the rest are keywords)
_TORCH_ORDER = ("batch_size", "shuffle", "sampler", "batch_sampler", "num_workers",
                "collate_fn", "pin_memory", "drop_last", "timeout", "worker_init_fn",
                "multiprocessing_context", "generator")
# their defaults in PyTorch: given by position as placeholders, they ask for nothing here
# (drop_last=False is not one: it keeps the last partial batch, which the default here drops)
_TORCH_DEFAULTS = {"sampler": None, "batch_sampler": None, "collate_fn": None,
                   "pin_memory": False, "timeout": 0, "multiprocessing_context": None,
                   "generator": None}


def _shown(value: Any) -> str:
    """``value`` as a message shows it: an array by its type and shape (its repr, twice in a
    message, ran to its 1,000 values)."""
    if hasattr(value, "shape") and hasattr(value, "dtype") and len(value.shape):
        return f"<{type(value).__name__} of shape {tuple(value.shape)}>"
    return f"{value.item()!r:.80}" if hasattr(value, "item") and hasattr(value, "dtype") else \
        brief_value(value)  # (a list's whole repr, made to be cut: 6.4 MB for a dataset=)


def refuse_call(owner: str, source: Any, extra: tuple[Any, ...], unknown: dict[str, Any],
                batch_size: Any, made: Any = None) -> None:
    """``refuse``, after the call's positional arguments: a second one (PyTorch's
    ``DataLoader(ds, 32, True)``) or none (Grain's ``data_source=``) raises ``TypeError``
    naming what to pass, as does a missing ``batch_size`` (``ArgumentError``, a ``TypeError``).

    Example:
        >>> refuse_call("DataLoader", [1, 2], (32,), {}, REQUIRED)  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.ArgumentError: DataLoader(source, 32): ... batch_size=32)
    """
    first = "stream" if owner == "StreamLoader" else "source"
    arrays = [v for v in (source, *extra) if hasattr(v, "shape") and hasattr(v, "dtype")
              and len(v.shape)]
    if extra and len(arrays) == 1 + len(extra):  # (TensorDataset(X, y), Keras' fit(X, y))
        shapes = ", ".join(map(_shown, arrays))
        names = "x, y" if len(arrays) == 2 else ", ".join(f"x{i}" for i in range(len(arrays)))
        raise ArgumentError(
            f"{owner}({shapes}): {owner} takes one {first}, by position; for records of "
            f"{len(arrays)} arrays, a row of each, make them one source: {owner}(jl."
            f"ArraySource(({names})), batch_size=32) (a dict names them: jl.ArraySource("
            "{'image': x, 'label': y}))")
    if extra:
        given = ", ".join(_shown(value) for value in extra)
        foreign = _STREAM_REMEDIES if owner == "StreamLoader" else _REMEDIES
        pairs = list(zip(_TORCH_ORDER, extra))
        named = ", ".join(f"{name}={_shown(value)}" for name, value in pairs
                          if name not in foreign)
        other = "".join(  # (each foreign one that asks for something: a collate_fn dropped
            f"; and {owner}(..., {name}={_shown(value)}): {owner} has no {name}: "  # unsaid)
            f"{foreign[name]}" for name, value in pairs if name in foreign and not (
                name in _TORCH_DEFAULTS and value is _TORCH_DEFAULTS[name] or (
                    type(value) is int and value == _TORCH_DEFAULTS.get(name))))
        raise ArgumentError(f"{owner}({first}, {given}): {owner} takes its {first} alone by "
                        f"position, every other argument by name: {owner}({first}, {named})"
                        + other)
    refuse(owner, unknown, made)
    if source is REQUIRED:
        raise ArgumentError(f"{owner}() needs a {first}, given first: {owner}({first}, "
                        "batch_size=...)")
    if batch_size is REQUIRED:
        raise ArgumentError(f"{owner}({first}) needs batch_size=, the records a batch (each "
                        f"process's): {owner}({first}, batch_size=32)")


def refuse(owner: str, unknown: dict[str, Any], made: Any = None) -> None:
    """Raises ``ArgumentError`` (a ``TypeError``) for the first name in ``unknown`` (none:
    returns); ``owner`` is ``"DataLoader"`` or ``"StreamLoader"``, whose remedies differ where a
    stream differs; ``made``, its class, whose arguments a near miss is told.

    Example:
        >>> refuse("DataLoader", {"drop_last": True})  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        jaxloader.base.errors.ArgumentError: DataLoader(drop_last=True): ... use last_batch=...
    """
    for name, value in unknown.items():
        remedy = (_STREAM_REMEDIES if owner == "StreamLoader" else _REMEDIES).get(name)
        if owner == "DataLoader" and name == "readers_per_process":  # (the other loader's)
            remedy = ("it is a StreamLoader's (a stream's readers); a DataLoader reads by index "
                      "in num_workers= processes, read_threads= threads each")
        if remedy is None:  # (Python's own "Did you mean" is not said for **unknown)
            close = difflib.get_close_matches(name, _arguments(made), n=1)
            raise ArgumentError(f"{owner}() got an unexpected keyword argument {name!r}" + (
                f"; did you mean {close[0]}=?" if close else ""))
        raise ArgumentError(f"{owner}({name}={_shown(value)}): {owner} has no {name}: {remedy}")


_ORDER = ("the order is a function of seed= and the epoch: each iter(loader) is the next epoch, "
          "reshuffled (DistributedSampler.set_epoch's work), and process_index= and "
          "process_count= split it between hosts (left None: JAX's)")
_STATE = ("the position is the loader's, not an iterator's: loader.state_dict() (JSON-ready) "
          "and loader.load_state_dict(state) before iter(), or checkpoint.LoaderSave(loader) "
          "and LoaderRestore(loader) beside the model in Orbax (docs/guides/checkpointing.md)")
_ATTRIBUTES = {  # name -> (the peer's, what to do instead)
    "dataset": ("PyTorch's DataLoader.dataset", "keep a name for the source you passed "
                "(len(source) records); len(loader) is the batches of an epoch, len(loader) * "
                "batch_size the records they hold"),
    "sampler": ("PyTorch's DataLoader.sampler", _ORDER),
    "batch_sampler": ("PyTorch's DataLoader.batch_sampler", _ORDER),
    "set_epoch": ("PyTorch's DistributedSampler.set_epoch, a Hugging Face or WebDataset "
                  "loader's", _ORDER + "; loader.epoch is the epoch of the next batch"),
    "get_state": ("Grain's iterator.get_state()", _STATE),
    "set_state": ("Grain's iterator.set_state(state)", _STATE),
}
# PyTorch's DataLoader keeps each argument as an attribute (loader.drop_last in a step count,
# loader.collate_fn handed on): the loader's argument's remedy says what it has instead
_TORCH_KEPT = ("drop_last", "collate_fn", "pin_memory", "timeout", "generator",
               "prefetch_factor", "persistent_workers", "multiprocessing_context", "in_order",
               "pin_memory_device")
_ATTRIBUTES.update({name: (f"PyTorch's DataLoader.{name}", f"not an argument here either: "
                           f"{_REMEDIES[name]}") for name in _TORCH_KEPT})


class _Refused:
    """A PyTorch or Grain loader's attribute this one has not: reading it raises an
    ``AttributeError`` saying what to do instead (Python's bare one named nothing). It holds
    no value of its own, so an assignment (a subclass's ``self.dataset = ds``) is kept and read
    as any attribute."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, loader: object, owner: type | None = None) -> NoReturn:
        kind = type(loader).__name__ if loader is not None else getattr(owner, "__name__", "")
        peer, remedy = _ATTRIBUTES[self.name]
        raise AttributeError(f"{kind} has no {self.name} ({peer}): {remedy}")


class GrainAttributes:
    """Grain's ``iterator.get_state()`` and ``set_state()``, its checkpoint idiom: each raises
    an ``AttributeError`` saying where the position is kept instead."""

    if not TYPE_CHECKING:  # (a type checker says these are not there: NoReturn passed them,
        get_state = _Refused()  # and hid the lines after them from the checks)
        set_state = _Refused()


class TorchAttributes(GrainAttributes):
    """PyTorch's ``DataLoader.dataset``, ``.sampler`` and ``.batch_sampler``, which a training
    loop reads (``len(loader.dataset)``, ``loader.sampler.set_epoch(epoch)``), a
    ``set_epoch`` of the loader's own, and the arguments PyTorch's keeps (``drop_last``,
    ``collate_fn``, ...): each raises an ``AttributeError`` saying what to do instead."""

    if not TYPE_CHECKING:  # (as GrainAttributes')
        dataset = _Refused()
        sampler = _Refused()
        batch_sampler = _Refused()
        set_epoch = _Refused()
        drop_last = _Refused()
        collate_fn = _Refused()
        pin_memory = _Refused()
        timeout = _Refused()
        generator = _Refused()
        prefetch_factor = _Refused()
        persistent_workers = _Refused()
        multiprocessing_context = _Refused()
        in_order = _Refused()
        pin_memory_device = _Refused()


_STREAM_ORDER = ("a stream's order is its readers' (each reads its shards' epochs in turn: "
                 "state_dict()['readers']); a step count is the stream's position, "
                 "loader.step; loop for a number of steps (for step, batch in zip(range(n), "
                 "loader)), or pass num_epochs=1 for one pass")


class _StreamRefused:
    """A ``DataLoader``'s attribute a ``StreamLoader`` has not (its source's length, its order,
    its epoch): reading it raises an ``AttributeError`` saying what a stream has instead."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, loader: object, owner: type | None = None) -> NoReturn:
        raise AttributeError(f"StreamLoader has no {self.name} (a DataLoader's, or PyTorch's): "
                             + _STREAM_ORDER)


class StreamAttributes(GrainAttributes):
    """What a training loop moved from a ``DataLoader`` asks a ``StreamLoader`` for (its
    ``epoch``, ``len(loader)``, PyTorch's ``dataset`` and ``sampler``): each refused saying what
    a stream has instead (Python's bare ``AttributeError`` or ``TypeError`` named nothing)."""

    if not TYPE_CHECKING:  # (as GrainAttributes': len(stream_loader) is said not Sized)
        epoch = _StreamRefused()
        set_epoch = _StreamRefused()
        dataset = _StreamRefused()
        sampler = _StreamRefused()
        batch_sampler = _StreamRefused()

        def __len__(self) -> int:
            raise TypeError("a StreamLoader has no len(): a stream's length is not known "
                            "before it is read; " + _STREAM_ORDER)

    def __bool__(self) -> bool:  # (true, as any object: not asked of its len())
        return True


def _arguments(made: Any) -> list[str]:
    """The names ``made`` (the loader's class; ``None``: none known) takes, for a near miss's
    remedy."""
    import inspect

    return [] if made is None else [
        name for name, p in inspect.signature(made).parameters.items()
        if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD]


_GRAINS = {"last_seen_indices",  # (grain.DataLoader's; a dataset iterator's, mp_prefetch's)
           "next_index", "workers_state", "iterations_to_skip"}


def grain_state_hint(state: Any, stream: bool = False) -> str:
    """What to do with a Grain iterator's state (``grain.checkpoint``'s file, which has the
    name a loader's state file has, or ``get_state()``'s) given as a loader's (``stream``: a
    ``StreamLoader``'s); ``""`` for any other state.

    Example:
        >>> grain_state_hint({"next_index": 95})[:40]
        "; this is a Grain iterator's state (grai"
    """
    if not (isinstance(state, dict) and _GRAINS & set(state)):
        return ""
    return ("; this is a Grain iterator's state (grain.checkpoint), whose order jaxloader "
            "cannot continue: restore the model's items alone, then " + (
                "start the stream loader afresh (its position is its readers' places, which "
                "a step set by hand does not move)" if stream else
                "start the loader at the step trained (state = loader.state_dict(); "
                "state['step'] = n; loader.load_state_dict(state)), its own order")
            + " (docs/migrating/grain.md)")


def peeked(error: Exception) -> Exception:
    """``error``, a ``peek()``'s, of a loader whose workers ran a ``worker_init_fn``: where the
    source's read failed, with a note that the batch is made in this process, where it never
    ran (the source read ``None``: "'NoneType' object is not subscriptable")."""
    if "source[index] raised" in str(error):
        error.add_note("peek() makes the batch in this process (the training process), where "
                       "worker_init_fn never ran: open what the source reads lazily in its "
                       "__getitem__ (keyed by os.getpid()), not in worker_init_fn")
    return error
