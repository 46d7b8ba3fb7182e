"""States saved before functions' default arguments were digested (until the thirty-third
session of 2026-11-30) restore: their digests are matched as written then, the functions'
defaults left out (``base.abilities.OLDER_DIGESTS``). Before, such a state over a function with
a default was refused (a ``MapSource``, a ``Stream.map``, a ``PackedStream``'s ``tokenize``),
a joined Hugging Face stream's too (its parts were not digested), and a ``Map``'s warned."""

from __future__ import annotations

import functools
import json
import warnings

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.code_digest import code_digest
from jaxloader.sources.fingerprint import combined
from streams.test_shards import write_jsonl

K = 3


def add(r, k=K):
    return {**r, "id": r["id"] + k}


def tokens(r, k=K):
    return {"tokens": np.asarray([r["id"], r["id"] + k], np.int32)}


def _stream_loader(stream):
    return jl.StreamLoader(stream, batch_size=4, process_index=0, process_count=1)


def _saved_then(loader, rename):
    """The loader's state after 3 batches, its 4th batch's ids, and the state as an older
    version wrote it (``rename`` on its JSON text)."""
    batches = iter(loader)
    for _ in range(3):
        next(batches)
    state = json.loads(json.dumps(loader.state_dict()))
    return state, next(batches)["id"].tolist(), json.loads(rename(json.dumps(state)))


def _restored_quietly(make, state):
    with make() as again, warnings.catch_warnings():
        warnings.simplefilter("error")
        again.load_state_dict(state)
        return next(iter(again))["id"].tolist()


def test_a_stream_map_and_a_tokenize_with_defaults_restore_states_of_older_digests(tmp_path):
    paths = [write_jsonl(tmp_path / f"p{i}.jsonl", range(i * 100, i * 100 + 30))
             for i in range(3)]
    then = code_digest(add, defaults=False, code_as_before=True)[:16]  # (before defaults)
    now = code_digest(add)[:16]
    assert now != then
    make = lambda: _stream_loader(jl.Stream.jsonl(paths).map(add))  # noqa: E731
    with make() as loader:
        state, want, older = _saved_then(loader, lambda text: text.replace(now, then))
    assert older != state
    assert _restored_quietly(make, older) == want
    packed = lambda: _stream_loader(jl.PackedStream(  # noqa: E731
        jl.Stream.jsonl(paths), "tokens", 4, tokenize=tokens))
    now = code_digest(tokens)[:16]
    then = code_digest(tokens, defaults=False, code_as_before=True)[:16]
    with packed() as loader:
        batches = iter(loader)
        next(batches)
        state = json.loads(json.dumps(loader.state_dict()))
        want = next(batches)["tokens"].tolist()
    assert state["stream"]["tokenize"] == now
    state["stream"]["tokenize"] = then
    with packed() as again, warnings.catch_warnings():
        warnings.simplefilter("error")
        again.load_state_dict(state)
        assert next(iter(again))["tokens"].tolist() == want


def test_a_map_source_and_a_map_with_defaults_restore_states_of_older_digests():
    records = [{"id": i} for i in range(40)]
    source = jl.MapSource(records, add)
    make = lambda: jl.DataLoader(source, batch_size=4, shuffle=True)  # noqa: E731
    then = combined("map", 40, [records],
                    code_digest(add, defaults=False, code_as_before=True), b"records")
    with make() as loader:
        state, want, older = _saved_then(loader, lambda text: text)
    assert state["source"] != then
    assert _restored_quietly(make, {**older, "source": then}) == want
    make = lambda: jl.DataLoader(records, batch_size=4, shuffle=True,  # noqa: E731
                                 transforms=[jl.Map(add)])
    with make() as loader:
        state, want, _ = _saved_then(loader, lambda text: text)
    from jaxloader.loaders.transform_names import older_transforms_of

    for older in older_transforms_of([jl.Map(add)]):  # (a Map's change is warned of)
        assert _restored_quietly(make, {**state, "transforms": older}) == want


def test_a_generators_digest_is_what_older_versions_wrote():
    # (its defaults were digested through a partial before functions' were: taking them
    # twice made every older state's generators "differ", warned at each restore)
    def read(shard, n=K):
        for i in range(12):
            yield {"id": np.int64(shard * 100 + i * n)}

    with _stream_loader(jl.Stream.from_generator(read, shards=2)) as loader:
        next(iter(loader))
        codes = loader.state_dict()["generators"]
    assert codes == [code_digest(functools.partial(read, K), defaults=False)[:16]] * 2


