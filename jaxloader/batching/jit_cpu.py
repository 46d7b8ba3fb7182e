"""Where a ``JitMap`` runs: XLA's CPU device, sized in a worker to the worker's share of the
cores; freed memory kept for the next chunk's output; input buffers at the addresses XLA
reads in place.

Example:
    >>> aligned(100).ctypes.data % 64
    0
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

import numpy as np

THREADS_ENV = "JAXLOADER_XLA_THREADS"  # cores a worker's XLA CPU backend is sized for
IN_WORKER = False  # set as a worker or a Ray actor starts (not read from the environment, which
# a user may set THREADS_ENV in, and the training process then shares: it was pinned, donated)


def donates() -> bool:
    """Whether a ``JitMap`` here donates the chunk before's output (XLA writes over it): in a
    worker. A jit made with ``keep_unused=True`` (which donating an argument it does not read
    needs) is never let go by JAX 0.12 (its lowering's cache entry holds the key it keeps
    weakly): ~1 MB a loader made in the training process, which may make one each time (an
    evaluation's); a worker ends with its loader. Not donating there costs no measured speed."""
    return IN_WORKER


def as_compiled() -> Any:
    """A context in which a ``JitMap`` runs as in a worker whatever this process's debugging
    settings (``jax_disable_jit`` ran it op by op, other bits; ``jax_debug_nans`` raised where
    a worker gave NaN); nothing to enter where none is set (~4 us a chunk otherwise)."""
    import contextlib

    import jax

    config: Any = jax.config  # (JAX 0.10's stubs name neither debug setting)
    if not (config.jax_disable_jit or config.jax_debug_nans or config.jax_debug_infs):
        return contextlib.nullcontext()
    stack = contextlib.ExitStack()
    for setting in (jax.disable_jit, jax.debug_nans, jax.debug_infs):
        stack.enter_context(setting(False))
    return stack


def cpu_device() -> Any:
    """JAX's first CPU device of this process (after ``jax.distributed.initialize``,
    ``jax.devices("cpu")[0]`` is process 0's, which another process cannot address: its
    JitMap failed with num_workers=0, "UnsafeBufferPointer() is supported only for unsharded
    arrays"). In a worker (``IN_WORKER``), with ``JAXLOADER_XLA_THREADS`` in its environment (1
    by default, ``workers/process.py``), XLA's CPU backend is started while this process may
    run on that many cores only: XLA sizes its thread pools from the cores it may use, and
    flags do not bound them. Every thread may use all the cores again afterwards."""
    import jax

    if _CPU:
        return _CPU[0]
    threads = os.environ.get(THREADS_ENV) if IN_WORKER else None
    if not threads or not hasattr(os, "sched_setaffinity"):
        _CPU.append(jax.local_devices(backend="cpu")[0])
        return _CPU[0]
    _keep_freed_memory()
    allowed = os.sched_getaffinity(0)
    os.sched_setaffinity(0, sorted(allowed)[:max(1, int(threads))])
    try:
        _CPU.append(jax.local_devices(backend="cpu")[0])
        return _CPU[0]
    finally:
        try:  # (XLA's threads, started meanwhile, given the whole affinity back)
            started = os.listdir("/proc/self/task")
        except OSError:  # (no /proc: this thread's alone)
            started = [str(threading.get_native_id())]
        for tid in started:
            try:
                os.sched_setaffinity(int(tid), allowed)
            except OSError:  # a thread that ended meanwhile
                pass


_CPU: list = []  # cpu_device()'s, once found


def _keep_freed_memory() -> None:
    """In a worker (glibc): memory freed stays in the process for the next allocation. XLA
    allocates buffers in its calls (a batch's first output, a shape's first chunk, its own
    temporaries); glibc, left alone, gives large blocks back to the system (``mmap``, heap
    trimming) and the next allocation faults them in again, page by page, which cost a
    JitMap's chunks more than XLA's work. Elsewhere (musl, macOS): nothing."""
    try:
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    mallopt(_M_MMAP_THRESHOLD, 32 << 20)  # blocks up to 32 MiB from the heap (glibc's most)
    mallopt(_M_TRIM_THRESHOLD, 256 << 20)  # and up to 256 MiB free kept at its top


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's malloc.h


def aligned(nbytes: int) -> np.ndarray:
    """``nbytes`` of fresh memory at a 64-byte aligned address, where XLA on the CPU takes
    a NumPy input without copying it (at NumPy's 16 bytes it copies).

    Example:
        >>> aligned(100).ctypes.data % 64, len(aligned(100))
        (0, 100)
    """
    raw = np.empty(nbytes + 64, np.uint8)
    start = -raw.ctypes.data % 64
    return raw[start:start + nbytes]


def in_place(buffers: list[np.ndarray]) -> list:
    """Each of ``buffers`` as a ``jax.Array`` on the CPU device over the same memory, or the
    buffer itself where JAX would copy it (a dtype it converts, memory it does not take). A
    call given NumPy arrays wraps each anew (~10 us a call of a JitMap's ~100); writing into a
    buffer between calls changes what the next call reads, as with NumPy inputs.

    Example:
        >>> b = aligned(64).view(np.float32)
        >>> x, = in_place([b])
        >>> b[:] = 2.0; float(x.sum())
        32.0
    """
    import jax

    device = cpu_device()
    given = []
    for buffer in buffers:
        placed = jax.device_put(buffer, device) if buffer.nbytes else None
        same = placed is not None and placed.unsafe_buffer_pointer() == buffer.ctypes.data
        given.append(placed if same else buffer)
    return given


# What changes a compiled function's output besides its code: the dtypes, a key's random bits
# (a worker's default drew others than a process that set them, without a word), promotions
CARRIED = ("jax_enable_x64", "jax_threefry_partitionable", "jax_default_matmul_precision",
           "jax_default_prng_impl", "jax_numpy_dtype_promotion", "jax_numpy_rank_promotion")


def jax_settings() -> dict[str, Any] | None:
    """This process's ``CARRIED`` settings (``None``: JAX not imported, its defaults then)."""
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    found = {}
    for name in CARRIED:
        try:
            value = getattr(jax.config, name)  # (read() refuses some)
            found[name] = getattr(value, "value", value)  # (an Enum's: its text)
        except Exception:  # noqa: BLE001 - (a JAX without the option)
            pass
    return found
