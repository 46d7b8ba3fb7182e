"""A loader's state in a checkpoint's folder: one JSON file a process, read back into a loader.

::

    <checkpoint>/<item>/process_{i}-of-{n}.json    the state_dict() of process i of n
    a restore reads its own process's file, or any when the process count changed (every
    process of a step holds the same global position; load_state_dict checks the rest)
    <checkpoint>/<item>/process_0-of-1.host{j}-of-{m}.json    that of JAX process j of m,
    where each runs loaders of its own over its own data (``process_count=1`` on each of
    several hosts): their states differ, each restored on its own host

Paths go through ``etils.epath``, as Orbax's do, so ``gs://`` folders work the same. Orbax's
classic API saves and restores through ``jaxloader.checkpoint``'s handler; its newer one
(``ocp.v1``) calls ``save_v1``/``load_v1`` from the loaders' ``save``/``load``, with no Orbax
import here.

Example:
    >>> import tempfile, numpy as np, jaxloader as jl
    >>> loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
    ...                        process_index=0, process_count=1)
    >>> folder = tempfile.mkdtemp()
    >>> write_state(folder, loader)
    >>> read_state(folder, loader)["step"]
    0
"""

from __future__ import annotations

import asyncio
import errno
import json
import os
import re
import warnings
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Awaitable

from etils import epath

from jaxloader.base.errors import ConfigError, JaxloaderWarning, StateDictError, user_stacklevel
from jaxloader.loaders.options import jax_started

_FILE = re.compile(r"process_\d+-of-(\d+)\.json$")
_HOST = re.compile(r"process_\d+-of-(\d+)\.host\d+-of-(\d+)\.json$")
PathLike = str | os.PathLike[str]  # epath.Path included


def check_loader(loader: Any, what: str, method: str = "state_dict") -> None:
    """Refuses ``loader`` (``what``'s argument) where it is not a loader (``iter(loader)``,
    Grain's idiom, say, or a ``state_dict()`` already)."""
    if not callable(getattr(loader, method, None)) or not hasattr(loader, "process_count"):
        remedy = ("pass the loader itself, not iter(loader): the position is the loader's, and "
                  "its iterators follow it")
        if isinstance(loader, dict):  # a state_dict() already
            remedy = ("pass the loader itself, not its state_dict(): Orbax saves and restores "
                      "through it (a state you hold goes in with loader.load_state_dict(state))")
        raise ConfigError(
            f"{what}: expected a DataLoader or StreamLoader (its {method}()), got "
            f"{type(loader).__name__}; {remedy}")


def state_filename(loader: Any) -> str:
    """``process_{i}-of-{n}.json`` for this loader's process index and count; with
    ``.host{j}-of-{m}`` before ``.json`` where a loader of one process runs on each of several
    JAX processes (each host's over its own data: one file for all, the last writer's state
    was restored on every host, some records skipped without a word; the multi-host audit).

    Example:
        >>> import numpy as np, jaxloader as jl
        >>> from jaxloader.checkpoint import state_filename
        >>> state_filename(jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
        ...                              process_index=1, process_count=2))
        'process_1-of-2.json'
    """
    check_loader(loader, "checkpoint.state_filename(loader)")
    host = ""
    if loader.process_count == 1 and jax_started():  # (JAX not asked before it runs: its
        import jax  # runtime started, jax.distributed.initialize() would fail; the review)

        if (hosts := jax.process_count()) > 1:
            host = f".host{jax.process_index()}-of-{hosts}"
    return f"process_{loader.process_index}-of-{loader.process_count}{host}.json"


def write_state(directory: PathLike, loader: Any, state: dict[str, Any] | None = None) -> None:
    """Writes this process's loader state into ``directory`` (which must exist), removing
    the states a run on another process count wrote there at an earlier step (a folder
    reused: ``read_state`` refuses a folder holding states of other steps).

    Paths go through ``etils.epath``, as Orbax's do, so ``gs://`` and other remote directories
    work. Orbax makes the whole checkpoint appear at once (it renames its temporary directory
    when every item is written), so the file is written in place.

    Example (no Orbax; ``read_state`` and ``restore_into`` read the state back):
        >>> import os, tempfile, numpy as np, jaxloader as jl
        >>> from jaxloader.checkpoint import read_state, restore_into, write_state
        >>> def make():
        ...     return jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2,
        ...                          process_index=0, process_count=1)
        >>> loader, folder = make(), tempfile.mkdtemp()
        >>> it = iter(loader); _ = next(it)
        >>> write_state(folder, loader)
        >>> os.listdir(folder), read_state(folder, loader)["step"]
        (['process_0-of-1.json'], 1)
        >>> again = make()
        >>> restore_into(folder, again)["step"], next(iter(again))["x"].tolist()
        (1, [2, 3])
    """
    check_loader(loader, "checkpoint.write_state(directory, loader)")
    state = loader.state_dict() if state is None else state
    path = epath.Path(directory) / state_filename(loader)
    try:
        path.write_text(json.dumps(state))
    except OSError as e:  # a full disk, a read-only or vanished directory
        remedy = ("make the directory first (Orbax makes a step's), or pass one that exists"
                  if isinstance(e, FileNotFoundError) else "save the checkpoint to a directory "
                  "this process may write (its permissions, a read-only mount)" if e.errno in (
                      errno.EROFS, errno.EACCES, errno.EPERM) else "pass a directory: "
                  f"{directory} or a folder above it is a file" if e.errno == errno.ENOTDIR
                  else f"{path} is a folder: remove or rename it" if e.errno == errno.EISDIR
                  else "free space on that disk, or save the "
                  "checkpoint to another directory" if e.errno in (errno.ENOSPC, getattr(
                      errno, "EDQUOT", errno.ENOSPC))
                  else "save the checkpoint to another directory")
        raise OSError(e.errno, f"checkpoint: cannot write the loader's state to {path} "
                      f"({e.strerror or e}); {remedy}", str(path)) from e
    for other in path.parent.iterdir():  # a run's on another process count, at a step before
        layout = _layout(other.name)  # this one's: its past (a folder reused)
        if layout is not None and layout != _layout(path.name):
            _remove_past(other, state.get("step"))


