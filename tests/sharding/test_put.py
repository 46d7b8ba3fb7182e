"""Sharded batches on 8 CPU devices: every device holds exactly its rows."""

from __future__ import annotations

import pytest

from sharding.devices import run_with_devices

pytestmark = pytest.mark.timeout(180)


def test_data_parallel_mesh_each_device_holds_its_rows():
    out = run_with_devices("""
    mesh = jax.make_mesh((8,), ("data",))
    loader = jl.DataLoader(source(40), batch_size=16, shuffle=True, seed=1, num_workers=2,
                           sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
    ref = reference(40, batch_size=16, shuffle=True, seed=1)
    devices = list(mesh.devices.flat)
    with loader:
        batches = list(loader)
    assert len(batches) == len(ref) == 2
    for batch, want in zip(batches, ref):
        for key in ("x", "y"):
            arr = batch[key]
            assert isinstance(arr, jax.Array) and arr.shape == want[key].shape
            assert len(arr.addressable_shards) == 8
            for shard in arr.addressable_shards:
                i = devices.index(shard.device)
                assert shard.index[0] == slice(2 * i, 2 * i + 2), shard.index
                assert np.array_equal(np.asarray(shard.data), want[key][2 * i:2 * i + 2])
    print("ok")
    """)
    assert out.strip() == "ok"


def test_2d_mesh_replicates_over_the_model_axis():
    out = run_with_devices("""
    mesh = jax.make_mesh((4, 2), ("data", "model"))
    loader = jl.DataLoader(source(24), batch_size=8, num_workers=0, last_batch="pad",
                           sharding=jl.data_sharding(mesh, "data"), device_prefetch=0,
                           process_index=0, process_count=1)
    ref = reference(24, batch_size=8, last_batch="pad")
    for batch, want in zip(loader, ref):
        for key in ("x", "y", "mask"):
            rows = {}
            for shard in batch[key].addressable_shards:
                d, m = np.argwhere(mesh.devices == shard.device)[0]
                assert shard.index[0] == slice(2 * d, 2 * d + 2)
                data = np.asarray(shard.data)
                assert np.array_equal(data, want[key][2 * d:2 * d + 2])
                rows.setdefault(d, []).append(data)
            assert sorted(rows) == [0, 1, 2, 3] and all(len(v) == 2 for v in rows.values())
    print("ok")
    """)
    assert out.strip() == "ok"


def test_pytree_of_shardings_and_object_leaves():
    out = run_with_devices("""
    mesh = jax.make_mesh((4,), ("data",))
    class Tagged:
        def __len__(self): return 8
        def __getitem__(self, i):
            return {"x": np.full(2, i, np.float32), "name": f"r{i}"}
    replicated = NamedSharding(mesh, P())
    loader = jl.DataLoader(Tagged(), batch_size=4, num_workers=1, process_index=0,
                           process_count=1,
                           sharding={"x": replicated, "name": jl.data_sharding(mesh)})
    with loader:
        batch = next(iter(loader))
    assert batch["x"].sharding == replicated and batch["x"].shape == (4, 2)
    assert isinstance(batch["name"], np.ndarray) and batch["name"].tolist() == ["r0", "r1", "r2", "r3"]
    # a placed batch's dicts keep their keys' order, as a NumPy batch's (JAX's tree functions
    # sorted them: z, a came out as a, z)
    ordered = jl.ArraySource({"z": np.arange(8.0), "a": np.arange(8), "m": {"y": np.arange(8),
                                                                         "b": np.arange(8)}})
    for ahead in (0, 2):
        with jl.DataLoader(ordered, batch_size=4, sharding=jl.data_sharding(mesh),
                           device_prefetch=ahead, process_index=0, process_count=1) as placed:
            batch = next(iter(placed))
        assert list(batch) == ["z", "a", "m"] and list(batch["m"]) == ["y", "b"], list(batch)
    print("ok")
    """, n=4)
    assert out.strip() == "ok"


def test_fixed_width_strings_and_dates_stay_numpy_and_bfloat16_goes_to_the_devices():
    # np.array(["a", "bb"]) is <U2, not an object array: it was sent to device_put, and the
    # error blamed the batch size ("must divide evenly over the devices")
    out = run_with_devices("""
    import jax.numpy as jnp
    mesh = jax.make_mesh((2,), ("data",))
    n = 8
    src = jl.ArraySource({"x": np.arange(n * 2, dtype=np.float32).reshape(n, 2),
                          "name": np.array([f"r{i}" for i in range(n)]),
                          "raw": np.array([b"b%d" % i for i in range(n)]),
                          "day": np.arange(n).astype("datetime64[D]"),
                          "half": np.arange(n).astype(jnp.bfloat16)})
    with jl.DataLoader(src, batch_size=4, num_workers=1, process_index=0, process_count=1,
                       sharding=jl.data_sharding(mesh)) as loader:
        batch = next(iter(loader))
    for key in ("name", "raw", "day"):
        assert isinstance(batch[key], np.ndarray), (key, type(batch[key]))
    assert batch["name"].tolist() == ["r0", "r1", "r2", "r3"]
    assert batch["x"].sharding == jl.data_sharding(mesh)
    assert batch["half"].sharding == jl.data_sharding(mesh) and batch["half"].dtype == jnp.bfloat16
    print("ok")
    """, n=2)
    assert out.strip() == "ok"


