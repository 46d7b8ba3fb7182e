"""The state: every field checked for type and range, and a source fingerprint."""

from __future__ import annotations

import re

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base.errors import StateDictError


def make(x, **kw):
    return jl.DataLoader(jl.ArraySource({"x": x}), batch_size=4, shuffle=True, seed=1,
                         process_index=0, process_count=1, **kw)


def test_other_data_of_the_same_length_is_refused_with_what_differs():
    state = make(np.arange(40.0).reshape(20, 2)).state_dict()
    other_values = make(np.arange(40.0).reshape(20, 2) + 1)
    with pytest.raises(StateDictError, match=r"record_hash: expected '\w+', received '\w+'"):
        other_values.load_state_dict(state)
    other_shape = make(np.arange(60.0).reshape(20, 3))
    with pytest.raises(StateDictError) as e:
        other_shape.load_state_dict(state)
    assert "record_spec: expected \"['x']: float64(3,)\", received \"['x']: float64(2,)\"" in str(
        e.value)
    make(np.arange(40.0).reshape(20, 2)).load_state_dict(state)  # the same data: accepted


def test_a_source_may_give_its_own_fingerprint_and_a_state_without_it_is_refused():
    class Versioned:
        def __init__(self, version):
            self.fingerprint = f"corpus-v{version}"

        def __len__(self):
            return 20

        def __getitem__(self, i):
            return {"i": np.int64(i)}

    def loader(version):
        return jl.DataLoader(Versioned(version), batch_size=4, process_index=0, process_count=1)

    state = loader(1).state_dict()
    assert state["source"] == "corpus-v1" and "record_hash" not in state
    with pytest.raises(StateDictError, match="source: expected 'corpus-v2', received 'corpus-v1'"):
        loader(2).load_state_dict(state)
    stripped = {k: v for k, v in state.items() if k != "source"}  # nothing says what it read
    with pytest.raises(StateDictError, match="source: expected 'corpus-v1', received None"):
        loader(1).load_state_dict(stripped)


@pytest.mark.parametrize("key", ["batch_size", "process_count", "version", "step",
                                 "num_records", "global_batch_size", "seed"])
@pytest.mark.parametrize("bad", [None, -1, "x", [], True, 1.5])
def test_every_integer_field_is_checked_and_named(key, bad):
    loader = make(np.zeros((20, 2)))
    state = loader.state_dict()
    with pytest.raises(StateDictError, match=rf"state\['{key}'\]: expected an int"):
        loader.load_state_dict({**state, key: bad})


@pytest.mark.parametrize("key,bad", [("shuffle", 1), ("shuffle", "yes"), ("last_batch", "keep"),
                                     ("last_batch", None), ("record_hash", 5)])
def test_other_fields_are_checked_and_named(key, bad):
    loader = make(np.zeros((20, 2)))
    with pytest.raises(StateDictError, match=rf"state\['{key}'\]: expected"):
        loader.load_state_dict({**loader.state_dict(), key: bad})


def test_unknown_keys_and_a_step_past_every_epoch_are_refused_by_name():
    loader = make(np.zeros((20, 2)))
    state = loader.state_dict()
    with pytest.raises(StateDictError, match=r"state: unknown keys \['epochs', 'stepp'\]; "
                                             r"expected keys \[.*'step'"):
        loader.load_state_dict({**state, "stepp": 3, "epochs": 1})
    with pytest.raises(StateDictError, match=r"state\['step'\]: 1,000,000,000,000 is past any "
                                             r"step this loader reaches: epoch 200,000,000,000 "
                                             r"of 5 steps, where epochs stop at 16,777,216"):
        loader.load_state_dict({**state, "step": 10**12})
    loader.load_state_dict({**state, "step": 5 * 2**24 - 1})  # the last epoch's last step
    assert loader.step == 5 * 2**24 - 1


