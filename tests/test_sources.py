from __future__ import annotations

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.sources import check_source


def test_array_source_records_and_vectorised_reads():
    src = jl.ArraySource({"img": np.arange(24).reshape(6, 4), "nested": (np.arange(6) * 2,)})
    assert len(src) == 6 and isinstance(src, jl.Source)
    assert src[2]["img"].tolist() == [8, 9, 10, 11] and src[2]["nested"][0] == 4
    batch = src.__getitems__(np.array([5, 0]))
    assert batch["img"].shape == (2, 4) and batch["nested"][0].tolist() == [10, 0]


def test_array_source_leaves_of_different_lengths():
    with pytest.raises(jl.ConfigError, match=r"same number of records.*\['a'\]: 3.*\['b'\]: 4"):
        jl.ArraySource({"a": np.zeros(3), "b": np.zeros(4)})


def test_array_source_rejects_scalars_and_objects():
    with pytest.raises(jl.ConfigError, match=r"\['a'\]"):
        jl.ArraySource({"a": np.float32(3)})
    with pytest.raises(jl.ConfigError, match="numeric"):
        jl.ArraySource([np.array(["a", None], dtype=object)])


def test_empty_and_non_sources():
    with pytest.raises(jl.ConfigError, match="empty source"):
        check_source(jl.ArraySource({"a": np.zeros((0, 3))}))
    with pytest.raises(jl.ConfigError, match="__len__ and __getitem__"):
        check_source(iter([1, 2]))
