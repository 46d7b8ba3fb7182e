"""JitMap: a jax.numpy transform compiled over the batch, the same batches wherever it runs."""

import importlib
import os
import re
import warnings

import numpy as np
import pytest

import jaxloader as jl

jax = pytest.importorskip("jax")
jnp = jax.numpy

N, SIZE, CROP = 37, 12, 8  # 37 records in batches of 8: a partial last batch of 5


def records():
    rng = np.random.default_rng(0)
    images = rng.integers(0, 255, (N, SIZE, SIZE, 3), np.uint8)
    images[1] = images[0]  # two alike records: their keys, not their bytes, set the crops
    return jl.ArraySource({"image": images, "label": np.arange(N)})


def decode(r):  # a NumPy Map before the JitMap (as decoding would be)
    return {"image": r["image"], "label": r["label"], "bright": np.float32(r["image"].mean())}


def augment(r, key):
    """A random crop and flip, cast and normalised: the augmentation written in jax.numpy."""
    k_crop, k_flip = jax.random.split(key)
    y, x = jax.random.randint(k_crop, (2,), 0, SIZE - CROP + 1)
    image = jax.lax.dynamic_slice(r["image"], (y, x, 0), (CROP, CROP, 3))
    image = jnp.where(jax.random.bernoulli(k_flip), image[:, ::-1], image)
    return {"image": image.astype(jnp.float32) / 255.0 - 0.5, "label": r["label"],
            "bright": r["bright"]}


def loader(workers, **kw):
    return jl.DataLoader(records(), batch_size=8, shuffle=True, seed=5, last_batch="partial",
                         transforms=[jl.Map(decode), jl.JitMap(augment)], num_workers=workers,
                         num_epochs=2, process_index=0, process_count=1, **kw)


def same(a, b):
    return len(a) == len(b) and all(
        x.keys() == y.keys() and all(np.array_equal(x[k], y[k]) for k in x) for x, y in zip(a, b))


def test_same_batches_with_0_and_2_workers_and_across_a_restore():
    with loader(0) as in_process:
        expected = list(in_process)
        assert in_process.stats.stages["JitMap(augment)"] > 0  # its time (compiling too)
    assert [len(b["label"]) for b in expected] == [8, 8, 8, 8, 5] * 2  # partial last batches
    assert expected[0]["image"].shape == (8, CROP, CROP, 3)
    assert expected[0]["image"].dtype == np.float32
    by_label = {int(label): image for b in expected[:5] for label, image in
                zip(b["label"], b["image"])}
    assert not np.array_equal(by_label[0], by_label[1])  # same bytes, other keys: other crops
    epoch_2 = {int(label): image for b in expected[5:] for label, image in
               zip(b["label"], b["image"])}
    assert any(not np.array_equal(by_label[i], epoch_2[i]) for i in range(N))  # keyed by epoch
    with loader(2) as workers:
        it = iter(workers)
        made = [next(it) for _ in range(3)]
        state = workers.state_dict()
        made += list(it)
    assert same(made, expected)  # bit for bit, 2 workers against in process
    with loader(0) as restored:  # a state of 2 workers into another count
        restored.load_state_dict(state)
        assert same(list(restored), expected[3:])


_STATS = np.zeros(4, np.float32)  # a fold's normalisation, refilled in place each trial


def _normalised(r):
    return {"x": r["x"] - _STATS}


def test_a_jit_map_kept_across_loaders_reads_what_its_function_reads_at_each_loader():
    # compiled once on the JitMap in the training process, it kept the globals and arrays
    # its first trace read: a sweep's later folds were normalised by the first fold's stats
    # with num_workers=0, and by their own with workers (the sweeps audit)
    normalise = jl.JitMap(_normalised)
    source = jl.ArraySource({"x": np.ones((4, 4), np.float32)})
    got = {}
    for fold in (0.0, 0.5):
        _STATS[:] = fold
        for workers in (0, 1):
            with jl.DataLoader(source, batch_size=4, transforms=[normalise],
                               num_workers=workers) as loader:
                got[fold, workers] = float(next(iter(loader))["x"][0, 0])
    assert got == {(0.0, 0): 1.0, (0.0, 1): 1.0, (0.5, 0): 0.5, (0.5, 1): 0.5}
    # the loader's copy compiles under this process's settings, not those of its making: it
    # turned jax_enable_x64 off for the whole process at its first batch (the review)
    before = jax.config.read("jax_enable_x64")
    with jl.DataLoader(source, batch_size=4, transforms=[normalise]) as loader:
        try:
            jax.config.update("jax_enable_x64", not before)
            next(iter(loader))
            assert jax.config.read("jax_enable_x64") == (not before)
        finally:
            jax.config.update("jax_enable_x64", before)


def _keeps(r):
    return {"y": r["img"] * 2, "mask": r["mask"]}


def _drops(k):
    def drops(r):  # (leaves the pad mask out: its padded rows look like records)
        return {"y": r["img"] * k}
    return drops


@pytest.mark.parametrize("kind", [jl.BatchMap, jl.JitMap])
def test_a_sweeps_new_transforms_are_each_looked_at_though_a_freed_ones_id_comes_again(
        monkeypatch, kind):
    # each config of a sweep makes its own function in a transform: one that kept the mask,
    # freed, left its id to a later one that dropped it, whose check was skipped (25 of 99
    # BatchMaps, 5 of 38 JitMaps: the fifteenth review); known by a weak reference now
    monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})
    source = jl.ArraySource({"img": np.arange(40, dtype=np.float32).reshape(10, 4)})
    unwarned, keeps = [], np.random.default_rng(1).random(100) < 0.5
    for cfg, keep in enumerate(keeps.tolist()):
        fn = _keeps if keep and kind is jl.JitMap else _drops(cfg + 1) if kind is jl.JitMap \
            else (lambda c, k: lambda b: {"img": b["img"] * c, **({"mask": b["mask"]}
                                                                 if k else {})})(cfg, keep)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0,
                               process_count=1, transforms=[kind(fn)]) as loader:
                list(loader)
        if not keep and not any("without the 'mask'" in str(w.message) for w in caught):
            unwarned.append(cfg)
    assert unwarned == []



