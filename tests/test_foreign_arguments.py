"""PyTorch's and Grain's argument names given to DataLoader say what to pass instead."""

from __future__ import annotations

import inspect
import json
import re

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.loaders.foreign_arguments import _REMEDIES, _STREAM_REMEDIES


def loader(**kw):
    return jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, process_index=0,
                         process_count=1, **kw)


@pytest.mark.parametrize("name, value, remedy", [
    ("drop_last", True, "last_batch='drop'"),
    ("collate_fn", list, "(what a padding collate_fn did)"),
    ("pin_memory", True, "sharding="),
    ("worker_count", 2, "num_workers="),
    ("generator", None, "seed="),
    ("pin_memory_device", "cuda", "sharding="),
    ("transformations", [], "transforms="),
    # tf.data's (their names were Python's bare "unexpected keyword argument")
    ("num_parallel_calls", -1, "num_workers="),
    ("padded_shapes", None, "jaxloader.Pad(keys)"),
    ("padding_values", 0, "jaxloader.Pad(keys, value=...)"),
    ("reshuffle_each_iteration", False, "FilteredSource(source, indices=a permutation)"),
    ("deterministic", True, "a batch is a function of (seed, epoch, step)"),
    # near misses of other meanings ("did you mean sharding=?", "did you mean workers=?")
    ("shard_index", 1, "use process_index="),
    ("num_shards", 2, "use process_count="),
    ("world_size", 2, "use process_count="),
    ("seed_worker", print, "use seed=: every random draw"),
    # where to place batches ("did you mean prefetch=?", the sharding audit; or nothing)
    ("prefetch_to_device", 2, "use device_prefetch="),
    ("mesh", None, "sharding=jaxloader.data_sharding(mesh, 'data')"),
    ("device", None, "pass sharding=device"),
])
def test_a_peer_name_raises_naming_the_value_and_what_to_pass(name, value, remedy):
    with pytest.raises(TypeError) as info:
        loader(**{name: value})
    message = str(info.value)
    said = getattr(value, "__qualname__", repr(value))  # (a function, a class: its name)
    assert message.startswith(f"DataLoader({name}={said}): DataLoader has no {name}: ")
    assert remedy in message
    # one of jaxloader's, as troubleshooting.md says every error is (it was a bare TypeError)
    assert isinstance(info.value, jl.ArgumentError) and isinstance(info.value, jl.JaxloaderError)


@pytest.mark.parametrize("owner, remedies, extra", [
    (jl.DataLoader, _REMEDIES, set()),
    (jl.StreamLoader, _STREAM_REMEDIES, {"shuffle_window"}),  # an argument of every Stream maker
])
def test_every_remedy_names_an_argument_or_class_jaxloader_has(owner, remedies, extra):
    accepted = set(inspect.signature(owner).parameters) | set(jl.__all__) | extra
    for name, remedy in remedies.items():
        assert name not in accepted - extra, name  # a name jaxloader has is never foreign
        classes = set(re.findall(r"jaxloader\.(\w+)", remedy))
        outside_calls = re.sub(r"jaxloader\.\w+\([^)]*\)", "", remedy)
        arguments = set(re.findall(r"(\w+)=", outside_calls)) - set(_REMEDIES)  # drop_last=True
        assert arguments | classes or remedy.startswith("nothing to set") or (
            "the first argument" in remedy), name
        assert (arguments | classes) <= accepted, (name, (arguments | classes) - accepted)


def test_a_grain_samplers_epochs_and_shards_are_named_for_sampler():
    # (the migration audit: IndexSampler(num_epochs=3) was told shuffle=, seed= and a subset,
    # and a user who dropped it trained an epoch a loop where three were meant)
    with pytest.raises(TypeError, match=r"IndexSampler\(num_epochs=n, shard_options=...\) is "
                                        r"num_epochs=n .* process_index=, process_count="):
        jl.DataLoader(np.arange(8), batch_size=2, sampler=range(8))


