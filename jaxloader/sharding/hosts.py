"""Whether the processes of a multi-host run made their loaders alike.

Every process reads its own rows of one global order, so every process's loader must be made
with the same source, seed, batch size and the rest, and stand at the same step. Where one
differs nothing fails: a process with another seed reads its rows of another order (records
repeated, others never read), one restored at another step reads other steps' rows, and one
with another batch size makes global batches of other shapes, on which the first collective
aborts or waits. So where ``jax.distributed`` is initialised, each ``iter()`` of a loader
shared by the processes writes what must agree (``settings``, each value short or a digest)
to the run's key-value store, and its run's first ``next()`` compares it with every other
process's: it waits up to ``WAIT_S`` for them (the first collective would wait for them
anyway), then looks again at the 2nd, 4th, 8th... ``next()`` for any that came later. A
difference raises ``ConfigError`` at every ``next()`` of the run, naming the process, the
setting and both values; one only in what the data is, told by digests (``NOTED``), warns.

Runs are paired by count: each process's k-th ``iter()`` of a loader with several processes is
compared with every other process's k-th, as every process runs the same code. Without
``jax.distributed`` (``process_count=`` given by hand) there is no store, and nothing is
compared.

Example:
    >>> check = publish({"seed": 0}, process_count=1)  # one process: nothing to compare
    >>> check is None
    True
"""

from __future__ import annotations

import hashlib
import itertools
import json
import logging
import sys
import threading
import time
import warnings
from typing import Any, Protocol

from jaxloader.base.errors import ConfigError

log = logging.getLogger("jaxloader")
WAIT_S = 10.0  # the run's first next() waits this long for the other processes' settings
SHORT = 60  # a value whose JSON is longer is compared by its digest
# What the data is, told apart only by digests (a fingerprint, files' identities, a stream's
# shards): a difference with all else alike is warned of, not refused, since a digest may
# differ over the same data (a Hugging Face dataset's fingerprint made at random).
NOTED = frozenset({"source", "record_spec", "record_hash", "files", "stream"})
_PREFIX = "jaxloader/hosts"
_count = itertools.count()  # this process's iter() calls of loaders with several processes
_lock = threading.Lock()


class Store(Protocol):
    """The part of ``jax.distributed``'s key-value client used here."""

    def key_value_set(self, key: str, value: str) -> None: ...

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str: ...

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]: ...


def publish(settings: dict[str, Any], process_count: int, owner: str = "DataLoader",
            store: Store | None = None, me: int | None = None,
            n: int | None = None) -> "HostsCheck | None":
    """Writes this process's ``settings`` for its next ``iter()`` to the store and returns
    the check its run's ``next()`` calls make; ``None`` where there is nothing to compare
    with (one process, or no ``jax.distributed`` and no ``store``). ``process_count``: the
    loader's; ``me``: this process's index in the store's run (JAX's); ``n``: which of its
    ``iter()`` calls this is (counted here unless given)."""
    if process_count == 1:
        return None
    if store is None:
        store, me = _jax_store(process_count)
        if store is None:
            return None
    assert me is not None
    compact = {name: _compact(value) for name, value in settings.items()}
    if n is None:
        with _lock:
            n = next(_count)
    check = HostsCheck(store, f"{_PREFIX}/{n}/", me, process_count, compact, owner, n)
    store.key_value_set(f"{check.prefix}{me}", json.dumps(compact, sort_keys=True))
    return check


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