def _layout(name: str) -> tuple[int, ...] | None:
    """A state file's run: ``(n,)`` for ``process_{i}-of-{n}.json``, ``(1, m)`` for a host's
    own loader's of ``m`` hosts; None for another file."""
    found = _FILE.match(name) or _HOST.match(name)
    return None if found is None else tuple(map(int, found.groups()))


def _remove_past(other: Any, step: Any) -> None:
    """Removes ``other``, a state of a run on another process count, where it is at a step
    before ``step``: one at this step or later is left (a run still saving there, which
    ``read_state`` refuses beside this one where the steps differ)."""
    then = _saved_step(other)
    if type(then) is not int or type(step) is not int or then == step:
        return
    if then > step:  # (a rollback on another process count, or a run saving there meanwhile)
        warnings.warn(f"checkpoint: {other.parent} holds the state of a run on another process "
                      f"count at a later step, {then} ({other.name}), beside this one at {step}: "
                      "read_state refuses the folder while both are there; remove the one not "
                      "meant, or keep each checkpoint in a folder of its own", JaxloaderWarning,
                      stacklevel=user_stacklevel())
        return
    try:
        other.unlink()
    except FileNotFoundError:  # (another process of this run took it first)
        pass
    except OSError as e:  # (a bucket's retention, no right to delete: the save stands)
        warnings.warn(f"checkpoint: {other}, the state of a run on another process count at "
                      f"step {then}, could not be removed ({e}); read_state refuses the folder "
                      "while it is there: remove it", JaxloaderWarning,
                      stacklevel=user_stacklevel())


def read_state(directory: PathLike, loader: Any) -> dict[str, Any]:
    """The state in ``directory`` that fits this process (see the module docstring); a folder
    holding the files of runs on several process counts (one reused by ``write_state``) is
    refused, naming each run's step."""
    check_loader(loader, "checkpoint.read_state(directory, loader)", "load_state_dict")
    root = epath.Path(directory)
    own = root / state_filename(loader)
    present = sorted(p.name for p in root.iterdir()) if root.is_dir() else []
    files = [f for f in present if _FILE.match(f)]
    _one_run(root, [f for f in present if _layout(f) is not None])
    if own.exists():
        path = own
    elif hosts := sorted({int(m.group(2)) for f in present if (m := _HOST.match(f))}):
        raise StateDictError(
            f"checkpoint {root}: holds the states of loaders of their own on each of {hosts[0]}"
            f" JAX processes ({[f for f in present if _HOST.match(f)][:4]}), each over its own "
            f"data, and none for this one ({own.name}): restore on as many processes as saved "
            "it, each host's loader made as it was")
    else:
        if not files:
            found = present if root.is_dir() else (  # (a state file itself: its folder)
                f"a file, not a directory (pass its folder, {root.parent})" if root.exists()
                else "no such directory")
            items = [name for name in present if (root / name).is_dir() and any(
                _layout(p.name) for p in (root / name).iterdir())]
            if items:  # (a step's folder: its item's)
                found = f"{found} (a checkpoint step's folder: pass its item's, {root / items[0]})"
            raise StateDictError(
                f"checkpoint {root}: expected loader state files "
                f"'process_<i>-of-<n>.json', found {found}; was the loader saved with "
                "jaxloader.checkpoint (LoaderSave or the v1 API)?"
            )
        path = root / files[0]  # every process's file holds the same step: checked
        _one_step(root, [f for f in files if _layout(f) == _layout(files[0])], loader)
    try:
        state = json.loads(path.read_text())
        if isinstance(state, dict):
            return state
        what = f"JSON of a {type(state).__name__} ({state!r:.60}), not of a state's dict"
    except (ValueError, RecursionError) as e:  # (a UnicodeDecodeError; JSON nested 100k deep)
        what = f"not whole JSON ({e})"
    step = _step_of(path)
    raise StateDictError(
        f"checkpoint {path}{f' (step {step})' if step is not None else ''}: the loader's "
        f"state is {what}: the file was cut short or damaged; restore an earlier checkpoint "
        "step" + (f" than {step}" if step is not None else "") + ", or start the run again")


