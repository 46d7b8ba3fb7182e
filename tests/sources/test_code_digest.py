"""code_digest: the same function the same digest in every process, another function another."""

from __future__ import annotations

import functools
import inspect
import linecache
import sys
import types
import zlib

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources.code_digest import code_digest


def _keep_small(limit, r):
    return r < limit


def _keep_large(limit, r):
    return r > limit


class _Node:  # Python's own repr (an address): digested by its attributes
    def __init__(self, value):
        self.value, self.other = value, None


class _Unprintable:
    def __repr__(self):
        raise RuntimeError("no repr")


def test_a_partial_is_its_function_and_arguments():
    # its repr named the function by address: another digest in every process
    assert code_digest(functools.partial(_keep_small, 3)) == code_digest(
        functools.partial(_keep_small, 3))
    assert code_digest(functools.partial(_keep_small, 3)) != code_digest(
        functools.partial(_keep_large, 3))
    assert code_digest(functools.partial(_keep_small, 3)) != code_digest(
        functools.partial(_keep_small, 4))


def test_a_value_bound_as_a_default_argument_is_part_of_the_digest():
    # ``lambda r, m=m: ...`` (a phase's value, bound as a loop's variables are) digested the
    # same for every m: a kept file or a MapSource's state of another phase was taken for this
    def at_least(m):
        return lambda r, m=m: r >= m

    def keyword(m):
        def keep(r, *, m=m):
            return r >= m
        return keep

    for make in (at_least, keyword):
        assert code_digest(make(10)) == code_digest(make(10))
        assert code_digest(make(10)) != code_digest(make(90))
        assert code_digest(make(10), deep=True) != code_digest(make(90), deep=True)
    assert code_digest(_keep_small) == code_digest(_keep_small)  # (none: as before)


def test_objects_that_hold_each_other_or_cannot_be_printed_are_digested():
    a, b = _Node(1), _Node(2)
    a.other, b.other = b, a  # a cycle of attributes: a RecursionError before
    unprintable = _Unprintable()

    def reads(r):
        return (r, a, unprintable)

    before = code_digest(reads)
    assert code_digest(reads) == before
    a.value = 5  # what the object holds counts
    assert code_digest(reads) != before


def test_deep_sees_a_constant_of_the_users_module_and_not_into_installed_code(tmp_path,
                                                                              monkeypatch):
    (tmp_path / "settings_mod.py").write_text("LIMIT = 5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import settings_mod

    try:
        def over(r):
            return r > settings_mod.LIMIT

        before = code_digest(over, deep=True)
        settings_mod.LIMIT = 7
        assert code_digest(over, deep=True) != before
        assert code_digest(over) == code_digest(over)  # (not deep: the code alone)
    finally:
        sys.modules.pop("settings_mod", None)


def test_deep_sees_a_helper_of_a_notebooks_main_which_has_no_file():
    # a notebook's (or python -c's) __main__ has no __file__: its helpers were taken for an
    # installed library's and digested by name, so a changed helper kept a file stale
    import subprocess

    script = (
        "from jaxloader.sources.code_digest import code_digest\n"
        "def helper(r):\n    return r > 5\n"
        "def keep(r):\n    return helper(r)\n"
        "first = code_digest(keep, deep=True)\n"
        "def helper(r):\n    return r > 7\n"
        "print(first != code_digest(keep, deep=True))\n")
    said = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          check=True).stdout
    assert said.strip() == "True"


CELL = """
import functools


class Scale:
    BIAS = 1

    def __init__(self, k):
        self.k = k

    def __call__(self, r):
        return self.scaled(r) + self.shift(r) + self.table

    def scaled(self, r):
        return r * self.k

    @staticmethod
    def shift(r):
        return r + 1

    @functools.cached_property
    def table(self):
        return 2 + self.BIAS
"""


def notebook_class(monkeypatch, text: str = CELL, name: str = "Scale") -> type:
    """A class as a notebook's cell defines it: in a ``__main__`` with no file, the cell's
    text kept by ``linecache`` under the cell's own file name, as IPython's kernel keeps it."""
    main = types.ModuleType("__main__")
    monkeypatch.setitem(sys.modules, "__main__", main)
    filename = f"/tmp/ipykernel_0/{zlib.crc32(text.encode())}.py"
    monkeypatch.setitem(linecache.cache, filename,
                        (len(text), None, text.splitlines(True), filename))
    exec(compile(text, filename, "exec"), vars(main))  # noqa: S102 - (a cell, as a kernel runs it)
    return vars(main)[name]


