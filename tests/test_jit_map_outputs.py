"""A JitMap's outputs as the function wrote them, and its errors as they happened (a JitMap
audit's findings)."""

import collections
import dataclasses
import functools
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.base.columns import beyond_32_bits

jax = pytest.importorskip("jax")
jnp = jax.numpy
ONE = {"process_index": 0, "process_count": 1}


def columns(n=8):
    return jl.ArraySource({"x": np.arange(n, dtype=np.float32),
                           "y": 100 + np.arange(n, dtype=np.int32)})


def ordered(r):
    return collections.OrderedDict([("z", r["x"]), ("a", r["y"]),
                                    ("m", collections.OrderedDict([("q", r["x"] * 2),
                                                                   ("b", r["y"] + 1)]))])


@pytest.mark.parametrize("workers", [0, 2])
def test_an_ordered_dicts_values_stay_under_their_keys(workers):
    # its leaves are in insertion order in JAX's flattening, a plain dict's sorted: the
    # values came back under each other's keys (and, with workers, cast to each other's dtype)
    expected = jax.vmap(ordered)({"x": np.arange(4, dtype=np.float32),
                                  "y": 100 + np.arange(4, dtype=np.int32)})
    with jl.DataLoader(columns(), batch_size=4, num_workers=workers,
                       transforms=[jl.JitMap(ordered)], **ONE) as loader:
        batch = next(iter(loader))
    assert type(batch) is collections.OrderedDict and list(batch) == ["z", "a", "m"]
    assert type(batch["m"]) is collections.OrderedDict and list(batch["m"]) == ["q", "b"]
    for got, want in zip(jax.tree.leaves(batch), jax.tree.leaves(expected)):
        assert got.dtype == want.dtype
        np.testing.assert_array_equal(got, np.asarray(want))


def test_a_jit_map_shared_by_two_loaders_keeps_each_ones_key_order():
    def added(r):
        return {**r, "n": jnp.float32(0)}

    shared = jl.JitMap(added)
    a = jl.DataLoader(jl.ArraySource({"z": np.zeros(8, np.float32), "a": np.zeros(8)}),
                      batch_size=4, transforms=[shared], num_epochs=None, **ONE)
    b = jl.DataLoader(jl.ArraySource({"q": np.zeros(8, np.float32), "b": np.zeros(8)}),
                      batch_size=4, transforms=[shared], num_epochs=None, **ONE)
    with a, b:
        first = list(next(ia := iter(a)))
        assert list(next(iter(b))) == ["q", "b", "n"]
        # the order the function wrote, over its record's as given (was ["a", "z", "n"]: jit
        # gave the function the record's keys sorted, where a Map gives them as they are)
        assert list(next(ia)) == first == ["z", "a", "n"]


def maybe_noisy(r, key=None):
    return {"x": r["x"] if key is None else r["x"] + jax.random.normal(key)}


def test_a_restore_under_another_random_setting_is_warned_and_the_same_one_is_not():
    def saved(**kw):
        with jl.DataLoader(columns(32), batch_size=4, transforms=[jl.JitMap(maybe_noisy, **kw)],
                           **ONE) as loader:
            next(iter(loader))
            return loader.state_dict()

    for before, after, told in [({}, {"random": True}, True), ({}, {}, False),
                                ({"random": True}, {"random": True}, False),
                                ({"random": True}, {}, True)]:
        state = saved(**before)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            restored = jl.DataLoader(columns(32), batch_size=4,
                                     transforms=[jl.JitMap(maybe_noisy, **after)], **ONE)
            restored.load_state_dict(state)
            restored.close()
        said = [w for w in caught if "transforms differ" in str(w.message)]
        assert bool(said) == told, (before, after, [str(w.message) for w in caught])
    from jaxloader.loaders.transform_names import older_transforms_of  # (a state saved before: silent)

    forced = [jl.JitMap(maybe_noisy, random=True)]
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with jl.DataLoader(columns(32), batch_size=4, transforms=forced, **ONE) as restored:
            restored.load_state_dict({**saved(random=True),
                                      "transforms": older_transforms_of(forced)[-1]})
    assert not [w for w in caught if "transforms differ" in str(w.message)]
    assert repr(jl.JitMap(maybe_noisy, random=True)) == "JitMap(maybe_noisy, random=True)"
    assert repr(jl.JitMap(maybe_noisy)) == "JitMap(maybe_noisy)"  # (what states held before)


def test_float32s_largest_value_written_as_numpy_prints_it_is_taken():
    rounds_up = 2.0 ** 128 - 2.0 ** 103  # the least float64 that float32 makes infinite
    assert beyond_32_bits(np.array([1.0, 3.4028235e38, -3.4028235e38])) is None
    assert beyond_32_bits(np.array([np.nextafter(rounds_up, 0)])) is None
    assert beyond_32_bits(np.array([rounds_up]))[:2] == (rounds_up, rounds_up)
    with np.errstate(over="ignore"):
        assert np.isinf(np.float32(rounds_up))
    assert np.isfinite(np.float32(np.nextafter(rounds_up, 0)))
    source = jl.ArraySource({"v": np.array([1.0, 3.4028235e38] * 2)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(lambda r: r)],
                       **ONE) as loader:
        assert next(iter(loader))["v"].tolist() == [1.0, float(np.finfo(np.float32).max)] * 2


