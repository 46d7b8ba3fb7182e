from __future__ import annotations

import collections
import functools
import re

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.batching.transforms import RecordRng, split_transforms


@pytest.mark.parametrize("seed, epoch, position, t_index", [
    (11, 3, 99, 2), (2**64 - 1, 2**23, 2**40 - 1, 5 + (7 << 32))])  # the largest words
def test_record_rng_equals_a_fresh_philox_and_ignores_history(seed, epoch, position, t_index):
    rng = RecordRng(seed=seed)
    rng.at(epoch=0, position=1, transform_index=0).random(1001)  # odd draws leave a buffer
    rng.at(epoch=0, position=2, transform_index=0).integers(9, size=3, dtype=np.uint32)
    got = rng.at(epoch=epoch, position=np.int64(position), transform_index=t_index)
    key, counter = RecordRng.key_counter(seed, epoch, position, t_index)
    want = np.random.Generator(np.random.Philox(key=key, counter=counter))
    assert np.array_equal(got.random(5), want.random(5))
    assert np.array_equal(got.integers(9, size=3, dtype=np.uint32),
                          want.integers(9, size=3, dtype=np.uint32))


def test_record_rng_streams_differ_by_position_epoch_and_transform():
    rng = RecordRng(seed=0)
    draws = {
        (e, p, t): rng.at(epoch=e, position=p, transform_index=t).integers(0, 2**62)
        for e in range(2) for p in range(3) for t in range(2)
    }
    assert len(set(draws.values())) == len(draws)



def test_a_random_map_that_spawns_from_its_rng_is_told_what_works():
    # NumPy's way to independent streams, rng.spawn(2), raised NumPy's own message alone
    # (the vision audit: two views of a record); the remedy's generators, as written
    import jaxloader as jl

    def spawned(record, rng):
        views = rng.spawn(2)
        return {"a": views[0].random(), "b": views[1].random()}

    def made(record, rng):
        views = [np.random.default_rng(s) for s in rng.integers(2**63, size=2)]
        return {"a": views[0].random(), "b": views[1].random()}

    source = jl.ArraySource({"x": np.arange(8)})
    with pytest.raises(jl.RecordError, match=r"spawning.*\[np.random.default_rng\(s\) for s in "
                                             r"rng.integers\(2\*\*63, size=2\)\]"):
        next(iter(jl.DataLoader(source, batch_size=4, transforms=[jl.RandomMap(spawned)])))
    batch = next(iter(jl.DataLoader(source, batch_size=4, transforms=[jl.RandomMap(made)])))
    assert (batch["a"] != batch["b"]).all()


@pytest.mark.parametrize("made", ["map", "source", "batch", "jit", "list"])
def test_a_batch_of_no_leaves_is_refused_naming_what_made_it(made):
    # {} from a Map, a MapSource, a BatchMap or a JitMap gave the training step {} batches,
    # without a word (the vision audit's JitMap); {"a": []} beside a pad mask raised
    # "generator raised StopIteration" (the formats audit)
    import jaxloader as jl

    source = jl.ArraySource({"x": np.arange(8)})
    empty = {"map": [jl.Map(lambda r: {})], "source": [], "batch": [jl.BatchMap(lambda b: {})],
             "jit": [jl.JitMap(lambda r: {})], "list": [jl.Map(lambda r: {"a": []})]}[made]
    if made == "source":
        source = jl.MapSource(source, lambda r: {})
    named = r"its records have no leaves \(\{'a': \[\]\}\)" if made == "list" else \
        r"its records have no leaves \(\{\}\): the source or a Map" if made in (
        "map", "source") else r"BatchMap\(.*<lambda>\) returned a batch of no leaves" if (
        made == "batch") else r"JitMap\(.*<lambda>\) returns \{\}, no array"
    for last_batch in ("drop", "pad"):  # (a pad mask alone: a batch of nothing too)
        with pytest.raises(jl.RecordError, match=r"step 0 .*" + named):
            next(iter(jl.DataLoader(source, batch_size=4, transforms=empty,
                                    last_batch=last_batch)))