@pytest.mark.parametrize("edit", [("r * self.k", "r / self.k"), ("r + 1", "r - 1"),
                                  ("BIAS = 1", "BIAS = 3"), ("2 + self", "2 - self")],
                         ids=["a method", "a static method", "a class's value",
                              "a cached property"])
def test_a_notebook_cells_class_is_digested_by_its_functions_text(monkeypatch, edit):
    # (Python finds no source of a class defined in a notebook's cell: a callable object was
    # digested by its __call__'s names and constants, so an edited operator was the same
    # digest, and a restore under the edited class went unsaid; then by its functions' text,
    # which left its values and decorated methods out, the review)
    before = notebook_class(monkeypatch)(2)
    with pytest.raises((OSError, TypeError)):
        inspect.getsource(type(before))
    after = notebook_class(monkeypatch, CELL.replace(*edit))(2)
    assert code_digest(before) != code_digest(after)
    assert code_digest(before, deep=True) != code_digest(after, deep=True)
    assert code_digest(before) == code_digest(notebook_class(monkeypatch)(2))  # (run again)
    assert code_digest(before, methods=False) == code_digest(after, methods=False)  # (before)


WRAPPED = """
import functools


class Base:
    K = 2

    @functools.lru_cache
    def __call__(self, r):
        return r * self.K


class Variant(Base):
    K = 3
"""


@pytest.mark.parametrize("edit, name", [(("r * self", "r / self"), "Base"),
                                        (("K = 3", "K = 4"), "Variant")],
                         ids=["a wrapped __call__", "a subclass's value alone"])
def test_a_notebook_class_with_a_wrapped_call_or_values_alone_is_told_when_edited(
        monkeypatch, edit, name):
    # (a __call__ under lru_cache or jax.jit has no code of its own: no source was taken at
    # all, in a module file too; a subclass that sets K = 3 alone has no function to find
    # its cell by; the second review)
    before = notebook_class(monkeypatch, WRAPPED, name)()
    after = notebook_class(monkeypatch, WRAPPED.replace(*edit), name)()
    assert code_digest(before) != code_digest(after)
    assert code_digest(before) == code_digest(notebook_class(monkeypatch, WRAPPED, name)())


WRAPPED_FUNCTION = """
import functools


@functools.lru_cache
def doubled(r):
    return r * 2


class Words:
    STOP = {w: True for w in {"the", "a", "an", "of", "to"}}

    def __call__(self, r):
        return r in self.STOP
"""


def test_a_wrapped_function_and_a_cells_values_by_their_text(monkeypatch):
    # (lru_cache(f), jax.jit(f): f's source was taken, unwrapped, but the fix for a wrapped
    # __call__ took its wrapper's class instead, no text at all; and a class's values were
    # taken beside its cell's text, a dict built from a set in its run's order: refused in a
    # new process; the third review)
    doubled = notebook_class(monkeypatch, WRAPPED_FUNCTION, "doubled")
    edited = notebook_class(monkeypatch, WRAPPED_FUNCTION.replace("r * 2", "r - 2"), "doubled")
    assert code_digest(doubled) != code_digest(edited)
    words = notebook_class(monkeypatch, WRAPPED_FUNCTION, "Words")
    before = code_digest(words())
    words.STOP = dict(reversed(list(words.STOP.items())))  # (another run's order)
    assert code_digest(words()) == before


WRAPPERS = """
import functools

import jax


class Logged:
    def __init__(self, f):
        functools.update_wrapper(self, f)
        self.f = f

    def __call__(self, r):
        return self.f(r) * 2


@Logged
def tripled(r):
    return r * 3


def scale(r, n):
    return r * n


jitted = jax.jit(functools.partial(scale, n=3))


def doubled(r):
    return r * 2


class Model:
    def __init__(self):
        self.step = jax.jit(doubled)

    def __call__(self, r):
        return self.step(r)


model = Model()
"""


@pytest.mark.parametrize("edit, name", [(("self.f(r) * 2", "self.f(r) * 5"), "tripled"),
                                        (("r * n", "r - n"), "jitted"),
                                        (("self.step(r)\n", "self.step(r) + 1\n"), "model")],
                         ids=["a wrapper class's __call__", "jax.jit of a partial",
                              "an object holding jax.jit"])