def test_a_generators_older_digests_are_taken_and_made_only_for_a_state_that_differs():
    # (they were made at each Stream.from_generator, three digests more than its own: about
    # half of a small stream loader's making)
    from jaxloader.streams.iterable_shards import older_codes_of

    def read(shard, n=K):
        yield from ({"id": np.int64(shard * 100 + i * n)} for i in range(12))

    make = lambda: _stream_loader(jl.Stream.from_generator(read, shards=2))  # noqa: E731
    with make() as loader:
        state, want, _ = _saved_then(loader, str)
        older = loader._stream.shards[0].code_before
        loader.load_state_dict(state)  # (into this loader: its shards' digests are looked at)
        assert older._codes is None  # (a state of this version asked for none)
        forms = older_codes_of(loader._stream.shards)
    assert len(forms) == 3 and all(codes != state["generators"] for codes in forms[1:])
    for codes in forms:
        assert _restored_quietly(make, {**state, "generators": codes}) == want
    with make() as other, pytest.warns(UserWarning,
                                       match="functions that make the stream's records"):
        other.load_state_dict({**state, "generators": ["0" * 16] * 2})


def test_a_joined_hugging_face_streams_state_of_older_names_restores(tmp_path):
    datasets = pytest.importorskip("datasets")
    paths = [str(write_jsonl(tmp_path / f"p{i}.jsonl", range(i * 100, i * 100 + 30)))
             for i in range(4)]

    def joined():
        return datasets.concatenate_datasets([
            datasets.load_dataset("json", data_files=paths[:2], split="train", streaming=True),
            datasets.load_dataset("json", data_files=paths[2:], split="train", streaming=True)])

    make = lambda: _stream_loader(jl.Stream.huggingface(joined()))  # noqa: E731
    with make() as loader:
        name = loader.state_dict()["stream"]["shards"][0]  # ('json@<its parts' digest>[0/1]')
        state, want, older = _saved_then(  # (the end of its chain only: undigested)
            loader, lambda text: text.replace(name.split("[")[0], "json"))
    assert "@" in name and older != state
    assert _restored_quietly(make, older) == want


def test_a_map_source_over_images_restores_a_state_of_the_thirty_third_session():
    # (that session digested defaults but described a PIL image by its type: one older form
    # that switched both back matched neither it nor today's, and refused its states)
    from PIL import Image

    from jaxloader.base.abilities import OLDER_DIGESTS, fingerprint_of

    images = [{"im": Image.fromarray(np.full((2, 2), i, np.uint8))} for i in range(12)]
    source = jl.MapSource(images, add_size)
    forms = []
    for level in (0, 4, 5):  # (3, the 34th session's: 2's where no value is long)
        token = OLDER_DIGESTS.set(level)
        try:
            forms.append(fingerprint_of(source))
        finally:
            OLDER_DIGESTS.reset(token)
    assert len(set(forms)) == 3  # (today's, the 33rd session's, and before it)
    make = lambda: jl.DataLoader(source, batch_size=2, shuffle=True)  # noqa: E731
    with make() as loader:
        state, want, _ = _saved_then(loader, lambda text: text)
    for then in forms[1:]:
        assert _restored_quietly(make, {**state, "source": then}) == want


def add_size(r, size=2):
    return {"id": np.asarray(r["im"]).shape[0] * size + int(np.asarray(r["im"])[0, 0])}


IDS = frozenset(__import__("uuid").UUID(int=i * 7919) for i in range(6))


def not_excluded(r, ids=IDS):
    return {"id": r["x"], "kept": int(r["x"]) not in ids}