def test_split_transforms_order_and_types():
    m, b = jl.Map(abs), jl.BatchMap(abs)
    record, batch = split_transforms([m, len, b])
    assert record[0] is m and isinstance(record[1], jl.Map) and batch == (b,)
    with pytest.raises(jl.ConfigError, match=r"transforms\[1\].*before BatchMap"):
        split_transforms([b, m])
    with pytest.raises(jl.ConfigError, match=r"transforms\[0\].*int"):
        split_transforms([3])
    with pytest.raises(jl.ConfigError, match="callable"):
        jl.RandomMap("nope")


def test_a_data_loader_refuses_a_filter_and_names_filtered_source():
    source = jl.ArraySource({"x": np.arange(10)})
    with pytest.raises(jl.ConfigError, match=r"transforms\[1\]: Filter\(.*\) drops records, but "
                                             r"a DataLoader's batch is a fixed set of positions"
                                             r".*jaxloader.FilteredSource\(source, fn\) \(it "
                                             r"sees the records Map\(.*\) make: filter "
                                             r"jaxloader.MapSource\(source, f\)"):
        # (FilteredSource(source, fn) alone ran fn on the records before the Map)
        jl.DataLoader(source, batch_size=2, transforms=[jl.Map(lambda r: r),
                                                        jl.Filter(lambda r: True)])


def _forgot_return(record):
    record = {"x": record["x"] * 2}  # no return


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_that_returns_none_is_named_with_the_missing_return(num_workers):
    """A Map without `return` gave batches of None (alone) or a TypeError in the next
    transform (in a chain); now the transform is named, and what to do."""
    source = jl.ArraySource({"x": np.arange(8)})
    chains = {0: [jl.Map(_forgot_return)],
              1: [jl.Map(lambda r: r), jl.RandomMap(lambda r, rng: None), jl.Map(len)]}
    for index, transforms in chains.items():
        with jl.DataLoader(source, batch_size=4, num_workers=num_workers, transforms=transforms,
                           process_index=0, process_count=1) as loader:
            with pytest.raises(jl.JaxloaderError, match=rf"record position 0.*transforms\[{index}\]"
                               r" .*returned None, expected the new record.*missing `return`"):
                next(iter(loader))
    with jl.DataLoader(source, batch_size=4, num_workers=num_workers, process_index=0,
                       process_count=1, transforms=[jl.BatchMap(lambda b: None)]) as loader:
        with pytest.raises(jl.JaxloaderError, match=r"BatchMap.*returned None, expected the "
                                                    r"new batch"):
            next(iter(loader))


def test_a_stream_transform_that_returns_none_is_named():
    stream = jl.Stream.from_generator(lambda s: ({"x": i} for i in range(10)), 1)
    with jl.StreamLoader(stream, batch_size=4, transforms=[jl.Map(_forgot_return)],
                         process_index=0, process_count=1) as loader:
        with pytest.raises(jl.RecordError, match=r"stream step 0, row 0 \(\S+<lambda>\[0\] "
                                                 r"record 1\): transforms\[0\] "
                                                 r"Map\(_forgot_return\) returned None"):
            next(iter(loader))


# Grain's transform bases, as their classes look to jaxloader (grain is not a test dependency;
# checked by hand against grain 0.2.18's own classes, with workers and a StreamLoader)
_GrainMap = type("Map", (), {"__module__": "grain.transforms"})
_GrainRandomMap = type("RandomMap", (), {"__module__": "grain.transforms"})
_GrainFilter = type("Filter", (), {"__module__": "grain.transforms"})


class _Double(_GrainMap):
    def map(self, element):
        return {"x": element["x"] * 2}


class _Jitter(_GrainRandomMap):
    def random_map(self, element, rng):
        return {"x": element["x"], "u": rng.random()}


class _Even(_GrainFilter):
    def filter(self, element):
        return element["x"] % 2 == 0