def test_the_same_files_at_another_path_restore_and_a_state_of_whole_paths_still_does(tmp_path):
    # the fingerprint hashed the whole paths: a dataset copied to another disk, or staged at
    # another path on each host, was refused ("source: expected 'parquet:50:a8..'")
    import shutil

    pa, pq = pytest.importorskip("pyarrow"), pytest.importorskip("pyarrow.parquet")

    (tmp_path / "a").mkdir()
    pq.write_table(pa.table({"y": np.arange(50)}), tmp_path / "a" / "part.parquet",
                   row_group_size=10)
    shutil.copytree(tmp_path / "a", tmp_path / "b")

    def loader(folder, mixed=False):
        source = jl.ParquetSource(str(tmp_path / folder / "part.parquet"))
        if mixed:
            source = jl.mix([source, jl.ArraySource({"y": np.arange(100, 120)})], [0.5, 0.5])
        return jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                             process_count=1)

    for mixed in (False, True):
        with loader("a", mixed) as there:
            it = iter(there)
            next(it), next(it)
            state, expected = there.state_dict(), next(it)["y"].tolist()
        with loader("b", mixed) as here:
            here.load_state_dict(state)  # the same bytes elsewhere: the same data
            assert next(iter(here))["y"].tolist() == expected
            from jaxloader.sources.fingerprint import older_fingerprint

            older = older_fingerprint(here._source)  # 2026-11-28's, and before it
            assert len(older) == 2 and state["source"] not in older
            for then in older:
                here.load_state_dict({**state, "source": then})  # as saved before
                assert next(iter(here))["y"].tolist() == expected
            with pytest.raises(StateDictError, match="source: expected"):
                here.load_state_dict({**state, "source": older[0][:-4] + "0000"})


def test_a_restore_under_other_transforms_is_told():
    # a state saved under transforms=[Map(a)] restored under Map(b), or none, without a word:
    # the same records, in the same order, made into other batches than the saved run's
    import warnings

    def a(r):
        return {"x": r["x"] * 1}

    def b(r):
        return {"x": r["x"] * 100}

    source = jl.ArraySource({"x": np.arange(40)})

    def loader(*fns):
        return jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                             process_count=1, transforms=[jl.Map(f) for f in fns])

    with loader(a) as there:
        state = there.state_dict()
    for fns, said in (((b,), r"transforms\[0\]: saved Map\(.*a\) \w+, now Map\(.*b\) \w+\): "
                              r"from step 0 on, the same records"),
                      ((), r"transforms\[0\]: saved Map\(.*a\) \w+, now none"),
                      ((a, b), r"transforms\[1\]: saved none, now Map\(.*b\)")):
        with loader(*fns) as here, pytest.warns(UserWarning, match=said):
            here.load_state_dict(state)
    with loader(a) as here, warnings.catch_warnings():
        warnings.simplefilter("error")
        here.load_state_dict(state)  # the same transforms
        here.load_state_dict({k: v for k, v in state.items() if k != "transforms"})  # older
        with pytest.raises(StateDictError, match=r"state\['transforms'\]: expected a list"):
            here.load_state_dict({**state, "transforms": "Map(b)"})
    # an object's repr holds its address, another each run: the digests alone are compared;
    # a bound method's object is in its digest (a Grain transform's parameters)
    with loader(_Scale(2)) as there:
        state = there.state_dict()
    with loader(_Scale(2)) as here, warnings.catch_warnings():
        warnings.simplefilter("error")
        here.load_state_dict(state)
    with loader(_Scale(2).times) as there:
        state = there.state_dict()
    with loader(_Scale(3).times) as here, pytest.warns(UserWarning, match=r"Scale.times"):
        here.load_state_dict(state)
    with loader(b) as there:  # (a Map made a BatchMap: the same function, another transform)
        state = there.state_dict()
    with jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0, process_count=1,
                       transforms=[jl.BatchMap(b)]) as here, \
            pytest.warns(UserWarning, match=r"saved Map\(.*b\) \w+, now BatchMap"):
        here.load_state_dict(state)
    stream = jl.Stream.from_generator(lambda i: ({"x": np.int64(j)} for j in range(10)), 2)
    with jl.StreamLoader(stream, batch_size=4, transforms=[jl.Map(a)], process_index=0,
                         process_count=1) as there:
        state = there.state_dict()
    with jl.StreamLoader(stream, batch_size=4, transforms=[jl.Map(b)], process_index=0,
                         process_count=1) as here, \
            pytest.warns(UserWarning, match=r"transforms\[0\]: saved Map\(.*a\)"):
        here.load_state_dict(state)


