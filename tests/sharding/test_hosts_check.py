"""The hosts' settings compared through a key-value store (sharding/hosts.py), on a store in
memory standing for jax.distributed's (test_hosts.py runs the real one on two processes)."""

from __future__ import annotations

import logging
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.loaders.stream_runs import stream_settings
from jaxloader.sharding import hosts
from jaxloader.sharding import pairing as pairs


class Store:
    """A key-value store in memory, with jax.distributed's client's calls, counting looks."""

    def __init__(self):
        self.values, self.looks, self.waits = {}, 0, []

    def key_value_set(self, key, value, allow_overwrite=False):
        assert allow_overwrite or key not in self.values  # (the client refuses a key set twice)
        self.values[key] = value

    def blocking_key_value_get(self, key, timeout_in_ms):
        self.waits.append(timeout_in_ms)
        if key not in self.values:
            raise RuntimeError(f"DEADLINE_EXCEEDED: GetKeyValue() timed out with key: {key}")
        return self.values[key]

    def key_value_try_get(self, key):
        self.looks += 1
        if key not in self.values:
            raise RuntimeError(f"NOT_FOUND: {key}")
        return self.values[key]

    def key_value_dir_get(self, key):
        self.looks += 1
        return [(k, v) for k, v in list(self.values.items())  # (a copy: threads write too)
                if k.startswith(key)]

    def key_value_delete(self, key):
        self.values.pop(key, None)


def _pairings(count=2):
    """One loader's pairings in ``count`` processes (one process here: named alike by hand)."""
    pairings = [pairs.Pairing("DataLoader") for _ in range(count)]
    for pairing in pairings:
        pairing.name = "DataLoader-0"
    return pairings


def _pair(store, mine, theirs, pairings=None):
    """Process 0's check of ``mine`` and, if ``theirs`` is not None, process 1's of it."""
    pairings = pairings or _pairings()
    check = pairings[0].publish(mine, 2, store=store, me=0)
    other = None if theirs is None else pairings[1].publish(theirs, 2, store=store, me=1)
    return check, other


def test_alike_settings_are_compared_once_and_then_left():
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
                           r"has 2, this process \(0\) 1\)\. .*same source, seed, batch_size.*"
                           r"this loader's 1st iter\(\).*this one is 'DataLoader-0', "
                           r"numbered as its process first iterated it"):
            check.due(0)
    with pytest.raises(jl.ConfigError, match=r"seed: process 0 has 1, this process \(1\) 2"):
        other.due(5)  # (its first look, whenever it comes)


def test_two_processes_reading_as_one_process_index_are_refused():
    # (process_index= given by hand, the same on two processes: both read the same rows,
    # another's never read); each its own index is no difference in the settings
    def checks(indices):
        pairings, store = _pairings(3), Store()
        return [p.publish({"seed": 1}, 3, store=store, me=i, index=index)
                for i, (p, index) in enumerate(zip(pairings, indices))]
    assert all(c.due(0) for c in checks((0, 1, 2)))
    for check in checks((0, 0, 2))[:2]:  # (process 1 sees it against process 0's)
        with pytest.raises(jl.ConfigError, match=r"processes 0 and 1 of 3 both read as "
                           r"process_index=0, .*leave process_index out.*0 to 2"):
            check.due(0)
    zero, one, two = checks((0, 2, 2))  # (process 0 sees every process's)
    with pytest.raises(jl.ConfigError, match=r"processes 1 and 2 of 3 both read as "
                       r"process_index=2"):
        zero.due(0)
    pairings, store = _pairings(), Store()  # (another difference: the indices not named)
    check = pairings[0].publish({"seed": 1}, 2, store=store, me=0, index=0)
    pairings[1].publish({"seed": 2}, 2, store=store, me=1, index=1)
    with pytest.raises(jl.ConfigError, match=r"differ at this iter\(\) \(seed: process 1 has 2, "
                       r"this process \(0\) 1\)\."):
        check.due(0)