@pytest.mark.parametrize("num_workers", [0, 2])
def test_grain_transform_objects_are_taken_as_the_same_transforms(num_workers):
    source = jl.ArraySource({"x": np.arange(8)})
    with jl.DataLoader(source, batch_size=4, num_workers=num_workers, seed=5, process_index=0,
                       process_count=1, transforms=[_Double(), _Jitter()]) as loader:
        got = [{k: v.copy() for k, v in b.items()} for b in loader]
    with jl.DataLoader(source, batch_size=4, seed=5, process_index=0, process_count=1,
                       transforms=[jl.Map(_Double().map),
                                   jl.RandomMap(_Jitter().random_map)]) as loader:
        want = [{k: v.copy() for k, v in b.items()} for b in loader]
    assert [b["x"].tolist() for b in got] == [[0, 2, 4, 6], [8, 10, 12, 14]]
    assert all(np.array_equal(g["u"], w["u"]) for g, w in zip(got, want))  # seeded as ours
    with pytest.raises(jl.ConfigError, match=r"Filter\(_Even.filter\) drops records.*"
                                             r"FilteredSource"):
        jl.DataLoader(source, batch_size=4, transforms=[_Even()])
    # where that error sends the user: FilteredSource takes the same object (it said "expected
    # a function")
    assert jl.FilteredSource(source, _Even()).indices.tolist() == [0, 2, 4, 6]
    assert jl.FilteredSource(source, jl.Filter(_Even().filter)).indices.tolist() == [0, 2, 4, 6]
    stream = jl.Stream.from_generator(lambda i: ({"x": j} for j in range(10)), 1)
    with jl.StreamLoader(stream, batch_size=4, transforms=[_Even(), _Double()],
                         process_index=0, process_count=1) as loader:
        assert next(iter(loader))["x"].tolist() == [0, 4, 8, 12]


def test_an_object_with_a_map_method_not_from_grain_is_still_refused():
    class Mapper:
        def map(self, element):
            return element
    with pytest.raises(jl.ConfigError, match=r"expected Map, RandomMap, BatchMap, JitMap or a callable"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, transforms=[Mapper()])


def test_grain_objects_alone_and_those_not_taken_are_named():
    source = jl.ArraySource({"x": np.arange(8)})
    # one Grain object without a list: "'_Double' object is not iterable"
    with jl.DataLoader(source, batch_size=4, transforms=_Double(), process_index=0,
                       process_count=1) as loader:
        assert next(iter(loader))["x"].tolist() == [0, 2, 4, 6]
    # Grain's Batch, MapWithIndex...: "wrap functions as Map(fn)", which cannot help
    batch = type("Batch", (), {"__module__": "grain._src.python.dataset.transformations"})
    with_index = type("MapWithIndex", (), {"__module__": "grain.transforms"})
    with pytest.raises(jl.ConfigError, match=r"transforms\[1\]: .*the batch is batch_size= and "
                                             r"last_batch=; a batch_fn is a BatchMap"):
        jl.DataLoader(source, batch_size=4, transforms=[_Double(), batch()])
    with pytest.raises(jl.ConfigError, match=r"Grain's MapWithIndex has no counterpart"):
        jl.DataLoader(source, batch_size=4, transforms=[type("Mine", (with_index,), {})()])
    flat = type("FlatMapTransform", (), {"__module__": "grain.transforms"})  # (its page did
    with pytest.raises(jl.ConfigError, match=r"FlatMapTransform has no counterpart .* several "
                                             r"examples from one record: stack them"):  # not
        jl.DataLoader(source, batch_size=4, transforms=[type("Clips", (flat,), {})()])  # say)
    # the Filter refusal named the Grain object's repr (an address), and the MapSource it
    # advises refused the object without saying what to pass
    with pytest.raises(jl.ConfigError, match=r"it sees the records Map\(_Double.map\) make"):
        jl.DataLoader(source, batch_size=4, transforms=[_Double(), _Even()])
    with pytest.raises(jl.ConfigError, match=r"got _Double; pass its method: MapSource\(source, "
                                             r"_Double\(...\).map\)"):
        jl.MapSource(source, _Double())


def _halve(b):
    return {"x": b["x"][::2]}


def _as_is(b):
    return b


def _write_in_place(b):
    b["x"] += 1
    return b