class _Scale:
    def __init__(self, k):
        self.k = k

    def __call__(self, r):
        return {"x": r["x"] * self.k}

    def times(self, r):
        return {"x": r["x"] * self.k}


class _Run:
    """A transform's object that also holds a value of its run, which its method does not read."""

    def __init__(self, k, started):
        self.k, self.started = k, started

    def times(self, r):
        return {"x": r["x"] * self._factor()}

    def _factor(self):  # (read through another method: still the object's k)
        return self.k

    def logged(self, r):  # (passes itself on: its reads are not followed, the object whole)
        return {"x": r["x"] * _k_of(self)}


def _k_of(run):
    return run.k


def test_a_bound_methods_object_is_digested_as_its_code_reads_it():
    # an object that held a start time, a run id or a temporary folder it did not read made
    # every restore warn that the transforms differ (huggingface/datasets#7986's defect)
    import warnings

    from jaxloader.loaders.transform_names import _digest

    source = jl.ArraySource({"x": np.arange(40)})

    def loader(fn):
        return jl.DataLoader(source, batch_size=4, shuffle=True, process_index=0,
                             process_count=1, transforms=[jl.Map(fn)])

    with loader(_Run(2, 1.0).times) as there:
        state = there.state_dict()
    with loader(_Run(2, 2.0).times) as here, warnings.catch_warnings():
        warnings.simplefilter("error")
        here.load_state_dict(state)
    with loader(_Run(3, 1.0).times) as here, pytest.warns(UserWarning, match=r"Run.times"):
        here.load_state_dict(state)  # (k, read through _factor: the batches differ)
    with loader(_Run(2, 1.0).logged) as there:
        state = there.state_dict()
    with loader(_Run(2, 2.0).logged) as here, pytest.warns(UserWarning, match=r"Run.logged"):
        here.load_state_dict(state)  # (the object whole: what _k_of reads is not followed)
    # a state saved before (the object whole in the digest) restores quietly
    with loader(_Run(2, 1.0).times) as there:
        state = there.state_dict()
    older = _digest(jl.Map(_Run(2, 1.0).times), whole_owner=True)
    assert older != _digest(jl.Map(_Run(2, 1.0).times))
    state["transforms"] = [t.rsplit(" ", 1)[0] + " " + older for t in state["transforms"]]
    with loader(_Run(2, 1.0).times) as here, warnings.catch_warnings():
        warnings.simplefilter("error")
        here.load_state_dict(state)


def test_records_of_array_likes_are_hashed_by_their_values_and_older_states_restore():
    # (a PIL image, a jax.Array, an xarray DataArray was described by its type alone and
    # hashed as nothing: a state restored over other images, silently)
    import hashlib

    from PIL import Image

    def images(level):
        return [{"im": Image.fromarray(np.full((2, 3), level + i, np.uint8))} for i in range(8)]

    with jl.DataLoader(images(0), batch_size=2, shuffle=True) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert state["record_spec"] == "['im']: uint8(2, 3)"
    with jl.DataLoader(images(1), batch_size=2, shuffle=True) as other, pytest.raises(
            StateDictError, match="records 0, n // 2, n - 1 are alike in structure, not in values"):
        other.load_state_dict(state)
    spec = "['im']: Image"  # (as versions before wrote it: the type, and no bytes hashed)
    older = {**state, "record_spec": spec, "record_hash": hashlib.blake2b(
        spec.encode() * 3, digest_size=16).hexdigest()}
    with jl.DataLoader(images(0), batch_size=2, shuffle=True) as again:
        again.load_state_dict(older)
        assert again.step == 1 and again.state_dict() == state


