"""A loader's ``iter()`` calls in a multi-host run (``Pairing``): each writes this process's
settings to ``jax.distributed``'s key-value store for ``hosts.HostsCheck`` to compare, under a
name the loaders of a kind take in the order of their first ``iter()`` in the process; and the
keys of ``iter()`` calls no process waits on any more are deleted (a loader's own two calls
on; a loader gone, two calls of any loader on).

Example:
    >>> Pairing("DataLoader").publish({"seed": 0}, process_count=1) is None  # one process
    True
"""

from __future__ import annotations

import json
import sys
import threading
import weakref
from typing import Any

from jaxloader.sharding import host_verdict
from jaxloader.sharding.hosts import _INDEX, _PREFIX, HostsCheck, Store, _compact, _unavailable
from jaxloader.sharding.pass_votes import PassVotes

_named: dict[str, int] = {}  # loaders of a kind named so far in this process
_published = [0]  # iter()s that published in this process, of any loader
_gone: list[tuple[int, Store, list[str]]] = []  # keys of loaders gone: (_published then, ...)
_gone_votes: list[tuple[Store, list[str]]] = []  # the pass votes loaders gone left
_lock = threading.Lock()


class Pairing:
    """A loader's name in the store and its ``iter()`` calls so far. The name is given on
    the first ``publish``: loaders of a kind are told apart by the order of their first
    ``iter()`` in the process, which every process runs the same (not by their settings,
    which may be what differs)."""

    def __init__(self, kind: str, owner: Any = None) -> None:
        """``owner``: the loader, whose collection forgets its keys (``forget``)."""
        self.kind = kind
        if owner is not None:
            weakref.finalize(owner, self.forget)
        self.name: str | None = None
        self.count = 0  # (counted whether or not its publish got through: every process's
        # k-th iter() stays its k-th)
        self.voted: list[str] = []  # the pass votes it wrote, not yet deleted (pass_votes)
        self._store: tuple[Store, int] | None = None  # where it published, as process me

    def publish(self, settings: dict[str, Any], process_count: int,
                store: Store | None = None, me: int | None = None,
                index: int | None = None) -> "HostsCheck | None":
        """Writes this process's ``settings`` for the loader's next ``iter()`` to the store
        (and drops its own of two ``iter()`` calls before: the store stays small) and
        returns the check its run's ``next()`` calls make; ``None`` where there is nothing
        to compare with (one process, or no ``jax.distributed`` and no ``store``).
        ``process_count``: the loader's; ``me``: this process's index in the store's run;
        ``index``: the loader's ``process_index``, which must differ from every other's."""
        if process_count == 1:
            return None
        if store is None:
            store, me = _jax_store(process_count)
            if store is None:
                return None
        assert me is not None
        if self.name is None:
            with _lock:
                self.name = f"{self.kind}-{_named.setdefault(self.kind, 0)}"
                _named[self.kind] += 1
        n, self.count = self.count, self.count + 1
        text = json.dumps({**{name: _compact(value, name) for name, value in settings.items()},
                           **({_INDEX: index} if index is not None else {})},
                          sort_keys=True, default=repr)
        check = HostsCheck(store, self.name, me, process_count, json.loads(text), self.kind,
                           n)  # (the settings as the others read them)
        try:
            store.key_value_set(f"{check.prefix}{me}", text)
        except Exception as e:  # noqa: BLE001 (the store's: said, and nothing compared)
            _unavailable(self.kind, e)
            return None
        self._store = (store, me)
        with _lock:
            _published[0] += 1
            due = [gone for gone in _gone if gone[0] <= _published[0] - 2]
            for gone in due:  # (in place: forget() appends without the lock)
                _gone.remove(gone)
        for _, where, keys in [*due, (0, store, self._keys(n - 2, n - 1))] if n >= 2 else due:
            for key in keys:
                try:
                    where.key_value_delete(key)
                except Exception:  # noqa: BLE001 (the store's; a key left is no harm)
                    pass
        return check

    def _keys(self, first: int, end: int) -> list[str]:
        """Its keys of its ``iter()``s ``first`` to ``end - 1``: settings, process 0's verdicts."""
        assert self._store is not None
        me = self._store[1]
        return [key for k in range(first, end) for key in [f"{_PREFIX}/{self.name}/{k}/{me}"]
                + ([host_verdict.key(f"{_PREFIX}/{self.name}/{k}")] if me == 0 else [])]

    def forget(self) -> None:
        """The loader is gone: its settings and verdicts of its last two ``iter()``s go at the
        second ``iter()`` after of any loader here, as its own do two ``iter()``s on (a loader
        made anew for each evaluation left them for good). A host that has not read them then
        waits its bounded wait and is said to be late. Its pass votes, which a host waits on
        with no bound, go once every process has voted at a step of another ``iter()``
        (``_drop_gone_votes``; each is then past this loader's: one made anew for each
        evaluation left its last vote for good). No lock: it runs in a collection, which may
        come in ``publish``."""
        if self._store is not None:
            _gone.append((_published[0], self._store[0],
                          self._keys(max(0, self.count - 2), self.count)))
            if self.voted:
                _gone_votes.append((self._store[0], list(self.voted)))

    def votes(self, process_count: int) -> PassVotes | None:
        """The last ``iter()``'s votes on whether a stream's pass has ended (``pass_votes``):
        every process of a run that ``jax.distributed`` runs votes, whether or not its
        settings got through (one left on a collective would wait for the others for good);
        ``None`` where none does."""
        if process_count == 1 or self.name is None:
            return None
        store, me = _jax_store(process_count)
        if store is None:
            return None
        assert me is not None
        n = self.count - 1
        for key in [k for k in self.voted if int(k.split("/")[-3].split("-")[0]) <= n - 2]:
            try:  # (an iter() two before: its votes no one waits on any more, as its
                store.key_value_delete(key)  # settings; those of iter()s refused till now)
            except Exception:  # noqa: BLE001 (the store's; a key left is no harm)
                pass
            self.voted.remove(key)
        return PassVotes(store, f"{_PREFIX}/{self.name}/{n}-pass/", me, process_count,
                         self.kind, self.voted, _drop_gone_votes)


def _drop_gone_votes() -> None:
    """Every process voted at a step: each is past the passes of the loaders gone before
    (their consumers asked their last votes first), whose last votes go."""
    while _gone_votes:
        store, keys = _gone_votes.pop()
        for key in keys:
            try:
                store.key_value_delete(key)
            except Exception:  # noqa: BLE001 (the store's; a key left is no harm)
                pass


def _jax_store(process_count: int) -> tuple[Store | None, int | None]:
    """JAX's key-value client and this process's index, where ``jax.distributed`` runs the
    loader's ``process_count`` processes (JAX imported by then: a loader with several
    processes asked it for its place, or was given it by hand)."""
    if "jax" not in sys.modules:
        return None, None
    import jax

    try:
        from jax._src import distributed  # (private: the client is not public in JAX)

        client = distributed.global_state.client
    except (ImportError, AttributeError):
        return None, None
    if client is None or jax.process_count() != process_count:
        return None, None
    return client, jax.process_index()
