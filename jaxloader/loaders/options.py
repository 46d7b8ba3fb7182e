"""The DataLoader's options, validated once, as plain data.

``batch_size``, ``seed``, ``last_batch`` and the process placement are checked by the
``Sampler``, which uses them; everything else is checked here, each with the argument's name,
what was expected, what came and what to do.

Example:
    >>> LoaderOptions(num_workers=2).prefetch
    2
    >>> LoaderOptions(num_epochs=0)
    Traceback (most recent call last):
    ...
    jaxloader.base.errors.ConfigError: num_epochs: expected an int >= 1, got 0; pass None for an endless iterator
"""

from __future__ import annotations

import dataclasses
import sys
import warnings
from typing import Any, Literal, NamedTuple, get_args

from jaxloader.base.checks import BATCH_LIMIT, Int, check_int, is_seconds, refused_call
from jaxloader.base.errors import (ConfigError, JaxloaderWarning, PerformanceWarning,
                                   user_stacklevel)
from jaxloader.loaders.diagnosis import cores_available
from jaxloader.loaders.monitor import MAX_READ_WAIT_FACTOR
from jaxloader.runtime.worker_info import get_worker_info

MAX_DEVICE_PREFETCH = 4096  # batches kept on device at most (past 32 is warned of, elsewhere)
StartMethod = Literal["exec", "fork"]
START_METHODS: tuple[str, ...] = get_args(StartMethod)



@dataclasses.dataclass(frozen=True)
class LoaderOptions:
    """How batches are made and delivered (see ``DataLoader`` for each argument)."""

    num_workers: int = 0  # (1 with auto_workers: the count at the start)
    num_epochs: int | None = 1
    mask_key: str = "mask"
    prefetch: int = 2  # (2 with auto_prefetch: the start)
    start_method: str = "exec"
    device_prefetch: int | None = None  # (an int once checked: 2 where not given)
    stall_warning_s: float | None = 300.0
    timeout_s: float | None = None
    log_every_s: float | None = None
    auto_workers: bool = False  # (set from num_workers="auto")
    auto_prefetch: bool = False  # (set from prefetch="auto")
    unplaced: bool = False  # (no sharding: a device_prefetch given is warned of, once)
    unmasked: str = ""  # (no mask added: what would add one, a mask_key given warned of, once)

    def __post_init__(self) -> None:
        def keep(name: str, value: Any) -> None:  # as a Python int (NumPy's are not JSON)
            object.__setattr__(self, name, value)


        if self.num_epochs is not None:
            keep("num_epochs", check_int("num_epochs", self.num_epochs, low=1,
                                         remedy="pass None for an endless iterator"))
        keep("num_workers", check_int("num_workers", self.num_workers, low=0,
                                      remedy="0 runs in this process; 'auto' chooses"))
        if self.num_workers > MAX_READ_WAIT_FACTOR * (cores := cores_available()) and (
                get_worker_info() is None):  # (a typo? In a worker none start: said there)
            warnings.warn(
                f"num_workers={self.num_workers}: {self.num_workers} worker processes on "
                f"{cores} cores, more than {MAX_READ_WAIT_FACTOR} a core, which even reads "
                "waiting 95% of the time do not keep busy (each worker is an interpreter of "
                "its own, with its own memory); use fewer, or num_workers='auto', which grows "
                "while more help", PerformanceWarning, stacklevel=user_stacklevel())
        keep("prefetch", check_int(
            "prefetch", self.prefetch, low=1,
            remedy="tasks in flight per worker, a task up to 16 batches; 'auto' chooses"))
        given = self.device_prefetch is not None
        keep("device_prefetch", 2 if not given else check_int(
            "device_prefetch", self.device_prefetch, low=0, high=MAX_DEVICE_PREFETCH,
            remedy="batches kept ready on device, each a batch of device memory; 0 places "
                   "each batch inside next()"))
        if given and self.device_prefetch and self.unplaced:  # (given, to no effect)
            warnings.warn(
                f"device_prefetch={self.device_prefetch} without a sharding: batches stay "
                "NumPy arrays on the host and none is placed ahead; pass sharding= (a device, "
                "jax.devices()[0], or jaxloader.data_sharding(mesh); a mesh set by "
                "jax.set_mesh is not used without one: sharding=PartitionSpec('data')) to "
                "have them placed on a thread ahead of next(), or leave device_prefetch out",
                JaxloaderWarning, stacklevel=user_stacklevel())
        keep("unplaced", False)  # (looked at once: a copy, dataclasses.replace, says nothing,
        # and a default device_prefetch is not a given one there)
        if not isinstance(self.mask_key, str) or not self.mask_key:  # ("": a key no one
            raise ConfigError(  # reads as a name, batch[""])
                f"mask_key: expected a non-empty str (the name of the pad mask leaf), got "
                f"{type(self.mask_key).__name__} {self.mask_key!r}"
            )
        if self.unmasked and self.mask_key != "mask":  # (given, to no effect)
            warnings.warn(f"mask_key={self.mask_key!r}: no mask is added to these batches, "
                          f"which only {self.unmasked} adds; pass that, or leave mask_key out",
                          JaxloaderWarning, stacklevel=user_stacklevel())
        keep("unmasked", "")  # (as unplaced: once)
        for name in ("stall_warning_s", "timeout_s", "log_every_s"):
            value = getattr(self, name)
            if value is not None and not is_seconds(value):
                raise ConfigError(
                    f"{name}: expected a number of seconds > 0, or None, got "
                    f"{type(value).__name__} {value!r}; None: "
                    + {"stall_warning_s": "no report of a late batch",
                       "timeout_s": "wait for a batch as long as it takes",
                       "log_every_s": "no periodic summary"}[name])
            if value is not None:
                keep(name, float(value))  # (NumPy's: a Python float)
        if self.start_method not in START_METHODS:
            raise ConfigError(
                f"start_method: expected one of {START_METHODS}, got {self.start_method!r}; "
                "'exec' is the safe default"
            )


