"""Page-locked slots: the workers' shared-memory slots registered with the GPU they are copied to.

``jax.device_put`` of a NumPy array in pageable memory goes through PJRT's staging buffer: a
memcpy into page-locked memory, then the DMA. Measured on an H200 (docs/benchmarks.md, "Pinned
slots"), 38.5 MB batches: 9.1 GB/s from pageable memory, two copies in flight, against 53.8
GB/s from a slot registered with the device's client (``client.dma_map``: PJRT then copies
from it directly), 98% of CuPy's ``cudaMemcpyAsync`` from pinned memory. A ring's slot is made
once and reused batch after batch, so it is registered once (2.5 ms a 38.5 MB slot there).

``pinner_for(putter)`` gives a ``Pinner`` when the batches are placed on GPUs, else ``None``
(the CPU backend has no DMA to save; TPUs were not measured). The ring (``workers/ring.py``)
pins each slot it makes and unpins it before it is unmapped, and never while a view of it is
alive: JAX holds the host array until its copy is done, and the copy reads the slot after
``device_put`` returns (measured), so a slot whose views live is unpinned when they die. An
address is never left registered once unmapped: a later mapping at that address could not be
registered, or would be taken for registered.

A backend that refuses (``dma_map`` raising: a limit on locked memory, an old driver) is warned
of once, with what it costs, and the loader goes on with pageable slots: the same batches.

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


class Pinner:
    """Registers slots with one JAX client (``dma_map``), and unregisters them."""

    def __init__(self, client: Any, label: str = "jaxloader") -> None:
        self._client, self._label = client, label
        self._at: dict[str, int] = {}  # slot name -> its registered address
        self.failed: str | None = None  # the backend's refusal: no slot is pinned after it

    def pinned(self, segment: Any) -> bool:
        return segment.name in self._at

    def pin(self, segment: Any) -> None:
        """Registers ``segment``'s mapping (whole pages); a refusal is warned of, once."""
        if self.failed is not None:
            return
        address = np.frombuffer(segment.memory, np.uint8).ctypes.data
        try:
            self._client.dma_map(address, segment.size)
        except Exception as e:  # noqa: BLE001 - any refusal: the copies still work unpinned
            self.failed = f"{type(e).__name__}: {e}"
            warnings.warn(
                f"{self._label}: the shared-memory slots could not be page-locked for the "
                f"copies to the GPU (dma_map of {segment.size} bytes: {self.failed}); batches "
                "are the same, copied from pageable memory through the runtime's staging "
                "buffer, ~1/5 of the link's rate on an H200; raise the locked-memory limit "
                "(ulimit -l) or leave it: a step longer than the copy does not wait for it",
                JaxloaderWarning, stacklevel=user_stacklevel())
            return
        self._at[segment.name] = address

    def unpin(self, segment: Any) -> None:
        """Unregisters ``segment`` (pinned, none of its views alive), before it is unmapped."""
        address = self._at.pop(segment.name, None)
        if address is None:
            return
        try:
            self._client.dma_unmap(address)
        except Exception:  # noqa: BLE001 - a client already shut down (the process ending)
            pass


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
