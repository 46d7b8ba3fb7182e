"""Orbax checkpointing of a loader's position, next to the model, in one step.

Importing this module imports Orbax; ``import jaxloader`` does not (workers stay light).

Classic API (``CheckpointManager``)::

    import orbax.checkpoint as ocp
    from jaxloader.checkpoint import LoaderSave, LoaderRestore

    manager.save(step, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                               loader=LoaderSave(loader)))
    restored = manager.restore(step, args=ocp.args.Composite(
        state=ocp.args.StandardRestore(abstract_state), loader=LoaderRestore(loader)))

Newer API (``orbax.checkpoint.experimental.v1``): a ``DataLoader`` is a
``StatefulCheckpointable``::

    ocp_v1.save_checkpointables(path, {"state": state, "loader": loader})
    ocp_v1.load_checkpointables(path, {"state": abstract_state, "loader": loader})

Each process writes its own ``process_{i}-of-{n}.json`` (the loader's ``state_dict()``). A
restore reads this process's file when the process count is the same, and otherwise any file
of the checkpoint: every process of one step holds the same global position, and
``load_state_dict`` checks that the global batch, data, seed and policy still fit, listing what
differs when they do not. A loader of one process on each of several JAX processes (each
host's own data) writes ``process_0-of-1.host{j}-of-{m}.json`` and restores its own.
"""

from __future__ import annotations

import asyncio
import dataclasses
from typing import Any

import orbax.checkpoint as ocp
from etils import epath

from jaxloader.base.errors import ArgumentError
from jaxloader.loaders.state_files import (apply_state, check_loader, read_state,
                                           restore_into, state_filename, write_state)

__all__ = ["LoaderCheckpointHandler", "LoaderRestore", "LoaderSave", "apply_state",
           "read_state", "restore_into", "state_filename", "write_state"]

# -- classic API -----------------------------------------------------------------------------
@dataclasses.dataclass
class LoaderSave(ocp.args.CheckpointArgs):
    """Saves ``loader``'s position with ``LoaderCheckpointHandler``.

    Example:
        >>> import tempfile, numpy as np, orbax.checkpoint as ocp, jaxloader as jl
        >>> from jaxloader.checkpoint import LoaderRestore, LoaderSave
        >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
        ...                        process_index=0, process_count=1)
        >>> manager = ocp.CheckpointManager(tempfile.mkdtemp())
        >>> manager.save(0, args=ocp.args.Composite(loader=LoaderSave(loader)))
        True
        >>> manager.wait_until_finished()
        >>> restored = manager.restore(0, args=ocp.args.Composite(loader=LoaderRestore(loader)))
        >>> restored["loader"]["step"]
        0
    """

    loader: Any

    def __post_init__(self) -> None:
        _check_loader(self, "state_dict")


@dataclasses.dataclass
class LoaderRestore(ocp.args.CheckpointArgs):
    """Restores a checkpointed position into ``loader`` (which must exist already): made
    as the saved one was, it continues from the saved step (``LoaderSave``'s example saves
    and restores).

    Example (a fresh process's resume; ``manager`` as ``LoaderSave``'s)::

        loader = jl.DataLoader(source, batch_size=32, shuffle=True, seed=0)
        step = manager.latest_step()
        manager.restore(step, args=ocp.args.Composite(loader=LoaderRestore(loader)))
        for batch in loader:  # from the saved step on
            ...
    """

    loader: Any

    def __post_init__(self) -> None:
        _check_loader(self, "load_state_dict")


def _check_loader(args: Any, method: str) -> None:
    """Refuses an argument that is not a loader (``iter(loader)``, Grain's idiom, say)."""
    check_loader(args.loader, f"{type(args).__name__}(loader)", method)


# An asynchronous handler where Orbax has one: a synchronous one in a CheckpointManager's save
# waits for the step's directory to be made, for good where making it failed (a read-only or
# full disk), and a Ctrl-C does not end that wait; an asynchronous one's failure is raised
_COMMIT: Any = getattr(getattr(ocp, "future", None), "CommitFutureAwaitingContractedSignals",
                       None)
_BASE: Any = getattr(ocp, "AsyncCheckpointHandler", None) if _COMMIT else None


class LoaderCheckpointHandler(_BASE or ocp.CheckpointHandler):  # type: ignore[misc]
    """Orbax handler: one JSON file per process with the loader's ``state_dict()``; Orbax
    finds it through ``LoaderSave``/``LoaderRestore`` (their examples), registered when this
    module is imported."""

    def save(self, directory: Any, *args: Any, **kwargs: Any) -> None:
        """Writes ``args=LoaderSave(loader)``'s state into ``directory`` (``write_state``)."""
        save_args = _args(args, kwargs, LoaderSave)
        path = epath.Path(directory)
        path.mkdir(parents=True, exist_ok=True)
        write_state(path, save_args.loader)

    async def async_save(self, directory: Any, *args: Any, **kwargs: Any) -> list:
        """The loader's state as of this call (the position saved), written once Orbax has
        made the step's directory, by a commit future (Orbax's own handlers' way)."""
        save_args = _args(args, kwargs, LoaderSave)
        loader = save_args.loader
        state = loader.state_dict()

        async def write() -> None:
            path = epath.Path(directory)
            await asyncio.to_thread(path.mkdir, parents=True, exist_ok=True)
            await asyncio.to_thread(write_state, path, loader, state)
        return [_COMMIT(write(), name="jaxloader_loader_save")]

    def restore(self, directory: Any, *args: Any, **kwargs: Any) -> dict:
        """Loads the fitting state in ``directory`` into ``args=LoaderRestore(loader)``'s
        loader (``restore_into``); returns the state."""
        restore_args = _args(args, kwargs, LoaderRestore)
        return restore_into(directory, restore_args.loader)

    def metadata(self, directory: Any) -> None:
        """None: a loader's state has no metadata apart from the state."""
        return None

    def finalize(self, directory: Any) -> None:
        """Nothing: the state file is whole once written."""

    def close(self) -> None:
        """Nothing: the handler holds no resource."""


def _args(args: tuple, kwargs: dict, cls: type) -> Any:
    value = kwargs.get("args", args[0] if args else None)
    if not isinstance(value, cls):
        raise ArgumentError(
            f"LoaderCheckpointHandler: expected args={cls.__name__}(loader), got "
            f"{type(value).__name__}; save with LoaderSave(loader), restore with "
            "LoaderRestore(loader)"
        )
    return value


ocp.args.register_with_handler(LoaderCheckpointHandler, for_save=True)(LoaderSave)
ocp.args.register_with_handler(LoaderCheckpointHandler, for_restore=True)(LoaderRestore)