def _casts_all(r):  # (a whole-tree cast: the pad mask made floats with the rest)
    return jax.tree.map(lambda x: x.astype(jnp.float32) / 255, r)


@pytest.mark.parametrize("kind,fn,workers", [
    (jl.JitMap, _casts_all, 0),
    (jl.BatchMap, lambda b: {k: v.astype(np.float32) / 255 for k, v in b.items()}, 2),
    (jl.BatchMap, lambda b: {**b, "mask": np.ones((len(b["img"]), 16), bool)}, 0)])
def test_a_transform_that_returns_the_pad_mask_changed_is_warned_of_once(kind, fn, workers,
                                                                         monkeypatch):
    # a cast of the whole batch made the mask 0 or 1/255 (a loss divided by its sum weighted
    # records 1/255), an MAE's patch mask took its key (padding then unknown): without a word,
    # where a transform that leaves it out is warned of; once a transform, the one that
    # changed it (not one after it), and a mask refined or given an axis is a mask still
    source = jl.ArraySource({"img": np.arange(40, dtype=np.uint8).reshape(10, 4)})
    kept = (jl.BatchMap(lambda b: {k: v if k == "mask" else v.astype(np.float32) / 255
                                   for k, v in b.items()}), jl.JitMap(lambda r: r),
            jl.BatchMap(lambda b: {**b, "mask": b["mask"] & (b["img"][:, 0] != 4)}),
            jl.BatchMap(lambda b: {**b, "mask": b["mask"][:, None]}),
            jl.BatchMap(lambda b: {**b, "mask": b["mask"].astype(np.float32)}),  # (weights)
            jl.BatchMap(lambda b: {**b, "mask": b["mask"][:, None].astype(jnp.bfloat16)}))
    cast_first = jl.BatchMap(lambda b: {**b, "mask": b["mask"].astype(np.float32)})

    def fills(b):  # (in place: padding rows made records, unsaid; the third review)
        b["mask"][:] = True
        return b

    kept += (jl.BatchMap(lambda b: b),)
    for chain, blamed in [((kind(fn), jl.BatchMap(lambda b: b)), 0),
                          ((cast_first, kind(fn)), 1),  # (held to the loader's mask)
                          ((jl.BatchMap(lambda b: b), jl.BatchMap(fills)), 1),
                          ((jl.BatchMap(lambda b: {**b, "mask": np.where(b["mask"], 1.0, np.nan)
                                                   .astype(np.float32)}),
                            jl.BatchMap(lambda b: b)), 0),  # (NaN passed on: not blamed)
                          *(((k,), None) for k in kept)]:
        warned = blamed is not None
        monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})  # (a JitMap's said
        with warnings.catch_warnings(record=True) as caught:  # by its function: one per chain)
            warnings.simplefilter("always")
            with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0,
                               process_count=1, transforms=list(chain),
                               num_workers=workers if warned else 0) as loader:
                list(loader)
        said = [str(w.message) for w in caught if "leaf changed" in str(w.message)]
        assert len(said) == warned or warned and workers and len(said) <= workers, (chain, said)
        # (3 batches: said once a process, of the first transform)
        if warned:
            assert said[0].startswith(re.sub(r" at 0x[0-9a-f]+", "", repr(chain[blamed]))) \
                and re.search(
                r"returned the 'mask' leaf changed \(given: the pad mask, bool of shape \(4,\)"
                r".*returned: (float32 of shape \(4,\)|bool of shape \(4(, 16)?,?\)).*leave it "
                r"out.*mask_key='pad_mask'", said[0]), said


def _np_offset(r):
    s = np.random.randint(0, 4)  # (traced once: one offset for every record)
    return {"first": r["img"][s]}


def _key_offset(r, key):
    return {"first": r["img"][jax.random.randint(key, (), 0, 4)]}


def _imports_a_drawing_module(r):
    importlib.import_module("draws_as_imported")  # (draws as flax.linen does: not the
    return r  # function's own draw)