def _one_run(root: Any, files: list[str]) -> None:
    """Refuses a folder holding the state files of several process counts at other steps:
    runs on other counts wrote into one folder (``write_state`` to a folder reused, before it
    removed the past ones, or two runs at once), and a process would read its own count's,
    maybe the oldest, without a word. At one step they are one position: any restores it."""
    counts: dict[tuple, str] = {}
    for name in files:
        counts.setdefault(_layout(name) or (), name)
    if len(counts) < 2:
        return
    said, steps = [], set()
    for count, name in sorted(counts.items()):
        then = _saved_step(root / name)
        step = "not read" if then is None else f"step {then}"
        said.append(f"{count[-1] if count else '?'} process(es), {name}: {step}")
        steps.add(step)
    if len(steps) == 1 and "not read" not in steps:  # (one position: any of them restores it)
        return
    raise StateDictError(
        f"checkpoint {root}: holds the loader states of runs on {len(counts)} process counts "
        f"({'; '.join(said)}): written into one folder by runs on other process counts, so a "
        "restore cannot tell which is the run to continue; keep each checkpoint in a folder of "
        "its own (Orbax makes one a step), and delete the files of the states not meant")


def _one_step(root: Any, files: list[str], loader: Any) -> None:
    """Refuses the state files of one run on another process count (``files``) that hold
    different steps: its processes saved at different positions (one took a batch more), and
    a restore on this count read the first file's without a word (one on the same count
    refuses it at ``iter()``, the processes compared). A file that cannot be read is left to
    the restore that reads it."""
    if len(files) < 2:
        return
    with ThreadPoolExecutor(min(16, len(files))) as pool:  # (a pod's files in a bucket: read
        read = list(pool.map(lambda name: _saved_step(root / name), files))  # at once)
    steps = dict(zip(files, read))
    if len({step for step in steps.values() if step is not None}) < 2:
        return
    said = "; ".join(f"{name}: step {step}" for name, step in steps.items() if step is not None)
    raise StateDictError(
        f"checkpoint {root}: the {len(files)} processes that saved it hold the loader at other "
        f"steps ({said}): they saved at different positions (one took more batches than "
        f"another before the save), and a restore on {loader.process_count} process(es) cannot "
        "tell which to continue; restore an earlier checkpoint step, and save on every process "
        "after the same number of batches")


def _saved_step(path: Any) -> Any:
    """The ``step`` a state file holds, or ``None`` where it cannot be read (gone, not whole,
    not a state)."""
    try:
        return json.loads(path.read_text()).get("step")
    except (OSError, ValueError, AttributeError, RecursionError):
        return None


def _step_of(path: Any) -> int | None:
    """The checkpoint step a state file belongs to, where its folders say it as Orbax lays a
    checkpoint out (``<root>/<step>/<item>/<file>``, the step a number or ``step_<n>``), else
    ``None``."""
    parents = epath.Path(path).parents
    for parent in list(parents)[1:2]:  # the item's folder holds the file; the step's, that
        found = re.fullmatch(r"(?:step[_-]?)?(\d+)", parent.name)
        if found:
            return int(found.group(1))
    return None


def apply_state(directory: PathLike, loader: Any, state: dict[str, Any]) -> dict[str, Any]:
    """Loads ``state`` (read from ``directory``) into ``loader``; returns it: a refusal
    (``StateDictError``) names the checkpoint. ``restore_into(directory, loader)`` is
    ``apply_state(directory, loader, read_state(directory, loader))`` (``write_state``'s
    example)."""
    try:
        loader.load_state_dict(state)
    except StateDictError as e:
        raise StateDictError(f"checkpoint {directory}: {e}") from e
    return state


def restore_into(directory: PathLike, loader: Any) -> dict[str, Any]:
    """Reads the fitting state and loads it into ``loader``; returns the state
    (``write_state``'s example)."""
    return apply_state(directory, loader, read_state(directory, loader))


# -- orbax v1: the loaders' save / load call these ------------------------------------------
# File I/O runs in a thread (asyncio.to_thread): on a remote path it takes a round trip, and the
# event loop it would block is the one Orbax runs every other item's save on.
async def save_v1(loader: Any, directory: Any) -> Awaitable[None]:
    """``StatefulCheckpointable.save``: the state is taken now, written in the background."""
    state = loader.state_dict()

    async def write() -> None:
        path = await directory.await_creation()
        await asyncio.to_thread(write_state, path, loader, state)

    return write()


async def load_v1(loader: Any, directory: Any) -> Awaitable[None]:
    """``StatefulCheckpointable.load``: reads and applies the fitting state before it returns
    (a small file), not in the awaitable it returns: Orbax gives an error raised there as a
    ``NoEntryError`` about handlers, with jaxloader's ``StateDictError`` only as its cause;
    raised here, it reaches the caller as itself."""
    state = await asyncio.to_thread(read_state, directory, loader)
    apply_state(directory, loader, state)

    async def done() -> None:
        return None

    return done()