@pytest.mark.parametrize("name, value, remedy", [
    ("shuffle", True, "shuffle_window=1000"),
    ("drop_last", True, "num_epochs=n"),
    ("sampler", range(4), "jaxloader.Filter"),
    ("collate_fn", list, "BatchMap"),
    ("read_threads", 16, "readers_per_process="),  # (a DataLoader's)
])
def test_a_peer_name_given_to_a_stream_loader_says_what_a_stream_takes(name, value, remedy):
    stream = jl.Stream.from_generator(lambda i: ({"x": j} for j in range(8)), 1)
    with pytest.raises(TypeError) as info:
        jl.StreamLoader(stream, batch_size=2, process_index=0, process_count=1, **{name: value})
    message = str(info.value)  # it was "unexpected keyword argument"
    said = getattr(value, "__qualname__", repr(value))  # (a function, a class: its name)
    assert message.startswith(f"StreamLoader({name}={said}): StreamLoader has no {name}: ")
    assert remedy in message


@pytest.mark.parametrize("owner, first", [(jl.DataLoader, "source"), (jl.StreamLoader, "stream")])
def test_a_source_by_a_peers_name_or_a_peers_positions_says_how_to_pass_it(owner, first):
    # Python said "missing 1 required positional argument: 'source'" to Grain's data_source=
    # and PyTorch's dataset=, and "missing ... 'batch_size'" to DataLoader(ds, 32)
    name = owner.__name__
    source = jl.ArraySource({"x": np.arange(8)})
    for peer in ("data_source", "dataset"):
        with pytest.raises(TypeError, match=rf"^{name}\({peer}=.*\): {name} has no {peer}: pass "
                                            r"the source as the first argument$"):
            owner(**{peer: source}, batch_size=2)
    named = "batch_size=32, shuffle=True" if owner is jl.DataLoader else (
        r"batch_size=32\); and StreamLoader\(..., shuffle=True\): StreamLoader has no shuffle: "
        r"a stream's shards are reordered")  # (what it names is what the loader takes)
    with pytest.raises(TypeError, match=rf"^{name}\({first}, 32, True\): {name} takes its "
                                        rf"{first} alone by position, every other argument by "
                                        rf"name: {name}\({first}, {named}"):
        owner(source, 32, True)
    with pytest.raises(TypeError, match=rf"^{name}\(\) needs a {first}, given first"):
        owner(batch_size=2)
    with pytest.raises(TypeError, match=rf"^{name}\({first}\) needs batch_size=.*"
                                        rf"{name}\({first}, batch_size=32\)$"):
        owner(source)
    with pytest.raises(jl.ArgumentError):  # (a JaxloaderError, a TypeError)
        owner(source, 32)


def test_a_pytorch_call_by_position_names_every_argument_it_cannot_take_and_none_it_can():
    # DataLoader(ds, 32, True, None, None, 4, my_collate) was answered with the call less the
    # collate_fn and a word on the sampler=None placeholder: the collate_fn dropped, unsaid;
    # drop_last, timeout and worker_init_fn by position were not read at all (the migration
    # audit)
    source = jl.ArraySource({"x": np.arange(8)})

    def my_collate(records):
        return records

    def init(worker_id):
        pass

    with pytest.raises(jl.ArgumentError) as caught:
        jl.DataLoader(source, 32, True, None, None, 4, my_collate)
    said = str(caught.value)
    assert "collate_fn=" in said and "my_collate" in said and "sampler" not in said, said
    with pytest.raises(jl.ArgumentError) as caught:
        jl.DataLoader(source, 32, False, None, None, 2, None, False, False, 0, init)
    said = str(caught.value)
    assert re.search(r"DataLoader\(source, batch_size=32, shuffle=False, num_workers=2, "
                     r"worker_init_fn=.*init.*\); and DataLoader\(\.\.\., drop_last=False\): "
                     r".*last_batch='partial'", said), said  # (not PyTorch's default here)
    assert "pin_memory" not in said and "timeout" not in said, said


def test_a_dataset_without_len_or_batch_size_none_gets_the_pytorch_remedy():
    class NoLen:  # (torch.utils.data.Dataset defines __getitem__ alone)
        def __getitem__(self, i):
            return {"x": np.int64(i)}

    with pytest.raises(jl.ConfigError, match=r"got NoLen; add __len__ to the class"):
        jl.DataLoader(NoLen(), batch_size=2)

    class Shards(NoLen):  # (a torch IterableDataset: Dataset's __getitem__, its own __iter__)
        def __iter__(self):
            yield {"x": np.int64(0)}

    with pytest.raises(jl.ConfigError, match=r"got Shards; an iterable without random access "
                                             r"\(a generator\) is a stream"):
        jl.DataLoader(Shards(), batch_size=2)
    with pytest.raises(jl.ConfigError, match=r"batch_size=None \(records one at a time, not "
                                             r"batched\) has none here"):
        jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=None)