def test_a_record_of_long_lists_makes_a_small_state_and_a_whole_spec_of_before_restores():
    # a 30 s clip as a Python list: 480,000 leaves in record_spec, a 12 MB state (4,000 here:
    # each fingerprint flattens three records, and a restore tries its older forms too)
    import hashlib
    import json

    clips = [{"audio": [float(i)] * 4_000, "id": i} for i in range(4)]
    with jl.DataLoader(clips, batch_size=2) as loader:
        next(iter(loader))
        state = loader.state_dict()
    assert len(json.dumps(state)) < 3000
    assert state["record_spec"].startswith("['audio'][0]: float; ['audio'][1]: float;")
    whole = "; ".join([f"['audio'][{i}]: float" for i in range(4_000)] + ["['id']: int"])
    digest = hashlib.blake2b(whole.encode(), digest_size=16).hexdigest()
    assert state["record_spec"].endswith(f" ... ({len(whole):,} characters, blake2b {digest})")
    with jl.DataLoader(clips, batch_size=2) as again:  # (as saved before 2026-11-30: whole)
        again.load_state_dict({**state, "record_spec": whole})
        assert next(iter(again))["id"].tolist() == [2, 3]
    from jaxloader.base.abilities import fingerprint_of, in_generation

    mapped = jl.MapSource(clips, lambda r: {"id": r["id"]})  # (a source made of them: its
    with jl.DataLoader(mapped, batch_size=2) as loader:  # fingerprint takes their spec)
        saved = loader.state_dict()
        then = in_generation(1, lambda: fingerprint_of(mapped))
        assert then != saved["source"]
        loader.load_state_dict({**saved, "source": then})  # (as saved before: it restores)
    other = [{**c, "audio": c["audio"][:-1]} for c in clips]
    with jl.DataLoader(other, batch_size=2) as shorter, pytest.raises(
            StateDictError, match=r"record_spec: expected .* characters, "
                                      r"blake2b"):
        shorter.load_state_dict(state)


def test_a_long_value_that_differs_is_shown_where_it_differs():
    # a stream of 64 shards whose state differs in its shuffle_window only: both values were
    # cut at 1,000 characters, alike, before the difference
    from jaxloader.loaders.state import differ

    shards = [f"train-{i:05d}-of-00064.jsonl" for i in range(64)]
    said = differ("stream", {"shards": shards, "shuffle_window": 8},
                  {"shards": shards, "shuffle_window": 16})
    assert "'shuffle_window': 8}" in said and "'shuffle_window': 16}" in said, said
    assert len(said) < 1000 and said.count("...") == 2
    huge = differ("source", "x" * 10**7, "y")  # (a crafted 10 MB: cut, quickly)
    assert len(huge) < 1000 and huge.startswith("source: expected 'xxx")


class _WorkerOnly:
    """Records readable only in a worker (a connection its worker_init_fn opens), unless it
    names its data itself."""

    def __init__(self, fingerprint: str | None = None) -> None:
        if fingerprint is not None:
            self.fingerprint = fingerprint

    def __len__(self) -> int:
        return 16

    def __getitem__(self, i: int):
        if jl.get_worker_info() is None:
            raise AttributeError("'NoneType' object has no attribute 'execute'")
        return {"x": np.int64(i)}


def test_a_source_the_training_process_cannot_read_is_told_of_a_fingerprint_at_state_dict():
    # state_dict() hashes records 0, n // 2 and n - 1 in the training process: it raised the
    # source's own AttributeError at the first checkpoint, after training had run fine.
    with jl.DataLoader(_WorkerOnly(), batch_size=4, num_workers=2) as loader:
        next(iter(loader))  # (training reads its records in the workers)
        with pytest.raises(StateDictError, match=r"source\[0\] raised AttributeError: .*"
                           r"`fingerprint` attribute") as raised:
            loader.state_dict()
        assert isinstance(raised.value.__cause__, AttributeError)
    with jl.DataLoader(_WorkerOnly("rows-v1"), batch_size=4, num_workers=2) as loader:
        next(iter(loader))
        assert loader.state_dict()["source"] == "rows-v1"