def test_a_draw_from_numpys_global_state_as_a_jit_map_is_traced_is_warned_of(
        tmp_path, monkeypatch):
    # np.random in a JitMap ran once, as it was traced: one crop for every record, another in
    # each worker, unsaid, where the same line in a Map is watched (the vision audit)
    (tmp_path / "draws_as_imported.py").write_text("import random\nrandom.random()\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    source = jl.ArraySource({"img": np.arange(64, dtype=np.float32).reshape(16, 4)})
    for fn, warned in ((_np_offset, True), (_key_offset, False), (lambda r: r, False),
                       (_imports_a_drawing_module, False)):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jl.DataLoader(source, batch_size=4, process_index=0, process_count=1,
                               transforms=[jl.JitMap(fn)]) as loader:
                list(loader)
        said = [w for w in caught if "as JAX traced it" in str(w.message)]
        assert bool(said) == warned, [str(w.message) for w in said]
        if warned:
            assert said[0].lineno == _np_offset.__code__.co_firstlineno
            assert "jax.random.randint(key" in str(said[0].message)

def test_each_jit_map_that_drops_the_mask_is_warned_of_once_across_loaders(monkeypatch):
    # a loader's own copy of a JitMap, freed, left its id to the next loader's copy: the
    # check was skipped for it, silently (6 of 10 candidates of a sweep; the review)
    monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})
    source = jl.ArraySource({"img": np.arange(44, dtype=np.float32).reshape(11, 4)})
    keeps, candidates = jl.JitMap(_keeps), [jl.JitMap(_drops(k)) for k in range(1, 5)]
    said = []
    for candidate in candidates + candidates:  # (the second round: said already)
        for t in (keeps, candidate):
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0,
                                   process_count=1, transforms=[t]) as loader:
                    list(loader)
            said += [t for w in caught if "without the 'mask'" in str(w.message)]
    assert said == candidates
    # one function in two BatchMaps, one keeping its mask and one dropping another's: the
    # second went unwarned (keyed by the function, the review); a JitMap subclass ran as a
    # BatchMap on the whole batch, its attributes lost on the way to the workers: refused

    def model_inputs(b):
        return {k: b[k] for k in ("img", "mask") if k in b}

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for key in ("mask", "valid"):
            list(jl.DataLoader(source, batch_size=4, last_batch="pad", mask_key=key,
                               transforms=[jl.BatchMap(model_inputs)]))
    assert ["'valid'" in str(w.message) for w in caught
            if "returned a batch without" in str(w.message)] == [True]

    class Scaled(jl.JitMap):
        pass

    with pytest.raises(jl.ConfigError, match=r"Scaled is a subclass of JitMap.*JitMap\(fn\)"):
        jl.DataLoader(source, batch_size=4, transforms=[Scaled(_keeps)])


def test_a_function_that_does_not_trace_is_refused_naming_the_line_and_the_remedy():
    def branchy(r):
        if r["image"].mean() > 100:  # Python control flow on a traced value
            return {"image": r["image"] * 2}
        return r

    with jl.DataLoader(records(), batch_size=4, transforms=[jl.JitMap(branchy)],
                       process_index=0, process_count=1) as bad:
        with pytest.raises(jl.JaxloaderError) as raised:
            next(iter(bad))
    message = str(raised.value)
    assert "JitMap(test_a_function_that_does_not_trace" in message and "does not trace" in message
    assert "test_jit_map.py:" in message and 'if r["image"].mean() > 100' in message
    assert "jnp.where" in message and "lax.cond" in message and "Map before" in message


class _Branchy:
    def __call__(self, r):
        if r["image"].mean() > 100:  # (an instance's)
            return r
        return r


def _branchy(r, limit):
    if r["image"].mean() > limit:  # (a partial's, a jax.jit's)
        return r
    return r


def test_a_wrapped_function_that_does_not_trace_names_its_line_too():
    # a class instance, a functools.partial and a jax.jit-wrapped function gave no line (they
    # have no __code__), and the instance was named by its address
    import functools

    for fn, name, line in ((_Branchy(), "JitMap(_Branchy.__call__)", '> 100:  # (an instance'),
                           (functools.partial(_branchy, limit=3), "JitMap(_branchy)", "> limit:"),
                           (jax.jit(functools.partial(_branchy, limit=3)), "JitMap(", "> limit:")):
        with jl.DataLoader(records(), batch_size=4, transforms=[jl.JitMap(fn)],
                           process_index=0, process_count=1) as bad:
            with pytest.raises(jl.JaxloaderError) as raised:
                next(iter(bad))
        message = str(raised.value)
        assert name in message and "test_jit_map.py:" in message and line in message, message


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_jit_maps_dict_keeps_the_order_the_function_wrote(num_workers):
    # jax.jit returns a dict with its keys sorted: {"z": ..., "a": ...} came out as a, z (a
    # Map's and a BatchMap's keep the function's order), and nested dicts too
    def out_of_order(r):
        return {"z": r["label"], "nested": {"y": r["label"] * 2, "b": r["image"][0, 0]},
                "a": r["image"].mean()}

    for chunk in (None, 1):  # (one chunk: XLA's output itself in process; several chunks)
        kw = {} if chunk is None else {"chunk_bytes": chunk}
        with jl.DataLoader(records(), batch_size=4, num_workers=num_workers,
                           transforms=[jl.JitMap(out_of_order, **kw)], process_index=0,
                           process_count=1) as loader:
            batch = next(iter(loader))
        assert list(batch) == ["z", "nested", "a"] and list(batch["nested"]) == ["y", "b"]
        assert batch["z"].tolist() == [0, 1, 2, 3] and batch["nested"]["y"].tolist() == [0, 2,
                                                                                        4, 6]


