from __future__ import annotations

import os
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.workers.payload import SHARE_MIN_BYTES, dumps, loads


def test_large_arrays_cross_once_through_shared_memory_read_only():
    big = np.arange(SHARE_MIN_BYTES, dtype=np.uint8)
    small = np.arange(10)
    segments = []
    blob = dumps({"a": big, "again": big, "fn": lambda: small.sum()}, segments.append)
    assert len(segments) == 1 and len(blob) < SHARE_MIN_BYTES // 4
    out = loads(blob)
    assert np.array_equal(out["a"], big) and out["a"] is out["again"]
    assert out["fn"]() == 45
    with pytest.raises(ValueError, match="read-only"):
        out["a"][0] = 1
    del out
    for seg in segments:
        seg.destroy()


def test_an_arrow_table_crosses_once_through_shared_memory():
    # an in-memory datasets.Dataset pickles its pa.Table: each worker held a copy of it
    # (150 MB of float32: 221 MiB private a worker against 74 with it shared)
    pa = pytest.importorskip("pyarrow")
    table = pa.table({"x": np.arange(SHARE_MIN_BYTES // 4, dtype=np.int64),
                      "s": [str(i) for i in range(SHARE_MIN_BYTES // 4)]})
    segments = []
    blob = dumps({"t": table, "again": table, "small": pa.table({"y": [1, 2]})}, segments.append)
    assert len(segments) == 1 and len(blob) < 10_000
    out = loads(blob)
    assert out["t"].equals(table) and out["t"] is out["again"] and out["small"]["y"].to_pylist() \
        == [1, 2]
    del out
    for seg in segments:
        seg.destroy()


def test_an_arrow_table_of_an_extension_type_of_the_script_is_pickled_with_its_type():
    # read from shared memory by a worker that never registered the type: its storage type
    # (double), where pickling kept the type; a type of an importable module is registered
    # by importing it first (datasets' Array2D), pyarrow's own are always there
    pa = pytest.importorskip("pyarrow")

    class Celsius(pa.ExtensionType):  # (a script's: no worker can import it)
        def __init__(self) -> None:
            super().__init__(pa.float64(), "test.celsius")

        def __arrow_ext_serialize__(self) -> bytes:
            return b""

        @classmethod
        def __arrow_ext_deserialize__(cls, storage_type, serialized):
            return cls()

    storage = pa.array(np.arange(SHARE_MIN_BYTES // 4, dtype=np.float64))
    table = pa.table({"t": pa.ExtensionArray.from_storage(Celsius(), storage)})
    segments = []
    out = loads(dumps(table, segments.append))
    assert not segments and out.schema.field("t").type.extension_name == "test.celsius"
    from jaxloader.workers.payload import _registering

    array2d = pytest.importorskip("datasets").Array2D(shape=(2, 2), dtype="float32")
    assert _registering(pa.schema([("a", pa.list_(array2d()))])) == [
        type(array2d()).__module__]


def test_out_of_descriptors_for_a_sources_arrays_says_so_and_what_to_do():
    # a list of records of 1 MiB arrays: one memory file an array, and a full descriptor table
    # was blamed on batch slots ("use fewer workers, keep fewer batches alive")
    import resource

    from jaxloader.base.errors import SharedMemoryError

    records = [{"x": np.full(SHARE_MIN_BYTES, i, np.uint8)} for i in range(40)]
    segments: list = []
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (len(os.listdir("/proc/self/fd")) + 20, hard))
    try:
        with pytest.raises(SharedMemoryError, match=r"no descriptor left for the source's array "
                           r"\d+ of 1 MiB or more .* hold the records' arrays in fewer, larger"):
            dumps(records, segments.append)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        for seg in segments:
            seg.destroy()
    assert 0 < len(segments) < 40


def test_memmaps_cross_as_their_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32).reshape(1024, -1))
    mm = np.load(path, mmap_mode="r")
    segments = []
    blob = dumps([mm, mm[100:200, 3:]], segments.append)
    assert not segments and len(blob) < 4096  # (np.load(a Path) crossed as its bytes)
    out = loads(blob)
    assert np.array_equal(out[0], mm) and np.array_equal(out[1], mm[100:200, 3:])


def test_arrays_of_bfloat16_and_structured_dtypes_cross_with_their_dtype(tmp_path):
    # the reference held dtype.str, which for these is raw bytes ("<V2", "|V12"): with workers
    # a bfloat16 column of 1 MiB or more came out as void bytes, a structured one nameless
    import jaxloader as jl

    ml_dtypes = pytest.importorskip("ml_dtypes")
    n = SHARE_MIN_BYTES // 2
    bf16 = (np.arange(n) % 7).astype(ml_dtypes.bfloat16)
    pairs = np.zeros(n // 4, [("a", "<i4"), ("b", "<f8")])  # (1.5 MiB)
    pairs["a"], pairs["b"] = np.arange(len(pairs)), 0.5
    path = tmp_path / "pairs.npy"
    np.save(path, pairs)
    segments = []
    out = loads(dumps([bf16, pairs, np.load(path, mmap_mode="r")], segments.append))
    try:
        assert len(segments) == 2 and [o.dtype for o in out] == [bf16.dtype, pairs.dtype,
                                                                 pairs.dtype]
        assert np.array_equal(out[0], bf16) and all(np.array_equal(o, pairs) for o in out[1:])
    finally:
        del out
        for seg in segments:
            seg.destroy()
    source = jl.ArraySource({"x": bf16.reshape(-1, 4), "p": pairs})
    with jl.DataLoader(source, batch_size=4, num_workers=1, process_index=0,
                       process_count=1) as loader:
        batch = next(iter(loader))
    assert batch["x"].dtype == bf16.dtype and batch["p"].dtype == pairs.dtype
    assert np.array_equal(batch["x"], bf16.reshape(-1, 4)[:4]) and batch["p"]["a"].tolist() == [
        0, 1, 2, 3]


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux says what is mapped")
def test_a_memmap_whose_file_has_other_bytes_crosses_as_its_bytes(tmp_path):
    # a copy-on-write map changed in memory, a file replaced since it was mapped: a worker
    # reading the file would get other data than the training process
    path = tmp_path / "x.npy"
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32))
    changed = np.load(path, mmap_mode="c")
    changed[:3] = -1
    replaced = np.load(path, mmap_mode="r")
    np.save(tmp_path / "new.npy", np.zeros(2 * SHARE_MIN_BYTES, np.int32))
    (tmp_path / "new.npy").replace(path)
    segments = []
    out = loads(dumps([changed, replaced[5:]], segments.append))
    assert len(segments) == 2
    assert out[0][:4].tolist() == [-1, -1, -1, 3] and out[1][:2].tolist() == [5, 6]
    del out
    for seg in segments:
        seg.destroy()


def test_a_memmap_file_replaced_before_a_worker_maps_it_is_an_error_naming_it(tmp_path):
    from jaxloader.base.errors import ConfigError

    path = tmp_path / "x.npy"
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32))
    blob = dumps(np.load(path, mmap_mode="r"), [].append)
    np.save(tmp_path / "new.npy", np.zeros(2 * SHARE_MIN_BYTES, np.int32))
    (tmp_path / "new.npy").replace(path)
    with pytest.raises(ConfigError, match=r"x.npy: replaced or removed since the loader's "
                                          r"payload was made .*a worker would read other data"):
        loads(blob)
    path.unlink()
    with pytest.raises(ConfigError, match=r"x.npy: replaced or removed .*FileNotFoundError"):
        loads(blob)
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32))
    blob = dumps(np.load(path, mmap_mode="r"), [].append)
    for size in (0, 4096):  # (cut in place: the worker's start failed as NumPy's bare error)
        os.truncate(path, size)
        with pytest.raises(ConfigError, match=rf"x.npy: changed in place since the loader's "
                                              rf"payload was made \({size:,} bytes now; "):
            loads(blob)