def test_what_a_wrapper_runs_and_what_it_wraps_are_both_told(monkeypatch, edit, name):
    # (a wrapper that unwraps to a function was digested by that function alone: an edit of
    # a user's decorator class went unseen; jax.jit of a partial, a callable object or a bound
    # method unwraps to no plain function, and was digested by nothing; the fourth review)
    before = notebook_class(monkeypatch, WRAPPERS, name)
    after = notebook_class(monkeypatch, WRAPPERS.replace(*edit), name)
    assert code_digest(before) != code_digest(after)
    moved = notebook_class(monkeypatch, "# (a line more above)\n" + WRAPPERS, name)
    assert code_digest(moved) == code_digest(before)  # (not jax.jit's text: a file and line,
    # also where an object holds it: another with each kernel; the fifth review)


def test_a_notebook_cells_class_digests_as_the_version_before_took_it_without_methods(
        monkeypatch):
    # (what a state saved by 7f10e28 holds of MapSource(..., Scale(2)) defined in a cell)
    assert code_digest(notebook_class(monkeypatch)(2), methods=False) == SCALE_BEFORE


SCALE_BEFORE = "6f0aaf9bf4354acd65e3298b91da2ca9"


def test_sets_of_strings_inside_containers_digest_alike_under_every_hash_seed():
    # a partial's set keyword, a dataclass's set field, sets in a list or dict were digested
    # by repr, in the order of the run's string hash key: a state saved over a
    # MapSource(partial(fn, stop={...})) was refused in every new process; Enum members and
    # frozen dataclasses hash by their names and fields, the same way; so do paths, compiled
    # patterns and dates (a default's: refused in every new process, the third review)
    import os
    import subprocess

    script = (
        "import collections, dataclasses, functools, sys\n"
        "sys.path.insert(0, sys.argv[1])\n"
        "from jaxloader.sources.code_digest import code_digest\n"
        "@dataclasses.dataclass\nclass Config:\n    stop: set\n    n: int = 3\n"
        "Pair = collections.namedtuple('Pair', 'a b')\n"
        "def tag(r, stop):\n    return r in stop\n"
        "cfg, pair = Config({'x', 'y', 'zz', 'w'}), Pair(frozenset({'p', 'q', 'rr'}), [2])\n"
        "nested = {'k': [({'u', 'v', 'ww'}, 1)], 'j': 2}\n"
        "import enum\nclass Kind(enum.Enum):\n    A = 1\n    B = 2\n    C = 3\n    D = 4\n"
        "@dataclasses.dataclass(frozen=True)\nclass Tag:\n    name: str\n"
        "kinds, tags = {Kind.A, Kind.B, Kind.C, Kind.D}, {Tag('p'), Tag('q'), Tag('rr')}\n"
        "def uses(r):\n    return r in cfg.stop or r in pair.a or r in nested\n"
        "def typed(r):\n    return r in kinds or r in tags\n"
        "import types\n"  # (a default's or a closure's namespace or defaultdict: unsorted
        "def held(r, o=types.SimpleNamespace(stop={'a', 'b', 'cc', 'd'}),\n"  # until 2026-11-30)
        "         d=collections.defaultdict(set, {'k': {'e', 'ff', 'g'}})):\n    return r\n"
        "import datetime, pathlib, re\n"  # (paths, patterns, dates hash by text: unsorted
        "def other(r, p={re.compile('a+'), re.compile('bb'), re.compile('c')},\n"  # until
        "          q=frozenset(map(pathlib.Path, ['/a', '/bb', '/c', '/d'])),\n"  # 2026-11-30:
        "          d={datetime.date(2020, 1, i) for i in range(1, 6)}):\n    return r\n"
        "print(code_digest(other), code_digest(lambda r: r in {re.compile('x'), 1.5, 'y'}))\n"
        "print(code_digest(functools.partial(tag, stop={'a', 'b', 'cc', 'ddd', 'e'})),\n"
        "      code_digest(uses, deep=True), code_digest(lambda r: r in ('s', {'t', 'uu'})),\n"
        "      code_digest(typed, deep=True), code_digest(functools.partial(tag, stop=kinds)),\n"
        "      code_digest(held))\n"
        "def long(r, o=[object() for _ in range(30)], f=[f'/data/ep_{i:06d}.npz' for i in "
        "range(40)], s={f'word{i}' for i in range(60)}):\n    return r\n"  # (past 200
        "print(code_digest(long))\n"  # characters: the rest's digest, addresses left out;
        "class Custom:\n    def __repr__(self):\n"  # a repr of its own holds a set in the
        "        return 'C(' + 'x' * 210 + repr({f'tag{i}' for i in range(30)}) + ')'\n"  # run's
        "def custom(r, c=Custom()):\n    return r\nprint(code_digest(custom))\n"  # order;
        "import numpy as np\nclass Ep:\n    def __init__(self, i):\n        self.i = i\n"  # an
        "eps = np.empty(40, dtype=object)\neps[:] = [Ep(i) for i in range(40)]\n"  # object
        "def episodes(r, e=eps):\n    return r\nprint(code_digest(episodes))\n"  # array;
        "import time\nclass Stamped:\n    def __init__(self):\n        self.t = time.time()\n"
        "def stamped(r, s=[Stamped() for _ in range(20)]):\n    return r\n"  # objects: by
        "print(code_digest(stamped))\n")  # their type, not attributes a time holds)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    said = {subprocess.run([sys.executable, "-c", script, root], capture_output=True, text=True,
                           check=True, env={**os.environ, "PYTHONHASHSEED": str(seed)}
                           ).stdout for seed in range(1, 6)}
    assert len(said) == 1, said


