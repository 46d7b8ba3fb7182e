"""Random numbers the loader does not own, beyond the global state's draws a transform makes
(tests/test_transforms.py): a generator a transform holds, the global generators reached by
value through a script's ``from numpy.random import randint``, workers forked with one global
state, and a source that draws as it reads. Each gave repeated or irreproducible augmentations
without a word (the augmentation-randomness audit)."""

from __future__ import annotations

import pickle
import re
import random
import warnings

import numpy as np
import pytest

import held_augs
import jaxloader as jl
from jaxloader.workers import by_value, payload

ONE = {"process_index": 0, "process_count": 1}


def _epoch(transforms, num_workers, **options):
    """The values the transforms drew over one epoch of 64 records, and the warnings said."""
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8,
                           transforms=transforms, num_workers=num_workers, **ONE,
                           **options) as loader:
            drawn = np.concatenate([batch["aug"] for batch in loader])
    return drawn, [str(w.message) for w in said]


class _Crop:  # an augmentation object with its own generator (torchvision, albumentations)
    def __init__(self):
        self.rng = np.random.default_rng(1234)

    def __call__(self, record):
        return {**record, "aug": np.float64(self.rng.random())}


class _SharedCrop:  # the generator a class attribute: one for every instance
    rng = np.random.default_rng(1234)

    def __call__(self, record):
        return {**record, "aug": np.float64(self.rng.random())}


MODULE_RNG = random.Random(7)  # (made as the module is imported: in each worker the same)


def _module_draw(record):
    return {**record, "aug": np.float64(MODULE_RNG.random())}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_generator_a_transform_holds_is_warned_of_by_where_it_is(num_workers):
    # with workers each drew from a copy in one state: 32 values of 64, nothing said
    drawn, said = _epoch([jl.Map(lambda r: r), jl.Map(_Crop())], num_workers)
    found = [s for s in said if "random generator it holds" in s]
    assert found and all(s.startswith("transforms[1] Map(") for s in found), said
    assert "(fn.rng)" in found[0] and "each worker draws from a copy" in found[0]
    assert "jl.RandomMap(lambda record, rng:" in found[0]
    # one the function's module holds, found in each worker's own module (not a copy of the
    # training process's, which never moves there)
    drawn, said = _epoch([jl.Map(_module_draw)], num_workers)
    assert any("(fn.MODULE_RNG)" in s for s in said), said
    drawn, said = _epoch([jl.RandomMap(lambda r, rng: {**r, "aug": rng.random()})], num_workers)
    assert len(set(drawn.tolist())) == 64 and not [s for s in said if "drew from" in s], said
    drawn, said = _epoch([jl.Map(_SharedCrop())], num_workers)  # (a class attribute's: not
    assert any("(fn.rng)" in s for s in said), said  # looked at, nothing said; the audit)


_SCRIPT = """
from numpy.random import randint
from random import random

def augment(record):
    return {**record, "aug": np.float64(randint(1 << 30) + random())}
"""


def test_the_global_generators_reach_workers_by_name_not_as_copies():
    # a script's `from numpy.random import randint` is a bound method of NumPy's global
    # RandomState: a function pickled by value carried a copy of it, in the training
    # process's state, to each worker (the same numbers in each, out of the watch's sight)
    for bound in (np.random.randint, random.random):
        again = payload.loads(payload.dumps(bound, lambda segment: None))
        assert again.__self__ is bound.__self__
    blob = by_value.dumps_by_value(np.random.randint, lambda buffer: True)  # (Ray's)
    assert pickle.loads(blob).__self__ is np.random.randint.__self__
    namespace = {"__name__": "__main__", "np": np}  # (a script's: pickled by value)
    exec(_SCRIPT, namespace)
    drawn, said = _epoch([jl.Map(namespace["augment"])], 2)
    assert len(set(drawn.tolist())) == 64, len(set(drawn.tolist()))  # (32: repeated)
    assert any("drew from the global random state" in s for s in said), said


