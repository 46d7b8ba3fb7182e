"""Whether a stream's pass has ended, asked of every process through ``jax.distributed``'s
key-value store rather than a collective, so that a process whose batch failed can say so.

A pass (``StreamLoader(num_epochs=n)``) ends once every reader of every process is done, so
each process asks the others at every step. With a collective (``process_allgather``), a
process that raised (a reader dealt only empty shards, a transform's error) never joined the
next one, and the others waited in it without a word: for as long as that process lived, or
until JAX's shutdown barrier aborted them minutes later. Here each process writes its vote
for a step to the store and reads the others' (every few milliseconds at first); a process
whose ``next()`` failed writes that instead, and the others raise naming it and its error.
A process later than ``WAIT_S`` is named in a log line, once a pass.

Example:
    >>> class Store(dict):  # (jax.distributed's client's calls, in memory)
    ...     key_value_set, key_value_delete = dict.__setitem__, dict.pop
    ...     def key_value_dir_get(self, prefix):
    ...         return [(k, v) for k, v in self.items() if k.startswith(prefix)]
    >>> store = Store()
    >>> one, two = (PassVotes(store, "run/0-pass/", me, 2, "StreamLoader") for me in (0, 1))
    >>> two.ask(False, "2", gone=lambda: True)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    jaxloader.sharding.prefetch.Stopped: (process 0 had not voted; the run was made stale)
    >>> one.ask(True, "2")  # (every vote in: the pass goes on)
    False
    >>> two.failed(ValueError("no records"), step=3)
    >>> try:
    ...     one.ask(True, "3")
    ... except Exception as e:
    ...     print(str(e)[:70])
    StreamLoader: process 1 of 2 failed at step 3 (ValueError: no records)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from jaxloader.base.errors import JaxloaderError

log = logging.getLogger("jaxloader")
WAIT_S = 10.0  # a process later than this is named in a log line
_FAILED = "failed"


class PassVotes:
    """One ``iter()``'s votes (``HostsCheck.votes``): ``prefix`` in the store, this process
    ``me`` of ``count``; ``owner``: the loader's kind, for messages."""

    def __init__(self, store: Any, prefix: str, me: int, count: int, owner: str) -> None:
        self.store, self.prefix, self.me, self.count, self.owner = store, prefix, me, count, owner
        self._mine: list[str] = []  # this process's votes, oldest first (two kept)
        self._told = False

    def ask(self, done: bool, key: str, gone: Callable[[], bool] = lambda: False) -> bool:
        """Whether ``done`` holds in every process at ``key`` (a step: each process asks at
        every step, alike); raises naming a process that failed, stops where ``gone()`` (its
        run was closed or restored from another thread)."""
        here = f"{self.prefix}{key}/"
        mine = f"{here}{self.me}"
        if mine not in self._mine:  # (a step asked again after a failed next(): voted once)
            self.store.key_value_set(mine, "1" if done else "0")
            self._mine.append(mine)
            if len(self._mine) > 2:  # every process has read the votes two steps before
                self.store.key_value_delete(self._mine.pop(0))
        pause, late = 0.0005, time.monotonic() + WAIT_S
        while True:
            votes: dict[str, str] = {}
            for name, value in self.store.key_value_dir_get(self.prefix):
                where, _, who = name[len(self.prefix):].rpartition("/")
                if where == _FAILED:
                    raise JaxloaderError(
                        f"{self.owner}: process {who} of {self.count} failed at {value}, so "
                        "this pass cannot end on every process (each asks the others at every "
                        "step whether it has); see that process's error. A pass "
                        "(num_epochs) reads on every process alike: make its data readable "
                        "there, or run the loop without num_epochs")
                if where == key:
                    votes[who] = value
            if len(votes) == self.count:
                return all(value == "1" for value in votes.values())
            if gone():
                from jaxloader.sharding.prefetch import Stopped

                raise Stopped(f"a run of {self.owner} made stale")
            if not self._told and time.monotonic() > late:
                self._told = True
                waiting = sorted(set(range(self.count)) - {int(w) for w in votes})
                log.warning("%s: waiting for process(es) %s of %d to say whether the pass "
                            "has ended at %s (more than %.3g s)", self.owner, waiting,
                            self.count, key, WAIT_S)
            time.sleep(pause)
            pause = min(0.02, 2 * pause)

    def failed(self, error: BaseException, step: int) -> None:
        """Tells the other processes that this one's ``next()`` at ``step`` failed (they
        raise at their next vote); a store that fails is left (the error is this process's)."""
        try:
            self.store.key_value_set(f"{self.prefix}{_FAILED}/{self.me}",
                                     f"step {step} ({type(error).__name__}: {error})"[:600])
        except Exception:  # noqa: BLE001 (said already, or said twice: the first stands)
            pass
