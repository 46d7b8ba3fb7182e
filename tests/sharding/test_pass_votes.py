"""A stream's pass's end voted through a key-value store (sharding/pass_votes.py), on a store in
memory standing for jax.distributed's (test_stream_passes.py runs the real one on two
processes, one of them failing)."""

from __future__ import annotations

import re
import threading

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sharding import pairing as pairs
from jaxloader.sharding.pass_votes import PassVotes
from sharding.test_hosts_check import Store


def test_a_vote_written_before_a_ctrl_c_is_not_written_again_on_the_retry():
    # the key was recorded after the write: a Ctrl-C between them made the retry write it
    # again, which JAX's client refuses (ALREADY_EXISTS), and the other host waited for good
    class Interrupted(Store):
        def key_value_set(self, key, value, allow_overwrite=False):
            super().key_value_set(key, value, allow_overwrite)
            if key.endswith("/7/1") and not getattr(self, "said", False):
                self.said = True
                raise KeyboardInterrupt

    store = Interrupted()
    one, two = (PassVotes(store, "p/0-pass/", me, 2, "StreamLoader", []) for me in (0, 1))
    with pytest.raises(KeyboardInterrupt):
        two.ask(False, 7)
    store.values["p/0-pass/7/0"] = "1"  # (the other host's vote)
    assert two.ask(False, 7) is False and one.ask(True, 7) is False


def test_a_failed_process_names_itself_on_a_retry_and_the_others_name_it():
    store = Store()
    one, two = (PassVotes(store, "p/0-pass/", me, 2, "StreamLoader", []) for me in (0, 1))
    store.values["p/0-pass/4/0"] = "0"
    assert two.ask(False, 4) is False
    two.failed(OSError("the disk went away"), step=4)
    with pytest.raises(jl.JaxloaderError, match=r"this process failed at step 4 \(OSError: "
                                                r"the disk went away\).*Restore a state saved "
                                                r"before it on every process"):
        two.ask(False, 4)  # (a retry: the others were told, and went their way)
    with pytest.raises(jl.JaxloaderError, match=r"process 1 of 2 failed at step 4 \(OSError"):
        one.ask(False, 5)


def test_old_votes_go_once_every_process_has_voted_after_them_across_iters():
    # (none were deleted; then some were deleted after an ask that raised, while a third
    # process still read them)
    store, voted = Store(), []
    alone = PassVotes(store, "p/0-pass/", 0, 1, "StreamLoader", voted)
    for step in ("start", 0, 1, 2):
        alone.ask(False, step)
    assert sorted(store.values) == ["p/0-pass/2/0"]
    later = PassVotes(store, "p/1-pass/", 0, 1, "StreamLoader", voted)
    later.ask(True, "start")
    assert sorted(store.values) == ["p/1-pass/start/0"]
    one, two = (PassVotes(store, "p/2-pass/", me, 2, "StreamLoader", []) for me in (0, 1))
    two.failed(ValueError("bad"), 0)
    with pytest.raises(jl.JaxloaderError, match="process 1 of 2 failed"):
        one.ask(False, 1)
    with pytest.raises(jl.JaxloaderError, match="process 1 of 2 failed"):
        one.ask(False, 1)  # (raised: nothing of it deleted, for a third that reads it still)
    assert "p/2-pass/1/0" in store.values
    told = [key for key in store.values if key.startswith("p/2-pass/") and key.endswith("/1")]
    assert sorted(told) == ["p/2-pass/1/1", "p/2-pass/told/1"]
    store.values["p/3-pass/0/0"] = "0"
    again = PassVotes(store, "p/3-pass/", 1, 2, "StreamLoader", two._voted)
    again.ask(False, 0)  # (the failed one's next iter(): its failure's votes go)
    assert not [key for key in store.values if key.startswith("p/2-pass/") and
                key.endswith("/1")]