def test_what_a_jit_map_cannot_take_is_refused_naming_it():
    text = jl.ArraySource({"x": np.zeros((4, 2), np.float32), "name": np.array(list("abcd"))})
    with jl.DataLoader(text, batch_size=2, transforms=[jl.JitMap(lambda r: r)],
                       process_index=0, process_count=1) as bad:
        with pytest.raises(jl.JaxloaderError, match=r"batch\['name'\] of dtype <U1.*Map before"):
            next(iter(bad))
    # another byte order (a FITS file's): named with its Map; bfloat16 (kind V) is taken
    swapped = jl.ArraySource({"x": np.arange(4, dtype=">f4"), "h": np.ones(4, jnp.bfloat16)})
    with jl.DataLoader(swapped, batch_size=2, transforms=[jl.JitMap(lambda r: {"h": r["h"]})],
                       process_index=0, process_count=1) as bad:
        with pytest.raises(jl.JaxloaderError, match=r"batch\['x'\]: dtype >f4 is of the other "
                                                     r"byte order.*newbyteorder"):
            next(iter(bad))
    with jl.DataLoader(jl.ArraySource({"h": np.ones(4, jnp.bfloat16)}), batch_size=2,
                       transforms=[jl.JitMap(lambda r: {"h": r["h"] * 2})], process_index=0,
                       process_count=1) as half:
        assert next(iter(half))["h"].tolist() == [2.0, 2.0]
    with pytest.raises(jl.ConfigError, match=r"after a batch transform \(JitMap.*before BatchMap"):
        jl.DataLoader(text, batch_size=2, transforms=[jl.JitMap(lambda r: r), jl.Map(len)],
                      process_index=0, process_count=1)
    with pytest.raises(jl.ConfigError, match="JitMap.*expected a callable"):
        jl.JitMap(3)
    # 64-bit integers JAX (without x64) would wrap to 32 bits: refused, not silently changed
    ids = jl.ArraySource({"id": np.array([5, 6, 2**40 + 5, 7]), "n": np.arange(4, dtype=np.uint64)})
    with jl.DataLoader(ids, batch_size=2, transforms=[jl.JitMap(lambda r: r)],
                       process_index=0, process_count=1) as wide:
        it = iter(wide)
        assert next(it)["id"].tolist() == [5, 6]  # (values 32 bits hold: taken)
        with pytest.raises(jl.RecordError, match=r"step 1 .*batch\['id'\] of dtype int64 with "
                                                 r"values 7..1099511627781, expected "
                                                 r"-2147483648..2147483647: .*jax_enable_x64"):
            next(it)
    edges = jl.ArraySource({"i": np.array([2**31 - 1, -2**31, 2**31, -2**31 - 1]),
                            "u": np.array([2**32 - 1, 0, 2**32, 0], np.uint64)})
    for leaf in ("i", "u"):
        one = jl.MapSource(edges, lambda r, leaf=leaf: {leaf: r[leaf]})
        with jl.DataLoader(one, batch_size=2, transforms=[jl.JitMap(lambda r: r)],
                           process_index=0, process_count=1) as edge:
            it = iter(edge)
            assert next(it)[leaf].tolist() == edges[0:2][leaf].tolist()  # (the edges: taken)
            with pytest.raises(jl.RecordError, match=rf"batch\['{leaf}'\] of dtype u?int64"):
                next(it)  # (one past each edge)
    # a float64 beyond float32's range: XLA made it infinite
    far = jl.ArraySource({"f": np.array([1.0, 2.0, 1e39, 3.0])})
    with jl.DataLoader(far, batch_size=2, transforms=[jl.JitMap(lambda r: r)],
                       process_index=0, process_count=1) as wide:
        it = iter(wide)
        assert next(it)["f"].tolist() == [1.0, 2.0]
        with pytest.raises(jl.RecordError, match=r"batch\['f'\] of dtype float64 with values "
                                                 r"3.0..1e\+39, .*float32 and makes them "
                                                 r"infinite"):
            next(it)
    far = jl.ArraySource({"c": np.array([1j, 2.0, 1e300j, 3.0])})  # (complex128: its parts)
    with jl.DataLoader(far, batch_size=2, transforms=[jl.JitMap(lambda r: r)],
                       process_index=0, process_count=1) as wide:
        it = iter(wide)
        assert next(it)["c"].tolist() == [1j, 2.0]
        with pytest.raises(jl.RecordError, match=r"batch\['c'\] of dtype complex128 with "
                                                 r"values 0.0..1e\+300, .*complex64"):
            next(it)


def test_a_key_only_where_the_function_takes_one_and_a_batch_map_after_it():
    src = jl.ArraySource({"x": np.arange(12, dtype=np.float32)})
    double = jl.JitMap(lambda r: {"x": r["x"] * 2})
    plus_one = jl.BatchMap(lambda b: {"x": b["x"] + 1})
    with jl.DataLoader(src, batch_size=4, transforms=[double, plus_one],
                       process_index=0, process_count=1) as plain:
        assert [b["x"].tolist() for b in plain] == [[2 * i + 1 for i in range(j, j + 4)]
                                                      for j in (0, 4, 8)]
    assert not double.random and jl.JitMap(lambda r, key: r).random


@pytest.mark.e2e
def test_a_stream_with_a_jit_map_is_the_same_with_0_and_2_workers():
    def shard(i):
        rng = np.random.default_rng(i)
        return ({"image": rng.integers(0, 255, (SIZE, SIZE, 3), np.uint8),
                 "label": np.int64(i * 100 + j)} for j in range(20))

    def run(workers):
        stream = jl.Stream.from_generator(shard, shards=2)
        with jl.StreamLoader(stream, batch_size=4, seed=1, num_workers=workers,
                             readers_per_process=2, process_index=0, process_count=1,
                             transforms=[jl.Map(decode), jl.JitMap(augment)]) as loader:
            return [next(it) for it in [iter(loader)] for _ in range(6)]

    assert same(run(2), run(0))


def test_a_batch_run_in_chunks_of_rows_is_the_batch_run_at_once():
    # ~1.3 KB of input and output a record: chunks of 2 rows; the partial batches of 5 run as
    # 2 + 2 + 2 (the last chunk filled up with rows of the one before, dropped)
    with loader(0) as whole:
        expected = list(whole)
    assert whole._maker.batch_transforms[0]._compiled._cache_size() == 2  # shapes 8 and 5
    chunked = jl.JitMap(augment, chunk_bytes=3000)

    def in_chunks(workers):
        with jl.DataLoader(records(), batch_size=8, shuffle=True, seed=5, last_batch="partial",
                           transforms=[jl.Map(decode), chunked], num_workers=workers,
                           num_epochs=2, process_index=0, process_count=1) as it:
            return list(it), it._maker.batch_transforms[0]

    made, used = in_chunks(0)
    assert used._compiled._cache_size() == 1  # one shape: chunks of 2 rows
    assert same(made, expected)
    assert same(in_chunks(2)[0], expected)  # written into the slots a chunk at a time
    with pytest.raises(jl.ConfigError, match=r"chunk_bytes\): expected an int >= 1, got 0"):
        jl.JitMap(augment, chunk_bytes=0)
    with pytest.raises(jl.ConfigError, match=r"chunk_bytes\): expected an int, got bool True"):
        jl.JitMap(augment, chunk_bytes=True)  # (taken: chunks of a byte)
    assert jl.JitMap(augment, chunk_bytes=np.int64(1 << 20)).chunk_bytes == 1 << 20  # (a
    # config's NumPy int was refused, where getting_started.md says they pass: the config audit)


