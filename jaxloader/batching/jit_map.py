"""``JitMap``: a per-record transform written with ``jax.numpy``, run ``jax.vmap``-ed over the
batch and ``jax.jit``-compiled for the host CPU, where the batch is made (a worker, or the
training process with ``num_workers=0``).

::

    records ──Map, RandomMap (NumPy, a record at a time)──> columns
            ──JitMap, a chunk of rows at a time: gathered into aligned buffers (reused)
              ──jit(vmap(fn))(chunk[, keys]) on the CPU device, written by XLA over the
                chunk before's output (donated, in a worker)──> copied into the slot
    keys: a jax.random key a record, from (seed, epoch, position, transform index): never from
          the worker, so a batch is the same with any worker count and after a restore

XLA fuses the function's operations into a pass or two over memory, where a NumPy transform pays
Python a record and a memory pass an operation. It runs on chunks of rows whose input and output
fit the caches (``chunk_bytes``): a whole batch would go through memory three times (gathered, run,
copied into the slot), and through a fresh output each time. Each chunk's output is written over
the chunk before's (in a worker: donated to XLA, still in the caches, none allocated), so the copy
into the slot reads from the caches; XLA cannot write into the slot itself (it takes over only
memory it allocated). In a worker, freed memory stays for the next allocation (glibc's ``mallopt``:
given back, XLA's next output is faulted in page by page). Compiled once a chunk shape (JAX's own
cache; a last chunk of fewer rows runs at the chunk's shape). JAX is imported only where a
``JitMap`` runs, and its computation stays on the CPU: a worker's JAX is CPU-only
(``workers/process.py``); in the training process the function is compiled for the CPU device.

Example:
    >>> import numpy as np
    >>> t = JitMap(lambda r: {"x": r["x"] * 2.0})
    >>> x = np.arange(3, dtype=np.float32)[:, None]
    >>> t({"x": x}, seed=0, epoch=0, positions=np.arange(3))["x"][:, 0]
    array([0., 2., 4.], dtype=float32)
"""

from __future__ import annotations

import copy
import threading
import warnings
from time import perf_counter
from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.checks import Int, callable_name, check_bool, check_int, refused_call
from jaxloader.base.errors import ConfigError, JaxloaderWarning, RecordError, user_stacklevel
from jaxloader.base.loader_names import loader_names
from jaxloader.base.one_device import one_device
from jaxloader.batching import collate, jit_inputs
from jaxloader.batching.collate import Layout
from jaxloader.batching.jit_inputs import record_keys
from jaxloader.batching.jit_cpu import (aligned, as_compiled, cpu_device, donates, in_place,
                                        jax_settings)
from jaxloader.batching.jit_outputs import (UNSORTED, aliases, check_keys, check_row_output,
                                             host_leaves, leaf_order, record_kind, row_bytes,
                                             write_rows)
from jaxloader.batching.global_draws import traced_call
from jaxloader.batching.jit_errors import (MANY_SHAPES, code_of, error_text, key_by,
                                           many_shapes, takes_key, user_line)
from jaxloader.batching.record_columns import batch_columns

# The errors of a function that does not trace: Python control flow on a traced value, a NumPy
# call on one (found by name: JAX's error classes moved between versions)
_NOT_TRACING = ("ConcretizationTypeError", "TracerBoolConversionError",
                "TracerArrayConversionError", "TracerIntegerConversionError",
                "NonConcreteBooleanIndexError")
CHUNK_BYTES = 4 << 20  # a chunk's input and output together: what stays in the caches
_KEY_ARGUMENT = (" (a function of two arguments is called fn(record, key): a tf.data-style "
                 "fn(image, label) gets the record as image and the key as label; take the "
                 "record whole: def f(record, key): image, label = record)")
_STAR_ARGS = (" (fn takes *args, so it is called fn(record, key): a wrapper without "
              "functools.wraps, partial(model.apply, params) given the key as their next "
              "argument; pass random=False where it takes the record alone)")
_MAIN_PYTREE = (" (a pytree class of your main script reaches a worker by value, without its "
                "registration with JAX, which ran in your script only: define the class in a "
                "module of its own, which the workers import, or return a dict)")