def test_a_leaf_of_a_dtype_jax_has_no_type_for_is_named_with_its_map():
    # another byte order, a structured dtype: the error blamed the batch size, and a
    # structured leaf's was taken for a sharding tree that did not match
    out = run_with_devices("""
    mesh = jax.make_mesh((2,), ("data",))
    for leaf, said in ((np.arange(8, dtype=">f4"), "of the other byte order"),
                       (np.zeros(8, [("a", "<f4"), ("b", "<i4")]), "is structured")):
        with jl.DataLoader(jl.ArraySource({"x": leaf}), batch_size=4, process_index=0,
                           process_count=1, sharding=jl.data_sharding(mesh)) as loader:
            try:
                next(iter(loader))
            except jl.ConfigError as e:
                assert said in str(e) and "divide evenly" not in str(e), str(e)
            else:
                raise AssertionError(f"placed a leaf of {leaf.dtype}")
    print("ok")
    """, n=2)
    assert out.strip() == "ok"


def test_64_bit_integers_that_32_bits_cannot_hold_are_refused_not_wrapped():
    # JAX without x64 placed an int64 leaf as int32: nanosecond times and ids past 2**31
    # came out wrapped, without a word
    import jax
    import numpy as np

    import jaxloader as jl
    from jaxloader.sharding.put import Putter

    put = Putter(jax.devices()[0], process_count=1)
    small = put({"id": np.arange(4, dtype=np.int64), "u": np.arange(4, dtype=np.uint64)})
    assert small["id"].tolist() == [0, 1, 2, 3] and small["u"].tolist() == [0, 1, 2, 3]
    for leaf, values in ((np.array([5, 2**40], np.int64), "5..1099511627776"),
                         (np.array([-2**31 - 1, 0], np.int64), "-2147483649..0"),
                         (np.array([2**32], np.uint64), "4294967296..4294967296")):
        with pytest.raises(jl.ConfigError, match=rf"leaf \['b'\]\['t'\] of dtype {leaf.dtype} "
                                                 rf"holds values {values}, expected .*would "
                                                 r"wrap them; make it fit"):
            put({"a": np.zeros(2, np.float32), "b": {"t": leaf}})
    # a float64 beyond float32's range came out infinite; one infinite already stays so
    fine = put({"f": np.array([1.5, -np.inf, np.nan, 3e38])})["f"]
    assert np.isinf(fine[1]) and np.isnan(fine[2]) and fine[3] == np.float32(3e38)
    with pytest.raises(jl.ConfigError, match=r"leaf \['f'\] of dtype float64 holds values "
                                             r"-1e\+39..2.0, expected .*float32 and makes them "
                                             r"infinite; make it fit \(a Map: a scale"):
        put({"f": np.array([2.0, -1e39, np.inf])})
    # a complex128 beyond complex64's came out infinite too (its parts float32s)
    assert put({"c": np.array([1 + 2j, 3e38j])})["c"].tolist() == [1 + 2j,
                                                                    np.complex64(3e38j)]
    with pytest.raises(jl.ConfigError, match=r"leaf \['c'\] of dtype complex128 holds values "
                                             r"0.0..1e\+300, .*complex64 \(its real and "
                                             r"imaginary parts float32s\) and makes them"):
        put({"c": np.array([1 + 2j, 1e300j])})
    # a loader's names the step whose batch holds it (it named the leaf alone), placed in
    # next() or ahead on the device-put thread
    x = np.arange(64, dtype=np.int64)
    x[40] = 2**40  # (record 40: step 5's)
    for ahead in (0, 2):
        with jl.DataLoader(jl.ArraySource({"x": x}), batch_size=8, sharding=jax.devices()[0],
                           device_prefetch=ahead, process_index=0, process_count=1) as loader:
            with pytest.raises(jl.ConfigError, match=r"^step 5: sharding: batch leaf \['x'\] "
                                                     r"of dtype int64 holds values 41\.\."):
                for _ in loader:
                    pass