_FORKED = """
import numpy as np, sys, jaxloader as jl
assert "jax" not in sys.modules  # (start_method="fork" is refused beside JAX)
def draw(record):
    return {**record, "aug": np.float64(np.random.random())}
with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, transforms=[jl.Map(draw)],
                   num_workers=2, start_method="fork", process_index=0, process_count=1) as dl:
    print(len(set(np.concatenate([b["aug"] for b in dl]).tolist())))
"""


def test_workers_forked_by_start_method_fork_draw_from_states_of_their_own():
    # the starter's workers were reseeded, those of start_method="fork" kept the training
    # process's state: each drew the same numbers (a warning said it might)
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-W", "ignore", "-c", _FORKED], capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["64"], out.stdout  # (32: each value twice)


class _AugmentedReads:  # a torchvision-style dataset augmenting in __getitem__
    def __len__(self):
        return 64

    def __getitem__(self, i):
        return {"x": np.int64(i), "jitter": np.float32(np.random.uniform(-1, 1))}


def test_a_source_that_draws_as_it_reads_is_warned_of_at_the_first_state():
    # nothing was said while training and saving; the restart's restore then refused the
    # state, every checkpoint of the run unusable
    with jl.DataLoader(_AugmentedReads(), batch_size=8, **ONE) as loader:
        next(iter(loader))
        with pytest.warns(jl.JaxloaderWarning, match=r"record 0, read twice, gave other "
                                                     r"values \(\['jitter'\] differs\).*"
                                                     r"RandomMap"):
            loader.state_dict()
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # (a source whose reads are its records: nothing)
        with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, **ONE) as ld:
            next(iter(ld))
            ld.state_dict()


class _Mixup:  # a batch's mixing weight from a generator of its own
    def __init__(self):
        self.rng = np.random.default_rng(0)

    def __call__(self, batch):
        return {**batch, "aug": np.full(len(batch["x"]), self.rng.beta(0.2, 0.2))}


def _mix_global(batch):
    return {**batch, "aug": np.full(len(batch["x"]), np.random.beta(0.2, 0.2))}


def _scaled(batch):
    return {**batch, "aug": batch["x"] * 0.5}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_batch_maps_draws_are_watched_as_a_record_transforms_are(num_workers):
    # a BatchMap was not watched at all: a mixup's weights from np.random, or from a generator
    # it holds (the same weights in each worker: 4 distinct of 8 with 2), said nothing
    for fn, what in ((_Mixup(), r"a random generator it holds \(fn.rng\)"),
                     (_mix_global, r"the global random state")):
        drawn, said = _epoch([jl.BatchMap(fn)], num_workers)
        assert said and all(re.match(rf"BatchMap\(.*\) drew from {what}.* on 2 of the first "
                                     r"batches.*JitMap's key", s) for s in said), said
    drawn, said = _epoch([jl.BatchMap(_scaled)], num_workers)
    assert not said, said


class _Slotted:  # an augmentation object of slots alone (a dataclass(slots=True))
    __slots__ = ("rng", "config")

    def __init__(self, config):
        self.rng, self.config = np.random.default_rng(0), config

    def __call__(self, record):
        return {**record, "aug": self.rng.random()}


class _Config:  # a config object that looks names up in a dict, and prints otherwise
    __slots__ = ("values",)

    def __init__(self):
        self.values = {"scale": 2.0}

    def __getattr__(self, name):
        return self.values[name]  # (KeyError for '__dict__': it ran the user's code)


class _Loud:
    def __repr__(self):
        raise RuntimeError("repr ran")

    @property
    def __class__(self):
        raise RuntimeError("__class__ ran")


def _via_temp_file(record):  # (a decoder fed through a temporary file)
    from tempfile import NamedTemporaryFile

    return record if NamedTemporaryFile else record


