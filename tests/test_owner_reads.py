"""A bound method's object in its digest as its code reads it (``sources/owner_reads.py``): a
value it holds and does not read leaves the digest be, and every way it may read one that
changed is seen (or the object taken whole)."""

from __future__ import annotations

import functools

import pytest

from jaxloader.sources.code_digest import code_digest
from jaxloader.sources.owner_reads import read_names


def _wrapped(f):
    @functools.wraps(f)
    def wrapper(*args, **kwargs):
        return f(*args, **kwargs)
    return wrapper


class _Plain:
    def __init__(self, k, started=0.0):
        self.k, self.started = k, started

    def m(self, r):
        return [v * self.k for v in r] + list(map(lambda v: v + self.k, r))


class _Cached(_Plain):
    @functools.cached_property
    def f(self):
        return self.k

    def m(self, r):
        return r * self.f


class _Wrapped(_Plain):
    @_wrapped
    def h(self):
        return self.k

    def m(self, r):
        return r * self.h()


class _Memo(_Plain):
    @functools.lru_cache  # noqa: B019 - (a memo of the method: its reads are not followed)
    def h(self):
        return self.k

    def m(self, r):
        return r * self.h()


class _ByDict(_Plain):
    def m(self, r):
        return r * self.__dict__["k"]


class _Config:
    def __init__(self, k, started=0.0):
        self.cfg, self.started = {"k": k}, started

    def __getattr__(self, name):
        return self.__dict__["cfg"][name]

    def m(self, r):
        return r * self.k


class _Mapping(dict):
    def __init__(self, k, started=0.0):
        super().__init__(k=k)
        self.started = started

    def m(self, r):
        return r * self.get("k")


class _Slot:
    __slots__ = ("k",)


class _Slotted(_Slot):
    def __init__(self, k, started=0.0):
        self.k, self.started = k, started

    def m(self, r):
        return r * self.k


@pytest.mark.parametrize("kind", [_Plain, _Cached, _Wrapped, _Memo, _ByDict, _Config, _Mapping,
                                  _Slotted])
@pytest.mark.parametrize("deep", [False, True])
def test_a_changed_value_the_method_reads_changes_the_digest(kind, deep):
    # a cached_property, a wrapped or memoized helper, __dict__, __getattr__, a dict's get, a
    # slot: the first version of owner_reads followed none, and saw k's change in none
    def digest(obj):
        return code_digest(obj.m, bound=not deep, deep=deep)

    assert digest(kind(2)) != digest(kind(3))
    if kind is _Plain:  # (a value of its run it does not read: the same digest)
        assert digest(kind(2, started=1.0)) == digest(kind(2, started=2.0))
        assert code_digest(kind(2, 1.0).m, bound=True, whole_owner=True) != code_digest(
            kind(2, 2.0).m, bound=True, whole_owner=True)


def test_the_names_read_and_where_the_object_goes_elsewhere():
    class Reads:
        scale = 2

        def direct(self, r):
            return r * self.k + self.scale

        def by_property(self, r):
            return r * self.p

        @property
        def p(self):
            return self.j

        def passes_itself_on(self, r):
            return vars(self)

        def writes(self, r):
            self.n += 1

        def up(self, r):
            return super().__repr__()

    assert read_names(Reads, Reads.direct.__code__) == {"k", "scale"}
    assert read_names(Reads, Reads.by_property.__code__) == {"p", "j"}
    for escapes in (Reads.passes_itself_on, Reads.writes, Reads.up):
        assert read_names(Reads, escapes.__code__) is None
    assert read_names(_Plain, _Plain.m.__code__) == {"k"}  # (a comprehension's, a lambda's)
