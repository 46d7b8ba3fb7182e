"""Whether a stream's pass has ended, asked of every process through ``jax.distributed``'s
key-value store rather than a collective, so that a process whose batch failed can say so.

A pass (``StreamLoader(num_epochs=n)``) ends once every reader of every process is done, so
each process asks the others at every step. With a collective (``process_allgather``), a
process that raised (a reader dealt only empty shards, a transform's error) never joined the
next one, and the others waited in it without a word: for as long as that process lived, or
until JAX's shutdown barrier aborted them minutes later. Here each process writes its vote
for a step to the store and reads the others' (waiting on the first missing one's key, which
returns as soon as it is written); a process whose ``next()`` failed writes that as its vote
for the step after, which the others wait on, and they raise naming it and its error. A
process later than ``WAIT_S`` is named in a log line, once an ``iter()``; one whose settings
check refused the others' (``hosts``) says so the same way, at ``iter()``'s vote and at its
step. Either is written once more in a folder of its own, which a process waiting looks at
between waits (one late, or at another step, asks where those votes are not). Every process
of a run votes where ``jax.distributed`` runs it (``Pairing.votes``), or none does. A
process's older votes go once every process has voted at a step (each is then done with the
steps before), its failures' too; a loader's last ones once it is gone and every process has
voted at a step of another ``iter()`` (``Pairing``).

Example:
    >>> class Store(dict):  # (jax.distributed's client's calls, in memory)
    ...     def key_value_set(self, key, value, allow_overwrite=False):
    ...         self[key] = value
    ...     def blocking_key_value_get(self, key, timeout_in_ms):
    ...         if key not in self:
    ...             raise RuntimeError("DEADLINE_EXCEEDED")
    ...         return self[key]
    ...     def key_value_delete(self, key):
    ...         self.pop(key, None)
    ...     def key_value_dir_get(self, prefix):
    ...         return [(k, v) for k, v in self.items() if k.startswith(prefix)]
    >>> store = Store()
    >>> one, two = (PassVotes(store, "run/0-pass/", me, 2, "StreamLoader", []) for me in (0, 1))
    >>> two.ask(False, 2, gone=lambda: True)  # doctest: +IGNORE_EXCEPTION_DETAIL
    Traceback (most recent call last):
    jaxloader.sharding.prefetch.Stopped: (process 0 had not voted; the run was made stale)
    >>> one.ask(True, 2)  # (every vote in: the pass goes on)
    False
    >>> two.failed(ValueError("no records"), step=2)
    >>> try:
    ...     one.ask(True, 3)
    ... except Exception as e:
    ...     print(str(e)[:70])
    StreamLoader: process 1 of 2 failed at step 2 (ValueError: no records)
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable

from jaxloader.base.errors import ConfigError, JaxloaderError

log = logging.getLogger("jaxloader")
WAIT_S = 10.0  # a process later than this is named in a log line
SLICE_S = 0.25  # a wait on the store lasts this long at most (a close() is seen between)
_FAILED = "failed "  # a vote that says its process failed, with where and why
_REFUSED = "refused "  # a vote that says its process's settings check refused the others'
_TOLD = "told/"  # where each such vote is written once more, for any step (a process late,
# or at another step: its votes are not where the others ask)


class PassVotes:
    """One ``iter()``'s votes (``Pairing.votes``): ``prefix`` in the store, this process ``me``
    of ``count``; ``owner``: the loader's kind, for messages; ``voted``: the keys this process
    wrote and has not deleted yet, kept by its loader across ``iter()`` calls."""

    def __init__(self, store: Any, prefix: str, me: int, count: int, owner: str,
                 voted: list[str], all_voted: Callable[[], None] = lambda: None) -> None:
        """``all_voted``: called where every process has voted at a step (``Pairing``'s: the
        last votes of loaders gone before, which no process waits on any more, go then)."""
        self.store, self.prefix, self.me, self.count, self.owner = store, prefix, me, count, owner
        self._voted, self._all_voted = voted, all_voted
        self._failed_at: str | None = None  # where this process's next() failed, if it did
        self._told = False

    def ask(self, done: bool, step: int | str,
            gone: Callable[[], bool] = lambda: False) -> bool:
        """Whether ``done`` holds in every process at ``step`` (each process asks at every
        step of a pass, alike; ``"start"`` at an ``iter()``); raises naming a process that
        failed, stops where ``gone()`` (the run was closed or restored from another thread)."""
        if self._failed_at is not None:
            raise JaxloaderError(
                f"{self.owner}: this process failed at {self._failed_at}, in a pass whose end "
                "every process asks the others at each step, and the others were told so: the "
                "pass cannot go on. Restore a state saved before it on every process (a "
                "loader whose worker failed: made anew)")
        here = f"{self.prefix}{step}/"
        mine = f"{here}{self.me}"
        if mine not in self._voted:
            self._voted.append(mine)
        # written each time (a step asked again after a failed write or a Ctrl-C: the same)
        self.store.key_value_set(mine, "1" if done else "0", allow_overwrite=True)
        late, votes = time.monotonic() + WAIT_S, self._votes(here)
        while True:
            for who, value in sorted(votes.items()):
                self._said(who, value)
            missing = [who for who in range(self.count) if who not in votes]
            if not missing:  # every process voted here, so each is done with its asks
                for old in self._voted:  # before: this process's older votes go
                    if old != mine:
                        self.store.key_value_delete(old)
                self._voted[:] = [mine]
                self._all_voted()
                return all(value == "1" for value in votes.values())
            if gone():
                from jaxloader.sharding.prefetch import Stopped

                raise Stopped(f"a run of {self.owner} made stale")
            if not self._told and time.monotonic() > late:
                self._told = True
                log.warning("%s: waiting for process(es) %s of %d to say whether the pass "
                            "has ended at %s (more than %.3g s)", self.owner, missing,
                            self.count, "iter()" if step == "start" else f"step {step}",
                            WAIT_S)
            try:  # (returns once that one has voted)
                votes[missing[0]] = self.store.blocking_key_value_get(f"{here}{missing[0]}",
                                                                      int(SLICE_S * 1000))
            except Exception as e:  # noqa: BLE001 (the store's timeout: every vote looked
                if "DEADLINE_EXCEEDED" not in str(e):  # at again, and what any process told
                    raise  # at another step: the one waited on may have stopped at it)
                for who, value in sorted(self._votes(f"{self.prefix}{_TOLD}").items()):
                    self._said(who, value)  # (its own: never there while it asks)
                votes = self._votes(here)

    def _votes(self, here: str) -> dict[int, str]:
        """The votes at ``here`` in the store, by process."""
        return {int(name.rsplit("/", 1)[1]): value
                for name, value in self.store.key_value_dir_get(here)}

    def _said(self, who: int, value: str) -> None:
        """Raises where process ``who``'s vote says it failed, or refused the settings."""
        if value.startswith(_FAILED):
            raise JaxloaderError(
                f"{self.owner}: process {who} of {self.count} failed at "
                f"{value[len(_FAILED):]}, so this pass cannot end on every process (each asks "
                "the others at every step whether it has); see that process's error. A pass "
                "(num_epochs) reads on every process alike: make its data readable there, or "
                "run the loop without num_epochs")
        if value.startswith(_REFUSED):
            raise ConfigError(
                f"{self.owner}: process {who} of {self.count} refused this iter()'s settings "
                f"({value[len(_REFUSED):]}); every process must make its loader alike and "
                "restore the same state: see that process's error")

    def failed(self, error: BaseException, step: int) -> None:
        """Tells the other processes that this one's ``next()`` failed at ``step``: its vote
        for the step after, which they ask next, says so (and once more where they look
        between waits), and they raise, naming it; this process's later asks in the pass are
        refused. A store that fails is left (the error is this process's own)."""
        self._failed_at = f"step {step} ({type(error).__name__}: {error})"[:600]
        self._tell(_FAILED + self._failed_at, step + 1)

    def refused(self, error: BaseException, step: int) -> None:
        """Tells the other processes that this one's check of their settings refused them
        (``sharding.hosts``) at the ``iter()`` or the ``next()`` of ``step``: they raise,
        naming it and what differs."""
        text = str(error)
        self._failed_at = f"step {step} (its settings check refused the others')"
        cut = text.find("). ")  # (the difference: "... at this iter() (seed: ...)")
        self._tell(_REFUSED + (text[:cut + 1] if cut > 0 else text)[:600], "start", step)

    def _tell(self, value: str, *steps: int | str) -> None:
        for key in [f"{self.prefix}{step}/{self.me}" for step in steps] + [
                f"{self.prefix}{_TOLD}{self.me}"]:
            try:
                self.store.key_value_set(key, value, allow_overwrite=True)
            except Exception:  # noqa: BLE001
                continue
            if key not in self._voted:  # (gone once every process has voted after it)
                self._voted.append(key)