def test_records_that_differ_from_read_to_read_are_told_of_at_the_state_which_restores():
    # (refused at the restore until 2026-12-03: the state held a hash of drawn values; a
    # generator made anew each read is none the watch finds: the reads differ)
    class Augmented:
        def __len__(self) -> int:
            return 8

        def __getitem__(self, i: int):
            return {"x": np.random.default_rng().random(3)}

    source = Augmented()
    with pytest.warns(jl.JaxloaderWarning, match=r"read twice, gave other values.*or its data "
                                                 r"change.*RandomMap.*fingerprint"):
        state = jl.DataLoader(source, batch_size=4).state_dict()
    with pytest.warns(jl.JaxloaderWarning, match="read twice"):
        jl.DataLoader(source, batch_size=4).load_state_dict(state)
    state["record_hash"] = state["record_hash"].removeprefix("drawn ")  # (an older state's)
    with pytest.raises(StateDictError, match=r"differ from read to read.*RandomMap.*fingerprint"):
        with pytest.warns(jl.JaxloaderWarning):
            jl.DataLoader(source, batch_size=4).load_state_dict(state)


class _SeekingSource:
    """Records read as a record file is, a seek then a read of one shared position; ``during``
    runs inside the read of record 5 (a signal handler, or another thread's call)."""

    def __init__(self) -> None:
        self.position, self.inside, self.overlapped, self.during = 0, False, False, None

    def __len__(self) -> int:
        return 32

    def __getitem__(self, index: int) -> dict:
        self.overlapped |= self.inside
        self.inside, self.position = True, index
        try:
            if index == 5 and self.during is not None:
                during, self.during = self.during, None
                during()
            return {"x": np.int64(self.position)}
        finally:
            self.inside = False


def test_the_first_state_dict_waits_for_a_read_and_refuses_to_read_inside_one():
    # its reads of records 0, n // 2 and n - 1 took no lock: a state_dict() from another
    # thread read inside a batch's read, and one from a signal handler interrupting a read
    # (a preemption save) moved that read's file: a record of the wrong place, or an error
    import threading

    source = _SeekingSource()
    loader = jl.DataLoader(source, batch_size=8)
    saved: list = []
    source.during = lambda: (saved.append(threading.Thread(
        target=lambda: saved.append(loader.state_dict()))), saved[0].start(), saved[0].join(0.3))
    first = next(iter(loader))
    saved[0].join(10)
    assert first["x"].tolist() == list(range(8)) and not source.overlapped
    assert saved[1]["step"] == 0  # (taken once the read was done)
    loader = jl.DataLoader(source, batch_size=8)
    source.during = loader.state_dict  # (as a handler called in the read would)
    with pytest.raises(StateDictError, match=r"called in a thread that is reading the source .*"
                                             r"call loader.state_dict\(\) once before"):
        next(iter(loader))
    assert not source.overlapped
    loader.state_dict()  # (outside a read: taken)


def test_a_state_whose_bool_came_back_as_numpys_restores():
    # a state through a NumPy or pytree round trip holds np.bool_: "expected a bool, received
    # bool np.True_" (np.int64 steps were taken)
    source = jl.ArraySource({"x": np.arange(16)})
    with jl.DataLoader(source, batch_size=4, shuffle=True) as loader:
        batches = iter(loader)
        next(batches)
        state, want = loader.state_dict(), next(batches)["x"].tolist()
    with jl.DataLoader(source, batch_size=4, shuffle=True) as again:
        again.load_state_dict({**state, "shuffle": np.bool_(True), "step": np.int64(1)})
        assert next(iter(again))["x"].tolist() == want
        with pytest.raises(jl.StateDictError, match=r"state\['shuffle'\]: expected a bool"):
            again.load_state_dict({**state, "shuffle": "yes"})


@pytest.mark.parametrize("kind", ["data", "stream"])
def test_a_state_nested_past_any_loaders_or_of_a_million_keys_is_refused_plainly(kind, tmp_path):
    # a list nested 100,000 deep in any field raised RecursionError (its checks and its
    # message's repr recurse), not the StateDictError a caller falls back from; 10**6 extra
    # keys made a message of 11 MB (the hostile-input audit)
    if kind == "data":
        loader = jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4,
                               process_index=0, process_count=1)
    else:
        (tmp_path / "a.jsonl").write_text('{"x": 1}\n' * 8)
        loader = jl.StreamLoader(jl.Stream.jsonl(str(tmp_path / "a.jsonl")), batch_size=4,
                                 process_index=0, process_count=1)
    state = loader.state_dict()
    deep: list = []
    for _ in range(100_000):
        deep = [deep]
    field = "transforms" if kind == "data" else "stream"
    with pytest.raises(StateDictError, match=rf"state\['{field}'\]: nested deeper than 64 "
                                             rf"levels"):
        loader.load_state_dict({**state, field: deep})
    many = {**state, **{f"k{i}": 0 for i in range(10**6)}}
    with pytest.raises(StateDictError, match=r"unknown keys \[.*\] and 999,980 more") as e:
        loader.load_state_dict(many)
    assert len(str(e.value)) < 3000


