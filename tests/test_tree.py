from __future__ import annotations

from collections import namedtuple

import numpy as np
import pytest

from jaxloader.base.errors import CollateError
from jaxloader.base.tree import flatten, gather, leaf_paths, structure, unflatten

Point = namedtuple("Point", "x y")


def test_round_trip_of_every_container():
    tree = {"a": [1, (2, 3)], "b": Point(4, {"c": 5}), "d": np.zeros(2)}
    leaves, treedef = flatten(tree)
    assert leaves[:5] == [1, 2, 3, 4, 5]
    rebuilt = unflatten(treedef, leaves)
    assert type(rebuilt["b"]) is Point and rebuilt["a"][1] == (2, 3)
    assert leaf_paths(treedef) == ["['a'][0]", "['a'][1][0]", "['a'][1][1]", "['b'].x",
                                   "['b'].y['c']", "['d']"]


def test_gather_names_the_path_and_position_of_a_structure_mismatch():
    trees = [{"a": {"b": 1}}, {"a": {"c": 1}}]
    with pytest.raises(CollateError, match=r"\['a'\].*position 12 lacks \['b'\] and has "
                                           r"\['c'\].*against record position 11"):
        gather(trees, structure(trees[0]), names=[11, 12])


@pytest.mark.parametrize("first", [0, 1])
def test_records_of_another_container_kind_in_one_batch_are_refused_in_either_order(first):
    # a namedtuple among tuples, an OrderedDict among dicts: other structures to JAX, refused
    # where one led the batch and passed (gathered into the leader's kind) where it followed
    import collections

    P = collections.namedtuple("P", "a b")
    for kinds, said in (([(1, 2), P(1, 2)], r"has tuple of length 2.* has P of 2 fields|"
                                            r"has P of 2 fields.* has tuple of length 2"),
                        ([{"a": 1}, collections.OrderedDict(a=1)],
                         r"has the same keys, in (an OrderedDict \(not a dict|a dict \(not an "
                         r"OrderedDict)\)")):
        trees = kinds[first:] + kinds[:first]
        with pytest.raises(CollateError, match=said):
            gather(trees, structure(trees[0]), names=[0, 1])


# -- JAX's pytree semantics: the batch has the structure jax.tree gives a stacked record ------
jax = pytest.importorskip("jax")  # a runtime dependency; named here because the tests use it
flax_struct = pytest.importorskip("flax.struct")

import collections  # noqa: E402
import dataclasses  # noqa: E402

import jaxloader as jl  # noqa: E402

# The workers import this module by name, as a user's: the classes below are registered with
# JAX at its top level, which must run there too (conftest.py sends test modules by value)
WORKERS_IMPORT_THIS_MODULE = True


@flax_struct.dataclass
class FlaxRecord:
    image: np.ndarray
    label: np.ndarray
    name: str = flax_struct.field(pytree_node=False, default="digits")


@dataclasses.dataclass
class RegisteredRecord:
    x: np.ndarray
    meta: dict
    tag: str


jax.tree_util.register_dataclass(RegisteredRecord, data_fields=["x", "meta"],
                                 meta_fields=["tag"])


@dataclasses.dataclass
class PlainRecord:  # not registered with JAX: a leaf, and not an array
    x: np.ndarray


def _flax(i):
    return FlaxRecord(np.full((2, 2), i, np.float32), np.int32(i))


def _registered(i):
    return RegisteredRecord(np.arange(3) + i, {"b": np.float32(i), "a": None}, "t")


def _ordered(i):
    return collections.OrderedDict([("z", np.int64(i)), ("a", np.zeros(2) + i)])


def _defaultdict(i):
    return collections.defaultdict(list, {"b": np.int16(i), "a": [np.int8(i), None]})


def _with_none(i):
    return {"x": np.zeros(2) + i, "mask": None, "pair": (None, np.int32(i))}


KINDS = {"flax.struct.dataclass": _flax, "register_dataclass": _registered,
         "OrderedDict": _ordered, "defaultdict": _defaultdict, "None leaves": _with_none}


def _stacked(records):
    return jax.tree.map(lambda *xs: np.stack(xs), *records)


class _Records:
    def __init__(self, make, n=8):
        self.make, self.n = make, n

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        return self.make(int(i))