def test_a_batch_transform_that_changes_the_batch_axis_is_the_one_named():
    # the check after all batch transforms named none of them ("a batch transform or
    # __getitems__ must keep the batch axis"); a scalar a later one takes up stays allowed
    source = jl.ArraySource({"x": np.arange(16, dtype=np.float32)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.BatchMap(_halve),
                                                         jl.BatchMap(_as_is)]) as loader:
        with pytest.raises(jl.RecordError, match=r"BatchMap\(_halve\) returned a leaf of shape "
                                                 r"\(2,\) at \['x'\], expected 4 rows first.* for "
                                                 r"several examples a record return them "
                                                 r"stacked from a Map"):
            next(iter(loader))
    # a list of text a batch (a PyTorch collate_fn's habit): each item a 0-d leaf, and the
    # leaf was not named (the pytrees audit)
    names = [jl.BatchMap(lambda b: {**b, "names": [f"n{i}" for i in range(len(b["x"]))]})]
    with jl.DataLoader(source, batch_size=4, transforms=names) as loader:
        with pytest.raises(jl.RecordError, match=r"shape \(\) at \['names'\]\[0\], .*a list or "
                                                 r"tuple in a batch is a node.*np.asarray"):
            next(iter(loader))
    taken_up = [jl.BatchMap(lambda b: {**b, "n": np.float32(len(b["x"]))}),
                jl.BatchMap(lambda b: {"x": b["x"] / b["n"]})]
    with jl.DataLoader(source, batch_size=4, transforms=taken_up) as loader:
        assert next(iter(loader))["x"].tolist() == [0.0, 0.25, 0.5, 0.75]
    # a Python number left in the batch was not named (a NumPy one was): the same now
    last = [jl.BatchMap(lambda b: {**b, "n": len(b["x"])})]
    with jl.DataLoader(source, batch_size=4, transforms=last) as loader:
        with pytest.raises(jl.RecordError, match=r"BatchMap\(\S*<lambda>\) returned a leaf of "
                                                 r"shape \(\) at \[.n.\], expected 4 rows"):
            next(iter(loader))
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(lambda r: r),
                                                         jl.BatchMap(_write_in_place)]) as loader:
        # (a JitMap's output of one chunk, XLA's and read-only, is copied for it)
        assert next(iter(loader))["x"].tolist() == [1.0, 2.0, 3.0, 4.0]


def _numpy_global(record):
    return {"x": record["x"] + np.random.randint(0, 100)}


def _python_global(record):
    import random

    return {"x": record["x"] + random.randint(0, 100)}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_transform_drawing_from_the_global_random_state_is_warned(num_workers, capfd):
    # the batches then differ with the worker count and from run to run: nothing said
    import warnings

    def said(*transforms, **options):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("default")
            with jl.DataLoader(jl.ArraySource({"x": np.arange(32)}), batch_size=8,
                               transforms=list(transforms), num_workers=num_workers,
                               process_index=0, process_count=1, **options) as loader:
                for _ in loader:
                    np.random.rand()  # (the training loop's own draws: not a transform's)
        lines = [str(w.message) for w in caught] + capfd.readouterr().err.splitlines()
        return [line for line in lines if "drew from the global random state" in line]

    for fn in (_numpy_global, _python_global):
        found = said(jl.Map(lambda r: r), jl.Map(fn))
        assert len(found) == 1, found  # (once a loader: each worker's, relayed, said once)
        assert re.search(rf"transforms\[1\] Map\({fn.__name__}\) drew from the global random "
                         r"state .*differ with the worker count.*jl.RandomMap\(lambda record, "
                         r"rng:", found[0]), found
    assert not said(jl.RandomMap(lambda r, rng: {"x": r["x"] + rng.integers(100)}))
    assert not said(jl.Map(_draws_once))  # (a module imported once may draw: JAX does)
    previous = np.random.get_bit_generator()
    np.random.set_bit_generator(np.random.PCG64(0))  # (no MT19937: its state a dict)
    try:
        assert said(jl.Map(_numpy_global))
    finally:
        np.random.set_bit_generator(previous)


def _draws_once(record, drawn=[]):  # noqa: B006 - (once a process)
    if not drawn:
        drawn.append(np.random.rand())
    return record


def _decodes(record):
    import time

    time.sleep(0.002)  # (a decode's time: the GIL given up, the loop draws meanwhile)
    return record


def test_draws_beside_a_transform_on_another_thread_are_not_its_own():
    # with sharding=, batches are made on a device-put thread while the loop draws
    import time
    import warnings

    import jax

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=4,
                           transforms=[jl.Map(_decodes)], process_index=0, process_count=1,
                           sharding=jax.devices("cpu")[0], device_prefetch=4) as loader:
            for _ in loader:
                for _ in range(50):
                    np.random.rand()  # (the trainer's own: dropout noise, a schedule)
                    time.sleep(0.0001)
    assert not [w for w in caught if "global random state" in str(w.message)]