def test_the_search_for_held_generators_looks_into_slots_and_runs_nothing_of_the_users():
    # (the twenty-sixth review) a slotted object's generator was not found; a config object's
    # __getattr__, a key's __repr__ and a proxy's __class__ ran and failed the first batch;
    # tempfile's own name generator, reached through its functions' globals, was warned of
    import tempfile

    from jaxloader.batching.global_draws import held_generators

    tempfile.mkstemp.__name__  # (its names' generator made, as after JAX's cache or Orbax)
    next(tempfile._get_candidate_names())
    config, loud = _Config(), _Loud()
    augment = _Slotted(config)
    table = {loud: 1, "x": loud}

    def uses(record):
        return augment(record) if config else record

    def proxied(record):
        return uses(record) if table else record

    found = held_generators((jl.Map(proxied), jl.Map(_via_temp_file)))
    assert [(i, where) for i, where, _ in found] == [(0, "fn.uses.augment.rng")], found
    with warnings.catch_warnings(record=True) as said:  # (the config's __getattr__ failed
        # the loader as it was made, in the digest of its transforms, too)
        warnings.simplefilter("always")
        with jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=4, **ONE,
                           transforms=[jl.Map(uses)]) as loader:
            assert len(list(loader)) == 2
    assert any("(fn.augment.rng)" in str(w.message) for w in said), said


def _via_module(record):  # (a project's augs.py, named by its attribute)
    return {**record, "aug": np.float64(held_augs.TRAIN.random())}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_generator_a_users_module_or_a_list_of_augmentations_holds_is_found(num_workers):
    # (the augmentation-libraries audit) augs.TRAIN, a seeded pipeline in the project's module:
    # each worker imported the same, half the augmentations repeated, nothing said; a list
    # subclass's own generator (imgaug's OneOf) was not looked for either
    drawn, said = _epoch([jl.Map(_via_module)], num_workers)
    assert any("(fn.held_augs.TRAIN)" in s for s in said), said
    pick = held_augs.OneOf(lambda r: {**r, "aug": 1.0}, lambda r: {**r, "aug": 2.0})
    drawn, said = _epoch([jl.Map(pick)], num_workers)
    assert any("(fn.random_state)" in s for s in said), said


def test_a_batch_maps_draw_warning_made_an_error_is_the_warning_not_the_batchs_error():
    # (the twenty-seventh review) under warnings-as-errors a Map's draws raise the warning;
    # a BatchMap's raised a RecordError naming the batch, the warning its "original error"
    with warnings.catch_warnings():
        warnings.simplefilter("error", jl.JaxloaderWarning)
        for transform in (jl.Map(lambda r: {**r, "aug": np.random.random()}),
                          jl.BatchMap(_mix_global)):
            with jl.DataLoader(jl.ArraySource({"x": np.arange(64)}), batch_size=8, **ONE,
                               transforms=[transform]) as loader:
                with pytest.raises(jl.JaxloaderWarning, match="drew from the global random"):
                    list(loader)


class _WarmingCache:  # a cache whose first read computes, the next ones give what it kept
    def __init__(self):
        self.kept = {}

    def __len__(self):
        return 16

    def __getitem__(self, i):
        if i in self.kept:
            return self.kept[i]
        self.kept[i] = {"x": np.float32(i), "id": i}  # (sorted keys, a Python int)
        return {"id": np.int64(i), "x": np.float32(i)}


def test_a_record_read_again_in_another_form_of_the_same_values_is_not_warned_of():
    # (the warnings sweep) a cache that gives its keys in another order, or an int where the
    # first read gave an np.int64, changes no batch: it was said to draw as it reads
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with jl.DataLoader(_WarmingCache(), batch_size=4, **ONE) as loader:
            loader.state_dict()  # (record 0 read cold, then from the cache)
            next(iter(loader))


def test_a_draw_watched_beside_a_thread_of_the_users_says_the_thread_may_have_drawn():
    # (the warnings sweep) an uploader's retry jitter drawn from random on a thread of its own
    # while a RandomMap ran made the RandomMap "draw from the global random state"
    import threading

    done = threading.Event()
    uploader = threading.Thread(target=done.wait, name="uploader", daemon=True)
    uploader.start()
    try:
        drawn, said = _epoch([jl.Map(_global_draw)], 0)
    finally:
        done.set()
    assert any("(or another of this process's threads drew while it ran)" in s
               for s in said), said


def _global_draw(record):
    return {**record, "aug": np.float64(np.random.random())}


