"""The hosts' settings compared through a key-value store (sharding/hosts.py), on a store in
memory standing for jax.distributed's (test_hosts.py runs the real one on two processes)."""

from __future__ import annotations

import logging

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sharding import hosts


class Store:
    """A key-value store in memory, with jax.distributed's client's calls, counting looks."""

    def __init__(self):
        self.values, self.looks, self.waits = {}, 0, []

    def key_value_set(self, key, value):
        assert key not in self.values  # (the client refuses a key set twice)
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        self.waits.append(timeout_in_ms)
        if key not in self.values:
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.values[key]

    def key_value_dir_get(self, key):
        self.looks += 1
        return [(k, v) for k, v in self.values.items() if k.startswith(key)]


def _pair(store, mine, theirs, count=2, n=0):
    """Process 0's check of ``mine`` and, if ``theirs`` is not None, process 1's of it."""
    check = hosts.publish(mine, count, store=store, me=0, n=n)
    other = None if theirs is None else hosts.publish(theirs, count, store=store, me=1, n=n)
    return check, other


def test_alike_settings_are_compared_once_and_then_left(monkeypatch):
    store = Store()
    long = list(range(100))  # (a list of file identities: compared by its digest)
    check, other = _pair(store, {"seed": 1, "files": long}, {"seed": 1, "files": long})
    assert check.due(0) is True and other.due(0) is True
    assert not store.waits  # (both there: no wait)
    stored = [v for k, v in store.values.items() if k.endswith("/0")]
    assert "digest " in stored[0] and "99" not in stored[0]  # (the value kept short)


def test_a_difference_names_the_process_setting_and_values_and_raises_at_every_call():
    store = Store()
    check, other = _pair(store, {"seed": 1, "step": 0, "shuffle": True},
                         {"seed": 2, "step": 0, "shuffle": True})
    for _ in range(2):
        with pytest.raises(jl.ConfigError, match=r"differ at this iter\(\) \(seed: process 1 "
                           r"has 2, this process \(0\) 1\)\. .*same source, seed, batch_size"):
            check.due(0)
    with pytest.raises(jl.ConfigError, match=r"seed: process 0 has 1, this process \(1\) 2"):
        other.due(5)  # (its first look, whenever it comes)


def test_a_late_process_is_waited_for_on_the_first_call_then_looked_for_at_powers_of_two(
        monkeypatch, caplog):
    store = Store()
    monkeypatch.setattr(hosts, "WAIT_S", 0.05)
    check, _ = _pair(store, {"seed": 1}, None, count=3)
    with caplog.at_level(logging.WARNING, logger="jaxloader"):
        assert check.due(0) is False
    assert store.waits and store.waits[0] <= 50  # (waited for it, then went on)
    assert len(caplog.records) == 1 and "process(es) 1, 2 of 3 have not made this iter()" in \
        caplog.records[0].getMessage() and "looked for again at the 2nd, 4th" in \
        caplog.records[0].getMessage()
    looks = []
    for call in range(1, 9):
        before = store.looks
        check.due(call)
        looks.append(store.looks - before)
    assert looks == [1, 1, 0, 1, 0, 0, 0, 1]  # calls 1, 2, 4 and 8 look
    store.key_value_set(check.prefix + "1", '{"seed": 1}')
    store.key_value_set(check.prefix + "2", '{"seed": 7}')
    with pytest.raises(jl.ConfigError, match=r"seed: process 2 has 7, this process \(0\) 1"):
        check.due(16)


def test_one_process_or_no_jax_distributed_compares_nothing():
    assert hosts.publish({"seed": 1}, 1, store=Store(), me=0) is None
    assert hosts.publish({"seed": 1}, 2) is None  # (this process runs no jax.distributed)
    # a loader given its place by hand, with no store, runs as before
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, process_index=1,
                       process_count=2) as loader:
        assert [b["x"].tolist() for b in loader] == [[2, 3], [6, 7]]


def test_other_data_told_only_by_digests_is_warned_of_not_refused():
    # a Hugging Face dataset's fingerprint may be made at random (datasets cannot hash a
    # map's function): the same data would be refused on every host
    store = Store()
    check, _ = _pair(store, {"seed": 1, "source": "a" * 80}, {"seed": 1, "source": "b" * 80})
    with pytest.warns(UserWarning, match=r"sources differ \(source: process 1 has 'digest "
                      r"[0-9a-f]{16}', this process \(0\) 'digest [0-9a-f]{16}'\).*Hugging Face"):
        assert check.due(0) is True
    check, _ = _pair(store, {"seed": 1, "source": "a"}, {"seed": 2, "source": "b"}, n=1)
    with pytest.raises(jl.ConfigError, match=r"\(seed: process 1 has 2, this process \(0\) 1; "
                       r"source: process 1 has 'b', this process \(0\) 'a'\)"):
        check.due(0)