def _slow(record):
    import time

    time.sleep(0.003)
    return record


def _gaussian_twice(record):  # (a legacy normal() draws two and keeps one: the second moves
    if int(record["x"]) in (0, 1):  # no bit generator, only the kept Gaussian)
        np.random.randn()
    return record


class _DrawingReads:  # a source whose reads draw (on read threads, beside the transforms)
    def __len__(self):
        return 64

    def __getitem__(self, i):
        np.random.rand()
        return {"x": np.int64(i)}


def test_the_watch_keeps_the_first_records_timings_and_sees_what_it_should(capfd):
    import warnings

    def loader(source, transforms, **options):
        return jl.DataLoader(source, batch_size=16, transforms=transforms, process_index=0,
                             process_count=1, **options)

    with loader(jl.ArraySource({"x": np.arange(64)}), [jl.Map(_slow)]) as timed:
        next(iter(timed))
        stages = timed.stats.stages
    assert stages.get("Map(_slow)", 0) > 0.04 > stages["read"], stages  # (all booked as read)
    with pytest.warns(UserWarning, match=r"Map\(_gaussian_twice\) drew"):
        with loader(jl.ArraySource({"x": np.arange(64)}), [jl.Map(_gaussian_twice)]) as ld:
            next(iter(ld))
    with warnings.catch_warnings():  # (the loader's warning made an error: not the Map's)
        warnings.simplefilter("error")
        with loader(jl.ArraySource({"x": np.arange(64)}), [jl.Map(_numpy_global)]) as ld:
            with pytest.raises(UserWarning, match=r"Map\(_numpy_global\) drew from the"):
                next(iter(ld))
    with loader(_DrawingReads(), [jl.Map(lambda r: r)], num_workers=1, read_threads=4) as ld:
        list(ld)
    assert "drew from the global random state" not in capfd.readouterr().err


@pytest.mark.parametrize("num_workers", [0, 2])
def test_jaxloaders_warnings_are_of_its_own_category_from_workers_too(num_workers):
    # each was a bare UserWarning: a user could filter all of jaxloader's by a message's regex
    # alone (they name the user's line, not a module of jaxloader's; the warnings audit)
    import warnings

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(32)}), batch_size=8,
                           transforms=[jl.Map(_numpy_global)], num_workers=num_workers,
                           process_index=0, process_count=1) as loader:
            list(loader)
        jl.DataLoader(list(range(10)), batch_size=4, last_batch="drop")
    said = {w.category for w in caught if "global random state" in str(w.message)
            or "last_batch='drop'" in str(w.message)}
    assert said == {jl.JaxloaderWarning}, [(w.category, str(w.message)[:60]) for w in caught]


def test_every_warning_of_the_package_names_its_category():
    # (a warnings.warn without one is a bare UserWarning, which no filter of jaxloader's sees)
    import ast
    import pathlib

    bare = []
    for path in pathlib.Path(jl.__file__).parent.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Call) and ast.unparse(node.func) in (
                    "warnings.warn", "warnings.warn_explicit"):
                category = node.args[1] if len(node.args) > 1 else next(
                    (k.value for k in node.keywords if k.arg == "category"), None)
                if category is None or ast.unparse(category) == "UserWarning":
                    bare.append(f"{path.name}:{node.lineno}")
    assert not bare