def test_a_numpy_int_step_restores_as_the_int_it_holds():
    # (a pytree restore gives NumPy ints) kept as one, a LocalShuffle's next() overflowed in
    # its index shuffle (a bare OverflowError), and later states held it (no JSON)
    import json

    def make():
        return jl.DataLoader(jl.ArraySource({"x": np.arange(200)}), batch_size=8, seed=3,
                             shuffle=jl.LocalShuffle(window=3, block_size=16), num_epochs=None,
                             process_index=0, process_count=1)

    with make() as there:
        it = iter(there)
        for _ in range(7):
            next(it)
        state, want = there.state_dict(), next(it)["x"].tolist()
    with make() as here:
        here.load_state_dict({**state, "step": np.int64(state["step"])})
        assert next(iter(here))["x"].tolist() == want
        assert type(here.state_dict()["step"]) is int
        json.dumps(here.state_dict())


def _fails_at_5(record):
    if record["x"] == 5:
        raise ValueError("bad record")
    return record


def test_a_broken_or_closed_loader_refuses_a_state_as_every_later_call_does():
    # load_state_dict() moved a broken loader's step, without a word (iter() then raised),
    # and a closed one's too: a restore that seemed to revive it
    def loader(make):
        return make(jl.ArraySource({"x": np.arange(16)}), batch_size=4,
                    transforms=[jl.Map(_fails_at_5)], num_workers=1,
                    process_index=0, process_count=1)

    dl = loader(jl.DataLoader)
    state = dl.state_dict()
    with pytest.raises(jl.WorkerError):
        list(dl)
    with pytest.raises(jl.WorkerError, match="bad record"):
        dl.load_state_dict(state)
    assert dl.state_dict()["step"] == 1  # (the step it broke at: what a new loader restores)
    dl.close()
    stream = jl.StreamLoader(jl.Stream.from_generator(lambda s: ({"x": i} for i in range(9)), 1),
                             batch_size=2, process_index=0, process_count=1)
    plain = jl.DataLoader(jl.ArraySource({"x": np.arange(16)}), batch_size=4,
                          process_index=0, process_count=1)
    for closed in (plain, stream):
        state = closed.state_dict()
        closed.close()
        with pytest.raises(jl.JaxloaderError, match="is closed; create a new one"):
            closed.load_state_dict(state)


def test_the_same_files_or_parts_in_another_order_are_named_so_with_the_saved_order(tmp_path):
    # refused (rightly) as "what differs is inside it: a function, its options or its data;
    # or restore with the jaxloader that saved it", where a glob's order differed
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    paths = [str(tmp_path / f"p{i}.parquet") for i in range(3)]
    for i, path in enumerate(paths):
        pq.write_table(pa.table({"x": np.arange(10) + 100 * i}), path)
    parts = [jl.ArraySource({"x": np.arange(4) + 10 * i}) for i in range(3)]
    for made, other, said in (
            (jl.ParquetSource(paths), jl.ParquetSource([paths[1], paths[0], paths[2]]),
             r"same files in another order: the state's was " + re.escape(
                 ", ".join(map(repr, paths))) + r"; pass them in that order \(sorted\(glob"),
            (jl.ConcatSource(parts), jl.ConcatSource([parts[1], parts[0], parts[2]]),
             r"same parts in another order: the state's was sources\[1\], sources\[0\], "
             r"sources\[2\]; pass them in that order\)")):
        with jl.DataLoader(made, batch_size=2, shuffle=True, process_index=0,
                           process_count=1) as first:
            state = first.state_dict()
        with jl.DataLoader(other, batch_size=2, shuffle=True, process_index=0,
                           process_count=1) as moved, pytest.raises(StateDictError, match=said):
            moved.load_state_dict(state)