def test_each_chunk_is_written_over_the_chunk_befores_output_never_over_a_batch_held(
        monkeypatch):
    # The chunk before's output is donated to XLA, which writes the next chunk over it (memory
    # still in the caches, no fresh allocation): one address for every chunk of every batch. In
    # a worker: here as there (the training process does not donate: jit_cpu.donates)
    from jaxloader.batching import jit_map

    monkeypatch.setattr(jit_map, "donates", lambda: True)
    t = jl.JitMap(lambda r, key: {"y": r["x"] * 2.0}, chunk_bytes=64)  # 32 bytes a row: 2 rows
    addresses, given = [], []
    call = t._call

    def spy(compiled, args, where):
        out = call(compiled, args, where)
        addresses.extend(leaf.unsafe_buffer_pointer() for leaf in jax.tree.leaves(out)
                         if isinstance(leaf, jax.Array))  # (not the shapes it traces first)
        if len(args) == 3:  # (last, record, keys): a chunk's call, not the shapes traced
            given.extend(jax.tree.leaves(args[1:]))
        return out
    t._call = spy
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    for step in range(2):
        out = t({"x": x + step}, seed=0, epoch=0, positions=np.arange(6))
        assert np.array_equal(out["y"], (x + step) * 2)
    assert len(addresses) == 6 and len(set(addresses)) == 1
    # the input, its keys too, is the same jax.Arrays over the input buffers every chunk (JAX
    # given NumPy arrays wraps each anew, a call)
    buffers = t._local.inputs[(2, (((4,), np.dtype(np.float32)),))][0]
    assert len(given) == 12 and all(isinstance(a, jax.Array) for a in given)
    assert {a.unsafe_buffer_pointer() for a in given} == {b.ctypes.data for b in buffers}
    # one chunk: XLA's own arrays are the batch, and a batch the caller still holds is not
    # written over (JAX gives a donated buffer with a view alive a fresh one instead)
    whole = jl.JitMap(lambda r: {"y": r["x"] * 2.0})
    held = whole({"x": x}, seed=0, epoch=0, positions=np.arange(6))
    again = whole({"x": x + 1}, seed=0, epoch=0, positions=np.arange(6))
    assert np.array_equal(held["y"], x * 2) and np.array_equal(again["y"], (x + 1) * 2)


def test_64_bit_leaves_reach_xla_as_the_32_bits_jax_would_make_them():
    # Without x64, JAX converts a 64-bit NumPy input at each call; the JitMap hands XLA the
    # leaf made 32-bit once a batch (read in place), with the values JAX's conversion gives
    rng = np.random.default_rng(3)
    batch = {"f": rng.normal(size=(6, 3)) * 1e3, "i": rng.integers(-2**31, 2**31, (6, 3)),
             "u": rng.integers(0, 2**32, (6, 3)).astype(np.uint64),
             "c": rng.normal(size=(6, 3)) + 1j * rng.normal(size=(6, 3))}
    t = jl.JitMap(lambda r: r, chunk_bytes=128)  # 96 bytes a row: a chunk a row
    given = []
    call = t._call

    def spy(compiled, args, where):
        given.extend(np.asarray(x).dtype for x in jax.tree.leaves(args[1:]))
        return call(compiled, args, where)
    t._call = spy
    out = t(batch, seed=0, epoch=0, positions=np.arange(6))
    assert set(given) == {np.dtype(d) for d in ("float32", "int32", "uint32", "complex64")}
    for name, values in batch.items():
        expected = np.asarray(jax.numpy.asarray(values))  # JAX's own conversion
        assert out[name].dtype == expected.dtype and out[name].tobytes() == expected.tobytes()


def _doubled(record):  # a new dict: the pad mask it was given left out
    return {"y": record["img"] * 2}