def automatic(name: str, value: Int | str, start: int) -> tuple[int, bool]:
    """``(start, True)`` for ``"auto"``, else ``(value, False)`` with ``value`` an int >= 0.

    Example:
        >>> automatic("num_workers", "auto", start=1), automatic("num_workers", 3, start=1)
        ((1, True), (3, False))
    """
    if value == "auto":
        return start, True
    low = 1 if name == "prefetch" else 0  # (as Options checks it: said once, the same)
    return check_int(name, value, low=low, remedy="a count, or 'auto' to let the loader choose"
                     + (" (with num_workers='auto')" if low else "")), False


class Placement(NamedTuple):
    """Where this process's batches sit in the global one: ``batch_size`` records of the
    ``batch_size * process_count``, at ``process_index``."""

    batch_size: int
    process_index: int
    process_count: int


def placement(batch_size: Int, process_index: Int | None,
              process_count: Int | None) -> Placement:
    """``batch_size`` and the process's place, checked; a place left ``None`` is JAX's.

    Example:
        >>> placement(32, 1, 4)
        Placement(batch_size=32, process_index=1, process_count=4)
    """
    batch_size = check_int("batch_size", batch_size, low=1, high=BATCH_LIMIT,
                           remedy="pass a positive batch size per process" + (
                               "; PyTorch's batch_size=None (records one at a time, not "
                               "batched) has none here: index the source, or batch_size=1 "
                               "and take [0]" if batch_size is None else ""))
    counted = process_count is None  # (JAX's, where an index was given alone)
    if process_count is not None:  # (an int first: a JAX scalar's checked as one below)
        process_count = check_int("process_count", process_count, low=1,
                                  remedy="leave it None to use jax's")
    if process_index is None or process_count is None:
        if process_index is None and process_count is None and not jax_started():
            index, count = 0, 1  # see jax_pending: one process, checked again by iter()
        else:  # one given (a multi-process run), or JAX in use: JAX says the other
            import jax  # (workers never get here)

            index, count = jax.process_index(), jax.process_count()
            if process_index is None and process_count not in (None, count):  # (JAX's index
                # 0 of 1: each host would read it)
                raise ConfigError(
                    f"process_count={process_count} was given without process_index, which "
                    f"would be JAX's, but JAX knows {count} process(es) (jax.distributed not "
                    "initialised in this process?), so this process's index is not known and "
                    "every host would read as process 0; pass process_index= too (each host "
                    "its own), or call jax.distributed.initialize() before the loader")
        process_index = index if process_index is None else process_index
        process_count = count if process_count is None else process_count
    process_count = check_int("process_count", process_count, low=1,
                              remedy="leave it None to use jax's")
    process_index = check_int("process_index", process_index, low=0, high=process_count - 1,
                              remedy=f"use an index in [0, {process_count})" + (
                                  " (JAX's count: pass process_count= too)" if counted else ""))
    return Placement(batch_size, process_index, process_count)