def test_a_late_process_is_waited_for_on_the_first_call_then_looked_for_at_powers_of_two(
        monkeypatch, caplog):
    store = Store()
    monkeypatch.setattr(hosts, "WAIT_S", 0.05)
    monkeypatch.setattr(hosts, "_told", {"late": False, "store": False})
    pairing = pairs.Pairing("DataLoader")
    pairing.name = "late"
    check = pairing.publish({"seed": 1}, 3, store=store, me=0)
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        assert check.due(0) is False
    assert store.waits and max(store.waits) <= 50  # (waited for it, then went on)
    assert [r.levelname for r in caplog.records] == ["WARNING"] and "process(es) 1, 2 of 3 " \
        "have not made this iter() (this loader's 1st iter())" in caplog.records[0].getMessage()
    assert "out of step: each global batch joins this process's step with another of theirs" \
        in caplog.records[0].getMessage() and "loader.peek()" in caplog.records[0].getMessage()
    looks = []
    for call in range(1, 9):
        before = store.looks
        check.due(call)
        looks.append(store.looks - before)
    assert looks == [1, 0, 1, 0, 0, 0, 1, 0]  # the 2nd, 4th and 8th next() look
    store.key_value_set(check.prefix + "1", '{"seed": 1}')
    store.key_value_set(check.prefix + "2", '{"seed": 7}')
    with pytest.raises(jl.ConfigError, match=r"seed: process 2 has 7, this process \(0\) 1"):
        check.due(15)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="jaxloader"):  # a later one: told at INFO
        assert pairing.publish({"seed": 1}, 3, store=store, me=0).due(0) is False
    assert [r.levelname for r in caplog.records] == ["INFO"]


def test_a_run_closed_while_waiting_stops_the_wait(monkeypatch):
    store = Store()
    monkeypatch.setattr(hosts, "WAIT_S", 60.0)
    check, _ = _pair(store, {"seed": 1}, None)
    asked = []
    assert check.due(0, gone=lambda: asked.append(1) or len(asked) > 2) is False
    assert len(store.waits) == 2 and max(store.waits) <= 250  # (slices of SLICE_S)


def test_each_process_compares_with_process_0_and_process_0_with_every_one():
    store = Store()
    pairings = _pairings(3)
    checks = [p.publish({"seed": 1}, 3, store=store, me=i) for i, p in enumerate(pairings)]
    assert checks[0].pending == {1, 2} and checks[2].pending == {0}
    assert all(check.due(0) for check in checks)
    for _ in range(2):  # the same loader's next iter()s: its own key of two before is gone
        for i, p in enumerate(pairings):
            p.publish({"seed": 1}, 3, store=store, me=i)
    assert sorted({key.split("/")[-2] for key in store.values}) == ["1", "2"]


def test_a_loader_is_named_by_kind_and_order_in_the_process_not_by_its_settings():
    # named by its length too, a host whose source had another length was never paired:
    # a wait and a warning naming the wrong cause, where the length is what differs
    store = Store()
    a, b, c = (pairs.Pairing("DataLoader") for _ in range(3))
    d = pairs.Pairing("StreamLoader")
    for pairing in (b, a, d, c):  # (named by their first publish)
        pairing.publish({"seed": 1}, 2, store=store, me=0)
    suffixes = [p.name.rsplit("-", 1) for p in (b, a, c, d)]
    assert [s[0] for s in suffixes] == ["DataLoader"] * 3 + ["StreamLoader"]
    assert [int(s[1]) for s in suffixes[:3]] == sorted(int(s[1]) for s in suffixes[:3])
    one, other = _pairings()
    check, _ = _pair(Store(), {"num_records": 10, "seed": 1}, {"num_records": 12, "seed": 1},
                     [one, other])
    with pytest.raises(jl.ConfigError, match=r"num_records: process 1 has 12, this process"):
        check.due(0)