def test_a_transform_whose_function_cannot_be_called_so_is_refused_as_it_is_made():
    # a RandomMap of fn(record), a Map of fn(record, rng), a BatchMap of fn(batch, rng), a
    # JitMap told random= against its function: each failed at the first batch, in a worker
    for make, fn, said in [
            (jl.RandomMap, lambda r: r, r"RandomMap\(fn\): fn is called as fn\(record, rng\), "
                                        r"but .*<lambda>\(r\) cannot be; .*jl.Map\(fn\)"),
            (jl.Map, lambda r, rng: r, r"Map\(fn\): fn is called as fn\(record\), but "
                                       r".*<lambda>\(r, rng\) cannot be; .*jl.RandomMap\(fn\)"),
            (jl.BatchMap, lambda b, rng: b, r"BatchMap\(fn\): fn is called as fn\(batch\)"),
            (lambda fn: jl.JitMap(fn, random=False), lambda r, key: r,
             r"JitMap\(fn\): fn is called as fn\(record\) \(random=False\), but .*<lambda>\(r, "
             r"key\) cannot be")]:
        with pytest.raises(jl.ConfigError, match=said):
            make(fn)
    for fn in (abs, lambda r, *more: r, lambda r, rng=None: r):  # (what can be called so)
        jl.Map(fn)
    jl.RandomMap(lambda r, rng, extra=1: r)

    def crops(record):  # (a FlatMap habit: the batch refused "a generator" at record 0, with
        for i in range(2):  # the remedy of a leaf to convert to numbers; the transforms audit)
            yield {"x": record["x"] + i}

    class Crops:
        def __call__(self, record, rng):
            yield record

    for make, fn in ((jl.Map, crops), (jl.RandomMap, Crops()), (jl.Map, functools.partial(crops))):
        with pytest.raises(jl.ConfigError, match=r"Map\(fn\): .* yields, so a call returns a "
                                                 r"generator, not a record: return it; .*stacked"):
            make(fn)


def _set_half(record):  # the PyTorch habit: the record's key set again, the record returned
    record["x"] = record["x"] / 2
    return record


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_map_setting_a_key_of_a_list_of_dicts_record_leaves_the_source_as_it_was(num_workers):
    # it rewrote the source's own dict: each epoch halved again (4, 2, 1), without a word
    records = [{"x": np.full(3, 8.0)} for _ in range(8)]
    with jl.DataLoader(records, batch_size=4, transforms=[jl.Map(_set_half)],
                       num_workers=num_workers, process_index=0, process_count=1) as loader:
        seen = [float(b["x"][0, 0]) for _ in range(3) for b in loader]
    assert seen == [4.0] * 6 and records[0]["x"][0] == 8.0, seen
    for kept in ([collections.OrderedDict(x=np.full(3, 8.0)) for _ in range(8)],
                 [collections.defaultdict(int, x=np.full(3, 8.0)) for _ in range(8)]):
        with jl.DataLoader(kept, batch_size=4, transforms=[jl.Map(_set_half)],
                           num_workers=num_workers, process_index=0, process_count=1) as loader:
            assert {float(b["x"][0, 0]) for _ in range(3) for b in loader} == {4.0}
    with jl.DataLoader(jl.MapSource(records, _set_half), batch_size=4, process_index=0,
                       process_count=1) as loader:  # (a MapSource's function sets it too)
        assert {float(b["x"][0, 0]) for _ in range(3) for b in loader} == {4.0}
    stream = jl.Stream.from_generator(lambda shard: iter(records), shards=1)
    with jl.StreamLoader(stream, batch_size=4, transforms=[jl.Map(_set_half)], num_epochs=3,
                         process_index=0, process_count=1) as loader:
        assert {float(b["x"][0, 0]) for b in loader} == {4.0}
    stream = jl.Stream.from_generator(lambda shard: iter(records), shards=1).map(_set_half)
    with jl.StreamLoader(stream, batch_size=4, num_epochs=3, process_index=0,
                         process_count=1) as loader:  # (a stream's map)
        assert {float(b["x"][0, 0]) for b in loader} == {4.0}


class _OneBuffer:
    """A fast reader's habit: each batch read into one buffer, or handed out as a view."""

    def __init__(self, view: bool) -> None:
        self.data, self.buffer, self.view = np.arange(8.0), np.empty(4), view

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        return {"x": self.data[i]}

    def __getitems__(self, indices) -> dict:
        if self.view:
            return {"x": self.data[indices[0]:indices[0] + len(indices)]}
        self.buffer[:] = self.data[indices]
        return {"x": self.buffer}


_COLUMN = np.arange(4.0)