def test_grains_per_worker_buffer_size_says_what_to_pass():
    # docs/migrating/grain.md lists it beside worker_buffer_size; it got Python's plain error
    with pytest.raises(jl.ArgumentError, match=r"has no per_worker_buffer_size: use prefetch="):
        loader(per_worker_buffer_size=4)


def test_any_other_unknown_name_is_pythons_usual_error():
    with pytest.raises(TypeError, match=r"^DataLoader\(\) got an unexpected keyword argument "
                                        r"'xyzzy'$"):  # (a near miss: with its near name)
        loader(xyzzy=3)


def test_the_loader_still_works_with_its_own_names():
    assert [b["x"].tolist() for b in loader(last_batch="partial")][-1] == [6, 7]


def test_none_for_transforms_is_none_and_a_worker_init_fn_that_is_no_function_is_refused():
    # transforms=None: "'NoneType' object is not iterable"; worker_init_fn=3 was taken, and
    # failed in the workers at the first batch
    assert len(list(loader(transforms=None))) == 4
    with pytest.raises(jl.ConfigError, match=r"worker_init_fn: expected a function of the "
                                             r"worker's id, or None, got int 3"):
        loader(worker_init_fn=3, num_workers=1)
    # Grain's worker_init_fn(worker_index, worker_count) failed in the workers as they started,
    # and with num_workers=0 was never called: refused when the loader is made
    def init(i, count):
        pass

    for workers in (0, 1):
        with pytest.raises(jl.ConfigError, match=r"worker_init_fn: it is called as "
                                                 r"fn\(worker_id\), but .*init\(i, count\) does "
                                                 r"not take one argument; .*num_workers"):
            loader(worker_init_fn=init, num_workers=workers)


def test_a_tf_data_style_function_of_image_and_label_is_told_a_record_is_one_argument():
    # tf.data maps over (image, label) as two arguments; a Map gets the record as one, and a
    # JitMap of two arguments takes the second for its key
    source = jl.ArraySource((np.zeros((8, 4, 4), np.uint8), np.arange(8)))

    def augment(image, label):
        return image, label
    class Augment:  # (an object: its __call__'s arguments)
        def __call__(self, image, label):
            return image, label
    for fn in (augment, Augment()):  # (said as the Map is made, not at its first batch)
        with pytest.raises(jl.ConfigError, match=r"Map\(fn\): fn is called as fn\(record\), "
                                                 r".*image, label = record"):
            jl.Map(fn)
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(augment)]) as loader:
        with pytest.raises(jl.RecordError, match=r"fn\(image, label\) gets the record as image "
                                                 r"and the key as label"):
            next(iter(loader))

    def helper(a, b):
        return a

    def calls_helper(record):  # (its own call's TypeError: not told the record is one)
        return helper(record)
    with jl.DataLoader(source, batch_size=4, transforms=[jl.Map(calls_helper)]) as loader:
        with pytest.raises(jl.RecordError, match=r"missing 1 required positional") as info:
            next(iter(loader))
    assert "the record is one argument" not in str(info.value)


def test_a_source_that_writes_into_its_own_large_arrays_in_a_worker_is_told_why():
    # (a decode cache in the source's arrays, a PyTorch habit): arrays of 1 MiB or more reach
    # the workers as shared read-only views; with num_workers=0 the write works
    class Cached:
        def __init__(self):
            self.x = np.zeros((8, 65_536), np.float32)  # 2 MiB

        def __len__(self):
            return 8

        def __getitem__(self, i):
            self.x[i] += 1.0
            return {"x": self.x[i]}
    with jl.DataLoader(Cached(), batch_size=4, num_workers=0) as loader:
        assert float(next(iter(loader))["x"].mean()) == 1.0
    frozen = Cached()
    frozen.x.flags.writeable = False  # (read-only in this process: not the workers' sharing)
    with jl.DataLoader(frozen, batch_size=4, num_workers=0) as loader:
        with pytest.raises(jl.RecordError, match=r"read-only") as info:
            next(iter(loader))
    assert "1 MiB" not in str(info.value)
    with jl.DataLoader(Cached(), batch_size=4, num_workers=1) as loader:
        with pytest.raises(jl.WorkerError, match=r"source\[index\] raised ValueError: .*read-only"
                                                 r".*1 MiB or more .*shared read-only views"):
            next(iter(loader))