def test_float64_whole_numbers_float32_rounds_together_are_warned_of_once(monkeypatch):
    # times in seconds as float64 (pandas' .astype(float)) became float32 in 128 s steps,
    # 4 distinct of 8 a minute apart, without a word, where int64 nanoseconds are refused
    # (the time-series audit); the same for a JitMap's input
    import warnings

    import jax
    import numpy as np

    import jaxloader as jl
    from jaxloader.base import columns
    from jaxloader.sharding.put import Putter

    monkeypatch.setattr(columns, "_WARNED", set())
    monkeypatch.setattr(columns, "_LOOKS_LEFT", [256])
    put = Putter(jax.devices()[0], process_count=1)
    times = 1.7e9 + np.arange(8) * 60.0
    with pytest.warns(jl.JaxloaderWarning, match=r"batch leaf \['t'\] is float64 of whole "
                                                 r"numbers past 2\*\*24, .*float32.*offset"):
        put({"t": times, "x": np.ones(8)})
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (once a leaf; fractions, small whole numbers: none)
        put({"t": times, "x": np.ones(8)})
        put({"u": times + 0.5, "w": np.arange(8.0)})
    source = jl.ArraySource({"t": times})
    with pytest.warns(jl.JaxloaderWarning, match=r"JitMap\(.*<lambda>\)'s input batch\['t'\] "
                                                 r"is float64 of whole numbers past 2\*\*24"):
        next(iter(jl.DataLoader(source, batch_size=4, process_index=0, process_count=1,
                                transforms=[jl.JitMap(lambda r: r)])))


