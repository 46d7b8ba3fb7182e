"""A state saved under one Python version restores under another: a function's digest is of
its code's names and constants as sets, the same from Python 3.11 on. It was of them in the
order each Python lists them, and Python 3.12 compiles a comprehension into its function's own
code (PEP 709), where 3.11 made a function of it: a ``MapSource``, ``Stream.map`` or
``PackedStream(tokenize=)`` state saved under 3.11 was refused under 3.13, a ``Map``'s warned,
and a ``FilteredSource``'s kept file was found again each time the two alternated.

The states' digests below were saved under Python 3.11 by this version, and by the versions
before it (3f18cdf) under 3.11 and 3.13, whose states restore as they did (the suite runs under
3.11 and 3.13: each must restore them)."""

from __future__ import annotations

import collections
import os
import sys
import types
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.code_digest import code_digest

OFFSET = 3


def with_sums(r, k=OFFSET):
    # (a list, a set and a dict comprehension, and a generator expression)
    parts = [int(x) * 2 for x in range(int(r["x"]) % 5)]
    odd = {p for p in parts if p % 4}
    return {"x": r["x"], "sum": np.int64(sum(parts) + len(odd) + k),
            "names": len({str(p): p for p in parts}), "any": any(p > 4 for p in parts)}


def kept(r):
    return all(int(r["x"]) % d for d in [3, 7]) and len([c for c in str(r["x"])]) < 3


def shaped(r, scale=0.5):
    # (what else 3.11 and 3.13 list otherwise: a nested lambda's and def's defaults, a match's
    # mapping pattern, a class body, a dead branch, keyword names, nested f-string specs)
    class Box:
        size = 4

    def grow(x, k=(224, 224), mode="rgb"):
        return x * k[0] if mode == "rgb" else x

    match r:
        case {"label": label, "image": image}:
            out = sorted([label, image], key=lambda t, w=scale: t * w)
        case _:
            out = []
    if 0:
        out = None
    return dict(out=out, box=Box.size, grown=grow(1), text=f"{r!r:{'>' if r else '<'}{10}}")


SAVED = {  # (what the states below hold of the functions' digests)
    "under 3.11": {"source": "map:60:bcd1ce32cc62c3555042814250bffe5c",
                   "transforms": ["Map(with_sums) 311054a7626a6151"],
                   "map": "5b0ff6c0d180f449", "generators": "57a2702942496f89"},
    "by 3f18cdf, under 3.11": {"source": "map:60:7b5ff60032aad27f6d9d0da6f42bde1f",
                               "transforms": ["Map(with_sums) 11a14348250e6034"],
                               "map": "0b9301c709d33aa7", "generators": "7fab0e0fe5b68640"},
    "by 3f18cdf, under 3.13": {"source": "map:60:6758c0121eac4a5518b42e7f510371c1",
                               "transforms": ["Map(with_sums) 4c3e684a75409357"],
                               "map": "758fcab940f3f169", "generators": "1ef073f65b0003f9"}}
DIGESTS_UNDER_311 = {"with_sums": "5b0ff6c0d180f4490b2d20fbeb115999",
                     "kept (deep)": "ea61305e5ba39c2695ffda4f0a4a553b",
                     "shaped": "412e12a37f29b1342c31f5f18c395baa"}


def read(shard):
    yield from ({"x": np.int64(i), "sq": np.int64(sum(j for j in range(i)))}
                for i in [k * 2 + shard for k in range(20)])


def _stream_loader() -> jl.StreamLoader:
    stream = jl.Stream.from_generator(read, shards=2).map(with_sums)
    return jl.StreamLoader(stream, batch_size=4, process_index=0, process_count=1)


def _loader() -> jl.DataLoader:
    source = jl.MapSource(jl.ArraySource({"x": np.arange(60)}), with_sums)
    return jl.DataLoader(source, batch_size=4, shuffle=True, seed=5, transforms=[jl.Map(
        with_sums)])


def _as_saved(state: dict, saved: dict) -> dict:
    if "source" in state:
        return {**state, "source": saved["source"], "transforms": saved["transforms"]}
    shards = [f"read[{i}] | map {saved['map']}" for i in range(2)]
    return {**state, "stream": {**state["stream"], "shards": shards},
            "generators": [saved["generators"]] * 2}