@loader_names("transform")
class JitMap:
    """A per-record transform ``fn(record)`` or ``fn(record, key)`` written with ``jax.numpy``,
    run ``jax.vmap``-ed over the batch and ``jax.jit``-compiled on the host CPU.

    ``key`` is a ``jax.random`` key a record, derived from ``(seed, epoch, position)``, so the
    batch stays a pure function of its step (any worker count, a restore). Put a NumPy ``Map``
    (decoding, Python logic) before it; a ``BatchMap`` may follow. ``random``: whether ``fn``
    takes the key (by default: whether it takes two positional arguments without defaults, or
    ``*args``; ``fn(record, key=None)`` is warned of, left at its default key).
    ``chunk_bytes``: the batch runs a chunk of rows at a time, as many (a power of two) as
    have this much input and output together (4 MiB: they stay in the caches; the same chunks
    in every process). Dtypes are JAX's: without ``jax_enable_x64`` (the training process's,
    which workers compile with too), 64-bit inputs are taken as 32-bit (return them from a
    ``Map`` before, or cast back in a ``BatchMap`` after, where 64 bits matter); 64-bit
    integers that 32 bits cannot hold are refused, naming the leaf, not wrapped.

    Example:
        >>> import jax, jax.numpy as jnp, numpy as np, jaxloader as jl
        >>> def augment(r, key):
        ...     flip = jax.random.bernoulli(key)
        ...     return {"image": jnp.where(flip, r["image"][:, ::-1], r["image"]) / 255.0}
        >>> t = jl.JitMap(augment)
        >>> out = t({"image": np.zeros((4, 8, 8), np.uint8)}, seed=0, epoch=0,
        ...         positions=np.arange(4))
        >>> out["image"].shape, out["image"].dtype
        ((4, 8, 8), dtype('float32'))
    """

    def __init__(self, fn: Callable[[Any], Any] | Callable[[Any, Any], Any], *,
                 random: bool | None = None, chunk_bytes: Int = CHUNK_BYTES) -> None:
        if not callable(fn):
            raise ConfigError(f"JitMap(fn): expected a callable, got {type(fn).__name__} "
                              f"{fn!r:.60}")
        self.fn: Callable[..., Any] = fn
        self.random = takes_key(fn) if random is None else check_bool("JitMap(random)", random)
        if random is None and key_by(fn) == "default":
            warnings.warn(
                f"JitMap(fn): {callable_name(fn)}'s second "
                "argument, named as a key, has a default, so fn is called fn(record) and draws "
                "from that default, if at all (the same numbers for every record of every "
                "batch, where it makes a key of its own); pass random=True to give each record "
                "its key, or random=False to say it takes none", JaxloaderWarning,
                stacklevel=user_stacklevel())
        if (signature := refused_call(fn, *[None] * (1 + self.random))) is not None:
            raise ConfigError(  # (as made, not at the first batch in a worker)
                f"JitMap(fn): fn is called as fn(record{', key' * self.random}) (random="
                f"{self.random}), but {callable_name(fn)}"
                f"{signature} cannot be; pass random= as fn takes a key, or not (a key is "
                "given by position, second: def fn(record, key), not fn(record, *, key))")
        self.chunk_bytes = check_int("JitMap(chunk_bytes)", chunk_bytes, low=1,
                                     remedy="pass a positive int (bytes), e.g. 1 << 20")
        self._compiled: Any = None  # jit(vmap(fn)): made in the process that runs it
        self._vmapped: Any = None
        self._shapes: dict = {}  # the chunks' shapes it was compiled for, in this process
        self._local = threading.local()  # a thread's chunk sizes, input buffers, last
        # output (written over by the next chunk) and batch layout
        self._likes: dict[tuple, Any] = {}  # a record's kind -> the skeleton of fn's output
        self._given: dict[tuple, Any] = {}  # ... -> the record's own (its keys' order)
        code = code_of(fn)  # its file, named in errors (a pickled function's may be lost)
        self._file = None if code is None else code.co_filename

    def __repr__(self) -> str:
        code = code_of(self.fn)  # (an instance, a partial: what it runs, not its address)
        name = getattr(self.fn, "__qualname__", None) or getattr(code, "co_qualname", None)
        given = f", {self.settings}" if self.settings else ""
        return f"JitMap({name or repr(self.fn)}{given})"

    @property
    def settings(self) -> str:
        """What changes the batches besides ``fn``'s code, for states' digests (``random``
        given against what ``fn``'s signature says, its keys or none)."""
        return "" if self.random == takes_key(self.fn) else f"random={self.random}"

    def fresh(self) -> JitMap:
        """A copy of this ``JitMap`` compiled anew where it runs (a loader's own: one kept
        across loaders kept the globals its first trace read), under this process's JAX
        settings (a worker's copy takes the training process's: ``jit_cpu.CARRIED``)."""
        made = copy.copy(self)
        made._jax = None
        return made

    def __getstate__(self) -> dict:
        return {"fn": self.fn, "random": self.random, "file": self._file,  # (not compiled)
                "chunk_bytes": self.chunk_bytes, "jax": jax_settings()}

    def __setstate__(self, state: dict) -> None:
        self.fn, self.random, self._file = state["fn"], state["random"], state["file"]
        self.chunk_bytes = state["chunk_bytes"]
        self._compiled = self._vmapped = None
        self._shapes, self._local, self._likes, self._given = {}, threading.local(), {}, {}
        self._jax = state.get("jax")  # the sender's settings: a worker compiles alike

    def __call__(self, batch: Any, *, seed: int, epoch: int, positions: np.ndarray,
                 index: int = 0, where: Callable[[], str] = lambda: "a batch") -> Any:
        """``fn`` on each record of the collated ``batch`` (leading axis: records), as NumPy
        arrays; ``positions``: the records' places in ``epoch`` (their keys')."""
        treedef, columns = batch_columns(batch, len(positions))
        return self.run(treedef, columns, len(positions), seed=seed, epoch=epoch,
                        positions=positions, index=index, where=where)[0]

    def run(self, treedef: tree_lib.TreeDef, columns: list, size: int, *, seed: int,
            epoch: int, positions: np.ndarray, index: int = 0,
            where: Callable[[], str] = lambda: "a batch",
            alloc: Callable[[int], Any] | None = None) -> tuple[Any, Layout | None, float, float]:
        """``fn`` over the ``size`` rows of ``columns`` (a batch's leaves), a chunk of rows at a
        time: each chunk is gathered into the same aligned buffers, run, and written out while
        it is still in the caches. Written into ``alloc(nbytes)`` when given, its
        layout returned, else into fresh arrays. Also returns the seconds spent gathering the
        input and writing the output (collation's, not the transform's), and those of a new
        chunk shape's trace and compilation (once a shape: a stage of their own, not a
        batch's cost).

        A last chunk of fewer rows is run at the chunk's shape (one compilation a chunk
        shape), its extra rows those of the chunk before, their results dropped."""
        begun = perf_counter()  # (JAX's first import too, in a worker: a compilation's)
        import jax

        jit_inputs.check_columns(columns, self, where)
        if size < 1:
            raise RecordError(f"{where()}: {self!r} got a batch of no rows; a batch has one "
                              "record or more")
        compiled = self._jitted()
        # JAX without x64 takes a 64-bit number as 32 bits: an integer out of their range
        # wraps, a float beyond float32's is infinite. Such a column is gathered, checked and
        # made 32-bit once a batch (not a chunk: a check's fixed cost; and JAX would convert
        # each chunk's input in the call, where XLA reads a 32-bit one in place)
        columns = [jit_inputs.checked_32_bits(column, size, self, where, narrow)
                   if column.dtype.kind in "iufc" and column.dtype.itemsize in (8, 16)
                   and (narrow := np.dtype(jax.dtypes.canonicalize_dtype(column.dtype)))
                   .itemsize == column.dtype.itemsize // 2
                   else column for column in columns]
        rows, row_out = self._chunk_rows(treedef, columns, where, size)
        shape = (rows, tuple((c.path, c.shape[1:], str(c.dtype)) for c in columns))
        new, compiled_s = shape not in self._shapes, 0.0
        inputs, given = self._inputs(columns, rows)
        last = self._last_output(row_out, rows)
        record = tree_lib.unflatten(treedef, given[:len(columns)])
        keys = record_keys(seed, epoch, positions, index) if self.random else None
        views: list | None = None
        out_treedef: Any = None
        layout = None
        outside = 0.0
        for a in range(0, size, rows):
            b = min(size, a + rows)
            start = perf_counter()
            for column, buffer in zip(columns, inputs):
                collate.stack_rows(column, a, b, buffer[:b - a])
            if keys is not None:
                inputs[-1][...] = keys[a:b] if b - a == rows else np.resize(keys[a:b], (rows, 2))
            args = (record,) if keys is None else (record, given[-1])
            outside += perf_counter() - start
            # in a worker the chunk before's output is donated: XLA writes this chunk's over it,
            # in memory still in the caches (refused, allocating afresh, while a view of it lives)
            last = self._call(compiled, (last, *args), where)
            if new:  # (its trace and compilation, with this one chunk's run)
                new, compiled_s = False, perf_counter() - begun - outside
                self._shapes[shape] = None
                if len(self._shapes) == MANY_SHAPES:  # (a partial batch's, a pad's: a few)
                    warnings.warn(many_shapes(self, [*self._shapes]),
                                  JaxloaderWarning, stacklevel=user_stacklevel())
            if views is None:  # the first chunk: the batch's structure (checked once), its place
                out_treedef, full, order, batch_layout = self._output_layout(
                    last, row_out, rows, size, self._likes.get(record_kind(record, 1)))
            leaves = host_leaves(last, order)  # (waits for XLA's run: the JitMap's time)
            start = perf_counter()
            if views is None:
                if rows == size and alloc is None:  # one chunk: XLA's arrays are the batch
                    views = [leaf.copy() if aliases(leaf, inputs) else leaf for leaf in leaves]
                    self._local.last = (row_out, rows, last)
                    return tree_lib.unflatten(out_treedef, views), None, outside, compiled_s
                if alloc is None:
                    views = [np.empty(c.shape, c.dtype) for c in full]
                else:
                    layout = batch_layout
                    views = layout.leaf_views(alloc(layout.nbytes))
            write_rows(views, leaves, a, b)
            del leaves  # no view of the output left (a view alive, XLA would not write over it)
            outside += perf_counter() - start
        assert views is not None
        self._local.last = (row_out, rows, last)
        return tree_lib.unflatten(out_treedef, views), layout, outside, compiled_s

    def _jitted(self) -> Any:
        """``jit(vmap(fn))`` on the CPU device, made once in the process that runs it; its
        first argument, the chunk before's output, donated in a worker (XLA writes over it)."""
        import jax

        if self._compiled is None:
            for name, value in (getattr(self, "_jax", None) or {}).items():
                if value != getattr(jax.config, name):  # (a worker: as the training process)
                    jax.config.update(name, value)
            fn, random, file = self.fn, self.random, self._file

            def traced(record: Any, *raw: Any) -> Any:
                # its dicts' keys in the record's order (jit sorts them), as a Map's get them
                record = tree_lib.reordered(record, self._given.get(record_kind(record)))
                try:
                    out = traced_call(self, lambda: fn(record, jax.random.wrap_key_data(
                        raw[0], impl="threefry2x32")) if random else fn(record))
                except Exception as e:  # the user's line, before JAX filters the traceback
                    setattr(e, "jaxloader_line", user_line(e, fn, file))
                    raise
                # its dicts' keys in the order fn wrote them (jit sorts them), by record kind
                self._likes[record_kind(record)] = tree_lib.skeleton(out)
                return out
            vmapped = jax.vmap(traced)
            on_cpu = one_device(cpu_device())  # (NumPy inputs go there)
            self._vmapped = vmapped
            donate = donates()
            self._compiled = jax.jit(lambda last, *args: vmapped(*args),
                                     donate_argnums=0 if donate else (), keep_unused=donate,
                                     in_shardings=on_cpu, out_shardings=on_cpu)
        return self._compiled

    def _chunk_rows(self, treedef: tree_lib.TreeDef, columns: list, where: Callable[[], str],
                    size: int) -> tuple[int, Any]:
        """Rows a chunk: the largest power of two whose input and output fit ``chunk_bytes``
        (found once a record signature, the output's size traced from one row), at most
        ``size``: a function of the shapes only, so the same in every process. Also the
        output's structure for one row (``jax.ShapeDtypeStruct`` leaves)."""
        import jax

        # (and this thread's JAX settings: x64 turned on between two batches changes the
        # output's dtypes, which a multi-chunk batch's slot was laid out in from the cache)
        signature = (treedef, tuple((c.shape[1:], c.dtype) for c in columns),
                     tuple((jax_settings() or {}).items()))
        found = self._local.__dict__.setdefault("rows", {}).get(signature)
        if found is None:
            one = tree_lib.unflatten(treedef, [np.zeros((1, *c.shape[1:]), c.dtype)
                                               for c in columns])
            check_keys(self, one, where)
            self._given.setdefault(record_kind(one, 1), tree_lib.skeleton(one))  # (for traced)
            args = (one,) if not self.random else (one, np.zeros((1, 2), np.uint32))
            out = self._call(lambda *a: jax.eval_shape(self._vmapped, *a), args, where)
            check_row_output(self, out, where, _KEY_ARGUMENT if self.random else "")
            per_row = sum(row_bytes(x.shape, x.dtype) for x in jax.tree.leaves(out))
            per_row += sum(row_bytes(c.shape, c.dtype) for c in columns)
            found = (1 << max(0, (self.chunk_bytes // max(1, per_row)).bit_length() - 1), out)
            self._local.rows[signature] = found
        return max(1, min(found[0], size)), found[1]

    def _output_layout(self, out: Any, row_out: Any, rows: int, size: int,
                       like: Any) -> tuple[Any, list, list[int] | None, Layout]:
        """The structure of a batch of ``size`` rows from chunks of ``rows`` like ``out`` (XLA's
        output; ``like``: the skeleton of what fn returned, its dicts' keys in fn's order): its
        treedef, its columns (no values), where its leaves are in JAX's order, and its layout
        in a slot. Checked (``batch_columns``) once a shape, in this thread: the compiled
        function's output is the same for every batch of it."""
        kept = self._local.__dict__.get("layout")
        if kept is None or kept[0] is not row_out or kept[1:3] != (rows, size):
            ordered = tree_lib.reordered(out, like)  # (as fn wrote)
            leaves, ours = tree_lib.flatten(ordered)
            treedef, columns = batch_columns(
                tree_lib.unflatten(ours, [np.asarray(x) for x in leaves]), rows)
            full = [c._replace(shape=(size, *c.shape[1:]), values=None) for c in columns]
            kept = (row_out, rows, size, treedef, full, leaf_order(out, ordered),
                    collate.layout_of(treedef, full))
            self._local.layout = kept
        return kept[3:]

    def _last_output(self, row_out: Any, rows: int) -> Any:
        """The output of this thread's chunk before, taken (an error leaves none: a donated
        buffer may be gone), to be written over by the next chunk; zeros where it had another
        shape, or there is none."""
        import jax

        kept = self._local.__dict__.pop("last", None)
        if kept is not None and kept[0] is row_out and kept[1] == rows:
            return kept[2]
        device = cpu_device()  # (put explicitly: jnp.zeros's fill broke jax_transfer_guard
        return jax.tree.map(lambda x: jax.device_put(  # "disallow", and an abstract mesh)
            np.zeros((rows, *x.shape[1:]), x.dtype), device), row_out)

    def _inputs(self, columns: list, rows: int) -> tuple[list[np.ndarray], list]:
        """This thread's input buffers for a chunk of ``rows`` (the keys' last, where ``fn``
        takes them): made once a signature, at 64-byte aligned addresses; and what XLA is
        given for each, ``jax.Array``s over the same memory (``in_place``)."""
        signature = (rows, tuple((c.shape[1:], c.dtype) for c in columns))
        made = self._local.__dict__.setdefault("inputs", {})
        if signature not in made:
            made.clear()  # (one signature kept: a last, partial batch's is made again)
            buffers = [aligned(row_bytes(c.shape, c.dtype) * rows).view(c.dtype)
                       .reshape(rows, *c.shape[1:]) for c in columns]
            if self.random:
                buffers.append(aligned(8 * rows).view(np.uint32).reshape(rows, 2))
            made[signature] = (buffers, in_place(buffers))
        return made[signature]

    def _call(self, compiled: Any, args: tuple, where: Callable[[], str]) -> Any:
        """``compiled(*args)``, outside the caller's ``jax.set_mesh`` (it runs on this process's
        CPU device: under a mesh of the accelerators, or of several CPU devices, jit refused
        its inputs as on "incompatible devices") and debugging settings (as in a worker:
        ``jax_disable_jit`` ran it op by op, other bits than 2 workers', ``jax_debug_nans``
        raised where they gave NaN); an error named: the batch, this transform, the user's
        line and, for a function that does not trace, the remedies."""
        import jax

        try:
            with jax.set_mesh(None), as_compiled():
                return compiled(*args)
        except Exception as e:
            line = getattr(e, "jaxloader_line", None) or user_line(e, self.fn, self._file)
            star = _STAR_ARGS if self.random and key_by(self.fn) == "*args" else ""
            if type(e).__name__ in _NOT_TRACING:
                raise RecordError(
                    f"{where()}: {self!r} does not trace{line}: "
                    f"{type(e).__name__}: {str(e).splitlines()[0]}; a JitMap's function runs "
                    "on traced arrays, once for all batches of a shape: write choices on "
                    "values with jnp.where or jax.lax.cond, use jax.numpy in place of NumPy, "
                    f"or move that part into a Map before the JitMap{star}") from e
            # (a tf.data-style fn(image, label) on (image, label) records: a tuple as image)
            hint = _KEY_ARGUMENT if self.random and isinstance(e, (AttributeError, TypeError)) \
                and "tuple" in str(e) else star
            if "__main__." in str(e) and "not a valid JAX type" in str(e):
                hint += _MAIN_PYTREE
            hint += UNSORTED if "Comparator raised exception" in str(e) else ""
            raise RecordError(f"{where()}: {self!r} raised {type(e).__name__}: {error_text(e)}"
                              f"{line}{jit_inputs.placed_elsewhere(self.fn, cpu_device())}"
                              f"{hint}; the original error is the cause below") from e