def _doubled(batch):  # written into the batch it is given
    batch["x"] *= 2
    return batch


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_shares_no_memory_with_the_source_or_a_transform_with_0_workers_too(
        num_workers):
    # With 0 workers a batch was the source's __getitems__ array itself: a buffer refilled
    # made every batch kept the last one, a batch written into wrote into the source (each
    # epoch doubled again), and a BatchMap's array (a constant) changed; a JitMap's batch of
    # one chunk was XLA's, read-only. A worker's batch, written into a slot, never was.
    def loader(source, transforms=()):
        return jl.DataLoader(source, batch_size=4, transforms=list(transforms),
                             num_workers=num_workers, process_index=0, process_count=1)

    with loader(_OneBuffer(view=False)) as dl:
        assert [b["x"].tolist() for b in list(dl)] == [[0, 1, 2, 3], [4, 5, 6, 7]]
    source = _OneBuffer(view=True)
    with loader(source) as dl:
        for _ in range(2):
            for b in dl:
                b["x"] += 100
        assert source.data.tolist() == list(range(8))
    with loader(_OneBuffer(view=True), [jl.BatchMap(_doubled)]) as dl:
        assert [b["x"].tolist() for _ in range(3) for b in dl] == [
            [0, 2, 4, 6], [8, 10, 12, 14]] * 3  # (the worker's copy of the source kept too)
    with loader(jl.ArraySource({"x": np.zeros(8)}),
                [jl.BatchMap(lambda b: {**b, "c": _COLUMN})]) as dl:
        for b in dl:
            b["c"] += 1
    assert _COLUMN.tolist() == [0, 1, 2, 3]
    with jl.DataLoader(jl.ArraySource({"x": np.arange(6.0)}), batch_size=4,
                       last_batch="partial", transforms=[jl.JitMap(lambda r: {"x": r["x"] * 2})],
                       num_workers=num_workers, process_index=0, process_count=1) as dl:
        for b in dl:
            b["x"] /= 2  # (the last batch, of 2 rows, is one chunk)
            assert b["x"].flags.writeable


class _RefilledRecords:
    """A reader that fills one buffer for every record (__getitem__, no __getitems__)."""

    def __init__(self) -> None:
        self.buffer = np.zeros(3, np.float32)

    def __len__(self) -> int:
        return 8

    def __getitem__(self, i: int) -> dict:
        self.buffer[:] = i
        return {"x": self.buffer}


class _Decode:  # a Map writing into one array it keeps
    def __init__(self) -> None:
        self.out = np.zeros(3, np.float32)

    def __call__(self, record):
        self.out[:] = record["x"]
        return {"x": self.out}


_SHARED = np.arange(3.0)  # (one array in every record, never changed: no refill)


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_source_or_a_map_that_refills_one_buffer_is_warned_of_naming_which(num_workers,
                                                                           monkeypatch):
    # each record of a batch held the last one's values, without a word (a stream's shards
    # were watched for it, a DataLoader's source and Maps not)
    from jaxloader.batching import refills

    monkeypatch.setattr(refills, "SAID", set())  # (in this process; a worker's own is fresh)
    records = [{"x": np.float32(i)} for i in range(8)]
    for source, transforms, said in (
            (_RefilledRecords(), [], r"changed as the source \(_RefilledRecords\) read the next "
                                    r"record: .*a copy: buf.copy\(\)\) from __getitem__"),
            (records, [jl.Map(_Decode())], r"changed as the record transforms \(Map\(_Decode "
                                           r"object\)\) ran on the next record: .*from the Map")):
        with pytest.warns(jl.JaxloaderWarning, match=said):
            with jl.DataLoader(source, batch_size=4, transforms=transforms,
                               num_workers=num_workers, process_index=0, process_count=1) as dl:
                assert [b["x"][:, 0].tolist() for b in dl] == [[3] * 4, [7] * 4]  # (as said)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.JaxloaderWarning)
        with jl.DataLoader(records, batch_size=4, transforms=[jl.Map(
                lambda r: {**r, "c": _SHARED})], num_workers=num_workers, process_index=0,
                process_count=1) as dl:
            assert [b["x"].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_source_that_refills_one_buffer_read_on_threads_is_warned_of(num_workers,
                                                                       monkeypatch):
    # read_threads= read every record on its threads, which the watch stepped aside for: the
    # records held whichever thread's values came last, without a word. A process's first
    # batch is read whole on the threads, each record sampled as read, compared after
    from jaxloader.batching import refills

    monkeypatch.setattr(refills, "SAID", set())
    with pytest.warns(jl.JaxloaderWarning, match=r"changed as the source \(_RefilledRecords\) "
                                                 r"read other records on its read threads"):
        with jl.DataLoader(_RefilledRecords(), batch_size=4, read_threads=4,
                           num_workers=num_workers, process_index=0, process_count=1) as dl:
            assert len(list(dl)) == 2
    records = [{"x": np.float32(i)} for i in range(8)]
    import warnings

    with warnings.catch_warnings():  # (records of their own, on threads: no word)
        warnings.simplefilter("error", jl.JaxloaderWarning)
        with jl.DataLoader(records, batch_size=4, read_threads=4, num_workers=num_workers,
                           process_index=0, process_count=1) as dl:
            assert [b["x"].tolist() for b in dl] == [[0, 1, 2, 3], [4, 5, 6, 7]]


def _look_up(record, vocab):
    raise KeyError("missing")


class _Augment:
    def __call__(self, record):
        return record


def test_a_partials_or_objects_name_in_messages_is_short_and_holds_no_address():
    # a partial over a 5,000-word vocabulary made each warning and error ~58,000 characters,
    # with an address that changed each run (the logging audit)
    import functools
    import re

    import jaxloader as jl

    look = jl.Map(functools.partial(_look_up, vocab={i: i for i in range(5000)}))
    assert repr(look) == "Map(partial(_look_up, vocab={0: 0, 1: 1, 2: 2, 3: 3, ...}))"
    assert repr(jl.Map(_Augment())) == "Map(_Augment object)"
    with pytest.raises(jl.RecordError) as e:
        next(iter(jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2,
                                transforms=[look], process_index=0, process_count=1)))
    assert len(str(e.value)) < 1000 and not re.search(r"0x[0-9a-f]{6}", str(e.value))