def test_a_getitems_written_for_a_list_of_indices_is_told_it_gets_an_array():
    class ListOnly:
        def __len__(self):
            return 8

        def __getitem__(self, i):
            return {"x": i}

        def __getitems__(self, indices):
            return [{"x": i} for i in json.loads(json.dumps(indices))]
    for source in (ListOnly(), jl.ConcatSource([ListOnly(), ListOnly()])):  # (under ours too)
        with jl.DataLoader(source, batch_size=4) as loader:
            with pytest.raises(jl.RecordError, match=r"__getitems__ raised TypeError: .*an "
                                                     r"int64 NumPy array.*indices.tolist\(\)"):
                next(iter(loader))


def test_a_generator_object_of_a_tf_data_style_function_is_told_the_call_that_works():
    def gen():
        yield {"x": 1}
    with pytest.raises(jl.ConfigError, match=re.escape("from_generator(lambda shard: gen(), "
                                                       "shards=1)")):
        jl.Stream.from_generator(gen(), shards=1)
    with pytest.raises(jl.ConfigError, match=re.escape("from_generator(_read, shards=2)")):
        jl.Stream.from_generator(_read(0), shards=2)  # (a function of the shard: itself)


def _read(shard):
    yield {"x": shard}


@pytest.mark.parametrize("loader", ["DataLoader", "StreamLoader"])
def test_a_misspelt_argument_is_told_its_near_name_and_a_shuffle_window_where_it_goes(loader):
    # the **unknown catch-all dropped Python's own "Did you mean 'transforms'?": worse than
    # none; a shuffle window given to a loader said nothing of where it goes
    source = (jl.ArraySource({"x": np.arange(8)}) if loader == "DataLoader" else
              jl.Stream.from_generator(lambda i: iter([{"x": 1}]), shards=1))
    make = getattr(jl, loader)
    for typo, meant in (("transform", "transforms"), ("num_worker", "num_workers"),
                        ("batchsize", "batch_size")):
        with pytest.raises(TypeError, match=rf"{loader}\(\) got an unexpected keyword "
                                            rf"argument '{typo}'; did you mean {meant}=\?"):
            make(source, **{"batch_size": 2, typo: 1})
    where = "Stream.jsonl\\(paths, shuffle_window=1000\\)" if loader == "StreamLoader" else (
        "shuffle=jaxloader.LocalShuffle\\(window=8\\)")
    with pytest.raises(TypeError, match=rf"{loader} has no shuffle_window: .*{where}"):
        make(source, batch_size=2, shuffle_window=100)


def test_the_loaders_type_hints_resolve_for_runtime_checkers():
    # typing.get_type_hints(DataLoader.__init__) raised NameError: 'Map' (transforms= named
    # its classes by string, looked up in the loader's module: typeguard, pydantic's
    # validate_call; the typing audit)
    import typing

    for loader in (jl.DataLoader, jl.StreamLoader):
        hints = typing.get_type_hints(loader.__init__)
        assert {"transforms", "batch_size", "return"} <= set(hints), hints


def test_pytorchs_loader_attributes_say_what_to_read_instead():
    # len(loader.dataset) and loader.sampler.set_epoch(epoch), a PyTorch loop's lines, were a
    # bare "'DataLoader' object has no attribute 'dataset'"
    loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2)
    with pytest.raises(AttributeError, match=r"DataLoader has no dataset \(PyTorch's "
                                             r"DataLoader\.dataset\): .*len\(loader\) \* "
                                             "batch_size"):
        len(loader.dataset)
    for name in ("sampler", "batch_sampler"):
        with pytest.raises(AttributeError, match=r"each iter\(loader\) is the next epoch"):
            getattr(loader, name).set_epoch(1)
    with pytest.raises(AttributeError, match=r"DataLoader has no set_epoch \(PyTorch's "
                                             r"DistributedSampler.set_epoch.*each iter\(loader\) "
                                             r"is the next epoch.*loader\.epoch is the epoch"):
        loader.set_epoch(1)  # (Python's bare AttributeError named nothing)
    assert not hasattr(loader, "dataset")
    # the arguments PyTorch's loader keeps as attributes (loader.drop_last in a step count):
    # Python's bare AttributeError, naming nothing (the docs audit)
    for name, said in (("drop_last", "last_batch='partial'"), ("collate_fn", "BatchMap"),
                       ("pin_memory", "sharding="), ("timeout", "timeout_s="),
                       ("generator", "seed="), ("prefetch_factor", "prefetch="),
                       ("persistent_workers", "close\\(\\) ends"),
                       ("multiprocessing_context", "start_method="), ("in_order", "in order"),
                       ("pin_memory_device", "sharding=")):
        with pytest.raises(AttributeError, match=rf"DataLoader has no {name} \(PyTorch's "
                                                 rf"DataLoader\.{name}\): not an argument "
                                                 rf"here either: .*{said}"):
            getattr(loader, name)
    with pytest.raises(AttributeError, match="'DataLoader' object has no attribute 'datasets'"):
        loader.datasets  # (any other name: Python's own)

    class Keeping(jl.DataLoader):  # (a subclass keeping its dataset, as a PyTorch one may)
        def __init__(self, dataset, **options):
            super().__init__(dataset, **options)
            self.dataset = dataset
    source = jl.ArraySource({"x": np.arange(8)})
    assert Keeping(source, batch_size=2).dataset is source


