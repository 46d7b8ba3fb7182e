"""Whether the processes of a multi-host run made their loaders alike.

Every process reads its own rows of one global order, so every process's loader must be made
with the same source, seed, batch size and the rest, and stand at the same step. Where one
differs nothing fails: a process with another seed reads its rows of another order (records
repeated, others never read), one restored at another step reads other steps' rows, and one
with another batch size makes global batches of other shapes, on which the first collective
aborts or waits. So where ``jax.distributed`` runs the loader's processes, each ``iter()`` of
a loader shared by them writes what must agree (``settings``, each value short or a digest)
to the run's key-value store, and its run's first ``next()`` compares: process 0 with every
other, the others with process 0. It waits up to ``WAIT_S`` for them (the first collective
would wait for them anyway), then looks again at the 2nd, 4th, 8th... ``next()`` for any that
came later. A difference raises ``ConfigError`` at every ``next()`` of the run, on process 0
and on the process that differs, naming the process, the setting and both values, and on the
others by process 0's verdict (``host_verdict``); one in the data's digests (``NOTED``) warns.

A loader's ``iter()`` calls are paired by count (``pairing``): its k-th with the other
processes' k-th of the same loader, the loaders named by kind and the order of their first
``iter()`` in the process. ``jaxloader.profile``'s runs, which put the position back, are not
counted. Without ``jax.distributed`` (``process_count=`` given by hand) there is no store,
and nothing is compared; a store that fails is said once, and the check left.

Example:
    >>> _compact("a" * 100)[:7]  # a long value: compared by its digest
    'digest '
"""

from __future__ import annotations

import hashlib
import json
import logging
import time
import warnings
from typing import Any, Callable, NoReturn, Protocol

from jaxloader.base.errors import ConfigError, JaxloaderWarning
from jaxloader.sharding import host_verdict

log = logging.getLogger("jaxloader")
WAIT_S = 10.0  # the run's first next() waits this long for the other processes' settings
SLICE_S = 0.25  # ... in waits this long each (a Ctrl-C or a close() is seen between them)
SHORT = 60  # a value whose JSON is longer is compared by its digest
# What the data is, told apart only by digests (a fingerprint, records' hashes, a stream's
# shard names, the transforms' and generators' code): a difference with all else alike is
# warned of, not refused, since a digest may differ over the same data (a Hugging Face
# dataset's fingerprint made at random, a function's code compiled by another Python, a
# source that draws as it reads). Files' identities are of their bytes alone: other ones are
# other data, refused (``per_host_remedy``).
NOTED = frozenset({"source", "record_hash", "transforms", "generators"})
_INDEX = "process_index"  # the loader's, published beside its settings: each its own
_PREFIX = "jaxloader/hosts"
_told = {"late": False, "store": False}  # said once at WARNING (later: at INFO)


class Store(Protocol):
    """The part of ``jax.distributed``'s key-value client used here."""

    def key_value_set(self, key: str, value: str, allow_overwrite: bool = False) -> None: ...

    def blocking_key_value_get(self, key: str, timeout_in_ms: int) -> str: ...

    def key_value_try_get(self, key: str) -> str: ...

    def key_value_dir_get(self, key: str) -> list[tuple[str, str]]: ...

    def key_value_delete(self, key: str) -> None: ...


def _unavailable(owner: str, error: BaseException) -> None:
    (log.info if _told["store"] else log.warning)(
        "%s: the processes' loaders are not compared at this iter(): jax.distributed's "
        "key-value store failed (%s: %s)", owner, type(error).__name__, error)
    _told["store"] = True


def _noted(name: str) -> bool:
    return name in NOTED or name.endswith(".shards")


def _compact(value: Any, name: str = "") -> Any:
    """``value`` as compared: itself if short or a Pad's (``pads[k]``), else its JSON's digest."""
    text = json.dumps(value, sort_keys=True, default=repr)
    if len(text) <= SHORT or name.startswith("pads["):
        return value
    return "digest " + hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