class _Normalize:
    def __init__(self, mean=0.0):
        self.mean = mean

    def __call__(self, record):
        return record


def test_a_transform_class_given_for_its_instance_is_refused_as_made():
    # jl.Map(Normalize) failed at the first batch: "record position 0 holds a _Normalize ...
    # register its class as a JAX pytree node", the Map unnamed (the errors audit)
    for kind in (jl.Map, jl.BatchMap):
        with pytest.raises(jl.ConfigError, match=rf"{kind.__name__}\(_Normalize\): got the "
                                                 rf"class.*{kind.__name__}\(_Normalize\(...\)\)"):
            kind(_Normalize)
    assert repr(jl.Map(_Normalize())) == "Map(_Normalize object)" and jl.Map(dict).fn is dict


def test_a_random_maps_generator_used_as_another_kind_is_told_its_kind():
    # rng.randint (RandomState's) and jax.random.uniform(rng) were Python's bare errors, the
    # RecordError around them adding nothing (the errors audit)
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})
    for fn, said in [(lambda r, rng: {"x": r["x"] + rng.randint(0, 3)},
                      r"has no attribute 'randint' \(a RandomMap's rng is a numpy.random."
                      r"Generator, seeded for each record: rng.integers for RandomState's"),
                     (lambda r, rng: rng.seed(0), r"it is seeded already, from \(seed, epoch"),
                     (lambda r, rng: {"x": r["x"] + rng.key(0)}, r"for a jax.random key, write "
                                                                r"the transform as a jl.JitMap")]:
        with pytest.raises(jl.RecordError, match=said):
            jl.DataLoader(source, batch_size=4, transforms=[jl.RandomMap(fn)]).peek()


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_key_a_transform_before_renamed_is_named_with_the_keys_it_was_given(num_workers):
    # a Map after one that renamed "x" said KeyError: 'x' alone (the JitMap audit)
    source = jl.ArraySource({"x": np.ones((8, 3), np.float32)})
    rename = jl.Map(lambda r: {"img": r["x"]})
    for then, what in [(jl.Map(lambda r: {"y": r["x"]}), "record"),
                       (jl.BatchMap(lambda b: {"y": b["x"]}), "batch")]:
        with jl.DataLoader(source, batch_size=4, transforms=[rename, then],
                           num_workers=num_workers) as loader:
            with pytest.raises(jl.JaxloaderError, match=rf"raised KeyError: 'x' \(the {what} "
                                                         r"it was given has keys \['img'\]\);"):
                next(iter(loader))