def check_label(y):
    if np.any(np.asarray(y) == 9):
        raise ValueError("record 9 is bad")


def test_an_error_in_a_debug_callback_is_named_with_its_line():
    def aug(r):
        jax.debug.callback(check_label, r["y"])
        return {"x": r["x"] * 2}

    source = jl.ArraySource({"x": np.arange(16, dtype=np.float32), "y": np.arange(16)})
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(aug)], **ONE) as loader:
        with pytest.raises(jl.RecordError) as info:
            list(loader)
    message = str(info.value)  # (was "...callback: Traceback (most recent call last):")
    assert "ValueError: record 9 is bad" in message
    assert f"{__file__}:" in message and "in check_label" in message


def test_a_tf_data_style_function_of_image_and_label_is_told_the_remedy():
    def augment(image, label):
        return image.astype(jnp.float32) / 255.0, label

    source = jl.ArraySource((np.zeros((8, 4, 4, 3), np.uint8), np.arange(8)))
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(augment)],
                       **ONE) as loader:
        with pytest.raises(jl.RecordError, match=r"'tuple' object .*image, label = record"):
            next(iter(loader))


@functools.partial(jax.tree_util.register_dataclass, data_fields=["image", "label"],
                   meta_fields=[])
@dataclasses.dataclass
class Example:
    image: object
    label: object


Example.__module__ = "__main__"  # (as in a script: sent to a worker by value, unregistered)


def as_example(r):
    return Example(r["x"] * 2, r["y"])


def test_a_pytree_class_of_the_main_script_is_named_with_the_remedy_in_a_worker():
    with jl.DataLoader(columns(), batch_size=4, transforms=[jl.JitMap(as_example)],
                       **ONE) as loader:
        assert next(iter(loader)).label.tolist() == [100, 101, 102, 103]  # (in process)
    with jl.DataLoader(columns(), batch_size=4, transforms=[jl.JitMap(as_example)],
                       num_workers=1, **ONE) as loader:
        with pytest.raises(jl.WorkerError, match="define the class in a module of its own"):
            next(iter(loader))


def scaled_by(table):
    def scale(r):
        return {"x": r["x"] * table[-1]}
    return scale


def test_a_change_past_the_repr_of_an_array_a_transform_holds_is_warned_at_a_restore():
    def restored(table, state, kind=jl.JitMap):
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            with jl.DataLoader(columns(32), batch_size=4, transforms=[kind(scaled_by(table))],
                               **ONE) as loader:
                loader.load_state_dict(state)
        return [w for w in caught if "transforms differ" in str(w.message)]

    for kind in (jl.JitMap, jl.Map):
        table = np.ones(1000, np.float32)  # (its repr's first 200 characters: ones)
        with jl.DataLoader(columns(32), batch_size=4, transforms=[kind(scaled_by(table))],
                           **ONE) as loader:
            state = loader.state_dict()
        assert not restored(table.copy(), state, kind)
        changed = table.copy()
        changed[-1] = 5.0
        assert restored(changed, state, kind), kind
        # a state saved before the digests held the arrays' bytes: the code's digest alone
        from jaxloader.loaders.transform_names import older_transforms_of

        older = {**state, "transforms": older_transforms_of([kind(scaled_by(table))])[-1]}
        assert older["transforms"] != state["transforms"]
        assert not restored(table.copy(), older, kind)


