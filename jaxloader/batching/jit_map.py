"""``JitMap``: a per-record transform written with ``jax.numpy``, run ``jax.vmap``-ed over the
batch and ``jax.jit``-compiled for the host CPU, where the batch is made (a worker, or the
training process with ``num_workers=0``).

::

    records ──Map, RandomMap (NumPy, a record at a time)──> collated batch (NumPy)
            ──JitMap: jit(vmap(fn))(batch[, keys]) on the CPU device──> NumPy ──> the slot
    keys: a jax.random key a record, from (seed, epoch, position, transform index): never from
          the worker, so a batch is the same with any worker count and after a restore

XLA compiles the function once a batch shape (JAX's own cache: a partial last batch is one more
compilation) and fuses its operations into a pass or two over memory, where a NumPy transform
pays Python a record and a memory pass an operation. JAX is imported only where a ``JitMap``
runs, and its computation stays on the CPU: a worker's JAX is CPU-only
(``workers/process.py``); in the training process the inputs are put on the CPU device, which
the compiled function follows.

Example:
    >>> import numpy as np
    >>> t = JitMap(lambda r: {"x": r["x"] * 2.0})
    >>> x = np.arange(3, dtype=np.float32)[:, None]
    >>> t({"x": x}, seed=0, epoch=0, positions=np.arange(3))["x"][:, 0]
    array([0., 2., 4.], dtype=float32)
"""

from __future__ import annotations

import inspect
import linecache
import os
import traceback
from typing import Any, Callable

import numpy as np

from jaxloader.base import tree as tree_lib
from jaxloader.base.checks import MASK64, POSITION_BITS
from jaxloader.base.errors import ConfigError, RecordError

# The errors of a function that does not trace: Python control flow on a traced value, a NumPy
# call on one (found by name: JAX's error classes moved between versions)
_NOT_TRACING = ("ConcretizationTypeError", "TracerBoolConversionError",
                "TracerArrayConversionError", "TracerIntegerConversionError",
                "NonConcreteBooleanIndexError")
THREADS_ENV = "JAXLOADER_XLA_THREADS"  # cores a worker's XLA CPU backend is sized for
_KEY_SALT = 0x9E3779B97F4A7C15  # a JitMap's keys differ from each other's and a RandomMap's


class JitMap:
    """A per-record transform ``fn(record)`` or ``fn(record, key)`` written with ``jax.numpy``,
    run ``jax.vmap``-ed over the batch and ``jax.jit``-compiled on the host CPU.

    ``key`` is a ``jax.random`` key a record, derived from ``(seed, epoch, position)``, so the
    batch stays a pure function of its step (any worker count, a restore). Put NumPy ``Map``s
    (decoding, Python logic) before it; ``BatchMap``s may follow. ``random``: whether ``fn``
    takes the key (by default: whether it takes two positional arguments). Dtypes are JAX's:
    without ``jax_enable_x64``, 64-bit inputs are taken as 32-bit (return them from a
    ``Map`` before, or cast back in a ``BatchMap`` after, where 64 bits matter).

    Example:
        >>> import jax, jax.numpy as jnp
        >>> def augment(r, key):
        ...     flip = jax.random.bernoulli(key)
        ...     return {"image": jnp.where(flip, r["image"][:, ::-1], r["image"]) / 255.0}
        >>> t = JitMap(augment)
        >>> out = t({"image": np.zeros((4, 8, 8), np.uint8)}, seed=0, epoch=0,
        ...         positions=np.arange(4))
        >>> out["image"].shape, out["image"].dtype
        ((4, 8, 8), dtype('float32'))
    """

    def __init__(self, fn: Callable[..., Any], *, random: bool | None = None) -> None:
        if not callable(fn):
            raise ConfigError(f"JitMap(fn): expected a callable, got {type(fn).__name__} "
                              f"{fn!r:.60}")
        self.fn = fn
        self.random = takes_key(fn) if random is None else bool(random)
        self._compiled: Any = None  # jit(vmap(fn)): made in the process that runs it
        code = getattr(fn, "__code__", None)  # its file, named in errors (a pickled
        self._file = None if code is None else code.co_filename  # function's may be lost)

    def __repr__(self) -> str:
        return f"JitMap({getattr(self.fn, '__qualname__', None) or repr(self.fn)})"

    def __getstate__(self) -> dict:
        return {"fn": self.fn, "random": self.random, "file": self._file}  # (not compiled)

    def __setstate__(self, state: dict) -> None:
        self.fn, self.random, self._file = state["fn"], state["random"], state["file"]
        self._compiled = None

    def __call__(self, batch: Any, *, seed: int, epoch: int, positions: np.ndarray,
                 index: int = 0, where: Callable[[], str] = lambda: "a batch") -> Any:
        """``fn`` on each record of the collated ``batch`` (leading axis: records), as NumPy
        arrays; ``positions``: the records' places in ``epoch`` (their keys')."""
        import jax  # here only: a loader without a JitMap never imports JAX in its workers

        cpu = cpu_device()
        if self._compiled is None:
            fn, random, file = self.fn, self.random, self._file

            def traced(record: Any, *raw: Any) -> Any:
                try:
                    if random:
                        return fn(record, jax.random.wrap_key_data(raw[0], impl="threefry2x32"))
                    return fn(record)
                except Exception as e:  # the user's line, before JAX filters the traceback
                    setattr(e, "jaxloader_line", _user_line(e, fn, file))
                    raise
            self._compiled = jax.jit(jax.vmap(traced))
        _check_leaves(batch, self, where)
        args = (batch, record_keys(seed, epoch, positions, index)) if self.random else (batch,)
        try:
            out = self._compiled(*jax.device_put(args, cpu))
            return jax.tree.map(np.asarray, out)
        except Exception as e:
            line = getattr(e, "jaxloader_line", None) or _user_line(e, self.fn, self._file)
            if type(e).__name__ in _NOT_TRACING:
                raise RecordError(
                    f"{where()}: {self!r} does not trace{line}: "
                    f"{type(e).__name__}: {str(e).splitlines()[0]}; a JitMap's function runs "
                    "on traced arrays, once for all batches of a shape: write choices on "
                    "values with jnp.where or jax.lax.cond, use jax.numpy in place of NumPy, "
                    "or move that part into a Map before the JitMap") from e
            first = str(e).splitlines()[0] if str(e) else ""
            raise RecordError(f"{where()}: {self!r} raised {type(e).__name__}: {first}"
                              f"{line}; the original error is "
                              "the cause below") from e