def test_a_stream_loader_asked_for_a_data_loaders_epoch_or_length_says_what_it_has():
    # loader.epoch, len(loader), loader.device_prefetch moved from a DataLoader loop were
    # Python's bare AttributeError and TypeError on a StreamLoader (the parity audit)
    stream = jl.Stream.from_generator(lambda i: ({"x": np.int64(j)} for j in range(6)),
                                      shards=1)
    loader = jl.StreamLoader(stream, batch_size=2, process_index=0, process_count=1)
    assert loader.device_prefetch == 2 and bool(loader)
    for name in ("epoch", "set_epoch", "dataset", "sampler"):
        with pytest.raises(AttributeError, match=rf"StreamLoader has no {name} .*zip\(range"):
            getattr(loader, name)
    with pytest.raises(TypeError, match=r"a StreamLoader has no len\(\).*num_epochs=1"):
        len(loader)
    assert len(list(zip(range(3), loader))) == 3


def test_grains_iterator_state_calls_say_where_the_position_is_kept():
    # (the migration audit: iter(loader).get_state(), Grain's checkpoint idiom, was a bare
    # "'LoaderIterator' object has no attribute 'get_state'")
    loader = jl.DataLoader(np.arange(8), batch_size=2, process_index=0, process_count=1)
    stream = jl.StreamLoader(jl.Stream.from_generator(lambda i: range(4), shards=1),
                             batch_size=2, process_index=0, process_count=1)
    for owner in (loader, iter(loader), stream):
        for name in ("get_state", "set_state"):
            with pytest.raises(AttributeError, match=rf"{type(owner).__name__} has no {name} "
                                                     r"\(Grain's iterator\.\w+\(.*loader\."
                                                     r"state_dict\(\).*LoaderSave"):
                getattr(owner, name)
    loader.close(), stream.close()


def test_arrays_given_by_position_are_told_to_make_one_source():
    # DataLoader(X, y, batch_size=32), TensorDataset's habit, was told to pass the label array
    # as batch_size=, printed whole twice (the errors audit)
    x, y = np.zeros((60000, 4)), np.arange(60000)
    with pytest.raises(jl.ArgumentError, match=r"DataLoader\(<ndarray of shape \(60000, 4\)>, "
                                               r"<ndarray of shape \(60000,\)>\): .*"
                                               r"DataLoader\(jl.ArraySource\(\(x, y\)\), "
                                               r"batch_size=32\)") as raised:
        jl.DataLoader(x, y, batch_size=32)
    assert "batch_size=array" not in str(raised.value) and len(str(raised.value)) < 400
    with pytest.raises(jl.ArgumentError, match=r"DataLoader\(source, 32, <ndarray of shape "
                                               r"\(60000,\)>\): .*shuffle=<ndarray"):
        jl.DataLoader(x, 32, y)
    with pytest.raises(jl.ArgumentError, match=r"DataLoader\(source, 25\): .*batch_size=25\)"):
        jl.DataLoader(x, np.int64(100) // 4)  # (a NumPy int: a number, not a second array)


def test_a_stream_loaders_argument_given_to_a_data_loader_is_told_whose_it_is():
    # "got an unexpected keyword argument 'readers_per_process'" (the API parity audit)
    with pytest.raises(jl.ArgumentError, match=r"DataLoader\(readers_per_process=4\): "
                                               r"DataLoader has no readers_per_process: it is a "
                                               r"StreamLoader's.*num_workers="):
        jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, readers_per_process=4)