def test_the_arrays_digest_leaves_mapped_files_and_looks_into_containers(tmp_path):
    from jaxloader.sources.array_digest import arrays_digest

    closing = lambda held: lambda r: held  # noqa: E731 - (a closure over held)
    mapped = np.memmap(tmp_path / "table.bin", dtype=np.uint8, mode="w+", shape=(1 << 20,))
    assert arrays_digest(closing(np.asarray(mapped)[10:])) == ""  # (a view: not read whole)
    table = np.zeros(10, np.float32)
    held = {"vocab": {str(i): i for i in range(200_000)}, "tables": [[table]]}
    before = arrays_digest(closing(held))
    table[3] = 1.0
    assert before and arrays_digest(closing(held)) != before
    big = np.zeros((2, (35 << 20) // 4), np.float32).T  # (past 64 MiB: a sample of its
    before = arrays_digest(closing(big))  # values, whatever its layout)
    big[0, 0] = 1.0
    assert arrays_digest(closing(big)) != before
    default = lambda r, t=table: t  # noqa: E731 - (an array held as a default argument)
    before = arrays_digest(default)
    table[4] = 1.0
    assert before and arrays_digest(default) != before
    stamps = np.arange(1_000).astype("M8[s]")  # (a datetime64's buffer: the digest raised)
    before = arrays_digest(closing(stamps))
    stamps[5] = np.datetime64(0, "s")
    assert before and arrays_digest(closing(stamps)) != before


def _centre(batch):  # a BatchMap writing in place, as it may into any collated batch
    batch["x"] -= batch["x"].mean()
    return batch


@pytest.mark.parametrize("workers", [0, 2])
def test_a_batch_map_after_a_jit_map_may_write_into_a_batch_of_one_chunk_too(workers):
    # full batches of two chunks were the loader's arrays, the partial last of one XLA's
    # own, read-only: the run failed at the epoch's end
    source = jl.ArraySource({"x": np.arange(19 * 256, dtype=np.float32).reshape(19, 256)})
    doubled = jl.JitMap(lambda r: {"x": r["x"] * 2}, chunk_bytes=8 << 10)  # (4 rows a chunk)
    with jl.DataLoader(source, batch_size=8, last_batch="partial", num_workers=workers,
                       transforms=[doubled, jl.BatchMap(_centre)], **ONE) as loader:
        batches = [b["x"] for b in loader]
    assert [len(b) for b in batches] == [8, 8, 3]
    for b, start in zip(batches, (0, 8, 16)):
        rows = np.arange(start * 256, (start + len(b)) * 256, dtype=np.float32) * 2
        np.testing.assert_allclose(b.ravel(), rows - rows.mean())


def _noisy(record, key=None):  # a key made optional: given one, not left at its default
    key = jax.random.key(0) if key is None else key
    return {"x": record["x"] + jax.random.uniform(key)}


def test_a_second_argument_named_key_with_a_default_is_warned_of_and_random_true_keys_it():
    # fn(record, key=None) is a function of the record alone unless random=True: its own
    # default key gave the same noise to every record of every batch, without a word
    source = jl.ArraySource({"x": np.zeros(8, np.float32)})
    with pytest.warns(jl.JaxloaderWarning, match=r"_noisy's second argument, named as a key, "
                                                 r"has a default.*pass random=True"):
        jl.JitMap(_noisy)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (said: nothing more)
        for told in (jl.JitMap(_noisy, random=True), jl.JitMap(_noisy, random=False)):
            with jl.DataLoader(source, batch_size=4, transforms=[told], **ONE) as loader:
                noise = np.concatenate([b["x"] for b in loader])
            assert len(set(noise.tolist())) == (8 if told.random else 1), noise


def _no_wraps(f):
    def wrapper(*args):
        return f(*args)
    return wrapper


_LIBRARY = """
import functools
def traced(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper
"""


def test_a_wrapper_taking_args_is_told_it_is_given_a_key_and_a_library_decorator_hides_no_line():
    source = jl.ArraySource({"x": np.arange(8, dtype=np.float32)})

    @_no_wraps
    def double(record):
        return {"x": record["x"] * 2}
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(double)], **ONE) as loader:
        with pytest.raises(jl.RecordError, match=r"fn takes \*args, so it is called fn\(record, "
                                                 r"key\).*pass random=False"):
            next(iter(loader))
    library: dict = {}
    exec(compile(_LIBRARY, "a_library.py", "exec"), library)  # (a decorator of another file)

    @library["traced"]
    def sine(record):
        return {"x": np.sin(record["x"])}  # (NumPy on a tracer: the user's line to name)
    with jl.DataLoader(source, batch_size=4, transforms=[jl.JitMap(sine, random=False)],
                       **ONE) as loader:
        with pytest.raises(jl.RecordError, match=r"test_jit_map_outputs\.py:\d+: `return \{\"x"
                                                 r"\": np\.sin"):
            next(iter(loader))


def test_records_or_outputs_with_int_and_str_dict_keys_are_named_not_a_bare_comparator_error():
    # JAX sorts a dict's keys to flatten it: an int key beside a str one gave its bare
    # "Comparator raised exception while sorting pytree dictionary keys", naming no dict
    mixed = [{1: np.float32(i), "a": np.float32(2 * i)} for i in range(8)]
    with pytest.raises(jl.RecordError, match=r"step 0 .*: JitMap\(double\) gets records whose "
                                             r"dict at <root> has keys of int and str "
                                             r"\(\[1, 'a'\]\), which JAX cannot sort to flatten "
                                             r"it; make them one type in a Map before it"):
        with jl.DataLoader(mixed, batch_size=4, transforms=[jl.JitMap(double)], **ONE) as loader:
            next(iter(loader))
    with pytest.raises(jl.RecordError, match=r"Comparator raised exception.* \(JAX sorts a "
                                             r"dict's keys to flatten it: the dicts the function "
                                             r"returns need keys of one type, str\(key\)"):
        with jl.DataLoader(columns(), batch_size=4, **ONE,
                           transforms=[jl.JitMap(lambda r: {1: r["x"], "y": r["y"]})]) as loader:
            next(iter(loader))


def double(record):
    return {k: v * 2 for k, v in record.items()}