def test_a_set_of_uuids_is_written_as_before_for_states_of_before():
    # (a set of UUIDs keeps one order in every process; written sorted since the 34th
    # session, its states saved before were refused: they hold repr's order)
    from jaxloader.base.abilities import OLDER_DIGESTS, fingerprint_of
    from jaxloader.sources.value_text import SETS_AS_BEFORE, written

    token = SETS_AS_BEFORE.set(True)
    try:
        assert written(IDS) == repr(IDS)
    finally:
        SETS_AS_BEFORE.reset(token)
    assert written(IDS) != repr(IDS)
    source = jl.MapSource(jl.ArraySource({"x": np.arange(40)}), not_excluded)
    token = OLDER_DIGESTS.set(4)  # (the 33rd session's)
    try:
        then = fingerprint_of(source)
    finally:
        OLDER_DIGESTS.reset(token)
    make = lambda: jl.DataLoader(source, batch_size=4, shuffle=True)  # noqa: E731
    with make() as loader:
        state, want, _ = _saved_then(loader, lambda text: text)
    assert then != state["source"]
    assert _restored_quietly(make, {**state, "source": then}) == want


EPISODES = [f"/data/replay/run-2026-11-30/episode_{i:06d}.npz" for i in range(12)]


def count_files(r, files=EPISODES):
    return {"id": r.get("x", r.get("id")) + len(files)}


def test_states_of_the_thirty_fourth_session_over_long_values_restore():
    # (a value's text past 200 characters is digested since the 35th session: its states,
    # which cut it there, are matched as written then; checked too with real states saved by
    # 74768d7 over a MapSource, a Map, a Stream.from_generator and a Stream.map)
    from jaxloader.base.abilities import OLDER_DIGESTS, fingerprint_of
    from jaxloader.loaders.transform_names import older_transforms_of, transforms_of

    source = jl.MapSource(jl.ArraySource({"x": np.arange(40)}), count_files)
    token = OLDER_DIGESTS.set(3)  # (the 34th session's)
    try:
        then = fingerprint_of(source)
    finally:
        OLDER_DIGESTS.reset(token)
    transforms = [jl.Map(count_files)]
    make = lambda: jl.DataLoader(source, batch_size=4, shuffle=True,  # noqa: E731
                                 transforms=transforms)
    with make() as loader:
        state, want, _ = _saved_then(loader, lambda text: text)
    older = older_transforms_of(transforms)[3]  # (the 34th session's)
    assert then != state["source"] and older != transforms_of(transforms)
    assert _restored_quietly(make, {**state, "source": then, "transforms": older}) == want


SHIFT = '''
class Shift:
    def __init__(self, k):
        self.k = k

    def __call__(self, r):
        return {"id": r["id"] + self.k}
'''


def test_a_notebook_class_is_told_when_edited_and_its_states_of_before_restore(monkeypatch):
    # (a class defined in a notebook's cell was digested by its __call__'s names alone: a
    # restore under it edited, + to -, was quiet; now told, and the states the version before
    # wrote, without its functions' text, restore as they did)
    from jaxloader.base.abilities import OLDER_DIGESTS, fingerprint_of
    from jaxloader.loaders.transform_names import older_transforms_of
    from sources.test_code_digest import notebook_class

    records = jl.ArraySource({"id": np.arange(40)})

    def make(cls, transforms=False):
        fn = cls(3)
        return jl.DataLoader(records if transforms else jl.MapSource(records, fn), batch_size=4,
                             shuffle=True, transforms=[jl.Map(fn)] if transforms else None)

    shift = notebook_class(monkeypatch, SHIFT, "Shift")
    token = OLDER_DIGESTS.set(1)
    try:
        then = fingerprint_of(jl.MapSource(records, shift(3)))
    finally:
        OLDER_DIGESTS.reset(token)
    with make(shift) as loader:
        state, want, _ = _saved_then(loader, lambda text: text)
    assert then != state["source"]
    assert _restored_quietly(lambda: make(shift), {**state, "source": then}) == want
    with make(shift, transforms=True) as loader:
        mapped, mapped_want, _ = _saved_then(loader, lambda text: text)
    older = {**mapped, "transforms": older_transforms_of([jl.Map(shift(3))])[1]}  # (0: until
    # 2026-12-04's, a bound method's object whole: no bound method here, today's names)
    assert older != mapped
    assert _restored_quietly(lambda: make(shift, transforms=True), older) == mapped_want
    edited = notebook_class(monkeypatch, SHIFT.replace("] + self", "] - self"), "Shift")
    with make(edited) as again, pytest.raises(jl.StateDictError, match="map"):
        again.load_state_dict(state)
    with make(edited, transforms=True) as again, pytest.warns(jl.JaxloaderWarning, match="Shift"):
        again.load_state_dict(mapped)