def test_a_state_edited_in_place_leaves_the_loader_and_its_own_states_alone():
    # state_dict() handed out a mixture's weight lists, its LocalShuffle description, a
    # StreamLoader's transform names and a PackedStream's keys as the loader kept them: an edit
    # of the returned dict changed every later state, and the loader refused its own (the
    # checkpoint audit)
    import copy

    parts = [jl.ArraySource({"x": np.arange(n)}) for n in (40, 20)]
    loader = jl.DataLoader(jl.mix(parts, [0.75, 0.25]), batch_size=4,
                           shuffle=jl.LocalShuffle(window=2), process_index=0, process_count=1)
    it = iter(loader)
    next(it), next(it)
    state = loader.state_dict()
    saved = copy.deepcopy(state)
    state["mixture"][0][1][0] = 0.5
    state["local_shuffle"][0] = "edited"
    assert loader.state_dict() == saved
    loader.load_state_dict(saved)  # (was refused: "the weights before step 2 differ")
    loader.close()

    def tokens(i):
        yield from ({"t": np.arange(1 + j % 4, dtype=np.int32),
                     "u": np.arange(1 + j % 4, dtype=np.int32)} for j in range(30))

    packed = jl.PackedStream(jl.Stream.from_generator(tokens, 1), ["t", "u"], 8)
    stream_loader = jl.StreamLoader(packed, batch_size=2, transforms=[jl.Map(lambda r: r)],
                                    process_index=0, process_count=1)
    state = stream_loader.state_dict()
    saved = copy.deepcopy(state)
    state["transforms"].append("edited")
    state["stream"]["keys"].reverse()
    assert stream_loader.state_dict() == saved and packed.keys == ["t", "u"]
    stream_loader.close()


PADDED = np.dtype([("a", "i1"), ("b", "f8")], align=True)


class _Records:  # a plain source of records of one kind of leaf, its values times scale
    def __init__(self, kind, scale):
        self.kind, self.scale = kind, scale

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.kind == "padded":  # (a fresh array: its padding bytes unset)
            value = np.empty(2, PADDED)
            value["a"], value["b"] = [i, i + 1], np.array([i, i + 1]) * self.scale
        elif self.kind == "long double":
            value = np.arange(2, dtype=np.longdouble) / 3 * self.scale + i
        elif self.kind == "long double field":  # (an array-shaped field: the review)
            value = np.empty(2, np.dtype([("a", np.longdouble, (2,)), ("n", "i8")]))
            value["a"], value["n"] = np.arange(2) / 3 * self.scale + i, i
        elif self.kind == "nested objects":  # (ragged lists of words: the review)
            value = np.empty(2, object)
            value[0] = np.array([f"word {i * self.scale}"] * (1 + i % 2), dtype=object)
            value[1] = value  # (one that holds itself: not for ever)
        else:
            value = np.array([f"text {i * self.scale}", None], dtype=object)
        return {"v": value}


@pytest.mark.parametrize("kind", ["padded", "long double", "objects", "long double field",
                                  "nested objects"])
def test_records_of_padded_structures_long_doubles_or_objects_are_hashed_by_their_values(kind):
    # padding bytes read as they were left made a source look as if it drew as it read (a
    # false warning, then its values unhashed), and an object array was left out: a state
    # restored over other data without a word (the dtypes audit)
    import warnings

    from jaxloader.base.abilities import RECORDS_AS_BEFORE

    def loader(scale):
        return jl.DataLoader(_Records(kind, scale), batch_size=2, process_index=0,
                             process_count=1)

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with loader(1) as first:
            state = first.state_dict()
        with loader(1) as same:
            same.load_state_dict(state)
    with loader(1000) as other, pytest.raises(StateDictError, match="record_hash: expected"):
        other.load_state_dict(state)
    if kind == "objects":  # (a state of the version before, its object arrays unhashed)
        token = RECORDS_AS_BEFORE.set(True)
        try:
            with loader(1) as before:
                saved = before.state_dict()
        finally:
            RECORDS_AS_BEFORE.reset(token)
        with loader(1) as again:
            again.load_state_dict(saved)