def _compact(value: Any) -> Any:
    """``value`` as compared: itself if short, else a digest of its JSON."""
    text = json.dumps(value, sort_keys=True, default=repr)
    if len(text) <= SHORT:
        return value
    return "digest " + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class HostsCheck:
    """One ``iter()``'s settings against the other processes' (``publish``)."""

    def __init__(self, store: Store, prefix: str, me: int, count: int,
                 settings: dict[str, Any], owner: str, n: int) -> None:
        self.store, self.prefix, self.me, self.settings = store, prefix, me, settings
        self.owner, self.n = owner, n
        self.pending = set(range(count)) - {me}
        self.next_call = 0  # the run's next() call (counted from 0) that looks next
        self.failure: ConfigError | None = None

    def due(self, call: int) -> bool:
        """At the run's ``call``-th ``next()`` (from 0): waits for the others on the first,
        looks again on the 2nd, 4th, 8th...; raises on a difference. Whether every other
        process's settings are compared (nothing left to do)."""
        if self.failure is not None:
            raise self.failure
        if call < self.next_call:
            return False
        self.next_call = max(1, 2 * call)
        self._look()
        if call == 0 and self.pending:
            deadline = time.monotonic() + WAIT_S
            while self.pending and self.failure is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                try:  # (returns once that one's settings are there; the look takes them all)
                    self.store.blocking_key_value_get(f"{self.prefix}{min(self.pending)}",
                                                      max(1, int(left * 1000)))
                except Exception:  # noqa: BLE001 (the store's timeout: said below)
                    break
                self._look()
            if self.pending and self.failure is None:
                log.warning(
                    "%s: process(es) %s of %d have not made this iter() (this process's "
                    "%s with several processes) within %.3g s, so their settings are not yet "
                    "compared with this process's; they are looked for again at the 2nd, "
                    "4th, 8th... next() (a process that calls iter() fewer times than the "
                    "others, or later, is out of step with them)", self.owner,
                    _listed(sorted(self.pending)), len(self.pending) + 1, _nth(self.n + 1),
                    WAIT_S)
        if self.failure is not None:
            raise self.failure
        return not self.pending

    def _look(self) -> None:
        """Takes the settings the store has now; a difference becomes ``failure``."""
        found = []
        for key, value in self.store.key_value_dir_get(self.prefix):
            peer = int(key.rsplit("/", 1)[1])
            if peer in self.pending:
                self.pending.discard(peer)
                found.append((peer, json.loads(value)))
        differ = [(peer, theirs) for peer, theirs in sorted(found, key=lambda f: f[0])
                  if theirs != self.settings]
        fatal = [(peer, theirs) for peer, theirs in differ if self._fields(peer, theirs, False)]
        if fatal:
            self.failure = self._differs(fatal)
        elif differ:
            peer, theirs = differ[0]
            warnings.warn(
                f"{self.owner}: the processes' sources differ ({self._fields(peer, theirs)}), "
                "where their lengths, seeds and steps agree: the hosts may read other data. "
                "Harmless if the data is the same (a Hugging Face dataset whose fingerprint "
                "datasets made at random, as it warns when it cannot hash a function); else "
                "give every process the same data", UserWarning, stacklevel=4)

    def _fields(self, peer: int, theirs: dict[str, Any], noted: bool = True) -> str:
        """The settings ``peer`` has otherwise, with both values (``noted``: also those of
        ``NOTED``)."""
        mine = self.settings
        return "; ".join(
            f"{name}: process {peer} has {theirs.get(name, '(none)')!r:.70}, this process "
            f"({self.me}) {mine.get(name, '(none)')!r:.70}"
            for name in sorted(set(mine) | set(theirs))
            if mine.get(name) != theirs.get(name) and (noted or name not in NOTED))

    def _differs(self, differ: list[tuple[int, dict[str, Any]]]) -> ConfigError:
        fields = self._fields(*differ[0])
        others = [p for p, _ in differ[1:]]
        more = f" (and process(es) {_listed(others)} too)" if others else ""
        return ConfigError(
            f"{self.owner}: the processes' loaders differ at this iter() ({fields})"
            f"{more}. Each process reads its own rows of one global order, so every process "
            "must make its loader with the same source, seed, batch_size, shuffle, last_batch "
            "and num_epochs, and restore the same step: one with another seed or step reads "
            "rows of another order (records repeated, others never read), one with another "
            "batch_size makes batches of other shapes. Pass every process the same "
            "arguments and state (randomness that should differ by process already does: "
            "each record's draws come from its own position). (Compared: this process's "
            f"{_nth(self.n + 1)} with several processes, with each other process's: one "
            "that iterates a loader the others do not is out of step with them.)")


def _listed(processes: list[int]) -> str:
    return ", ".join(map(str, processes[:8])) + (", ..." if len(processes) > 8 else "")


def _nth(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix} iter() of a loader"