class HostsCheck:
    """One ``iter()``'s settings against the other processes' (``Pairing.publish``)."""

    def __init__(self, store: Store, name: str, me: int, count: int,
                 settings: dict[str, Any], owner: str, n: int) -> None:
        self.prefix = f"{_PREFIX}/{name}/{n}/"  # its n-th iter()'s keys in the store
        self.store, self.name, self.me, self.settings = store, name, me, settings
        self.owner, self.n, self.count = owner, n, count
        self.pending = set(range(1, count)) if me == 0 else {0}
        self.next_call = 0  # the run's next() call (counted from 0) that looks next
        self.failure: ConfigError | None = None
        self.noted: str | None = None  # a difference in the data's digests, to warn of
        self.indices = {me: settings.get(_INDEX)}  # each process's loader's process_index
        self.told: Callable[[ConfigError], None] | None = None  # tells the others of a
        # failure (a stream's pass: its votes, which the others wait on; pass_votes)
        self.verdict = count > 2 and me > 0  # process 0's to hear (host_verdict; 2: no third)

    def due(self, call: int, gone: Callable[[], bool] = lambda: False) -> bool:
        """At the run's ``call``-th ``next()`` (from 0): waits for the others on the first (until
        ``gone()``: the run closed or restored), looks again on the 2nd, 4th, 8th...; raises on
        a difference. Whether every other process's settings are compared (nothing to do)."""
        if self.failure is not None:
            self._raise()
        if call < self.next_call:
            return False
        try:
            self._look()
            if call == 0 and self.pending:
                self._wait(gone)
        except Exception as e:  # noqa: BLE001 (the store's: said, and the check left)
            _unavailable(self.owner, e)
            self.pending.clear()
        self.next_call = 2 * call + 1  # (the 2nd, 4th, 8th... next())
        host_verdict.exchange(self, call, gone, WAIT_S)
        if self.noted is not None:
            warnings.warn(self.noted, JaxloaderWarning, stacklevel=3)  # (the caller's next())
            self.noted = None
        if self.failure is not None:
            self._raise()
        return not self.pending and not self.verdict

    def _raise(self) -> NoReturn:
        assert self.failure is not None
        if self.me == 0:
            host_verdict.say(self.store, self.prefix, str(self.failure))
        if self.told is not None:
            self.told(self.failure)
        raise self.failure

    def _wait(self, gone: Callable[[], bool]) -> None:
        """Up to ``WAIT_S`` for the pending processes' settings, in slices."""
        deadline = time.monotonic() + WAIT_S
        while self.pending and self.failure is None:
            left = deadline - time.monotonic()
            if gone():
                return
            if left <= 0:
                break
            try:  # (returns once that one's settings are there; the look takes them all)
                self.store.blocking_key_value_get(f"{self.prefix}{min(self.pending)}",
                                                  max(1, int(min(left, SLICE_S) * 1000)))
            except Exception as e:  # noqa: BLE001 (the store's timeout: waited again)
                if "DEADLINE_EXCEEDED" not in str(e):
                    raise
                continue
            self._look()
        if self.pending and self.failure is None:
            (log.info if _told["late"] else log.warning)(
                "%s: process(es) %s of %d have not made this iter() (this loader's %s) "
                "within %.3g s, so their settings are not yet compared with this process's; "
                "they are looked for again at the 2nd, 4th, 8th... next(). Where they iterate "
                "this loader fewer times than this process (an iter() made on one process "
                "alone, to look at a batch: loader.peek() gives it with no iter()), the "
                "processes are out of step: each global batch joins this process's step with "
                "another of theirs, records are lost, and the pass's end waits for good; "
                "iterate the loader alike on every process",
                self.owner, _listed(sorted(self.pending)), self.count, _nth(self.n + 1),
                WAIT_S)
            _told["late"] = True
            if self.me == 0:  # (the others need not wait for its verdict: host_verdict)
                host_verdict.say(self.store, self.prefix, host_verdict.PENDING)

    def _look(self) -> None:
        """Takes the settings the store has now (process 0: every other's; the others:
        process 0's); a difference becomes ``failure``."""
        if self.me == 0:
            entries = self.store.key_value_dir_get(self.prefix)
        else:
            try:
                entries = [(f"{self.prefix}0", self.store.key_value_try_get(f"{self.prefix}0"))]
            except Exception:  # noqa: BLE001 (not there yet)
                entries = []
        found = sorted((peer, json.loads(value)) for key, value in entries
                       if (peer := int(key.rsplit("/", 1)[1])) in self.pending)
        self._same_index(found)
        mine = {k: v for k, v in self.settings.items() if k != _INDEX}
        differ = [(peer, theirs) for peer, theirs in found
                  if {k: v for k, v in theirs.items() if k != _INDEX} != mine]
        fatal = [(peer, theirs) for peer, theirs in differ if self._fields(peer, theirs, False)]
        if fatal:
            self.failure = self._differs(fatal)
        elif differ:
            peer, theirs = differ[0]
            self.noted = (
                f"{self.owner}: the processes' data differ ({self._fields(peer, theirs)}), "
                "where the rest agrees: the hosts may read other data, or transform it "
                f"otherwise. Other data loses records: each of the {self.count} processes "
                "reads its own share of one order over its own data, and the other shares of "
                "it are never read. " + per_host_remedy(self.owner) + ". Only the functions "
                "differ, or the data is the same, where a Hugging Face dataset's fingerprint "
                "is made at random (datasets warns when it cannot hash a function), a function "
                "is compiled by another Python version, or a source draws as it reads")
        self.pending.difference_update(peer for peer, _ in found)  # (after: a Ctrl-C
        # before here leaves them to the next look)

    def _same_index(self, found: list[tuple[int, dict[str, Any]]]) -> None:
        """A ``failure`` where two processes' loaders read as one ``process_index``: both
        read the same rows, and another's are never read."""
        for peer, theirs in found:
            self.indices[peer] = theirs.get(_INDEX)
        seen: dict[Any, int] = {}
        for process, index in sorted(self.indices.items()):
            if index is None or self.failure is not None:
                continue
            if index in seen:
                self.failure = ConfigError(
                    f"{self.owner}: processes {seen[index]} and {process} of {self.count} both "
                    f"read as process_index={index}, so both read the same rows and another "
                    "process's are never read; leave process_index out (each process's is "
                    f"then JAX's, jax.process_index()) or give each its own, 0 to "
                    f"{self.count - 1}")
            seen.setdefault(index, process)

    def _fields(self, peer: int, theirs: dict[str, Any], noted: bool = True) -> str:
        """The settings ``peer`` has otherwise, with both values (``noted``: also those
        ``NOTED``)."""
        mine = self.settings
        return "; ".join(
            f"{name}: process {peer} has {theirs.get(name, '(none)')!r:.160}, this process "
            f"({self.me}) {mine.get(name, '(none)')!r:.160}"
            for name in sorted((set(mine) | set(theirs)) - {_INDEX})
            if mine.get(name) != theirs.get(name) and (noted or not _noted(name)))

    def _differs(self, differ: list[tuple[int, dict[str, Any]]]) -> ConfigError:
        fields = self._fields(*differ[0])
        others = [p for p, _ in differ[1:]]
        more = f" (and process(es) {_listed(others)} too)" if others else ""
        same = ("stream, seed, batch_size, readers_per_process (num_workers by default) and "
                "num_epochs" if self.owner == "StreamLoader" else
                "source, seed, batch_size, shuffle, last_batch and num_epochs")
        if "files:" in fields:  # (other bytes: each reads its share of its own, the rest never)
            same += (" (the files differ: each process reads its share of its own files, and "
                     f"the others' shares of them are never read; {per_host_remedy(self.owner)})")
        same += " (and the same settings in each Pad)" if "pads[" in fields else ""
        same += (" (and each PackedSource made alike: keys, length, method, seed, overlong, "
                 "bins, window and value)" if "packed[" in fields else "")
        if "meshes:" in fields:  # (each reads the rows its devices hold in its own mesh)
            same += (" (and the same mesh: spec, axes and the devices in one order, which JAX "
                     "needs on every process; make it alike on each, jax.make_mesh(...), not "
                     "from a process's own devices first)")
        if "local_shuffle_blocks:" in fields:  # (the same rows in other row groups)
            same += (" (a LocalShuffle reads the source's own blocks, a Parquet file's row "
                     "groups: write each process's copy with the same row groups, or give "
                     "LocalShuffle a block_size)")
        return ConfigError(
            f"{self.owner}: the processes' loaders differ at this iter() ({fields}){more}. "
            f"Each process reads its own rows of one global order, so every process must "
            f"make its loader with the same {same}, and restore the same step: one with "
            "another seed or step reads rows of another order (records repeated, others "
            "never read), one with another batch_size makes batches of other shapes. Pass "
            "every process the same arguments and state (randomness that should differ by "
            "process already does: each record's draws come from its own position). "
            f"(Compared: this loader's {_nth(self.n + 1)} with process 0's, and on process 0 "
            "with every process's; a process that iterates it where the others do not is out "
            "of step with them. Loaders are paired across processes by the order of their "
            f"first iter(): this one is {self.name!r}, numbered "
            "as its process first iterated it, so a process that first iterated another one "
            "before it (an eval loader) compares that one with this: iterate them first in "
            "the same order in every process.)")


def per_host_remedy(owner: str) -> str:
    """What to do where each host holds data of its own."""
    return (f"give every process the same data, whole (the {owner} deals each its share); for "
            "data that lives on each host alone, make each host's loader with process_index=0, "
            "process_count=1 and put the hosts' batches together with jax."
            "make_array_from_process_local_data(sharding, batch)")


def _listed(processes: list[int]) -> str:
    return ", ".join(map(str, processes[:8])) + (", ..." if len(processes) > 8 else "")


def _nth(k: int) -> str:
    suffix = "th" if 10 <= k % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(k % 10, "th")
    return f"{k}{suffix} iter()"