def test_a_jit_map_that_leaves_out_the_pad_mask_is_warned_of(monkeypatch):
    # the padded rows of the last batch then look like records in the loss, without a word
    monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})
    source = jl.ArraySource({"img": np.arange(44, dtype=np.float32).reshape(11, 4)})
    with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0, process_count=1,
                       transforms=[jl.JitMap(_doubled)]) as loader:
        with pytest.warns(UserWarning, match=r"^JitMap\(_doubled\) returned a batch without the "
                                             r"'mask' leaf it was given.*return it") as said:
            assert [sorted(b) for b in loader] == [["y"]] * 3  # (said at the padded batch)
        assert said[0].filename == __file__  # (at the function's line)
    # a transform that uses the mask (the labels' ignore index, weights of another name) made
    # the padded rows otherwise: warned as dropping it (the sixth review)
    for used in (jl.BatchMap(lambda b: {"x": b["img"], "y": np.where(b["mask"], 1, -100)}),
                 jl.JitMap(lambda r: {"y": r["img"], "w": r["mask"].astype(jnp.float32)}),
                 jl.JitMap(lambda r: {"y": jnp.where(r["mask"], r["img"], -1.0)})):
        with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0,
                           process_count=1, transforms=[used]) as loader, \
                warnings.catch_warnings():
            warnings.simplefilter("error")
            assert len(list(loader)) == 3
    nested = [{"im": {"a": np.full(2, float(i))}} for i in range(5)]  # (made again on a copy:

    def doubled_in_place(b):  # the batch it writes into is written once)
        b["im"]["a"] *= 2
        return {"x": b["im"]["a"]}

    monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})
    with pytest.warns(UserWarning, match=r"doubled_in_place\) returned a batch"):
        got = [b["x"][:, 0].tolist() for b in jl.DataLoader(
            nested, batch_size=2, last_batch="pad", transforms=[jl.BatchMap(doubled_in_place)])]
    assert got == [[0, 2], [4, 6], [8, 8]]
    buffer = np.zeros(2, np.float32)  # (a transform writing into a buffer of its own: the

    def ignore_padding(b):  # batch made again wrote into the one handed out)
        buffer[:] = np.where(b["mask"], b["img"][:, 0], -100)
        return {"y": buffer}

    def read_only(b):  # (and hands it out read-only: it was not put back)
        view = ignore_padding(b)["y"].view()
        view.flags.writeable = False
        return {"y": view}

    class Reused:  # (a dict of its own each call: filled again by the second call)
        def __init__(self):
            self.out = {}

        def __call__(self, b):
            self.out["y"] = np.where(b["mask"], b["img"][:, 0], -100)
            return self.out

    for fn in (ignore_padding, read_only, Reused()):
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            got = [b["y"].tolist() for b in jl.DataLoader(
                source, batch_size=2, last_batch="pad", transforms=[jl.BatchMap(fn)])]
        assert got[-1] == [40.0, -100.0]

    class Attrs(dict):  # (a mapping of its own type, read by attribute in the next transform:
        __getattr__ = dict.__getitem__  # handed on as made, not rebuilt a dict: the review)

    attrs = [jl.BatchMap(lambda b: Attrs(y=b["img"][:, 0])), jl.BatchMap(lambda b: {"y": b.y})]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # (it drops the mask: said)
        got = [b["y"].tolist() for b in jl.DataLoader(
            source, batch_size=2, last_batch="pad", transforms=attrs)]
    assert got[-1] == [40.0, 40.0]
    kept = jl.JitMap(lambda r: {"y": r["img"] * 2, "mask": r["mask"]})
    with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0, process_count=1,
                       transforms=[kept]) as loader, warnings.catch_warnings():
        warnings.simplefilter("error")
        assert [b["mask"].tolist() for b in loader][-1] == [True, True, True, False]
    # a tuple that carries the mask as it is, or cast (Keras' sample weights) carries it
    # (warned "without the 'mask' leaf", the mask its third element)
    for carried in (lambda b: (b["img"], b["mask"]), lambda b: (b["img"], b["mask"] * 1.0),
                    lambda b: (b["img"], jnp.asarray(b["mask"], jnp.float32)[:, None])):
        with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0,
                           process_count=1, transforms=[jl.BatchMap(carried)]) as loader, \
                warnings.catch_warnings():
            warnings.simplefilter("error")
            assert np.ravel([b[1] for b in loader][-1]).tolist() == [1, 1, 1, 0]
    monkeypatch.setattr("jaxloader.batching.batch_finish._SAID", {})
    with jl.DataLoader(source, batch_size=4, last_batch="pad", process_index=0, process_count=1,
                       transforms=[jl.BatchMap(lambda b: (b["img"],))]) as loader:
        with pytest.warns(UserWarning, match=r"without the 'mask' leaf"):
            list(loader)


def test_a_jit_map_over_an_array_on_a_mesh_names_it_and_the_remedy():
    # in process it failed with JAX's advice to enter a mesh context, which fails in turn
    from sharding.devices import run_with_devices

    said = run_with_devices("""
        mesh = jax.make_mesh((2,), ("data",))
        w = jax.device_put(np.arange(2, dtype=np.float32), NamedSharding(mesh, P("data")))
        scaled = jl.JitMap(lambda r: {"y": r["x"][0] @ w})
        with jl.DataLoader(source(8), batch_size=4, transforms=[scaled], process_index=0,
                           process_count=1) as loader:
            try:
                next(iter(loader))
            except jl.RecordError as e:
                print(e)
    """, n=2)
    assert re.search(r"a JitMap runs on one CPU device \(.*\), and its function uses w \(on 2 "
                     r"device\(s\): \['cpu'\]\): close over a NumPy array instead", said), said


def _scale(r, factor=2.0):
    return {"x": r["x"] * factor}


def _key_out(r, key):
    return {"x": r["x"], "key": key}


def test_a_default_argument_is_no_key_and_a_key_returned_is_named():
    # fn(r, factor=2.0) got a key as its factor ("multiply does not accept dtypes float32,
    # key<fry>"); a key returned: "Cannot interpret 'key<fry>' as a data type"
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(_scale)],
                       process_index=0, process_count=1) as scaled:
        assert next(iter(scaled))["x"].tolist() == [0.0, 2.0, 4.0, 6.0]
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(_key_out)],
                       process_index=0, process_count=1) as keyed:
        with pytest.raises(jl.RecordError, match=r"JitMap\(_key_out\) returns a jax.random key "
                                                 r"at \['key'\] .*jax.random.key_data\(key\)"):
            next(iter(keyed))


def _no_return(r):
    r["x"] * 2  # noqa: B018 - (the return forgotten)