def _lazy_module():
    """A project's module with a lazy ``__getattr__`` (PEP 562) that raises ``KeyError`` for a
    name it does not know, as a lazy-import table does."""
    import types

    module = types.ModuleType("lazy_augs")
    module.__file__ = __file__  # (the user's own)
    module.SEEDED = np.random.default_rng(3)
    module.__getattr__ = lambda name: {"later": 1}[name]
    return module


def test_the_search_reads_modules_without_running_their_code_and_follows_imports():
    # (the twenty-eighth review) a module's attributes were read with getattr: a lazy module's
    # __getattr__ ran and raised, a proxy global's __class__ ran and raised, and with them the
    # generator in the function's closure was lost, the workers' same draws unsaid; a name
    # imported from a project's module inside the function was no longer looked for
    from jaxloader.sources.held_generators import held_generators

    lazy, loud, rng = _lazy_module(), _Loud(), np.random.default_rng(7)
    space = {"lazy_augs": lazy, "loud": loud, "rng": rng, "np": np}
    exec("def lazily(r):\n    return r + 0 * lazy_augs.random + rng.random() if loud else r\n"
         "def imports(r):\n    from held_augs import TRAIN\n    return r + TRAIN.random()\n",
         space)
    found = held_generators((jl.Map(space["lazily"]), jl.Map(space["imports"])))
    assert [(i, where) for i, where, _ in found] == [(0, "fn.rng"), (1, "fn.held_augs.TRAIN")]


def _imports_its_noise(record):
    from held_later import NOISE  # (a fresh worker imports it at the first call)

    return {**record, "aug": np.float64(NOISE.random())}


def test_a_generator_of_a_module_imported_inside_the_transform_is_found_in_fresh_workers():
    # (the twenty-ninth review) the search ran before the transform's first call: a fresh
    # worker had not imported the module yet, its generator was not found, and each worker
    # drew the same numbers without a word (in process the module was already imported)
    drawn, said = _epoch([jl.Map(_imports_its_noise)], 2)
    assert len(set(drawn.tolist())) < len(drawn)  # (the workers' numbers repeat)
    assert any("(fn.held_later.NOISE)" in s for s in said), said


def _fresh_each_call(record):
    rng = np.random.default_rng()  # (the OS's entropy: another number each run)
    return {**record, "aug": np.float64(rng.random())}


def _helper_made(record):
    return {**record, "aug": np.float64(_draw() + random.Random(int(record["x"])).random())}


def _draw():
    return random.Random().random()


def _global_seeded(record):
    random.seed(0)
    rng = np.random.default_rng()
    return {**record, "aug": np.float64(rng.random())}


def _seeded_after(record):
    rng = random.Random()
    rng.seed(int(record["x"]))
    return {**record, "aug": np.float64(rng.random())}


def _seeded(record):
    rng = np.random.default_rng(int(record["x"]))
    return {**record, "aug": np.float64(rng.random())}


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_generator_made_without_a_seed_inside_a_transform_is_warned_of_at_its_line(
        num_workers):
    # np.random.default_rng() in a Map: a generator no watch finds (made and dropped each
    # call), drawing from the OS's entropy: the batches differed from run to run without a word
    first, said = _epoch([jl.Map(_fresh_each_call)], num_workers)
    again, _ = _epoch([jl.Map(_fresh_each_call)], num_workers)
    assert not np.array_equal(first, again)  # (what is warned of)
    assert any(re.search(r"transforms\[0\] Map\(_fresh_each_call\) makes a random generator "
                         r"without a seed \(default_rng\(\) in fn\): each one draws from the "
                         r"operating system's entropy.*jl.RandomMap", w) for w in said), said
    _, said = _epoch([jl.Map(lambda r: r), jl.Map(_helper_made)], num_workers)
    assert any("transforms[1] Map(_helper_made) makes a random generator without a seed "
               "(Random() in fn._draw)" in w for w in said), said
    for seeded in (_seeded, _seeded_after):  # (seeded from the record, as made or after)
        _, said = _epoch([jl.Map(seeded)], num_workers)
        assert not any("without a seed" in w for w in said), said
    _, said = _epoch([jl.Map(_global_seeded)], num_workers)  # (random.seed seeds another one)
    assert any("Map(_global_seeded) makes a random generator" in w for w in said), said
