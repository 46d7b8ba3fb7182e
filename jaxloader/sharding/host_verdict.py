"""Process 0's verdict on an ``iter()``'s settings, for the processes that agreed with it.

The hosts' check (``hosts``) compares process 0 with every other process, and the others with
process 0 alone. Where one process of three or more differs, process 0 and that one raise; a
third, whose settings agree with process 0's, went on into the first collective and waited
there for the others until JAX gave up (a ``DEADLINE_EXCEEDED`` from its own runtime, minutes
later on a pod), its log naming neither the process nor the setting. So process 0, once it
has compared every process or found one that differs, writes its verdict to the run's
key-value store (``say``): ``""`` where all agree, else its error's text; and the others,
having agreed with it, wait for that verdict at their first ``next()`` as they wait for its
settings (``heard``), then look for it again at the 2nd, 4th, 8th... ``next()``.

Example:
    >>> class Store(dict):  # (jax.distributed's client's calls, in memory)
    ...     def key_value_set(self, key, value, allow_overwrite=False):
    ...         self[key] = value
    ...     def key_value_try_get(self, key):
    ...         return self[key]
    ...     def blocking_key_value_get(self, key, timeout_in_ms):
    ...         return self[key]
    >>> store = Store()
    >>> heard(store, "run/0/", 0.0, lambda: False) is None  # (not said yet)
    True
    >>> say(store, "run/0/", "seed: process 2 has 1, this process (0) 0")
    >>> heard(store, "run/0/", 0.0, lambda: False)
    'seed: process 2 has 1, this process (0) 0'
"""

from __future__ import annotations

import time
from typing import Any, Callable

from jaxloader.base.errors import ConfigError

SLICE_S = 0.25  # a wait for the verdict is cut in slices this long (a close() is seen)
PENDING = "\0pending"  # process 0 still waits for some: looked for again, not waited on


def key(prefix: str) -> str:
    """The verdict's key of the ``iter()`` whose settings are under ``prefix`` (not among
    them: process 0 lists that folder for the processes' settings)."""
    return prefix.rstrip("/") + "-verdict"


def say(store: Any, prefix: str, failure: str | None) -> None:
    """Process 0: writes that every process agrees (``failure`` ``None``), its error's text,
    or that it still waits for some (``PENDING``: one later than its wait, whose first
    ``next()`` must not wait for a verdict process 0 gives later, in its first collective); a
    store that fails leaves the others to their first collective, as before."""
    try:  # (over its PENDING)
        store.key_value_set(key(prefix), "" if failure is None else failure[:4000],
                            allow_overwrite=True)
    except Exception:  # noqa: BLE001 - (the store's; said already where it failed first)
        pass


def heard(store: Any, prefix: str, wait_s: float, gone: Callable[[], bool]) -> str | None:
    """Process 0's verdict (``""``: all agree; else its error's text), waiting up to
    ``wait_s`` for it (until ``gone()``: the run closed or restored); ``None`` where it is not
    there yet."""
    deadline, said = time.monotonic() + wait_s, None
    try:
        said = str(store.key_value_try_get(key(prefix)))
    except Exception:  # noqa: BLE001 - (not there yet, or the store's)
        pass
    while said is None and not gone() and (left := deadline - time.monotonic()) > 0:
        try:  # (returns once it is written)
            said = str(store.blocking_key_value_get(key(prefix), max(1, int(min(
                left, SLICE_S) * 1000))))
        except Exception as e:  # noqa: BLE001 - (the store's timeout: waited again)
            if "DEADLINE_EXCEEDED" not in str(e):
                return None
    return None if said == PENDING else said

def exchange(check: Any, call: int, gone: Callable[[], bool], wait_s: float) -> None:
    """``check`` (a ``hosts.HostsCheck``) at its run's ``call``-th ``next()``: process 0, once
    it compared every process alike, says so; another, agreeing with process 0, hears whether
    process 0 refused a third (``check.failure`` then), waiting ``wait_s`` at the first."""
    if check.pending or check.failure is not None:
        return
    if check.me == 0:
        say(check.store, check.prefix, None)
    elif check.verdict:
        said = heard(check.store, check.prefix, wait_s if call == 0 else 0, gone)
        check.verdict = said is None
        if said:
            check.failure = ConfigError(
                f"{check.owner}: process 0 refused this iter()'s settings, which this "
                f"process's ({check.me}) agree with, as another process's differ; the run "
                f"cannot go on: make every process's loader alike. Process 0 said: {said}")