def cpu_device() -> Any:
    """JAX's first CPU device. In a worker (``JAXLOADER_XLA_THREADS`` in its environment: 1
    by default, ``workers/process.py``), XLA's CPU backend is started while this process may
    run on that many cores only: XLA sizes its thread pools from the cores it may use, and
    flags do not bound them. Every thread may use all the cores again afterwards."""
    import jax

    if _CPU:
        return _CPU[0]
    threads = os.environ.get(THREADS_ENV)
    if not threads or not hasattr(os, "sched_setaffinity"):
        _CPU.append(jax.devices("cpu")[0])
        return _CPU[0]
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(allowed)[:max(1, int(threads))])
    try:
        _CPU.append(jax.devices("cpu")[0])
        return _CPU[0]
    finally:
        for tid in os.listdir("/proc/self/task"):
            try:
                os.sched_setaffinity(int(tid), allowed)
            except OSError:  # a thread that ended meanwhile
                pass


_CPU: list = []  # cpu_device()'s, once found


def aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh memory at a 64-byte aligned address, where ``jax.device_put`` on
    the CPU takes an array without copying it (at NumPy's 16 bytes it copies).

    Example:
        >>> aligned(100).ctypes.data % 64, len(aligned(100))
        (0, 100)
    """
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes]


def takes_key(fn: Callable[..., Any]) -> bool:
    """Whether ``fn`` takes two positional arguments (a record and a key).

    Example:
        >>> takes_key(lambda r, key: r), takes_key(lambda r: r)
        (True, False)
    """
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin without a signature: one argument
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    return len(positional) >= 2 or any(p.kind == p.VAR_POSITIONAL for p in params)


def record_keys(seed: int, epoch: int, positions: np.ndarray, index: int) -> np.ndarray:
    """Raw ``threefry2x32`` key data, ``uint32[n, 2]``: a SplitMix64 hash of ``(seed, index)``
    and each record's ``epoch << POSITION_BITS | position`` (RandomMap's words).

    Example:
        >>> k = record_keys(0, 0, np.arange(3), 0)
        >>> k.shape, k.dtype, len({tuple(r) for r in k.tolist()})
        ((3, 2), dtype('uint32'), 3)
    """
    with np.errstate(over="ignore"):
        base = _mix(np.array([(seed ^ (_KEY_SALT * (index + 1))) & MASK64], np.uint64))
        words = np.asarray(positions, np.uint64) | np.uint64((epoch << POSITION_BITS) & MASK64)
        h = _mix(_mix(words ^ base))
    return np.stack([h >> np.uint64(32), h & np.uint64(0xFFFFFFFF)], axis=1).astype(np.uint32)


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser over an array (wrapping ``uint64`` arithmetic)."""
    z = z + np.uint64(0x9E3779B97F4A7C15)
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


def _check_leaves(batch: Any, t: JitMap, where: Callable[[], str]) -> None:
    """Refuses a leaf JAX cannot take (strings, objects), naming it."""
    leaves, treedef = tree_lib.flatten(batch)
    for path, leaf in zip(tree_lib.leaf_paths(treedef, "batch"), leaves):
        dtype = np.asarray(leaf).dtype
        if dtype.kind not in "biufc":
            raise RecordError(
                f"{where()}: {t!r} gets {path} of dtype {dtype}, expected numbers (bool, int, "
                "uint, float, complex): JAX takes numeric arrays; turn it into numbers in a Map "
                "before the JitMap, or drop it there")


def _user_line(e: BaseException, fn: Callable[..., Any], file: str | None) -> str:
    """`` at file:line: `code``` for the innermost frame of ``e`` in ``fn``'s file (named
    ``file``: where it was defined, before pickling)."""
    code = getattr(fn, "__code__", None)
    if code is None:
        return ""
    found = None
    cause: BaseException | None = e
    while cause is not None and found is None:
        frames = [f for f in traceback.extract_tb(cause.__traceback__)
                  if f.filename == code.co_filename]
        found = frames[-1] if frames else None
        cause = cause.__cause__ or cause.__context__
    if found is None:
        return ""
    file = file or found.filename
    line = (found.line or linecache.getline(file, found.lineno or 0)).strip()
    return f" at {file}:{found.lineno}" + (f": `{line}`" if line else "")
