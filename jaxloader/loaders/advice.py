"""The words of ``loader.diagnose()``'s advice that are measured apart from its verdict:
what placing a batch costs, and the functions a source runs as it reads (timed as reading).

Example:
    >>> placement_advice(0.2, 100, True, 4e6)[:55]
    'device placement takes 2.0 ms a batch in the training p'
"""

from __future__ import annotations

from typing import Any

PER_CALL_RATE = 1e9  # bytes/s under which placement costs its calls, not its bytes,
CALLS_BYTES = 1 << 20  # in batches up to this size, or a batch's in under 1 ms


def mapped_functions(source: Any) -> list[str]:
    """The ``MapSource`` functions ``source`` runs as it reads (``"MapSource(decode)"``)."""
    from jaxloader.batching.transforms import fn_name
    from jaxloader.sources.mapped import MapSource
    from jaxloader.sources.parts import walk

    return [] if source is None else list(dict.fromkeys(
        f"MapSource({fn_name(s.fn)})" for s in walk(source) if isinstance(s, MapSource)))


def placement_advice(place: float, batches: int, in_thread: bool, nbytes: float) -> str:
    """What placement costs a batch, and what makes it cheaper (a deeper ``device_prefetch``
    only where the copies leave the training thread: one device's, on the thread; several
    devices' are dispatched from the training thread, ahead, which overlaps them with the
    steps on an accelerator, not on the CPU backend). A batch of ``nbytes`` placed far below
    a copy's rate costs its calls, not its bytes: a lower precision would not help."""
    ahead = ("a larger device_prefetch= (batches copied ahead, on a thread)" if in_thread else
             "on an accelerator a larger device_prefetch= (several devices' copies are "
             "dispatched ahead from the training thread, and overlap the steps)")
    each = place / max(1, batches)
    if nbytes < PER_CALL_RATE * each and (each < 1e-3 or nbytes < CALLS_BYTES):  # (below a
        # copy's GB/s, and small: 300 leaves of 1 KB to 8 devices took 40 ms, told "a lower
        # precision"; a 12 MB batch as slow may be its bytes, as a 100 MB one's: the review)
        return (f"device placement takes {1e3 * each:.1f} ms a batch in the training process, "
                f"for {nbytes / 1e3:,.0f} KB a batch: the cost of its calls, not its bytes "
                f"(fewer leaves, or larger batches, carry it; a lower precision would not), or "
                f"{ahead}")
    return (f"device placement takes {1e3 * each:.1f} ms a batch in the training "
            f"process: fewer or smaller leaves, a lower precision (a Map to bfloat16/uint8), or "
            f"{ahead}")
