"""PyTorch's and Grain's argument names given to DataLoader say what to pass instead."""

from __future__ import annotations

import inspect
import re

import numpy as np
import pytest

import jaxloader as jl
from jaxloader.peer_arguments import _REMEDIES


def loader(**kw):
    return jl.DataLoader(jl.ArraySource({"x": np.arange(8)}), batch_size=2, process_index=0,
                         process_count=1, **kw)


@pytest.mark.parametrize("name, value, remedy", [
    ("drop_last", True, "last_batch='drop'"),
    ("collate_fn", list, "BatchMap"),
    ("pin_memory", True, "sharding="),
    ("worker_count", 2, "num_workers="),
    ("generator", None, "seed="),
])
def test_a_peer_name_raises_naming_the_value_and_what_to_pass(name, value, remedy):
    with pytest.raises(TypeError) as info:
        loader(**{name: value})
    message = str(info.value)
    assert message.startswith(f"DataLoader({name}={value!r}): jaxloader has no {name}: ")
    assert remedy in message


def test_every_remedy_names_an_argument_or_class_jaxloader_has():
    accepted = set(inspect.signature(jl.DataLoader).parameters) | set(jl.__all__)
    for name, remedy in _REMEDIES.items():
        assert name not in accepted, name  # a name jaxloader has is never answered as foreign
        classes = set(re.findall(r"jaxloader\.(\w+)", remedy))
        outside_calls = re.sub(r"jaxloader\.\w+\([^)]*\)", "", remedy)
        arguments = set(re.findall(r"(\w+)=", outside_calls)) - set(_REMEDIES)  # drop_last=True
        assert arguments | classes or remedy.startswith("nothing to set") or (
            "the first argument" in remedy), name
        assert (arguments | classes) <= accepted, (name, (arguments | classes) - accepted)


def test_any_other_unknown_name_is_pythons_usual_error():
    with pytest.raises(TypeError, match=r"^DataLoader\(\) got an unexpected keyword argument "
                                        r"'batchsize'$"):
        loader(batchsize=3)


def test_the_loader_still_works_with_its_own_names():
    assert [b["x"].tolist() for b in loader(last_batch="partial")][-1] == [6, 7]