@pytest.mark.parametrize("make, expected", [
    # tf.data's dataset.map(fn, num_parallel_calls=4), torchvision's ImageFolder(transform=),
    # a source handed the loader's batch_size=: Python's bare "unexpected keyword argument"
    (lambda: jl.Map(lambda r: r, num_parallel_calls=4),
     r"Map\(num_parallel_calls=4\): Map has no num_parallel_calls: .*"
     r"DataLoader\(source, num_workers=4\) or StreamLoader\(stream, num_workers=4\)"),
    (lambda: jl.RandomMap(lambda r, rng: r, seed=3),
     r"RandomMap\(seed=3\): .*it is the loader's: DataLoader\(source, seed=3\)"),
    (lambda: jl.FileListSource(["a.png"], transform=len),
     r"FileListSource\(transform=.*DataLoader\(source, transforms=\[jaxloader.Map\(fn\)\]\)"),
    (lambda: jl.ArraySource({"x": np.arange(8)}, batch_size=32),
     r"ArraySource\(batch_size=32\): .*: DataLoader\(source, batch_size=32\)$"),
    (lambda: jl.ParquetSource("a.parquet", drop_last=True), r"last_batch='drop'"),
    (lambda: jl.JsonlShard("a.jsonl", shuffle=True),
     r"JsonlShard\(shuffle=True\): .*shuffle_window=n .*StreamLoader's seed="),
    (lambda: jl.Stream([], drop_last=True), r"Stream\(drop_last=True\): .*all full"),
])
def test_a_loaders_argument_given_to_a_source_stream_or_transform_says_whose_it_is(make,
                                                                                   expected):
    with pytest.raises(jl.ArgumentError, match=expected):
        make()


def test_a_marked_class_keeps_its_signature_and_pythons_error_for_other_names():
    assert list(inspect.signature(jl.Map).parameters) == ["fn"]
    assert "shuffle_window" in inspect.signature(jl.Stream).parameters
    with pytest.raises(TypeError, match=r"unexpected keyword argument 'foo'") as raised:
        jl.Map(lambda r: r, foo=1)
    assert not isinstance(raised.value, jl.ArgumentError)
    # a name the class takes is its own: PackedSource's seed=, FilteredSource's num_workers=
    assert "seed" in inspect.signature(jl.PackedSource).parameters
    jl.FilteredSource(jl.ArraySource({"x": np.arange(4)}), indices=np.arange(2), num_workers=0)


def test_a_peer_names_value_is_shown_cut_short():
    # DataLoader(dataset=records): the list's whole repr, 6.4 MB for 200,000 records, in 4.4 s
    records = [{"x": i} for i in range(200_000)]
    with pytest.raises(TypeError) as info:
        loader(dataset=records)
    assert str(info.value).startswith("DataLoader(dataset=[{'x': 0}, {'x': 1}, {'x': 2}, "
                                      "{'x': 3}, ...]): DataLoader has no dataset: ")
    assert len(str(info.value)) < 1000


HANDLE: dict = {}


def _open_handle(worker_id):
    HANDLE.update({i: i * 10 for i in range(16)})


class _HandleSource:
    def __len__(self):
        return 16

    def __getitem__(self, i):
        return {"x": np.int64(HANDLE[i])}


def test_a_peek_over_a_source_set_up_by_worker_init_fn_says_where_it_was_made():
    # state_dict() said the training process reads records, and where to open a handle;
    # peek() said only "KeyError: 0" (the migration audit)
    with jl.DataLoader(_HandleSource(), batch_size=4, num_workers=1, worker_init_fn=_open_handle,
                       process_index=0, process_count=1) as loader:
        assert next(iter(loader))["x"].tolist() == [0, 10, 20, 30]
        with pytest.raises(jl.RecordError) as caught:
            loader.peek()
    assert any("worker_init_fn never ran: open what the source reads lazily" in note
               for note in caught.value.__notes__), caught.value

    def bad(record):
        raise KeyError("missing")

    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=1,
                       worker_init_fn=_open_handle, transforms=[jl.Map(bad)],
                       process_index=0, process_count=1) as loader:
        with pytest.raises(jl.RecordError) as caught:
            loader.peek()
    assert not getattr(caught.value, "__notes__", None), caught.value  # (a transform's own)