def test_other_data_told_only_by_digests_is_warned_of_not_refused():
    # a Hugging Face dataset's fingerprint may be made at random (datasets cannot hash a
    # map's function): the same data would be refused on every host
    store = Store()
    check, _ = _pair(store, {"seed": 1, "source": "a" * 80}, {"seed": 1, "source": "b" * 80})
    with pytest.warns(UserWarning, match=r"data differ \(source: process 1 has 'digest "
                      r"[0-9a-f]{16}', this process \(0\) 'digest [0-9a-f]{16}'\).*each of "
                      r"the 2 processes reads its own share.*Hugging Face"):
        assert check.due(0) is True
    check, _ = _pair(Store(), {"seed": 1, "source": "a"}, {"seed": 2, "source": "b"})
    with pytest.raises(jl.ConfigError, match=r"\(seed: process 1 has 2, this process \(0\) 1; "
                       r"source: process 1 has 'b', this process \(0\) 'a'\)"):
        check.due(0)
    # (other files, by their bytes, are other data: each host read its share of its own
    # records, the rest never, where the warning called itself "harmless if..."; the audit)
    check, _ = _pair(Store(), {"seed": 1, "files": "a" * 80}, {"seed": 1, "files": "b" * 80})
    with pytest.raises(jl.ConfigError, match=r"\(files: process 1 has 'digest .*the files "
                       r"differ: each process reads its share of its own files.*process_index=0,"
                       r" process_count=1 .*make_array_from_process_local_data"):
        check.due(0)


def test_a_streams_fields_are_compared_one_by_one_and_its_shard_names_noted():
    described = {"mix": [{"shards": ["a", "b"], "shuffle_window": 4, "shuffle_shards": True},
                         {"shards": ["c"], "shuffle_window": 1, "shuffle_shards": False}],
                 "stopping_strategy": "first_exhausted"}
    settings = stream_settings(described)
    assert settings["stream.mix[0].shuffle_shards"] is True
    assert settings["stream.mix[1].shard_count"] == 1 and settings["stream.mix[1].shards"] == ["c"]
    assert settings["stream.stopping_strategy"] == "first_exhausted"
    other = stream_settings({**described, "mix": [
        {**described["mix"][0], "shuffle_shards": False}, described["mix"][1]]})
    store = Store()
    check, _ = _pair(store, settings, other)
    with pytest.raises(jl.ConfigError, match=r"\(stream.mix\[0\].shuffle_shards: process 1 "
                       r"has False, this process \(0\) True\)"):
        check.due(0)


def test_one_process_or_no_jax_distributed_compares_nothing():
    assert pairs.Pairing("DataLoader").publish({"seed": 1}, 1, store=Store(), me=0) is None
    assert pairs.Pairing("DataLoader").publish({"seed": 1}, 2) is None  # (no jax.distributed)
    # a loader given its place by hand, with no store, runs as before
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, process_index=1,
                       process_count=2) as loader:
        assert [b["x"].tolist() for b in loader] == [[2, 3], [6, 7]]


class Failing(Store):
    def key_value_dir_get(self, key):
        raise RuntimeError("UNAVAILABLE: the coordination service is gone")


def test_a_store_that_fails_is_said_once_and_the_check_left(monkeypatch, caplog):
    monkeypatch.setattr(hosts, "_told", {"late": False, "store": False})
    store = Failing()
    check, _ = _pair(store, {"seed": 1}, {"seed": 2})
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        assert check.due(0) is True  # (left: not raised as the store's own error)
        check, _ = _pair(Failing(), {"seed": 1}, {"seed": 2})
        check.due(0)
    assert [r.levelname for r in caplog.records] == ["WARNING", "INFO"]
    assert "not compared at this iter(): jax.distributed's key-value store failed " \
        "(RuntimeError: UNAVAILABLE" in caplog.records[0].getMessage()


