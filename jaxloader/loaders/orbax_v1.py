"""``OrbaxV1``: a loader as Orbax v1's ``StatefulCheckpointable`` (``save``/``load``
coroutines Orbax awaits: this process's state as a JSON file, ``loaders.state_files``).

Example:
    >>> hasattr(OrbaxV1, "save") and hasattr(OrbaxV1, "load")
    True
"""

from __future__ import annotations

from typing import Any


class OrbaxV1:
    """What a loader gives Orbax v1 (``ocp_v1.save_checkpointables``/``load_checkpointables``)."""

    async def save(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.save``: this process's state as a JSON file. A
        coroutine, for Orbax to await (``loader.save(path)`` alone writes nothing): by hand,
        ``ocp_v1.save_checkpointables`` as below, or ``loader.state_dict()`` saved beside the
        model (``jaxloader.checkpoint.LoaderSave`` with a ``CheckpointManager``).

        Example:
            >>> import tempfile, numpy as np, jaxloader as jl
            >>> from orbax.checkpoint.experimental import v1 as ocp_v1
            >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
            ...                        process_index=0, process_count=1)
            >>> _ = next(iter(loader))
            >>> path = tempfile.mkdtemp() + "/ckpt"
            >>> ocp_v1.save_checkpointables(path, {"loader": loader})
            >>> fresh = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
            ...                       process_index=0, process_count=1)
            >>> _ = ocp_v1.load_checkpointables(path, {"loader": fresh})
            >>> fresh.step
            1
        """
        from jaxloader.loaders.state_files import save_v1

        return await save_v1(self, directory)

    async def load(self, directory: Any) -> Any:
        """Orbax v1 ``StatefulCheckpointable.load``: continues from the saved position (a
        coroutine, for Orbax to await: ``ocp_v1.load_checkpointables``, or
        ``loader.load_state_dict(state)``)."""
        from jaxloader.loaders.state_files import load_v1

        return await load_v1(self, directory)