def test_a_function_returning_nothing_is_named_as_the_jitmaps():
    # was the collation's "the batch is None ... the source's __getitems__, or a batch
    # transform", which named neither the JitMap nor its function
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})
    for fn, said in [(_no_return, r"JitMap\(_no_return\) returns None, no array: .*a missing "
                                  r"`return`"),
                     (lambda r: {}, r"JitMap\(.*<lambda>\) returns \{\}, no array")]:
        with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(fn)], process_index=0,
                           process_count=1) as loader:
            with pytest.raises(jl.RecordError, match=said):
                next(iter(loader))


def _widen(r):
    return {"x": r["x"] * 1.0, "big": r["big"] + 1}


def test_the_workers_compile_with_the_training_processs_x64():
    # jax_enable_x64 set in the training script alone: float64 batches in process, float32
    # ones from the workers, without a word
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float64) / 3,
                             "big": np.arange(8, dtype=np.int64) + 2**40})
    jax.config.update("jax_enable_x64", True)
    try:
        made = []
        for workers in (0, 2):
            with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(_widen)],
                               num_workers=workers, process_index=0, process_count=1) as loader:
                made.append(list(loader))
    finally:
        jax.config.update("jax_enable_x64", False)
    assert made[0][0]["x"].dtype == np.float64 and made[0][0]["big"][0] == 2**40 + 1
    assert same(made[0], made[1])


def test_the_workers_draw_a_keys_bits_as_the_training_processs_jax_settings_say():
    # jax_threefry_partitionable set in the training script alone (JAX's upgrade notes say to,
    # to keep an older version's bits): a key's crops in process were other than the workers'
    # (the cross-environment audit), and a state of 2 workers restored in process went on
    # with other crops, without a word
    given = jax.config.jax_threefry_partitionable
    jax.config.update("jax_threefry_partitionable", not given)
    try:
        made = []
        for workers in (0, 2):
            with loader(workers) as each:
                made.append(list(each))
    finally:
        jax.config.update("jax_threefry_partitionable", given)
    assert same(made[0], made[1])
    with loader(0) as as_given:  # (the setting matters: other crops)
        assert not same(list(as_given), made[0])


def _own_key(r):  # (a key the function makes itself: the default implementation's bits)
    return {"x": jax.random.normal(jax.random.key(r["i"][0]), (3,))}


def _own_key_numpy(r):  # (a NumPy Map computing with jax.random in a worker)
    return {"x": np.asarray(jax.random.normal(jax.random.key(int(r["i"][0])), (3,)))}


def test_the_keys_a_function_makes_follow_the_training_processs_prng_impl():
    # jax_default_prng_impl='rbg' (common on TPUs): a key a JitMap or a Map made itself drew
    # threefry's bits in the workers, rbg's in process: 0 and 2 workers, and peek(), gave other
    # batches, without a word (the newest-JAX audit)
    source = jl.ArraySource({"i": np.arange(16, dtype=np.int32).reshape(16, 1)})
    given = jax.config.jax_default_prng_impl
    jax.config.update("jax_default_prng_impl", "rbg")
    try:
        made = {}
        for kind, transform in (("jit", jl.JitMap(_own_key)), ("map", jl.Map(_own_key_numpy))):
            for workers in (0, 2):
                with jl.DataLoader(source, batch_size=4, transforms=[transform],
                                   num_workers=workers, process_index=0,
                                   process_count=1) as each:
                    made[kind, workers] = list(each)
    finally:
        jax.config.update("jax_default_prng_impl", given)
    assert same(made["jit", 0], made["jit", 2]) and same(made["map", 0], made["map", 2])


def test_a_jit_map_in_process_makes_no_implicit_transfer():
    # jax_transfer_guard "disallow", set to audit a training loop: the JitMap's zeros for its
    # first output put their fill value on the device implicitly, a bare JaxRuntimeError
    source = jl.ArraySource({"i": np.arange(8, dtype=np.int32).reshape(8, 1)})
    with jax.transfer_guard("disallow"), jl.DataLoader(
            source, batch_size=4, transforms=[jl.JitMap(_own_key)], process_index=0,
            process_count=1) as loader:
        assert [b["x"].shape for b in loader] == [(4, 3), (4, 3)]


def _fused(r):
    return {"y": jnp.exp(-r["x"] ** 2) * jnp.tanh(r["x"] * 1.7 + 0.3), "l": jnp.log(r["x"])}


@pytest.mark.parametrize("flag", ["jax_disable_jit", "jax_debug_nans"])
def test_a_jit_maps_batches_are_the_workers_whatever_the_training_processs_debugging(flag):
    # jax_disable_jit (debugging a training step) ran a JitMap op by op with num_workers=0,
    # other bits than the workers' compiled one; jax_debug_nans raised in process where the
    # workers gave NaN (the transforms audit)
    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    made = {}
    with _flag(flag):
        for workers in (0, 2):
            with jl.DataLoader(jl.ArraySource({"x": x}), batch_size=4, num_workers=workers,
                               transforms=[jl.JitMap(_fused)], process_index=0,
                               process_count=1) as loader:
                made[workers] = [(np.asarray(b["y"]), np.asarray(b["l"])) for b in loader]
    assert all(np.array_equal(a, b, equal_nan=True) for one, other in zip(made[0], made[2])
               for a, b in zip(one, other))


class _flag:
    def __init__(self, name):
        self.name = name

    def __enter__(self):
        self.was = getattr(jax.config, self.name)
        jax.config.update(self.name, True)

    def __exit__(self, *exc):
        jax.config.update(self.name, self.was)


_NO_PROC = """
import os, sys
listdir = os.listdir
def no_proc(path="."):
    if str(path).startswith("/proc"):
        raise FileNotFoundError(2, "No such file or directory", path)
    return listdir(path)
os.listdir = no_proc
os.environ["JAXLOADER_XLA_THREADS"] = "1"
allowed = os.sched_getaffinity(0)
from jaxloader.batching.jit_cpu import cpu_device
print(cpu_device().platform, os.sched_getaffinity(0) == allowed)
"""