def test_the_count_of_processes_said_is_the_runs(monkeypatch, caplog):
    # it was the pending processes' count plus one: "3 of 2" with 8 processes, 1 late
    monkeypatch.setattr(hosts, "WAIT_S", 0.02)
    store = Store()
    pairings = _pairings(8)
    checks = [pairings[i].publish({"seed": 1}, 8, store=store, me=i) for i in range(8) if i != 3]
    with caplog.at_level(logging.INFO, logger="jaxloader"):
        assert checks[0].due(0) is False
    assert "process(es) 3 of 8 have not made this iter()" in caplog.records[0].getMessage()


def test_a_local_shuffle_over_other_row_groups_on_another_process_is_refused(tmp_path,
                                                                            monkeypatch):
    # each host's copy of the same 400 rows in other row groups: the read-local orders
    # differed (a quarter of the epoch read twice, a quarter never), and the hosts' check
    # only warned that the files' digests differed, "harmless if the data is the same"
    pq = pytest.importorskip("pyarrow.parquet")
    import pyarrow as pa

    store, me = Store(), [0]
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, me[0]))
    its = []
    for index, rows in ((1, 80), (0, 50)):
        path = tmp_path / f"host{index}" / "data.parquet"
        path.parent.mkdir()
        pq.write_table(pa.table({"id": np.arange(400)}), path, row_group_size=rows)
        loader = jl.DataLoader(jl.ParquetSource(str(path)), batch_size=20, seed=0,
                               shuffle=jl.LocalShuffle(window=2), process_index=index,
                               process_count=2)
        loader._pairing.name = "DataLoader-blocks"  # (one loader of two processes)
        me[0] = index
        its.append(iter(loader))
    with pytest.raises(jl.ConfigError, match=r"local_shuffle_blocks: process 1 has '5 blocks, "
                                             r"starts sha1 [0-9a-f]{12}', this process \(0\) "
                                             r"'8 blocks.*the same row groups"):
        next(its[1])


def _scale(record):
    return {"x": record["x"] / 255.0}


def _same(record):
    return record


def _generator_of(names):
    def read(shard):
        return ({"f": f"{names[shard]}{i}"} for i in range(3))
    return read


def test_other_transforms_or_generators_on_another_process_are_warned_of(monkeypatch):
    # one host normalised its batches and the other did not, or its generator closed over
    # another file list: neither was compared, where a restore warns of both
    store, me = Store(), [0]
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, me[0]))

    def loaders(index):
        data = jl.DataLoader(jl.ArraySource({"x": np.full(8, 255.0)}), batch_size=2,
                             transforms=[jl.Map(_scale if index == 0 else _same)],
                             process_index=index, process_count=2)
        names = ["a", "b", "c", "d"] if index == 0 else ["a", "b", "x", "y"]
        stream = jl.StreamLoader(jl.Stream.from_generator(_generator_of(names), 4),
                                 batch_size=2, process_index=index, process_count=2)
        data._pairing.name, stream._pairing.name = "DataLoader-t", "StreamLoader-t"
        return data, stream

    its = []
    for index in (1, 0):
        me[0] = index
        its.append([iter(loader) for loader in loaders(index)])
    with pytest.warns(UserWarning, match=r"data differ \(transforms: process 1 has \['Map "
                                         r"[0-9a-f]{16}'\].*or transform it otherwise"):
        next(its[1][0])
    with pytest.warns(UserWarning, match=r"data differ \(generators: process 1 has "):
        next(its[1][1])