def test_a_vote_whose_write_failed_is_written_on_the_retry():
    # it was recorded as written: the retry skipped it, and every process waited for good
    class Flaky(Store):
        def key_value_set(self, key, value, allow_overwrite=False):
            if not getattr(self, "said", False):
                self.said = True
                raise RuntimeError("UNAVAILABLE: failed to connect to the coordinator")
            super().key_value_set(key, value, allow_overwrite)

    store = Flaky()
    one, two = (PassVotes(store, "p/0-pass/", me, 2, "StreamLoader", []) for me in (0, 1))
    with pytest.raises(RuntimeError, match="UNAVAILABLE"):
        two.ask(False, 5)
    store.values["p/0-pass/5/0"] = "0"
    assert two.ask(False, 5) is False and store.values["p/0-pass/5/1"] == "0"


def test_a_process_whose_settings_are_refused_tells_the_ones_that_agreed():
    # three processes, the third with another seed: process 0 and it raised, and process 1,
    # which compares with process 0 alone, waited for their votes for good
    store = Store()
    pairings = [pairs.Pairing("StreamLoader") for _ in range(3)]
    for pairing in pairings:
        pairing.name = "StreamLoader-told"
    checks = [pairing.publish({"seed": 1 if me == 2 else 0}, 3, store=store, me=me)
              for me, pairing in enumerate(pairings)]
    votes = [PassVotes(store, "p/0-pass/", me, 3, "StreamLoader", []) for me in range(3)]
    for me in (0, 2):
        checks[me].told = (lambda v: lambda e: v.refused(e, 4))(votes[me])
        with pytest.raises(jl.ConfigError, match="seed: process"):
            checks[me].due(0)
    with pytest.raises(jl.ConfigError, match=r"process 0 refused this iter\(\)'s settings, "
                       r"which this process's \(1\) agree with"):  # (process 0's verdict, at
        checks[1].due(0)  # its first next(); its votes tell one that asks the pass's end too)
    for step in (4, "start"):
        with pytest.raises(jl.ConfigError, match=r"process 0 of 3 refused this iter\(\)'s "
                                                 r"settings \(StreamLoader: the processes' "
                                                 r"loaders differ at this iter\(\) \(seed: "
                                                 r"process 2 has 1, this process \(0\) 0\)\); "
                                                 r"every process must make its loader alike"):
            votes[1].ask(False, step)
    # one at another step (a state of another pass restored, the settings' wait given up):
    # told where it looks between waits, not at the step it asks
    with pytest.raises(jl.ConfigError, match=r"process 0 of 3 refused"):
        votes[1].ask(False, 16)


def test_every_process_votes_where_jax_distributed_runs_even_if_its_settings_failed(
        monkeypatch):
    # a process whose settings' write failed went on with the allgather, the others with the
    # store: each waited for the other for good
    class SettingsFail(Store):
        def key_value_set(self, key, value, allow_overwrite=False):
            if "-pass/" not in key:
                raise RuntimeError("UNAVAILABLE: the coordinator")
            super().key_value_set(key, value, allow_overwrite)

    store = SettingsFail()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, 1))
    pairing = pairs.Pairing("StreamLoader")
    assert pairing.publish({"seed": 0}, 2) is None  # (said, and nothing compared)
    votes = pairing.votes(2)
    assert votes is not None and re.search(r"/StreamLoader-\d+/0-pass/$", votes.prefix)
    assert pairs.Pairing("StreamLoader").votes(1) is None