def test_bad_shardings_give_clear_errors():
    out = run_with_devices("""
    import collections
    from jaxloader.sharding.put import Putter
    mesh = jax.make_mesh((4,), ("data",))
    for bad, match in [("nope", "expected a jax.sharding.Sharding"),]:
        try:
            jl.DataLoader(source(8), batch_size=4, sharding=bad)
        except jl.ConfigError as e:
            assert match in str(e), e
    try:
        jl.data_sharding(mesh, "batch")
    except jl.ConfigError as e:
        assert "'batch' not in the mesh" in str(e) and "('data',)" in str(e)
    for spec in (P(P.UNCONSTRAINED), P("data", P.UNCONSTRAINED)):  # (JAX's TypeError as made,
        try:  # or its KeyError at next())
            jl.DataLoader(source(8), batch_size=4, sharding=NamedSharding(
                jax.sharding.Mesh(np.array(jax.devices()), ("data",)), spec))  # (axes Auto)
        except jl.ConfigError as e:
            assert "leaves a dimension UNCONSTRAINED" in str(e), e
        else:
            raise AssertionError(f"{spec} must be refused as the loader is made")
    for make in (jl.DataLoader, jl.StreamLoader):  # refused as it is made, not at a batch
        try:
            made = (source(12) if make is jl.DataLoader
                    else jl.Stream.from_generator(lambda s: iter([{"x": np.zeros(2)}]), 1))
            make(made, batch_size=6, sharding=jl.data_sharding(mesh), device_prefetch=0)
        except jl.ConfigError as e:
            assert ("a global batch of 6 rows (batch_size 6 x 1 process(es)) cannot be split "
                    "over the 4 devices of mesh axes ('data',)") in str(e), e
        else:
            raise AssertionError("6 rows over 4 devices must be refused")
    put = Putter(jl.data_sharding(mesh), process_count=1)  # (no batch size: when placed)
    try:
        put({"x": np.zeros((6, 3, 2), np.float32)})
    except jl.ConfigError as e:
        assert "['x']" in str(e) and "(6, 3, 2)" in str(e) and ("its axis 0 (6 rows, the "
               "global batch) is split over mesh axis data of 4 devices, which must divide "
               "it; make batch_size x process_count a multiple of it") in str(e), e
    else:
        raise AssertionError("6 rows over 4 devices must be refused")
    halves = {"x": jl.data_sharding(mesh), "y": None}  # (JAX put 'y' whole on device 0)
    try:
        next(iter(jl.DataLoader(source(8), batch_size=4, sharding=halves)))
    except jl.ConfigError as e:
        assert ("its tree holds None at ['y'], over the batch's leaf of shape (4,): JAX places "
                "it whole on one device") in str(e) and "NamedSharding(mesh, P())" in str(e), e
    else:
        raise AssertionError("None over a leaf the devices take must be refused")
    from jaxloader.sharding import leaf_checks  # (on several processes: P() and a device are
    count, jax.process_count = jax.process_count, lambda: 2  # refused there; the multi-host
    try:  # audit)
        leaf_checks.refuse_none_over_leaf([(jax.tree_util.DictKey("y"),)], {"y": np.zeros(4)},
                                          jax.devices())
    except jl.ConfigError as e:
        assert "give it a sharding: jl.data_sharding(mesh), its rows split" in str(e) and (
            "P()" not in str(e)), e
    else:
        raise AssertionError("None over a leaf the devices take must be refused")
    finally:
        jax.process_count = count
    first = next(iter(jl.DataLoader(source(8), batch_size=4, sharding={  # (all on JAX's
        "x": jax.devices()[0], "y": None})))  # first device: None puts it there too, as before)
    assert first["y"].devices() == first["x"].devices() == {jax.devices()[0]}
    try:
        next(iter(jl.DataLoader(source(8), batch_size=4, sharding={"x": jax.devices()[1],
                                                                   "y": None})))
    except jl.ConfigError as e:
        assert "one device (cpu:0), where the other leaves go to cpu:1" in str(e), e
    else:
        raise AssertionError("None beside a leaf on another device must be refused")
    absent = [jl.Map(lambda r: {"x": r["x"], "y": None})]  # (a leaf absent: None over None)
    placed = next(iter(jl.DataLoader(source(8), batch_size=4, sharding=halves,
                                     transforms=absent)))
    assert placed["y"] is None and len(placed["x"].devices()) == 4
    grid = jax.make_mesh((2, 2), ("data", "seq"))  # a padded leaf the seq axis cannot split:
    try:  # the remedy was the batch's alone, which divided
        next(iter(jl.DataLoader([{"t": np.arange(k % 7 + 1)} for k in range(8)], batch_size=4,
                                transforms=[jl.Pad("t", length=7, length_suffix=None)],
                                sharding=NamedSharding(grid, P("data", "seq")))))
    except jl.ConfigError as e:
        assert ("['t'] (local shape (4, 7)" in str(e) and "its axis 1 (7) is split over mesh "
                "axis seq of 2 devices, which must divide it; make it a multiple of 2 (a "
                "padded leaf: Pad(keys, multiple_of=2), or a length= that 2 divides)") in str(e), e
    else:
        raise AssertionError("a length of 7 over 2 devices must be refused")
    try:  # the batch size divides; the epoch's last 2 rows do not: refused before an epoch
        jl.DataLoader(source(10), batch_size=4, last_batch="partial",
                      sharding=jl.data_sharding(mesh))
    except jl.ConfigError as e:
        assert "last batch holds 2 rows" in str(e) and "last_batch='pad'" in str(e), e
    else:
        raise AssertionError("2 rows over 4 devices must be refused")
    put = Putter(jl.data_sharding(mesh), process_count=1, batch_size=4)
    fits = jl.DataLoader(source(12), batch_size=8, last_batch="partial", device_prefetch=0,
                         sharding=jl.data_sharding(mesh))
    assert [np.asarray(b["y"]).size for b in fits] == [8, 4]  # 4 last rows: 1 a device
    try:  # the same words when such a batch is placed (a sharding other than NamedSharding)
        put({"x": np.zeros((2, 3), np.float32)})
    except jl.ConfigError as e:
        assert "last batch, of 2 rows, not 4" in str(e) and "last_batch='pad'" in str(e), e
    else:
        raise AssertionError("2 rows over 4 devices must be refused")
    padded = jl.DataLoader(source(10), batch_size=4, last_batch="pad", device_prefetch=0,
                           sharding=jl.data_sharding(mesh))
    assert [np.asarray(b["mask"]).sum() for b in padded] == [4, 4, 2]
    try:  # a dict of the source's keys: the mask it adds was refused at the first batch
        jl.DataLoader(source(10), batch_size=4, last_batch="pad", device_prefetch=0,
                      sharding={"x": jl.data_sharding(mesh), "y": jl.data_sharding(mesh)})
    except jl.ConfigError as e:
        assert "without 'mask', the pad mask's leaf each batch holds" in str(e), e
    else:
        raise AssertionError("a dict of shardings without the mask must be refused")
    try:  # a stream's pass holds it too: refused at its first batch with a tree's words
        jl.StreamLoader(jl.Stream.from_generator(lambda i: ({"x": np.float32(j)} for j in
                                                            range(5)), shards=1),
                        batch_size=4, num_epochs=1, sharding={"x": jl.data_sharding(mesh)})
    except jl.ConfigError as e:
        assert "without 'mask', the pad mask's leaf each batch holds" in str(e), e
        assert "num_epochs" in str(e), e
    else:
        raise AssertionError("a stream pass's dict of shardings without the mask: refused")
    per_leaf = {"x": NamedSharding(mesh, P(None, "data")), "y": jl.data_sharding(mesh)}
    try:  # 3 columns over 4 devices: the error names the leaf, not the subtree's root
        next(iter(jl.DataLoader(source(8), batch_size=4, sharding=per_leaf, device_prefetch=0)))
    except jl.ConfigError as e:
        assert "leaf ['x']" in str(e) and ("its axis 1 (3) is split over mesh axis data of 4 "
                                           "devices, which must divide it") in str(e), e
    else:
        raise AssertionError("3 columns over 4 devices must be refused")
    try:
        jl.DataLoader(source(8), batch_size=4, sharding=P("data"))
    except jl.ConfigError as e:
        assert "no mesh set" in str(e) and "jax.set_mesh" in str(e), e
    else:
        raise AssertionError("a PartitionSpec with no mesh set must be refused")
    grid = jax.make_mesh((2, 2), ("data", "model"))  # one spec of 2 axes over every leaf:
    try:  # a 1-dimensional leaf it fails on was said to "divide evenly" (the pad mask, a
        # row's, takes the batch axis's part: test_the_pad_mask_takes_the_batch_axis...)
        both = NamedSharding(grid, P("data", "model"))  # (given to the leaf itself: one
        next(iter(jl.DataLoader(source(10), batch_size=4, device_prefetch=0,
                                transforms=[jl.Map(lambda r: {**r, "x": r["x"][:2]})],
                                sharding={"x": both, "y": both})))  # for all: its rows' part)
    except jl.ConfigError as e:
        assert ("leaf ['y']" in str(e) and "its spec names 2 dimensions, the leaf has 1" in
                str(e) and "NamedSharding(mesh, P('data')) splits its rows alone" in str(e)), e
    else:
        raise AssertionError("a spec longer than a leaf must be refused")
    try:  # a spec whose rows' axis is None: its remedy said P(None) "splits its rows alone",
        # which places them whole (the sharding audit)
        next(iter(jl.DataLoader(source(8), batch_size=4, device_prefetch=0, sharding={
            "x": NamedSharding(grid, P()), "y": NamedSharding(grid, P(None,
                                                                                  "data"))})))
    except jl.ConfigError as e:
        assert ("leaf ['y']" in str(e) and "P('data')) splits its rows alone, or "
                "NamedSharding(mesh, P()) places it whole" in str(e) and "P(None)" not in
                str(e)), e
    else:
        raise AssertionError("a spec longer than a leaf must be refused")
    try:  # two hosts by hand in one JAX process: it failed at the first batch, "divide evenly"
        jl.DataLoader(source(8), batch_size=4, sharding=jl.data_sharding(mesh),
                      process_index=0, process_count=2)
    except jl.ConfigError as e:
        assert "with process_count=2, where JAX runs 1 process(es)" in str(e), e
    else:
        raise AssertionError("a process count not JAX's must be refused with a sharding")
    try:  # jax.devices() as the sharding: "a prefix of the batch's tree" alone, no remedy
        next(iter(jl.DataLoader(source(8), batch_size=4, sharding=jax.devices())))
    except jl.ConfigError as e:
        assert ("a list of 4 device(s) puts a list batch's element i on device i" in str(e)
                and "data_sharding(jax.make_mesh((4,), ('data',), devices=jax.devices()))"
                in str(e)), e
    else:
        raise AssertionError("a list of devices for a dict batch must be refused")
    pairs = [jl.Map(lambda r: (r["x"], r["y"]))]  # (a tuple batch: a list was said to fit it)
    for given, said in [(jax.devices()[:2], "(this batch is a tuple: tuple(your_devices))"),
                        (jax.devices()[2:3], "pass the device itself: jax.devices()[2]")]:
        try:
            next(iter(jl.DataLoader(source(8), batch_size=4, sharding=given, transforms=pairs)))
        except jl.ConfigError as e:
            assert said in str(e), e
        else:
            raise AssertionError("a list of devices for a tuple batch must be refused")
    x, y = next(iter(jl.DataLoader(source(8), batch_size=4, sharding=tuple(jax.devices()[:2]),
                                   transforms=pairs)))
    assert x.devices() == {jax.devices()[0]} and y.devices() == {jax.devices()[1]}
    Pair = collections.namedtuple("Pair", "x y")  # (Pair(your_devices) fails as copied)
    named = [jl.Map(lambda r: Pair(r["x"], r["y"]))]
    try:
        next(iter(jl.DataLoader(source(8), batch_size=4, sharding=jax.devices()[:2],
                                transforms=named)))
    except jl.ConfigError as e:
        assert "(this batch is a Pair: Pair(*your_devices))" in str(e), e
    else:
        raise AssertionError("a list of devices for a namedtuple batch must be refused")
    x, y = next(iter(jl.DataLoader(source(8), batch_size=4, sharding=Pair(*jax.devices()[:2]),
                                   transforms=named)))
    assert x.devices() == {jax.devices()[0]} and y.devices() == {jax.devices()[1]}
    remedy = jl.data_sharding(jax.make_mesh((4,), ("data",), devices=jax.devices()))
    placed = next(iter(jl.DataLoader(source(8), batch_size=4, sharding=remedy)))
    assert len(placed["x"].sharding.device_set) == 4
    print("ok")
    """, n=4)
    assert out.strip() == "ok"