def test_the_digests_are_those_python_3_11_took():
    assert code_digest(with_sums) == DIGESTS_UNDER_311["with_sums"]
    assert code_digest(kept, deep=True) == DIGESTS_UNDER_311["kept (deep)"]
    assert code_digest(shaped) == DIGESTS_UNDER_311["shaped"]


@pytest.mark.parametrize("make", [_loader, _stream_loader], ids=["map source", "stream"])
@pytest.mark.parametrize("when", ["under 3.11", "before"])
def test_a_state_saved_under_python_3_11_or_by_an_older_version_restores_quietly(make, when):
    from jaxloader.sources.fingerprint import older_fingerprint

    with make() as loader:
        batches = iter(loader)
        for _ in range(3):
            next(batches)
        state = loader.state_dict()
        want = next(batches)["sum"].tolist()
        forms = older_fingerprint(loader._source) if make is _loader else ()
    older = sys.version_info[:2] if sys.version_info[:2] == (3, 11) else (3, 13)
    saved = _as_saved(state, SAVED[when if when != "before" else "by 3f18cdf, under %d.%d" %
                                   older])
    if when == "under 3.11":  # (this Python's digests are 3.11's; a MapSource's fingerprint
        # holds its mapped records' hash since 2026-12-07's eleventh session: as written before)
        assert {**saved, "source": None} == {**state, "source": None}
        assert saved.get("source") == state.get("source") or saved["source"] in forms
    with make() as again, warnings.catch_warnings():
        warnings.simplefilter("error")
        again.load_state_dict(saved)
        assert next(iter(again))["sum"].tolist() == want


def test_a_kept_file_of_an_older_version_is_taken_as_it_is(tmp_path):
    # (its .from names the keep function's digest as versions until 2026-12-01 took it)
    import json

    path, source = tmp_path / "kept.npy", jl.ArraySource({"x": np.arange(60)})
    first = jl.FilteredSource(source, kept, indices=path).indices.tolist()
    said = json.loads((tmp_path / "kept.npy.from").read_text())
    said["keep function"] = code_digest(kept, deep=True, code_as_before=True)
    (tmp_path / "kept.npy.from").write_text(json.dumps(said))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        again = jl.FilteredSource(source, kept, indices=path)  # (found again: warned)
    assert again.indices.tolist() == first


def labelled(r, labels=collections.OrderedDict(cat=0, dog=1, stop={"the", "a", "an", "of"}),
             recent=collections.deque(["x", "y"], maxlen=4),
             chained=collections.ChainMap({"k": {"p", "q", "r"}}, {"z": 1}),
             frozen=types.MappingProxyType({"w": 2}),
             held=np.array([{"u", "v", "w"}, None], dtype=object)):
    return {"x": r["x"], "y": labels["cat"] + len(recent) + chained["z"] + frozen["w"] + len(held)}


LABELLED_UNDER_311_AND_313 = "ac74fa004cbad38cadfee42fe42a07c4"


def test_a_closures_ordered_dict_deque_chain_map_proxy_or_object_array_digests_alike_anywhere():
    # an OrderedDict's repr changed in Python 3.12 (a MapSource's state saved under 3.11 was
    # refused under 3.13), and sets of strings inside these were written in the run's hash
    # order (refused in every new process); each is written item by item now, sets sorted
    import subprocess

    assert code_digest(labelled) == LABELLED_UNDER_311_AND_313
    script = ("import sys; sys.path.insert(0, 'tests'); from test_cross_python import labelled;"
              "from jaxloader.sources.code_digest import code_digest; print(code_digest(labelled))")
    digests = {subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                              env={**os.environ, "PYTHONHASHSEED": seed}, check=True,
                              cwd=os.path.dirname(os.path.dirname(__file__))).stdout.strip()
               for seed in ("1", "2", "3")}
    assert digests == {LABELLED_UNDER_311_AND_313}
    for i, other in enumerate([collections.OrderedDict(cat=0, dog=2, stop={"the"}),
                               collections.deque(["x", "z"], maxlen=4),
                               collections.ChainMap({"k": {"p"}}, {"z": 1}),
                               types.MappingProxyType({"w": 3}),
                               np.array([{"u", "w"}, None], dtype=object)]):
        defaults = list(labelled.__defaults__)
        defaults[i] = other  # (each one's values are in the digest, not its type alone)
        changed = types.FunctionType(labelled.__code__, labelled.__globals__, "labelled",
                                     tuple(defaults))
        assert code_digest(changed) != LABELLED_UNDER_311_AND_313, other