def test_a_restore_from_another_thread_while_the_pass_waits_says_the_iterator_is_stale(
        monkeypatch):
    # the vote's Stopped came out of next() bare, where a run made stale says so
    from jaxloader.streams import passes

    store, here = Store(), threading.local()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, here.me))
    monkeypatch.setattr(passes, "check", lambda count: None)  # (two "processes" here)
    stream = jl.Stream.from_generator(lambda s: ({"id": s * 10 + i} for i in range(4)), 2)
    loaders = [jl.StreamLoader(stream, batch_size=2, num_epochs=1, process_index=i,
                               process_count=2) for i in (0, 1)]
    for loader in loaders:
        loader._pairing.name = "StreamLoader-stale"  # (one loader of two processes)
    its, said = {}, []

    def host(i):
        here.me = i
        its[i] = iter(loaders[i])  # (the processes vote on the pass at iter(): together)

    threads = [threading.Thread(target=host, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)

    def first():  # host 0's first next(), while host 1 never asks
        here.me = 0
        try:
            next(its[0])
        except Exception as e:  # noqa: BLE001
            said.append(e)

    waiting = threading.Thread(target=first)
    waiting.start()
    waiting.join(0.5)
    assert waiting.is_alive()  # (waiting for host 1's vote)
    loaders[0].load_state_dict(loaders[0].state_dict())
    waiting.join(10)
    assert not waiting.is_alive() and len(said) == 1, said
    assert isinstance(said[0], jl.JaxloaderError) and "this iterator is stale" in str(said[0])
    for loader in loaders:
        loader.close()
    assert np.all([not t.is_alive() for t in threads])


@pytest.mark.parametrize("how", ["close", "restore"])
def test_a_close_or_restore_while_iter_waits_for_the_others_ends_the_wait(monkeypatch, how):
    # iter()'s vote on a pass under way took no gone(): a close() or a restore from another
    # thread (a preemption handler) returned, and iter() waited for the other process for good
    from jaxloader.streams import passes

    store, here = Store(), threading.local()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, here.me))
    monkeypatch.setattr(passes, "check", lambda count: None)  # (two "processes" here)
    stream = jl.Stream.from_generator(lambda s: ({"id": s * 10 + i} for i in range(8)), 2)

    def loader(i, name):
        made = jl.StreamLoader(stream, batch_size=2, num_epochs=1, process_index=i,
                               process_count=2)
        made._pairing.name = name
        return made

    firsts = [loader(i, "StreamLoader-first") for i in (0, 1)]

    def step_once(i):
        here.me = i
        next(iter(firsts[i]))

    threads = [threading.Thread(target=step_once, args=(i,)) for i in (0, 1)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    mid_pass = firsts[0].state_dict()  # (a pass under way: iter() asks whether it ended)
    assert mid_pass["pass"]
    alone, said = loader(0, "StreamLoader-alone"), []
    alone.load_state_dict(mid_pass)

    def start():
        here.me = 0
        try:
            iter(alone)  # (process 1 never makes this iter())
        except Exception as e:  # noqa: BLE001
            said.append(e)

    waiting = threading.Thread(target=start)
    waiting.start()
    waiting.join(1.0)
    assert waiting.is_alive()
    if how == "close":
        alone.close()
    else:
        alone.load_state_dict(mid_pass)
    waiting.join(2)  # (the wait for the others' settings, 10 s, ends too)
    assert not waiting.is_alive() and len(said) == 1, said
    assert ("is closed" if how == "close" else "iter() was left") in str(said[0]), said
    for made in (*firsts, alone):
        made.close()


def test_a_vote_is_kept_when_an_older_iters_refusal_is_told_after_it():
    # the keys after the last were taken as older: a refusal told after a newer vote deleted
    # that vote, for which a third process still waited
    class Meanwhile(Store):  # (the older iter's refusal told while the newer one waits)
        def blocking_key_value_get(self, key, timeout_in_ms):
            old.refused(jl.ConfigError("x (seed: process 1 has 1, this process (0) 0). More"), 0)
            self.values[key] = "0"
            return "0"

    store, voted = Meanwhile(), []
    old, new = (PassVotes(store, f"r/{n}-pass/", 0, 2, "StreamLoader", voted) for n in (0, 1))
    assert new.ask(False, 0) is False
    assert "r/1-pass/0/0" in store.values and voted == ["r/1-pass/0/0"]


def test_the_votes_of_iters_refused_again_and_again_do_not_pile_up(monkeypatch):
    store = Store()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, 0))
    pairing = pairs.Pairing("StreamLoader")
    pairing.name = "StreamLoader-again"
    for n in range(50):  # (each iter() refused before any vote went through)
        pairing.count = n + 1
        pairing.votes(2).refused(jl.ConfigError("differ (seed: 1). More"), 0)
    mine = [key for key in store.values if "-pass/" in key]
    assert len(mine) <= 9 and len(pairing.voted) == len(mine), mine