def jax_pending(process_index: Int | None, process_count: Int | None) -> tuple[bool, bool]:
    """Which of the place's two numbers ``placement`` takes as one process's without asking
    JAX: both, when both are left ``None`` and this process has not started JAX's runtime
    (JAX not imported, or imported and not yet used). Such a process has not called
    ``jax.distributed.initialize()``, so it is the only one as far as JAX knows yet; asking
    JAX would start its runtime in a process that may still fork workers
    (``start_method="fork"``) or initialise ``jax.distributed``.
    ``check_jax_placement`` asks JAX at ``iter()`` (and ``peek()``, ``state_dict()``,
    ``load_state_dict()``), once it is imported."""
    if jax_started() or process_index is not None or process_count is not None:
        return False, False
    return True, True


def jax_started() -> bool:
    """Whether JAX is imported and its runtime started, or ``jax.distributed`` initialised:
    then JAX knows the process's place. Asking it earlier starts the runtime, after which
    ``jax.distributed.initialize()`` fails (JAX imported only: not asked)."""
    if "jax" not in sys.modules:
        return False
    import jax

    try:
        from jax._src import xla_bridge  # (private: checked to exist, else JAX is asked)

        return bool(jax.distributed.is_initialized() or xla_bridge.backends_are_initialized())
    except (ImportError, AttributeError):
        return True


def check_jax_placement(place: Placement, pending: tuple[bool, bool]) -> tuple[bool, bool]:
    """``pending`` numbers of ``place`` against JAX's, if JAX is imported now; returns what is
    still pending. Raises where JAX disagrees (a loader made before
    ``jax.distributed.initialize()``).

    Example:
        >>> check_jax_placement(Placement(8, 0, 1), (False, False))
        (False, False)
    """
    if not any(pending) or "jax" not in sys.modules:
        return pending
    import jax

    index, count = jax.process_index(), jax.process_count()
    if (pending[0] and index != place.process_index) or \
            (pending[1] and count != place.process_count):
        raise ConfigError(
            f"process_index/process_count: the loader was made before JAX was imported or "
            f"started, so it took this process as the only one (process {place.process_index} of "
            f"{place.process_count}), but JAX now runs it as process {index} of {count}; make "
            "the loader after jax.distributed.initialize(), or pass process_index= and "
            "process_count="
        )
    return False, False


def check_worker_init_fn(worker_init_fn: Any) -> None:
    """Refuses a ``worker_init_fn`` that is not a function of the worker's id, as the loader
    is made (not in the workers, each one's error).

    Example:
        >>> check_worker_init_fn(lambda worker_id: None)
    """
    if worker_init_fn is not None and not callable(worker_init_fn):
        raise ConfigError(f"worker_init_fn: expected a function of the worker's id, or "
                          f"None, got {type(worker_init_fn).__name__} {worker_init_fn!r:.60}")
    signature = None if worker_init_fn is None else refused_call(worker_init_fn, 0)
    if signature is not None:  # (Grain's takes (worker_index, worker_count))
        raise ConfigError(
            f"worker_init_fn: it is called as fn(worker_id), but "
            f"{getattr(worker_init_fn, '__qualname__', 'it')}{signature} does not take one "
            "argument; the count in use is jaxloader.get_worker_info().num_workers")