def test_a_workers_xla_starts_without_proc():
    # (the portable-paths audit) a worker's JitMap listed /proc/self/task to give XLA's
    # threads the cores back: without /proc (a locked-down container) every JitMap failed in
    # the workers, FileNotFoundError
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", _NO_PROC], capture_output=True, text=True,
                         timeout=120, env={**os.environ, "JAX_PLATFORMS": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["cpu", "True"], out.stdout


def _cumsum(r):
    return {"x": jnp.cumsum(r["x"])}


def test_a_jit_map_compiled_for_many_shapes_is_warned_of_once_naming_the_leaf(monkeypatch):
    # records of ever other lengths (no Pad's multiple_of): a compile a batch, 50-90 ms each,
    # and each shape's program kept, without a word (the JitMap audit)
    from jaxloader.batching import jit_map

    monkeypatch.setattr(jit_map, "MANY_SHAPES", 8)  # (64 in use: 8 compile sooner here)
    varied = [{"x": np.ones(1 + i // 2, np.float32)} for i in range(40)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        batches = list(jl.DataLoader(varied, batch_size=2, transforms=[jl.JitMap(_cumsum)],
                                     process_index=0, process_count=1))
    assert [b["x"].shape for b in batches[:2]] == [(2, 1), (2, 2)]
    said = [str(w.message) for w in caught if "shapes of its input" in str(w.message)]
    assert len(said) == 1 and re.search(r"JitMap\(_cumsum\): compiled for 8 shapes of its input "
                                        r"in a process \(leaf \['x'\] changes shape\).*a "
                                        r"Pad's larger multiple_of=", said[0]), said
    with warnings.catch_warnings():  # (a partial last batch, a few lengths: no word)
        warnings.simplefilter("error")
        list(jl.DataLoader(varied[:9], batch_size=2, transforms=[jl.JitMap(_cumsum)],
                           last_batch="partial", process_index=0, process_count=1))


def test_loaders_made_one_after_another_in_the_training_process_let_go_of_their_jits():
    # a jit made with keep_unused=True (the donation of the chunk before's output needed it) is
    # never let go by JAX 0.12: each loader made with num_workers=0 (an evaluation's, each
    # time) left its lowering in JAX's cache, ~1 MB each, up to 2,048 of them
    import gc

    from jax._src import pjit  # (the cache that held them: no public view of it)

    source = jl.ArraySource({"x": np.arange(64, dtype=np.float32).reshape(16, 4)})
    noisy = jl.JitMap(lambda r, key: {"x": r["x"] + jax.random.uniform(key)})

    def one_loader():
        with jl.DataLoader(source, batch_size=8, transforms=[noisy], process_index=0,
                           process_count=1) as loader:
            return next(iter(loader))["x"].sum()

    one_loader()
    gc.collect()
    before = pjit._pjit_lower.cache_info().currsize
    for _ in range(8):
        one_loader()
    gc.collect()
    assert pjit._pjit_lower.cache_info().currsize - before <= 1


def test_the_workers_xla_threads_exported_in_the_training_process_leave_it_be(monkeypatch):
    # JAXLOADER_XLA_THREADS (the cores of a worker's XLA) exported by the user made the
    # training process a worker too: its first JitMap (or peek()) pinned it to that many cores
    # while its CPU backend started (XLA's threads sized so) and kept its freed memory
    from jaxloader.batching import jit_cpu

    done = []
    monkeypatch.setenv(jit_cpu.THREADS_ENV, "1")
    monkeypatch.setattr(jit_cpu, "_CPU", [])
    monkeypatch.setattr(jit_cpu, "_keep_freed_memory", lambda: done.append("heap kept"))
    monkeypatch.setattr(os, "sched_setaffinity", lambda *a: done.append(a))
    jit_cpu.cpu_device()
    assert done == [] and not jit_cpu.donates()
    # a worker is one (told as it starts, not by its environment)
    in_worker = jl.Map(lambda r: {**r, "w": np.int64(
        importlib.import_module("jaxloader.batching.jit_cpu").IN_WORKER)})
    for workers in (0, 1):
        with jl.DataLoader(jl.ArraySource({"x": np.arange(4)}), batch_size=2,
                           transforms=[in_worker], num_workers=workers, process_index=0,
                           process_count=1) as loader:
            assert next(iter(loader))["w"].tolist() == [workers] * 2


def test_x64_turned_on_between_two_batches_gives_the_same_dtypes_in_one_chunk_or_several():
    # the output's structure was kept by the input's shapes alone: a batch of several chunks
    # after a peek() outside `with jax.enable_x64(True)` was laid out 32-bit and its float64
    # results cut to float32, where one chunk's were 64-bit (the JitMap audit)
    import jax
    import jax.numpy as jnp

    source = jl.ArraySource({"x": np.linspace(0, 1, 16, dtype=np.float32)})

    def f(r):
        return {"i": jnp.arange(2) + 2**20, "x": r["x"] * jnp.array(1.0, jnp.float64) + 1e-9}

    got = []
    for chunk_bytes in (1 << 22, 32):  # one chunk a batch, and several
        with jl.DataLoader(source, batch_size=8, process_index=0, process_count=1,
                           transforms=[jl.JitMap(f, chunk_bytes=chunk_bytes)]) as loader:
            loader.peek()
            with jax.enable_x64(True):
                batch = next(iter(loader))
        got.append((batch["i"].dtype, batch["x"].dtype))
    assert got == [(np.int64, np.float64)] * 2, got