def test_a_partition_spec_under_set_mesh_and_a_device_place_like_their_shardings():
    out = run_with_devices("""
    mesh = jax.make_mesh((4,), ("data",))
    with jax.set_mesh(mesh):
        by_spec = jl.DataLoader(source(8), batch_size=4, sharding={"x": P("data"), "y": P()},
                                process_index=0, process_count=1)
    with by_spec:
        batch = next(iter(by_spec))
    assert batch["x"].sharding == jl.data_sharding(mesh), batch["x"].sharding
    assert batch["y"].sharding == NamedSharding(mesh, P()), batch["y"].sharding
    assert np.array_equal(np.asarray(batch["x"]), reference(8, batch_size=4)[0]["x"])
    device = jax.devices()[2]
    import warnings  # (JAX 0.12 deprecates SingleDeviceSharding, which a device was made:
    with warnings.catch_warnings():  # under -W error the loader failed; the sharding audit)
        warnings.simplefilter("error", DeprecationWarning)
        with jl.DataLoader(source(8), batch_size=4, sharding=device, process_index=0,
                           process_count=1, transforms=[jl.JitMap(lambda r: r)]) as on_device:
            batch = next(iter(on_device))
    assert batch["x"].devices() == {device} and batch["y"].devices() == {device}
    with jax.set_mesh(mesh):  # (a typo: JAX's ValueError, no remedy; the errors audit)
        try:
            jl.DataLoader(source(8), batch_size=4, sharding=P("dta"))
        except jl.ConfigError as e:
            assert "names the axis 'dta', which the mesh set has not: its axes are ('data',)" \
                in str(e), e
        else:
            raise AssertionError("a spec naming an axis the mesh has not must be refused")
    print("ok")
    """, n=4)
    assert out.strip() == "ok"


