"""The engine as a ``StreamLoader``'s iterator sees it (``ReaderRuns``): each run starts every
reader from the state of what was handed out (``StreamLoader._states_ahead``), and files the
reports of the batches it hands out; with ``num_workers="auto"``, a new run each time the worker
count asked for changes (``rehosted``, on the device-put thread where there is one). What a run
starts from and tells: the readers' states as of a step, from the filed ones and the reports
after them (``overlaid``), and what an ``iter()`` tells the other processes, its settings and
its pass's votes (``published``).
"""

from __future__ import annotations

import weakref
from typing import Any, Callable, Generator

from jaxloader.loaders.transform_names import compared_transforms, exact_settings
from jaxloader.sharding.hosts import HostsCheck
from jaxloader.sharding.pass_votes import PassVotes
from jaxloader.streams import passes
from jaxloader.streams.iterable_shards import codes_of

StreamLoader = Any  # (jaxloader.loaders.stream_loader's, which imports this module)


class ReaderRuns:
    """The engine as a ``LoaderIterator`` sees it: each run starts every reader from the state
    of what was handed out, and files the reports of the batches it hands out."""

    def __init__(self, loader: StreamLoader) -> None:
        self._loader = loader

    @property
    def pids(self) -> list[int]:
        return self._loader.worker_pids

    def batches(self, start: int, stop: int | None) -> Generator[Any, None, None]:
        """The engine's run from ``start``; with ``num_workers="auto"``, runs that move the
        readers to their new hosts each time the worker count asked for changes."""
        loader = self._loader
        generation = loader._progress.generation  # (the runs' loader's: a restore ends them)
        if not loader._options.auto_workers:
            return self._run(start, stop, max(1, loader.num_workers), generation)
        return rehosted(weakref.ref(loader), loader._engine, start, stop, generation)

    def _run(self, start: int, stop: int | None, hosts: int,
             generation: int) -> Generator[Any, None, None]:
        """One engine run from ``start`` with ``hosts`` hosting the readers."""
        loader = self._loader
        states = loader._states_ahead(start, generation)
        if loader._until is not None:
            states = passes.stopping_at(states, loader._until)
        resets: list = [states[w::hosts] for w in range(hosts)]  # host w: readers w, w + W, ..
        # A stale run's read-ahead goes (list() copies the keys at once: an old device-put
        # thread may still be filing one; it would file the same state, runs being pure).
        for step in [s for s in list(loader._reports) if s >= start]:
            loader._reports.pop(step, None)
        return loader._engine.batches(start, stop, resets, loader._reports)

    def close(self) -> None:
        self._loader._engine.close()


def rehosted(loader_ref: Callable[[], StreamLoader | None], engine: Any, start: int,
             stop: int | None, generation: int) -> Generator[Any, None, None]:
    """Runs from ``start``, a new one from the next step each time the count the engine's
    roster asks for changes: the readers move to their new hosts from the states of what was
    handed out (what was read ahead is made again, identically). The roster is read anew each
    time (a run interrupted restarts the pool with a new one: the old one watched, autotune's
    counts were never taken up). Holds the loader weakly: a loader dropped mid-run must be
    collected, its device-put thread (which drives this) stopped."""
    step = start
    while stop is None or step < stop:
        loader = loader_ref()
        if loader is None:
            return
        hosts = engine.roster.target
        run = ReaderRuns(loader)._run(step, stop, hosts, generation)
        del loader
        try:
            for batch in run:
                step += 1
                yield batch
                if engine.roster.target != hosts:
                    break
            else:
                return
        finally:
            run.close()


def overlaid(base: list[dict], base_step: int, reports: dict[int, dict],
             step: int) -> list[dict]:
    """The readers' states as of ``step`` from ``base`` (as of ``base_step``) and the
    ``reports`` after it, nothing filed (a new list of the same dicts)."""
    states = list(base)
    for s in range(base_step, step):
        report = reports.get(s)
        if report is not None:
            states[s % len(states)] = report
    return states


def published(loader: StreamLoader) -> tuple[HostsCheck | None, PassVotes | None]:
    """What an ``iter()`` of ``loader`` tells the other processes: its settings, compared at
    its first ``next()`` (``sharding.hosts``), and, in a pass, the votes on its end
    (``sharding.pass_votes``), which a refusal of its settings is told through too."""
    if loader.process_count == 1 or loader._probing:
        return None, None
    config = loader._config()
    described = stream_settings(config.pop("stream"))
    hosts = loader._pairing.publish(
        {**config, **described, **loader._stream.extra_state(),
         "step": loader._progress.step, "num_epochs": loader.num_epochs,
         **({} if loader.num_epochs is None else {"mask_key": loader._options.mask_key}),
         "transforms": compared_transforms(loader._named()),
         **exact_settings(compared_transforms(loader._named())),
         "generators": codes_of(loader._stream.shards),
         **passes.to_state(loader._until, loader.num_epochs, loader._ended),
         **({"meshes": loader._putter.meshes()} if loader._putter is not None else {})},
        loader.process_count, index=loader.process_index)
    votes = None if loader.num_epochs is None else loader._pairing.votes(loader.process_count)
    if hosts is not None and votes is not None:
        refused, at = votes.refused, loader._progress
        hosts.told = lambda e: refused(e, at.step)
    return hosts, votes


def stream_settings(described: Any, name: str = "stream") -> dict[str, Any]:
    """A stream's ``describe()`` as settings, one a field (``stream.shuffle_window``,
    ``stream.mix[1].shuffle_shards``...), each list of shard names as its count (compared)
    and its names (``....shards``, noted: told by their digest).

    Example:
        >>> stream_settings({"shards": ["a", "b"], "shuffle_window": 4})
        {'stream.shards': ['a', 'b'], 'stream.shard_count': 2, 'stream.shuffle_window': 4}
    """
    if not isinstance(described, dict):
        return {name: described}
    out: dict[str, Any] = {}
    for key, value in described.items():
        if key == "shards" and isinstance(value, list):
            out[f"{name}.shards"], out[f"{name}.shard_count"] = value, len(value)
        elif isinstance(value, list) and value and all(isinstance(v, dict) for v in value):
            for i, part in enumerate(value):
                out.update(stream_settings(part, f"{name}.{key}[{i}]"))
        else:
            out.update(stream_settings(value, f"{name}.{key}"))
    return out