def test_a_value_changed_past_its_first_200_characters_is_another_function():
    # a closure's text was cut at 200 characters: a replay folder's list of files that grew
    # at its end restored a Stream.from_generator state without a word, and other records
    # came (the RL audit); a MapSource's the same, silently
    short = [f"/data/replay/run-2026-11-30/episode_{i:06d}.npz" for i in range(10)]
    grown = short + [f"/data/replay/run-2026-11-30/episode_{i:06d}.npz" for i in range(10, 16)]

    def reader(files):
        def read(shard):
            for f in files[shard::2]:
                yield {"n": np.int64(len(files)), "f": np.int64(len(f))}
        return read

    assert code_digest(reader(short)) != code_digest(reader(grown))
    assert code_digest(reader(short), tails=False) == code_digest(reader(grown), tails=False)
    import collections
    import pathlib

    for kind in (collections.OrderedDict.fromkeys, collections.deque,
                 lambda names: list(map(pathlib.Path, names)),
                 lambda names: np.array(dict.fromkeys(names), dtype=object)):  # (np.save's
        assert code_digest(reader(kind(short))) != code_digest(reader(kind(grown)))  # dict)
    with jl.StreamLoader(jl.Stream.from_generator(reader(short), shards=2), batch_size=2,
                         process_index=0, process_count=1) as loader:
        next(iter(loader))
        state = loader.state_dict()
    with jl.StreamLoader(jl.Stream.from_generator(reader(grown), shards=2), batch_size=2,
                         process_index=0, process_count=1) as loader:
        with pytest.warns(UserWarning, match=r"functions that make the stream's records"):
            loader.load_state_dict(state)
    source = lambda files: jl.MapSource(  # noqa: E731
        jl.ArraySource({"x": np.arange(8)}), lambda r, files=files: {"x": r["x"] + len(files)})
    with jl.DataLoader(source(short), batch_size=2) as loader:
        state = loader.state_dict()
    with jl.DataLoader(source(grown), batch_size=2) as loader, pytest.raises(jl.StateDictError):
        loader.load_state_dict(state)


def test_values_without_a_set_of_strings_digest_as_before():
    # a state saved by an earlier version restores: those values' text is still their repr
    from jaxloader.sources.value_text import written as _repr

    import collections
    import dataclasses

    @dataclasses.dataclass
    class Config:
        stop: set
        parent: object = None

    cyclic = [1, ("a",)]
    cyclic.append(cyclic)
    tree = Config({"eos"}, [Config({"x"})])
    tree.parent[0].parent = tree  # (a back reference: repr writes "...")
    for value in [(1, [2.5, "a"], {"k": (None,)}), ("one",), {3, 1, 2}, [frozenset({4})],
                  _keep_small, functools.partial(_keep_small, 3), ("x", {"b"}), cyclic, tree,
                  collections.namedtuple("Pair", "a b")([{"one"}], 2), {"k": {"v"}},
                  collections.defaultdict(list, {"a": [1]}), collections.defaultdict(set),
                  types.SimpleNamespace(a=1, b={"x"}), types.SimpleNamespace()]:
        assert _repr(value) == repr(value)  # (a set of one string: repr's text was stable)
    assert _repr(("x", {"b", "a"})) == """('x', set(["'a'", "'b'"]))"""  # (a set's own form)
    import enum

    from jaxloader.sources.value_text import value_text as _value_text

    kind = enum.Enum("Kind", "A B")
    for one in [{kind.A}, frozenset({kind.B}), ({kind.A}, 1)]:  # (an order of one: as before)
        assert _value_text(one) == _repr(one) == repr(one)
    many = [[i] for i in range(200_000)] + [{"b", "a"}]  # (its first 200 characters: no walk)
    text = _repr(many, 200)
    assert 200 <= len(text) < 1_000 and repr(many).startswith(text)