def test_a_sharding_over_an_abstract_mesh_is_refused_or_made_the_set_meshs():
    # jax.typeof(x).sharding, an explicit mesh's array type's, is over an AbstractMesh: JAX's
    # bare ValueError "device_set is not implemented" as the loader was made (the sharding audit)
    out = run_with_devices("""
    mesh = jax.make_mesh((4,), ("data",))
    typed = jax.typeof(jax.device_put(np.zeros((8,)), jl.data_sharding(mesh))).sharding
    try:
        jl.DataLoader(source(8), batch_size=4, sharding=typed, process_index=0, process_count=1)
    except jl.ConfigError as e:
        assert "is over an AbstractMesh" in str(e) and "NamedSharding(mesh, P('data',))" \
            in str(e) and "jax.set_mesh(mesh)" in str(e), e
    else:
        raise AssertionError("a sharding over an AbstractMesh must be refused without a mesh")
    with jax.set_mesh(mesh):
        loader = jl.DataLoader(source(8), batch_size=4, sharding={"x": typed, "y": typed},
                               process_index=0, process_count=1)
    with loader:
        batch = next(iter(loader))
    assert batch["y"].sharding == jl.data_sharding(mesh), batch["y"].sharding
    assert np.array_equal(np.asarray(batch["x"]), reference(8, batch_size=4)[0]["x"])
    print("ok")
    """, n=4)
    assert out.strip() == "ok"


def test_explicit_and_auto_meshes_feed_the_same_jitted_step():
    out = run_with_devices("""
    from jax.sharding import AxisType

    def train(axis_type):
        mesh = jax.make_mesh((8,), ("data",), axis_types=(axis_type,))
        loader = jl.DataLoader(source(64), batch_size=16, shuffle=True, seed=3, num_workers=1,
                               transforms=[jl.RandomMap(noise)], num_epochs=2,
                               sharding=jl.data_sharding(mesh), process_index=0, process_count=1)
        w = jax.device_put(np.linspace(-1, 1, 6, dtype=np.float32).reshape(3, 2),
                           NamedSharding(mesh, P()))

        @jax.jit
        def step(w, batch):
            def loss(w):
                logits = jnp.einsum("bij,ij->b", batch["x"], w)
                labels = jax.nn.one_hot(batch["y"] % 2, 2)
                return -jnp.mean(jnp.sum(labels * jax.nn.log_softmax(
                    jnp.stack([logits, -logits], -1)), -1))
            value, grad = jax.value_and_grad(loss)(w)
            return w - 0.01 * grad, value

        losses, types = [], set()
        with loader, jax.set_mesh(mesh):
            for batch in loader:
                assert batch["x"].sharding == jl.data_sharding(mesh)
                types.add(str(jax.typeof(batch["x"])))
                w, value = step(w, batch)
                losses.append(float(value))
        return losses, np.asarray(w), types

    import jax.numpy as jnp
    explicit, auto = train(AxisType.Explicit), train(AxisType.Auto)
    assert explicit[2] == {"float32[16@data,3,2]"}, explicit[2]  # the sharding is in the type
    assert auto[2] == {"float32[16,3,2]"}, auto[2]
    assert len(explicit[0]) == 8 and explicit[0] == auto[0], (explicit[0], auto[0])
    assert np.array_equal(explicit[1], auto[1])
    print("ok")
    """)
    assert out.strip() == "ok"


def test_a_mixtures_full_batches_are_not_refused_as_a_partial_last_one():
    # a mixture makes no short last batch, yet 11 records in batches of 4 with
    # last_batch='partial' and 2 devices were refused for a last batch of 3 rows that never comes
    out = run_with_devices("""
    mesh = jax.make_mesh((2,), ("data",))
    parts = [jl.ArraySource({"x": np.arange(n, dtype=np.float32)}) for n in (6, 5)]
    with jl.DataLoader(jl.mix(parts, [0.5, 0.5]), batch_size=4, last_batch="partial",
                       sharding=jl.data_sharding(mesh), process_index=0,
                       process_count=1) as loader:
        print([b["x"].shape[0] for b in loader])
    """, n=2)
    assert out.strip() == "[4, 4]"