@pytest.mark.skipif(not os.path.exists("/proc/self/smaps"), reason="Linux says what is mapped")
def test_a_copy_on_write_memmap_not_written_to_crosses_as_its_file(tmp_path):
    path = tmp_path / "x.npy"
    np.save(path, np.arange(2 * SHARE_MIN_BYTES, dtype=np.int32))
    unchanged = np.load(path, mmap_mode="c")
    segments = []
    blob = dumps(unchanged, segments.append)
    assert not segments and len(blob) < 4096 and np.array_equal(loads(blob), unchanged)


@pytest.mark.parametrize("rows", [1, 3, 7, 4099])
def test_large_copies_split_over_threads_give_the_same_array(monkeypatch, rows):
    from jaxloader.workers import payload

    monkeypatch.setattr(payload, "SPLIT_MIN_BYTES", 0)  # split even these (small) arrays
    monkeypatch.setattr(payload.os, "cpu_count", lambda: 4)
    base = np.random.default_rng(rows).integers(0, 1 << 30, (rows, 2 * SHARE_MIN_BYTES // rows))
    strided = base[::-1, ::3]  # not contiguous: rows must be split, not flattened bytes
    segments = []
    out = loads(dumps([strided, base[0]], segments.append))
    assert np.array_equal(out[0], strided) and np.array_equal(out[1], base[0])
    del out
    for seg in segments:
        seg.destroy()


def test_an_error_in_a_copy_thread_is_raised_not_lost(monkeypatch):
    import threading

    from jaxloader.workers import payload

    real = np.copyto

    def copyto(dst, src):
        if threading.current_thread() is not threading.main_thread():
            raise MemoryError("no room for these rows")
        real(dst, src)

    monkeypatch.setattr(payload, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(payload.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(payload.np, "copyto", copyto)
    segments = []
    with pytest.raises(MemoryError, match="no room"):
        dumps(np.ones((4, SHARE_MIN_BYTES), np.uint8), segments.append)
    for seg in segments:
        seg.destroy()


def test_alike_parts_of_a_concatenation_cross_as_one_segment_a_leaf():
    import jaxloader as jl

    rows = SHARE_MIN_BYTES // 2  # every leaf of every part over the size that is shared
    x, y = np.arange(3 * rows, dtype=np.float64), np.arange(3 * rows, dtype=np.int64)
    cuts = [(0, rows // 3), (rows // 3, 2 * rows), (2 * rows, 3 * rows)]
    mixture = jl.mix([jl.ArraySource({"x": x[a:b], "y": y[a:b]}) for a, b in cuts], [1, 1, 1])
    segments = []
    out = loads(dumps(mixture, segments.append))
    assert len(segments) == 2  # one a leaf (apart, they were one a leaf and part: 6)
    assert mixture.joined is None and out.joined is not None  # joined only where it crossed
    assert np.array_equal(out.joined.arrays[0], x) and np.array_equal(out.joined.arrays[1], y)
    for part, (a, b) in zip(out.sources, cuts):  # the parts are views of the joined rows
        assert np.array_equal(part.arrays[0], x[a:b])
        assert np.shares_memory(part.arrays[0], out.joined.arrays[0])
    assert out.schedule.keys() == mixture.schedule.keys() and len(out) == len(x)
    del out, part
    for seg in segments:
        seg.destroy()


def test_parts_not_joined_when_memory_mapped_or_repeated(tmp_path):
    import pickle

    import jaxloader as jl

    np.save(tmp_path / "x.npy", np.arange(SHARE_MIN_BYTES, dtype=np.int64))
    mm = jl.ArraySource({"x": np.load(tmp_path / "x.npy", mmap_mode="r")})
    small = jl.ArraySource({"x": np.arange(5, dtype=np.int64)})
    segments = []
    mapped = loads(dumps(jl.ConcatSource([mm, small]), segments.append))
    assert mapped.joined is None and not segments  # the big part still crosses as its file
    again = loads(dumps(jl.ConcatSource([small, small]), segments.append))
    assert again.joined is None and again.sources[0] is again.sources[1]
    negative = jl.ArraySource({"x": -small.arrays[0]})
    plain = pickle.loads(pickle.dumps(jl.ConcatSource([small, negative])))  # no payload
    assert plain.joined.arrays[0].tolist() == [0, 1, 2, 3, 4, 0, -1, -2, -3, -4]



@pytest.mark.parametrize("steps", [SHARE_MIN_BYTES // 8, 200])  # shared, then pickled, each
def test_windows_of_several_series_cross_as_the_bytes_they_span(tmp_path, steps):
    # one ArraySource of windows a series, joined by ConcatSource or jl.mix: alike parts were
    # joined, each window copied whole into one memory file (a window's length times the
    # series); windows too small to share were pickled element by element, by Ray's too
    import pickle

    import jaxloader as jl
    from jaxloader.workers.by_value import dumps_by_value

    np.save(tmp_path / "s.npy", np.arange(steps * 2, dtype=np.float32).reshape(-1, 2))
    series = [np.arange(steps * 2, dtype=np.float32).reshape(-1, 2) + k for k in range(2)]
    series.append(np.load(tmp_path / "s.npy", mmap_mode="r"))
    windows = [np.moveaxis(np.lib.stride_tricks.sliding_window_view(s, 60, axis=0), -1, 1)
               for s in series]
    real = sum(s.nbytes for s in series)
    assert sum(w.nbytes for w in windows) > 40 * real
    for source in (jl.ConcatSource([jl.ArraySource({"x": w}) for w in windows]),
                   jl.mix([jl.ArraySource({"x": w[:, :48], "y": w[:, 48:]}) for w in windows],
                          [1, 1, 1])):
        segments: list = []
        blob = dumps(source, segments.append)
        try:
            assert len(blob) + sum(seg.size for seg in segments) < 3 * real + 65536
            out = loads(blob)
            for part, given in zip(out.sources, source.sources):
                assert np.array_equal(part[7]["x"], given[7]["x"])
            del out, part
        finally:
            for seg in segments:
                seg.destroy()
        by_value = dumps_by_value(source, lambda buffer: True)  # (a Ray actor's payload)
        assert len(by_value) < 3 * real + 65536
        out = pickle.loads(by_value)
        assert np.array_equal(out.sources[1][5]["x"], source.sources[1][5]["x"])

SCRIPT = '''
import functools
import numpy as np
import jaxloader as jl


@functools.cache
def table():  # a tokenizer's vocabulary, say: loaded once a process
    return np.arange(10) * 3


@functools.lru_cache(maxsize=4)
def fib(n):  # recursive: its globals name the cache itself
    return n if n < 2 else fib(n - 1) + fib(n - 2)


def add(record):
    return {"x": record["x"] + table()[record["x"]] + fib(10),
            "misses": table.cache_info().misses, "size": fib.cache_info().maxsize}


if __name__ == "__main__":
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=2,
                       transforms=[jl.Map(add)]) as loader:
        for batch in loader:
            print(batch["x"].tolist(), batch["misses"].tolist(), batch["size"].tolist())
'''


def test_cached_functions_of_a_script_reach_the_workers(tmp_path):
    """cloudpickle names a ``functools.cache`` function, which a worker cannot find in its
    ``__main__``; it crosses by value, an empty cache of the same size in each worker."""
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(SCRIPT)
    done = subprocess.run([sys.executable, str(tmp_path / "train.py")], capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split("\n")[:2] == ["[55, 59, 63, 67] [1, 1, 1, 1] [4, 4, 4, 4]",
                                           "[71, 75, 79, 83] [1, 1, 1, 1] [4, 4, 4, 4]"]


SPAWNED = '''
import multiprocessing
import sys
import numpy as np
import jaxloader as jl


def f(record):  # (named as the worker's own -c code names its descriptors' loop variable)
    return {"x": record["x"] + 1}


def job(method):
    with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=2,
                       transforms=[jl.Map(f), jl.Map(lambda r: r)]) as loader:
        return f"{method} {f.__module__} {[b['x'].tolist() for b in loader]}"


if __name__ == "__main__":
    with multiprocessing.get_context(sys.argv[1]).Pool(1) as pool:
        print(pool.apply(job, (sys.argv[1],)))
'''


@pytest.mark.parametrize("method", ["spawn", "forkserver"])
def test_a_loader_made_in_a_spawned_process_sends_the_scripts_functions_by_value(tmp_path,
                                                                               method):
    """A spawn or forkserver child runs the script as the module ``__mp_main__``, which
    cloudpickle sent by name: a worker found another ``__mp_main__`` there (its own code), and
    raised a bare ``AttributeError``, or took a name of that code's (``f``) for the
    function."""
    import subprocess
    import sys

    (tmp_path / "train.py").write_text(SPAWNED)
    done = subprocess.run([sys.executable, str(tmp_path / "train.py"), method],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"{method} __mp_main__ [[1, 2, 3, 4], [5, 6, 7, 8]]"


USER_MODULE = '''
import os
import numpy as np

IMPORTED_BY = os.getpid()  # the process that ran this module's top level


def tag(record):
    return {**record, "imported_by": np.int64(IMPORTED_BY)}
'''


def test_a_transform_from_an_importable_module_is_imported_by_name_in_each_worker(
        tmp_path, monkeypatch):
    """A function of a module the main process imported crosses by name: each worker imports
    the module (the main process's ``sys.path`` reaches it), so its top level runs there. (The
    tests' own modules cross by value, as a script's functions do: ``conftest.py``.)"""
    import os
    import sys

    import jaxloader as jl

    (tmp_path / "user_transforms.py").write_text(USER_MODULE)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "user_transforms", raising=False)
    import user_transforms

    with jl.DataLoader(jl.ArraySource({"x": np.arange(32)}), batch_size=4, num_workers=2,
                       num_epochs=1, transforms=[jl.Map(user_transforms.tag)],
                       process_index=0, process_count=1) as loader:
        by = {int(v) for batch in loader for v in batch["imported_by"]}
        workers = set(loader.worker_pids)
    assert by and by <= workers and os.getpid() not in by, (by, workers, os.getpid())


def test_windows_of_an_array_cross_as_the_bytes_they_span(tmp_path):
    # sliding_window_view's windows of a 0.5 MiB signal are 32 MiB as elements: each was
    # copied into a memory file of its elements' size (a window's length times the signal),
    # and windows of a memory-mapped file were copied too, not mapped by the file
    from numpy.lib.stride_tricks import sliding_window_view

    signal = np.arange(SHARE_MIN_BYTES // 8, dtype=np.float32).reshape(-1, 2)
    path = tmp_path / "signal.npy"
    np.save(path, signal)
    mm = np.load(path, mmap_mode="r")
    for base in (signal, mm):
        windows = np.moveaxis(sliding_window_view(base, 65, axis=0)[::1], -1, 1)
        flipped = windows[::-3, ::-1]
        assert windows.nbytes > 60 * signal.nbytes
        segments: list = []
        blob = dumps({"x": windows[:, :-1], "y": windows[:, 1:], "f": flipped,
                      "b": np.broadcast_to(signal[:1], (SHARE_MIN_BYTES, 2))}, segments.append)
        try:
            assert len(blob) < 4096
            held = sum(segment.size for segment in segments)
            assert held <= (3 if base is signal else 1) * (signal.nbytes + 4096), held
            out = loads(blob)
            assert np.array_equal(out["x"], windows[:, :-1])
            assert np.array_equal(out["y"], windows[:, 1:])
            assert np.array_equal(out["f"], flipped) and np.array_equal(out["b"][-1], signal[0])
            with pytest.raises(ValueError, match="read-only"):
                out["y"][0, 0, 0] = 1
            del out
        finally:
            for segment in segments:
                segment.destroy()


def test_a_functions_code_crosses_with_its_file():
    # cloudpickle 3.1 names the file of every function it ships "<dynamic-code>": a worker's
    # traceback of a script's transform named no file and showed no line of it
    code = compile("def outer(x):\n    inner = lambda y: y + 1\n    return inner(x)\n",
                   "/home/me/train.py", "exec")
    namespace: dict = {"__name__": "__main__"}
    exec(code, namespace)
    loaded = loads(dumps(namespace["outer"], lambda segment: None))
    assert loaded(1) == 2 and loaded.__code__.co_filename == "/home/me/train.py"
    inner = next(c for c in loaded.__code__.co_consts if hasattr(c, "co_filename"))
    assert inner.co_filename == "/home/me/train.py"
    # no file ("<string>": python -c, exec): cloudpickle's name, not one a worker's traceback
    # would read lines for from its own -c text
    exec(compile("def f(x):\n    return x\n", "<string>", "exec"), namespace)
    assert loads(dumps(namespace["f"], lambda segment: None)).__code__.co_filename != "<string>"
    exec(compile("def g(x):\n    return x\n", "<python-input-3>", "exec"), namespace)  # (a REPL's)
    assert loads(dumps(namespace["g"], lambda s: None)).__code__.co_filename == "<python-input-3>"


def test_a_filtered_sources_record_is_named_by_its_pools_record_in_a_worker_too():
    # an error in a subset's record named its place in the subset alone, not the pool's
    # record the user knows (the active-learning audit)
    import jaxloader as jl

    pool = jl.ArraySource({"x": np.arange(4096 * 256, dtype=np.float32).reshape(4096, 256),
                           "y": np.arange(4096)})  # (4 MiB: shared whole, as the pool it is)
    client = jl.FilteredSource(pool, indices=np.array([4000, 7, 7, 300]))
    segments = []
    try:
        out = loads(dumps(client, segments.append))
        assert out.record_origin(0) == client.record_origin(0) == "its source's record 4000"
        assert out.indices.tolist() == [4000, 7, 7, 300] and len(out.source) == 4096
    finally:
        for segment in segments:
            segment.destroy()


def test_a_source_array_changed_in_place_after_the_workers_copied_it_is_warned_of():
    """Pseudo-labels written over labels[:] between epochs: num_workers=0 read them, the
    workers their copy as the loader started, and peek() (made here) differed from the next()
    after it, without a word (the workers audit). Looked at as each run begins and at a peek;
    arrays left alone (NaN in them too) say nothing."""
    import warnings

    import jaxloader as jl

    labels = np.zeros(4000, np.int64)  # (32 KB: in the pickle)
    images = np.full((4000, 64), np.nan, np.float32)  # (1 MiB: in shared memory)
    source = jl.ArraySource({"y": labels, "image": images})
    with jl.DataLoader(source, batch_size=100, num_workers=2, process_index=0,
                       process_count=1) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            for _ in range(2):
                assert len(list(loader)) == 40  # (nothing changed: nothing said)
            loader.peek()
        labels[:] = 7
        with pytest.warns(jl.JaxloaderWarning, match=r"the source the workers copied as the "
                          r"loader started \(its arrays and attributes, or a transform's "
                          r"arrays\) changed since "
                          r"\(an array of shape \(4000,\), int64\)"):
            loader.peek()
        images[5, 3] = 1.0  # (once a pool)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert int(next(iter(loader))["y"][0]) == 0  # (the copy, as said)


class _Relabelled:  # a PyTorch-style dataset, changed between epochs as PyTorch users do
    def __init__(self):
        self.labels, self.epoch, self.handle = np.zeros(64, np.int64), 0, None
        self.shard, self.reads, self.scale = -1, 0, float("nan")  # (set as it reads)

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __len__(self):
        return 64

    def __getitem__(self, i):
        if self.handle is None:  # (opened at the first read, as the guide advises)
            self.handle = {"opened": os.getpid()}
        self.cache = {}  # (set later: not looked at)
        self.shard, self.reads = i // 16, self.reads + 1  # (a shard cache's index, a count)
        return {"y": self.labels[i] + 1000 * self.epoch}


@pytest.mark.parametrize("change", ["rebind", "set_epoch", "concat"])
def test_a_source_attribute_set_anew_after_the_workers_copied_it_is_warned_of(change):
    # self.labels = new, or a set_epoch(): the workers read the old ones, num_workers=0 and
    # peek() the new, so the batches differed by the worker count, without a word (only an
    # array changed in place was said; the migration audit)
    source = _Relabelled()
    batches = 5 if change == "concat" else 4
    with jl.DataLoader(jl.ConcatSource([jl.ArraySource({"y": np.zeros(16, np.int64)}), source])
                       if change == "concat" else source, batch_size=16, num_workers=1,
                       process_index=0, process_count=1) as loader:
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(loader)) == batches  # (the handle, the cache opened: nothing said)
            source.epoch, source.scale = 0, float("nan")  # (set to what they held: no change)
            loader.peek()  # (this process reads records: what the source sets as it reads
            assert len(list(loader)) == batches  # is no change, the review: it warned)
        if change == "rebind":
            source.labels = np.ones(64, np.int64)
        else:
            source.set_epoch(1)
        name = "labels" if change == "rebind" else "epoch"
        loader.state_dict()  # (its first: reads records here; the change before it still said)
        with pytest.warns(jl.JaxloaderWarning, match=rf"the source the workers copied .* "
                                                     rf"changed since \(its attribute '{name}', "
                                                     rf"set anew\)"):
            assert int(next(iter(loader))["y"][0]) == 0  # (the copy, as said)


def test_a_state_dict_reading_the_source_here_is_no_change_and_a_replaced_dict_is_let_go():
    # (the review) state_dict()'s reads moved a shard cache's index: warned at the next iter();
    # a dict of arrays replaced was held by the check for the loader's life
    import gc
    import weakref

    source = _Relabelled()
    source.table = {"x": np.zeros(1 << 20)}
    gone = weakref.ref(source.table["x"])
    with jl.DataLoader(source, batch_size=16, num_workers=1, process_index=0,
                       process_count=1) as loader, warnings.catch_warnings():
        warnings.simplefilter("error")
        loader.state_dict()
        assert len(list(loader)) == 4
        source.table = {}
        gc.collect()
        assert gone() is None
        with pytest.warns(jl.JaxloaderWarning, match=r"its attribute 'table', set anew"):
            next(iter(loader))


def test_a_sources_array_the_memory_cannot_hold_a_copy_of_is_named_with_its_remedies(
        monkeypatch):
    # (the lifecycle audit) a 512 MB in-memory source under a 1000 MB cgroup: "Use smaller
    # batches, fewer workers or prefetch", none of which changes the source's copy
    from jaxloader.base.errors import SharedMemoryError
    from jaxloader.runtime import limits

    monkeypatch.setattr(limits, "reservable_bytes", lambda: 4096)
    segments: list = []
    with pytest.raises(SharedMemoryError) as raised:
        dumps({"x": np.zeros(SHARE_MIN_BYTES, np.uint8)}, segments.append)
    said = str(raised.value)
    assert said.startswith(f"the source's array 1 ({SHARE_MIN_BYTES:,} bytes) is shared with the "
                           "workers as a copy in memory, which could not be made: shared "
                           f"memory: could not reserve {SHARE_MIN_BYTES:,} bytes"), said
    assert "Read it from a memory-mapped file" in said and "smaller" not in said
    assert segments == []


def test_a_sources_array_the_address_space_cannot_map_is_named_with_its_remedies(monkeypatch):
    # (the second review) ulimit -v: "raise the limit, or use smaller batches, fewer workers
    # or prefetch", none of which but the first changes the source's copy
    import errno

    from jaxloader.base.errors import SharedMemoryError
    from jaxloader.runtime import shm
    from jaxloader.workers import payload

    def refused(cls, nbytes, prefault=False):
        raise shm.unmappable(nbytes, OSError(errno.ENOMEM, "Cannot allocate memory"))

    monkeypatch.setattr(payload.Segment, "create", classmethod(refused))
    with pytest.raises(SharedMemoryError) as raised:
        dumps({"x": np.zeros(SHARE_MIN_BYTES, np.uint8)}, [].append)
    said = str(raised.value)
    assert said.startswith("the source's array 1 (") and "could not map" in said, said
    assert "raise the limit, or read it from a memory-mapped file" in said and "smaller" not in \
        said, said


def test_a_module_loaded_from_a_file_under_another_name_crosses_by_value(tmp_path, monkeypatch):
    # a config loaded with spec_from_file_location("cfg_...", "conf/helper.py"): the workers
    # could not import it by that name, and the remedy said (its folder on sys.path) found
    # the file by its own name only (the env audit)
    import importlib.util
    import sys

    import cloudpickle

    import jaxloader as jl

    (tmp_path / "helper.py").write_text("SCALE = 3\n\n\ndef double(record):\n"
                                        "    return {'x': record['x'] * 2}\n")
    modules = []
    for name in ("cfg_renamed_x", "cfg_renamed_y"):
        spec = importlib.util.spec_from_file_location(name, tmp_path / "helper.py")
        modules.append(importlib.util.module_from_spec(spec))
        monkeypatch.setitem(sys.modules, name, modules[-1])
        spec.loader.exec_module(modules[-1])
    module, read = modules
    try:
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, num_workers=2,
                           transforms=[jl.Map(module.double)], process_index=0,
                           process_count=1) as loader:
            assert [b["x"].tolist() for b in loader] == [[0, 2, 4, 6], [8, 10, 12, 14]]
        # (a function of the script that reads the module: the module itself crosses; the
        # review)
        with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=4, num_workers=1,
                           transforms=[jl.Map(lambda r: {"x": r["x"] * read.SCALE})],
                           process_index=0, process_count=1) as loader:
            assert [b["x"].tolist() for b in loader] == [[0, 3, 6, 9]]
    finally:
        for made in modules:
            if made.__name__ in cloudpickle.list_registry_pickle_by_value():
                cloudpickle.unregister_pickle_by_value(made)
    # (one found by its name stays by reference: its workers import it)
    from jaxloader.workers.by_value import renamed_by_value

    renamed_by_value(sys.modules["jaxloader.workers.by_value"])
    assert "jaxloader.workers.by_value" not in cloudpickle.list_registry_pickle_by_value()
    # another file of that name on sys.path is not it: the workers would import that one
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "cfg_clash_z.py").write_text("X = 1\n")
    monkeypatch.syspath_prepend(str(tmp_path / "elsewhere"))
    spec = importlib.util.spec_from_file_location("cfg_clash_z", tmp_path / "helper.py")
    clash = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "cfg_clash_z", clash)
    spec.loader.exec_module(clash)
    renamed_by_value(clash)
    try:
        assert "cfg_clash_z" in cloudpickle.list_registry_pickle_by_value()
    finally:
        cloudpickle.unregister_pickle_by_value(clash)


def test_a_module_loaded_by_its_file_name_beside_another_of_that_name_crosses_by_value(
        tmp_path, monkeypatch):
    # exp/v2/augs_stem_q.py loaded as augs_stem_q while exp/v1 (on sys.path) has one too: the
    # workers imported v1's by the name and ran its code, num_workers=0 v2's, without a word
    import importlib.util
    import sys

    import cloudpickle

    import jaxloader as jl

    for version, factor in (("v1", 1), ("v2", 2)):
        (tmp_path / version).mkdir()
        (tmp_path / version / "augs_stem_q.py").write_text(
            f"def scale(record):\n    return {{'x': record['x'] * {factor}}}\n")
    monkeypatch.syspath_prepend(str(tmp_path / "v1"))
    monkeypatch.delitem(sys.modules, "augs_stem_q", raising=False)
    first = importlib.import_module("augs_stem_q")  # (v1's, by reference: found by its name;
    with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=4, num_workers=1,
                       transforms=[jl.Map(first.scale)], process_index=0,  # a name found
                       process_count=1) as loader:  # once was not checked again)
        assert next(iter(loader))["x"].tolist() == [0, 1, 2, 3]
    spec = importlib.util.spec_from_file_location("augs_stem_q", tmp_path / "v2" /
                                                  "augs_stem_q.py")
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, "augs_stem_q", module)
    spec.loader.exec_module(module)
    try:
        got = []
        for workers in (0, 1):
            with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=4,
                               num_workers=workers, transforms=[jl.Map(module.scale)],
                               process_index=0, process_count=1) as loader:
                got.append(next(iter(loader))["x"].tolist())
        assert got == [[0, 2, 4, 6]] * 2
    finally:
        if "augs_stem_q" in cloudpickle.list_registry_pickle_by_value():
            cloudpickle.unregister_pickle_by_value(module)
