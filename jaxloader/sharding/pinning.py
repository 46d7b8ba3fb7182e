"""Page-locked slots: the workers' shared-memory slots registered with the GPU they are copied to.

``jax.device_put`` of a NumPy array in pageable memory goes through PJRT's staging buffer: a
memcpy into page-locked memory, then the DMA. Measured on an H200 (docs/benchmarks.md, "Pinned
slots"), 38.5 MB batches, two copies in flight: 11.0 GB/s from a pageable slot against 54.5
from the slot registered with the device's client (``client.dma_map``: PJRT then copies from
it directly), 99% of CuPy's ``cudaMemcpyAsync`` from pinned memory. A ring's slot is made once
and reused batch after batch, so it is registered once, as it is made (1.6-2.5 ms a 38.5 MB
slot there, on the path that hands tasks out: a ring's first slots, a growth, a settle).

``pinner_for(putter)`` gives a ``Pinner`` when the batches are placed on GPUs of one client,
else ``None`` (the CPU backend has no DMA to save; TPUs were not measured). The ring
(``workers/ring.py``) pins each slot it makes and unpins it before it is unmapped, never while
a view of it is alive: JAX holds the host array until its copy is done, and the copy may read
the slot after ``device_put`` returns (measured), so a slot still read at ``close()`` is
unpinned once its views die (``workers/unpinning.py``). An address is never left registered
once unmapped: a later mapping there could not be registered, or would be taken for one.

A backend that refuses (``dma_map`` raising) is warned of once, with what it costs, and the
loader goes on with pageable slots: the same batches.

Example:
    >>> import jax, numpy as np
    >>> from jaxloader.sharding.put import Putter
    >>> print(pinner_for(Putter(jax.devices("cpu")[0], 1)))  # nothing to gain on CPU
    None
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from jaxloader.base.errors import JaxloaderWarning, user_stacklevel


_PINNING, _PINNED, _UNPINNING = "pinning", "pinned", "unpinning"
_HELD: list = []  # slots whose unregistration failed: mapped for the process's life, never
# unmapped (their address, reused by a later mapping, would be taken as registered)


class Pinner:
    """Registers slots with one JAX client (``dma_map``), and unregisters them.

    Each step is written down before it is taken, so that a Ctrl-C between two lines leaves a
    slot's state one its ring's ``close()`` can finish: a slot maybe registered is unregistered
    (a ``dma_unmap`` refused then means it was not), and one whose registration is certain and
    cannot be undone is kept mapped for good, and said."""

    def __init__(self, client: Any, label: str = "jaxloader") -> None:
        self._client, self._label = client, label
        self._at: dict[str, tuple[int, str]] = {}  # slot name -> (its address, its state)
        self.failed: str | None = None  # the backend's refusal: no slot is pinned after it

    def pinned(self, segment: Any) -> bool:
        """Whether ``segment`` is (or may be) registered, or kept for good: it goes through
        ``unpin``, never straight to its unmapping."""
        return segment.name in self._at or any(held is segment for held in _HELD)

    def pin(self, segment: Any) -> None:
        """Registers ``segment``'s mapping (whole pages); a refusal is warned of, once."""
        if self.failed is not None:
            return
        address = np.frombuffer(segment.memory, np.uint8).ctypes.data
        self._at[segment.name] = (address, _PINNING)
        try:
            self._client.dma_map(address, segment.size)
        except Exception as e:  # noqa: BLE001 - any refusal: the copies still work unpinned
            del self._at[segment.name]
            self.failed = f"{type(e).__name__}: {e}"
            unsupported = "UNIMPLEMENTED" in self.failed or "not supported" in self.failed
            warnings.warn(
                f"{self._label}: the shared-memory slots could not be registered with the GPU "
                f"for the copies (dma_map of {segment.size} bytes: {self.failed}); batches are "
                "the same, copied from pageable memory through the runtime's staging buffer "
                "(on an H200 at ~1/5 of the rate from registered memory): "
                + ("this JAX backend does not register host memory" if unsupported else
                   "the other slots of this loader are not tried; if a step waits for its "
                   "input (loader.diagnose()), report this with the error above"),
                JaxloaderWarning, stacklevel=user_stacklevel())
            return
        self._at[segment.name] = (address, _PINNED)

    def unpin(self, segment: Any) -> bool:
        """Unregisters ``segment`` (none of its views alive) before it is unmapped: whether it
        may be unmapped now (False: it could not be, and is kept mapped for good)."""
        if any(held is segment for held in _HELD):  # (kept for good: cut short, asked again)
            return False
        entry = self._at.get(segment.name)
        if entry is None:
            return True
        address, state = entry
        self._at[segment.name] = (address, _UNPINNING)
        try:
            self._client.dma_unmap(address)
        except Exception as e:  # noqa: BLE001 - registered for sure, and still: keep it
            if state == _PINNED:  # (pinning, unpinning: cut short, it was not, or is no more)
                _HELD.append(segment)
                del self._at[segment.name]
                warnings.warn(
                    f"{self._label}: a shared-memory slot of {segment.size} bytes could not be "
                    f"unregistered from the GPU ({type(e).__name__}: {e}); it stays mapped "
                    "until the process ends, so that its address is not reused while the "
                    "device may still take it as registered", JaxloaderWarning,
                    stacklevel=user_stacklevel())
                return False
        del self._at[segment.name]
        return True


def pinner_for(putter: Any, label: str = "jaxloader") -> Pinner | None:
    """A ``Pinner`` for ``putter``'s devices when they are GPUs of one client, else ``None``."""
    if putter is None:
        return None
    import jax

    devices = {d for s in jax.tree_util.tree_leaves(
        putter.sharding, is_leaf=lambda x: isinstance(x, jax.sharding.Sharding))
        for d in s.device_set}
    clients = {id(d.client) for d in devices}
    if not devices or len(clients) != 1 or any(d.platform != "gpu" for d in devices):
        return None
    client = next(iter(devices)).client
    return Pinner(client, label) if hasattr(client, "dma_map") else None