def test_a_pad_of_another_length_on_another_process_is_refused_naming_it(monkeypatch):
    # only warned of, as a digest of the whole transforms list: each host made a global batch
    # of its own shape (8, 5) and (8, 6), and computed another loss (the multi-host audit)
    store, me = Store(), [0]
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, me[0]))
    its = []
    for index in (1, 0):  # (a Map on process 1 alone, before the Pad: warned, as before)
        pad = jl.Pad("input_ids", length=256 * (index + 1))  # (its repr: 70 characters)
        more = [jl.Map(_same)] if index else []
        data = jl.DataLoader([{"input_ids": np.arange(3)}] * 8, batch_size=2,
                             transforms=[*more, pad], process_index=index, process_count=2)
        stream = jl.StreamLoader(jl.Stream.from_generator(
            lambda shard: ({"input_ids": np.arange(3)} for _ in range(4)), 2), batch_size=2,
            transforms=[*more, pad], process_index=index, process_count=2)
        data._pairing.name, stream._pairing.name = "DataLoader-pad", "StreamLoader-pad"
        me[0] = index
        its.append([iter(data), iter(stream)])
    for it in its[1]:
        with pytest.raises(jl.ConfigError, match=r"pads\[0\]: process 1 has \"Pad\('input_ids', "
                                                  r"value=0, length=512, length_suffix='_length'"
                                                  r"\)\", this process \(0\) \"Pad\('input_ids'"
                                                  r", value=0, length=256, .*and the same "
                                                  r"settings in each Pad"):
            next(it)


@pytest.mark.parametrize("setting", [{"length": 13}, {"seed": 1}, {"method": "first_fit"}])
def test_a_packing_made_otherwise_on_another_process_is_refused_naming_the_setting(
        monkeypatch, setting):
    # only warned of, as the source's fingerprint: another length made each host a global
    # batch of its own shape (the first collective waited for good), another seed or method
    # read documents twice in a global batch and others never (the multi-host audit)
    store, me = Store(), [0]
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, me[0]))
    docs = jl.RaggedSource.from_sequences({"x": [list(range(i * 10, i * 10 + 6))
                                                 for i in range(80)]})
    its = []
    for index in (1, 0):
        options = {"length": 12, **(setting if index else {})}
        packed = jl.PackedSource(docs, "x", options.pop("length"), **options)
        data = jl.DataLoader(jl.FilteredSource(packed, indices=np.arange(40)), batch_size=2,
                             process_index=index, process_count=2)
        data._pairing.name = f"DataLoader-packed-{setting}"
        me[0] = index
        its.append(iter(data))
    name, value = next(iter(setting.items()))
    with pytest.raises(jl.ConfigError, match=rf"packed\[0\]\.{name}: process 1 has "
                                              rf"'?\[?{value}.*each PackedSource made alike"):
        next(its[1])


def test_packings_that_make_the_same_rows_compare_alike():
    # bins and window, which concat does not read, and a value of -100 against -100.0 were
    # refused between hosts whose rows were the same (the review)
    docs = jl.RaggedSource.from_sequences({"x": [[1, 2, 3]] * 20})
    one = jl.PackedSource(docs, "x", 8, method="concat", bins=16, value=-100)
    other = jl.PackedSource(docs, "x", 8, method="concat", bins=8, window=5, value=-100.0)
    assert one.compared_settings() == other.compared_settings()
    assert jl.PackedSource(docs, "x", 8, bins=8).compared_settings() != \
        jl.PackedSource(docs, "x", 8, bins=16).compared_settings()  # (best_fit reads them)


class _Tokenizer:  # (a callable object: its repr holds its address, another in each process)
    def __call__(self, record):
        return record


def test_a_callable_objects_address_is_not_taken_for_another_transform(monkeypatch):
    store, me = Store(), [0]
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, me[0]))
    its = []
    for index in (1, 0):
        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8.0)}), batch_size=2,
                               transforms=[jl.Map(_Tokenizer())], process_index=index,
                               process_count=2)
        loader._pairing.name = "DataLoader-object"
        me[0] = index
        its.append(iter(loader))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        next(its[1])