@pytest.mark.parametrize("bad", [None, ("data",), "data"])
def test_data_sharding_of_something_not_a_mesh_says_what_it_needs(bad):
    # None gave AttributeError: 'NoneType' object has no attribute 'axis_names'
    import jaxloader as jl

    with pytest.raises(jl.ConfigError, match=r"data_sharding\(mesh\): expected a "
                                             r"jax.sharding.Mesh, got .*jax.make_mesh"):
        jl.data_sharding(bad)


@pytest.mark.parametrize("axis", [[], (), 0, None, ("data", 1)])
def test_data_sharding_of_no_axis_or_not_a_name_is_refused(axis):
    # [] gave PartitionSpec(None,): every device got the whole batch; 0 or None a TypeError
    import jax

    import jaxloader as jl

    mesh = jax.make_mesh((jax.device_count(),), ("data",))
    with pytest.raises(jl.ConfigError, match=r"data_sharding\(mesh, data_axis\): expected a "
                                             r"mesh axis's name or a non-empty tuple"):
        jl.data_sharding(mesh, axis)


def test_a_leaf_whose_width_changes_over_several_processes_is_warned():
    # a BatchMap padding to its batch's longest on 2 hosts: each host built the global array's
    # shape from its own width, (8, 9) on one and (8, 11) on the other, each its own loss
    out = run_with_devices("""
    import warnings
    from jaxloader.sharding.put import Putter
    put = Putter(jl.data_sharding(jax.make_mesh((4,), ("data",))), process_count=2)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for width in (9, 9, 11, 12):
            batch = {"len": np.zeros(2, np.int32), "tok": np.zeros((2, width), np.int32)}
            if not put._said_kinds:  # (as _placed asks: said once)
                put._same_kinds(batch, list(batch.values()))
    said = [str(w.message) for w in caught]
    assert len(said) == 1 and said[0].startswith(
        "batch leaf ['tok'] went from shape (rows, 9) int32 to (rows, 11) int32 between two "
        "batches, over 2 processes"), said
    print("ok")
    """, n=4)
    assert out.strip() == "ok"


def test_the_pad_mask_takes_the_batch_axis_of_a_sharding_that_also_splits_the_sequence():
    # one sharding for a batch of sequences split over "seq" (P(None, "seq"), context
    # parallelism): the 1-D pad mask of a pass that ends, or of last_batch='pad', failed at
    # the first padded batch, and the remedy's data_sharding(mesh) raised on a mesh with no
    # 'data' axis (the long-context audit)
    out = run_with_devices("""
        mesh = jax.make_mesh((4,), ("seq",))
        docs = [np.arange(1, n + 1, dtype=np.int32) for n in (100, 3000, 5000, 1, 9000)]
        stream = jl.Stream.from_generator(lambda i: ({"t": d} for d in docs), shards=1)
        with jl.StreamLoader(jl.PackedStream(stream, "t", 4096), batch_size=2, num_epochs=1,
                             sharding=NamedSharding(mesh, P(None, "seq"))) as loader:
            last = list(loader)[-1]
        print(tuple(last["t"].sharding.spec), tuple(last["mask"].sharding.spec),
              last["mask"].tolist())
        mesh = jax.make_mesh((2, 2), ("data", "seq"))
        with jl.DataLoader(source(10), batch_size=4, last_batch="pad", process_index=0,
                           process_count=1, transforms=[jl.Map(lambda r: {"x": r["x"][0]})],
                           sharding=NamedSharding(mesh, P("data", "seq"))) as loader:
            last = list(loader)[-1]
        print(tuple(last["x"].sharding.spec), tuple(last["mask"].sharding.spec),
              last["mask"].tolist())
        import collections  # (the review: a batch of an OrderedDict was refused as a tree that
        # differs, and the mask lost the sharding's memory kind)
        with jl.DataLoader(source(10), batch_size=4, last_batch="pad", process_index=0,
                           process_count=1, transforms=[
                               jl.Map(lambda r: {"x": r["x"][0]}),
                               jl.BatchMap(lambda b: collections.OrderedDict(b))],
                           sharding=NamedSharding(mesh, P("data", "seq"),
                                                  memory_kind="pinned_host")) as loader:
            last = list(loader)[-1]
        print(type(last).__name__, last["mask"].sharding.memory_kind)
        rows = [{"t": np.arange(k % 5 + 1), "label": np.int32(k)} for k in range(8)]
        with jl.DataLoader(rows, batch_size=4, transforms=[jl.Pad("t", length=6)],
                           sharding=NamedSharding(mesh, P("data", "seq"))) as loader:
            first = next(iter(loader))  # (a Pad's lengths and a label a row: rank 1, which
        print(*(tuple(first[k].sharding.spec) for k in ("t", "t_length", "label")),  # failed
              first["t_length"].tolist())  # as the spec named 2 dimensions)
        pairs = [(np.full(6, k, np.int32), {"meta": {"id": np.int32(k)}}) for k in range(8)]
        with jl.DataLoader(pairs, batch_size=4, device_prefetch=0,  # (a tuple, a nested dict:
                           sharding=NamedSharding(mesh, P("data", "seq"))) as loader:
            x, meta = next(iter(loader))  # their 1-D leaves were refused, a dict's only
        print(tuple(x.sharding.spec), tuple(meta["meta"]["id"].sharding.spec),  # placed)
              meta["meta"]["id"].tolist())
    """, n=4)
    assert out.splitlines() == ["(None, 'seq') (None,) [True, False]",
                                "('data', 'seq') ('data',) [True, True, False, False]",
                                "OrderedDict pinned_host",
                                "('data', 'seq') ('data',) ('data',) [1, 2, 3, 4]",
                                "('data', 'seq') ('data',) [0, 1, 2, 3]"]