@pytest.mark.parametrize("kind", sorted(KINDS))
def test_registered_pytrees_batch_with_the_structure_jax_gives_them(kind):
    make = KINDS[kind]
    loader = jl.DataLoader(_Records(make), batch_size=4, process_index=0, process_count=1)
    batch = next(iter(loader))
    want = _stacked([make(i) for i in range(4)])
    assert jax.tree.structure(batch) == jax.tree.structure(want)
    for got, expected in zip(jax.tree.leaves(batch), jax.tree.leaves(want)):
        assert got.dtype == expected.dtype and np.array_equal(got, expected)


def test_registered_pytrees_cross_to_workers_and_back():
    records = _Records(lambda i: {"f": _flax(i), "r": _registered(i), "o": _ordered(i)}, n=12)
    with jl.DataLoader(records, batch_size=4, num_workers=2, process_index=0,
                       process_count=1) as loader:
        batches = list(loader)
    reference = [_stacked([records[i] for i in range(s * 4, s * 4 + 4)]) for s in range(3)]
    for got, want in zip(batches, reference):
        assert jax.tree.structure(got) == jax.tree.structure(want)
        assert type(got["f"]) is FlaxRecord and got["f"].name == "digits"
        assert jax.tree.all(jax.tree.map(np.array_equal, got, want))


def test_leaf_paths_of_registered_nodes_use_jax_key_names():
    treedef = structure({"f": _flax(0), "r": _registered(0)})
    assert leaf_paths(treedef) == ["['f'].image", "['f'].label", "['r'].x", "['r'].meta['b']"]


def test_a_none_where_another_record_has_an_array_names_the_leaf():
    records = [{"x": np.zeros(2), "y": None}, {"x": np.zeros(2), "y": np.ones(2)}]
    with pytest.raises(CollateError, match=r"\['y'\].*position 3 has None.*position 4 has a leaf"):
        gather(records, structure(records[0]), names=[3, 4])


def test_differing_static_fields_are_a_structure_mismatch():
    a, b = _registered(0), dataclasses.replace(_registered(1), tag="other")
    with pytest.raises(CollateError, match=r"\['r'\].*RegisteredRecord.*position 1"):
        gather([{"r": a}, {"r": b}], structure({"r": a}), names=[0, 1])


def test_an_unregistered_class_is_refused_naming_the_leaf_and_the_fix():
    loader = jl.DataLoader(_Records(lambda i: {"p": PlainRecord(np.zeros(2))}), batch_size=2,
                           process_index=0, process_count=1)
    with pytest.raises(CollateError) as e:
        next(iter(loader))
    for part in ["['p']", "PlainRecord", "register_dataclass", "np.asarray"]:
        assert part in str(e.value)


def test_a_defaultdict_or_ordered_dict_batch_keeps_its_kind_when_placed_or_padded():
    # a defaultdict's batch was a plain dict once a sharding= was given (and from a JitMap),
    # and a Pad made an OrderedDict's records plain dicts, where the same batch without them
    # kept its kind (the pytrees audit)
    import jax

    import jaxloader as jl

    records = [collections.defaultdict(list, {"z": np.float32(i), "a": np.arange(2) + i})
               for i in range(4)]
    mesh = jax.make_mesh((1,), ("data",))
    for kwargs in ({"sharding": jl.data_sharding(mesh)}, {"transforms": [jl.JitMap(lambda r: r)]}):
        with jl.DataLoader(records, batch_size=2, process_index=0, process_count=1,
                           **kwargs) as loader:
            batch = next(iter(loader))
        assert type(batch) is collections.defaultdict and batch.default_factory is list
        assert list(batch) == ["z", "a"]  # (a JitMap's function got its keys sorted by jit)
    first = jl.JitMap(lambda r: {"k": next(iter(r.values())).reshape(3)})  # (its first trace)
    with jl.DataLoader([{"z": np.zeros(3, np.float32), "a": np.float32(i)} for i in range(4)],
                       batch_size=2, transforms=[first], process_index=0,
                       process_count=1) as loader:
        assert next(iter(loader))["k"].shape == (2, 3)
    ordered = [collections.OrderedDict(z=np.arange(i + 1), a=np.float32(i)) for i in range(4)]
    with jl.DataLoader(ordered, batch_size=2, transforms=[jl.Pad("z")], process_index=0,
                       process_count=1) as loader:
        assert type(next(iter(loader))) is collections.OrderedDict
