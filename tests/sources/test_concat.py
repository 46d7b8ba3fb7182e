"""ConcatSource: sources one after another, as one index space."""

from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from resume_harness import assert_same_stream, check_resume


def parts():
    x = np.arange(70, dtype=np.float32).reshape(35, 2)
    return x, [jl.ArraySource({"x": x[:10]}), jl.ArraySource({"x": x[10:11]}),
               jl.ArraySource({"x": x[11:]})]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_concatenation_reads_like_the_whole(num_workers):
    x, sources = parts()

    def loader(source):
        return jl.DataLoader(source, batch_size=4, shuffle=True, seed=2, num_workers=num_workers,
                             transforms=[jl.Map(lambda r: r)], process_index=0, process_count=1)

    with loader(jl.ConcatSource(sources)) as joined, loader(jl.ArraySource({"x": x})) as whole:
        assert_same_stream(list(joined), list(whole))


def test_index_mapping_and_resume():
    _, sources = parts()
    both = jl.ConcatSource(sources)
    assert len(both) == 35 and both.locate(np.array([9, 10, 11, 34])).tolist() == [
        [0, 9], [1, 0], [2, 0], [2, 23]]
    with pytest.raises(IndexError, match=r"index 35 out of range \[0, 35\)"):
        both[35]
    check_resume(lambda: jl.DataLoader(jl.ConcatSource(sources), batch_size=4, shuffle=True,
                                       seed=1, process_index=0, process_count=1),
                 total=12, k=5)


def test_bad_parts_are_named():
    with pytest.raises(jl.ConfigError, match="non-empty list"):
        jl.ConcatSource([])
    with pytest.raises(jl.ConfigError, match=r"sources\[1\]: source: expected at least one"):
        jl.ConcatSource([jl.ArraySource({"x": np.zeros(2)}), []])