def test_a_jit_map_in_process_runs_inside_the_training_loops_set_mesh():
    # the loop the guides write (with loader, jax.set_mesh(mesh):) made an in-process JitMap
    # fail at step 0 ("incompatible devices": its CPU input against the mesh's), and peek()
    # too; with device_prefetch=2 it ran (the put thread has no mesh; the device audit)
    out = run_with_devices("""
    mesh = jax.make_mesh((4,), ("data",))
    double = jl.JitMap(lambda r: {"x": r["x"] * 2, "y": r["y"]})
    for kw in ({}, {"sharding": jl.data_sharding(mesh), "device_prefetch": 0}):
        loader = jl.DataLoader(source(32), batch_size=8, transforms=[double],
                               process_index=0, process_count=1, **kw)
        with loader, jax.set_mesh(mesh):
            first = np.asarray(loader.peek()["x"])
            batches = [np.asarray(b["x"]) for b in loader]
        print(np.array_equal(first, batches[0]), len(batches),
              np.array_equal(batches[1], 2 * np.arange(48, 96, dtype=np.float32).reshape(8, 3, 2)))
    """, n=4)
    assert out.split() == ["True", "4", "True"] * 2, out


def test_small_placed_leaves_kept_on_the_cpu_backend_do_not_hold_their_batchs_slot():
    # an evaluation keeping each batch's placed labels (256 bytes) for its metric held each
    # batch's whole shared-memory slot (the images too: 1 MiB a step), as the CPU backend's
    # placed array is the slot's memory (the device audit)
    out = run_with_devices("""
    import gc
    src = jl.ArraySource({"image": np.ones((64 * 150, 64, 64), np.float32),
                          "label": np.arange(64 * 150, dtype=np.int32)})
    labels = []
    with jl.DataLoader(src, batch_size=64, num_workers=2, transforms=[lambda r: r],
                       sharding=jax.devices()[0], process_index=0, process_count=1) as loader:
        for batch in loader:
            labels.append(batch["label"])
            del batch
        gc.collect()
        print(loader._engine.segment_count, int(sum(l.sum() for l in labels)))
    """, n=1)
    slots, total = map(int, out.split())
    assert total == sum(range(64 * 150)) and slots < 40, out


def test_local_only_is_true_of_this_processs_own_devices_alone(monkeypatch):
    # a device, or a spec, names no device_set: all() of none was true, so a sharding of
    # another host's device passed the process-count check it guards (the review)
    import jax
    from jax.sharding import PartitionSpec as P, SingleDeviceSharding

    from jaxloader.sharding.given import local_only

    device = jax.devices()[0]
    assert local_only(device) and local_only({"x": SingleDeviceSharding(device)})
    assert not local_only(P("data"))  # (no mesh set: it names no device)
    monkeypatch.setattr(jax, "process_index", lambda *a, **k: 1)  # (host 1's view of them)
    assert not local_only(device) and not local_only({"x": device})


def test_a_sharding_that_gives_a_process_other_rows_is_said_by_its_cause():
    # (read from its devices' processes alone: stand-ins, one device a process, 4 processes of
    # batch_size=2, G=8). A mesh of unequal shares of the processes' devices, or of a batch axis
    # split over fewer parts than processes (its other axes spanning processes), was said "the
    # batch axis is not split across the processes", which it was (the review)
    from types import SimpleNamespace

    from jaxloader.sharding.leaf_checks import rows_remedy

    def over(*processes):
        return SimpleNamespace(device_set=[SimpleNamespace(process_index=p) for p in processes])

    assert rows_remedy(over(0), 0, 4, 8, 8).startswith("its mesh holds this process's devices "
                                                       "alone")
    assert rows_remedy(over(0, 0, 1), 0, 2, 6, 4).startswith(
        "the processes hold unequal numbers of its devices (process 0: 2, process 1: 1)")
    assert rows_remedy(over(0, 1, 2, 3), 0, 4, 8, 4).startswith(
        "the batch axis is split into 2 parts where 4 processes each read their own")
    assert rows_remedy(over(0, 1, 2, 3), 0, 4, 8, 8).startswith(
        "the batch axis is not split across the processes")