def test_a_process_alike_with_process_0_hears_that_process_0_refused_a_third(monkeypatch):
    # (it went on into the first collective, to wait there until JAX gave up, naming no
    # process; the multi-host audit)
    monkeypatch.setattr(hosts, "WAIT_S", 0.05)
    store = Store()
    checks = [p.publish({"seed": 7 if i == 2 else 1}, 3, store=store, me=i)
              for i, p in enumerate(_pairings(3))]
    assert checks[1].due(0) is False  # (process 0 has not said yet: looked for again)
    with pytest.raises(jl.ConfigError, match=r"seed: process 2 has 7, this process \(0\) 1"):
        checks[0].due(0)
    with pytest.raises(jl.ConfigError, match=r"process 0 refused this iter\(\)'s settings, which "
                       r"this process's \(1\) agree with.*Process 0 said: .*seed: process 2 "
                       r"has 7"):
        checks[1].due(1)
    store = Store()  # (alike: process 0 says so once it compared every process)
    checks = [p.publish({"seed": 1}, 3, store=store, me=i) for i, p in enumerate(_pairings(3))]
    assert checks[1].due(0) is False and checks[0].due(0) is True and checks[1].due(1) is True
    # (the review: a host later than process 0's wait found its settings, then waited for a
    # verdict process 0 gives only at a later next(), in its first collective: the run held
    # up 10 s more; now said to be coming, and looked for again)
    store = Store()
    pairings = _pairings(3)
    checks = [p.publish({"seed": 1}, 3, store=store, me=i) for i, p in enumerate(pairings[:2])]
    assert checks[0].due(0) is False  # (process 2 not there within its wait)
    waits = len(store.waits)
    assert checks[1].due(0) is False and len(store.waits) == waits  # (no wait on it)
    pairings[2].publish({"seed": 1}, 3, store=store, me=2)
    assert checks[0].due(1) is True and checks[1].due(1) is True
    store = Store()  # (two processes: each compares the other's, with no third to hear of)
    check, other = _pair(store, {"seed": 1}, {"seed": 1})
    assert other.due(0) is True and not any(k.endswith("-verdict") for k in store.values)


def test_a_loader_gone_leaves_no_keys_in_the_store(monkeypatch):
    # each loader deleted its own keys of an iter() two before, so one made anew for each
    # evaluation (as the docs suggest) left its last two iter()s' for good: 120 keys after 40
    # evaluations on two hosts, growing (the evaluation audit). A loader gone has them deleted
    # at the second iter() after, of any loader in the process
    store = Store()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, 0))

    def evaluate(n):
        for _ in range(n):
            with jl.DataLoader(jl.ArraySource({"x": np.arange(13)}), batch_size=4,
                               last_batch="pad", num_epochs=1, process_index=0,
                               process_count=2) as loader:
                iter(loader)  # (publishes: the other process's keys are never there)
            del loader
    evaluate(4)
    kept = len(store.values)
    evaluate(20)
    assert 0 < len(store.values) <= kept <= 6, sorted(store.values)


def test_a_stream_loader_gone_leaves_its_last_pass_votes_till_another_step_is_voted(
        monkeypatch):
    # a pass's votes went as every process voted at a later step of it: its last step's
    # stayed, so a StreamLoader(num_epochs=1) made anew for each evaluation left one key a
    # process in the store for good (30 evaluations on two hosts: 69 keys, growing; the
    # sharding audit). Once it is gone and every process voted at another iter()'s step,
    # each is past its pass: its last votes go then, not before
    store = Store()
    monkeypatch.setattr(pairs, "_jax_store", lambda count: (store, 0))

    def a_pass():
        pairing = pairs.Pairing("StreamLoader")
        pairing.publish({"seed": 0}, 2, store=store, me=0)
        votes = pairing.votes(2)
        for step in range(3):
            store.key_value_set(f"{votes.prefix}{step}/1", "1")  # (the other process's)
            assert votes.ask(step == 2, step) is (step == 2)
        return pairing

    gone = a_pass()
    last = [key for key in store.values if f"/{gone.name}/" in key and key.endswith("-pass/2/0")]
    assert len(last) == 1
    gone.forget()
    assert last[0] in store.values  # (till every process votes at another step)
    kept = a_pass()
    assert last[0] not in store.values
    assert any(key.endswith("-pass/2/0") for key in kept.voted)  # (a loader alive: its own)
